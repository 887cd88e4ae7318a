"""The vocabulary as constraints see it: the bytes of every token, and a trie over them.

Constraints never call a tokenizer: they walk token bytes. Special tokens (``None`` bytes)
are never matched by a constraint; EOS is allowed only where the constraint accepts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property

import numpy as np


def trie_insert(children: list[dict[int, int]], data: bytes) -> int:
    """Add ``data`` to a byte trie (``children[n]``: byte → node; node 0 the root) and
    return the node it ends at. Shared by the token trie and the ``choice`` string trie."""
    node = 0
    for b in data:
        nxt = children[node].get(b)
        if nxt is None:
            nxt = len(children)
            children[node][b] = nxt
            children.append({})
        node = nxt
    return node


class TokenTrie:
    """A byte trie over all non-special tokens.

    Node 0 is the root. ``children[n]`` maps a byte to a child node, ``ends[n]`` holds the ids
    of tokens whose bytes end at ``n``, and the tokens below ``n`` (inclusive) are
    ``order[span[n][0]:span[n][1]]``: a depth-first numbering makes every subtree one
    contiguous slice, so "all tokens that start with these bytes" is an array slice.
    """

    def __init__(self, token_bytes: Sequence[bytes | None]) -> None:
        self.children: list[dict[int, int]] = [{}]
        end_of = {tok: trie_insert(self.children, data)
                  for tok, data in enumerate(token_bytes) if data}
        ends: list[list[int]] = [[] for _ in self.children]
        for tok, node in end_of.items():
            ends[node].append(tok)
        self.ends = [np.asarray(e, dtype=np.int64) for e in ends]
        order: list[int] = []
        self.span = [(0, 0)] * len(self.children)
        # Iterative DFS: (node, entering?) so the exit can close the node's span.
        stack: list[tuple[int, bool]] = [(0, True)]
        starts = [0] * len(self.children)
        while stack:
            node, entering = stack.pop()
            if entering:
                starts[node] = len(order)
                order.extend(ends[node])
                stack.append((node, False))
                stack.extend((c, True) for c in self.children[node].values())
            else:
                self.span[node] = (starts[node], len(order))
        self.order = np.asarray(order, dtype=np.int64)

    def subtree(self, node: int) -> np.ndarray:
        """Ids of all tokens whose bytes start with the path to ``node``."""
        lo, hi = self.span[node]
        return self.order[lo:hi]


class Vocabulary:
    """Token byte values and EOS ids of a model.

    ``size`` is the width of the model's next-token scores; it may exceed
    ``len(token_bytes)`` (padded embedding matrices), and ids past the tokenizer are special.

    >>> v = Vocabulary([b"a", b"ab", None], eos_ids=[2])
    >>> v.size, v.decode([1, 0, 2])
    (3, b'aba')
    """

    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        eos_ids: Iterable[int] = (),
        size: int | None = None,
    ) -> None:
        self.token_bytes: tuple[bytes | None, ...] = tuple(token_bytes)
        self.size = len(self.token_bytes) if size is None else int(size)
        if self.size < len(self.token_bytes):
            raise ValueError(
                f"vocabulary size {self.size} is smaller than the {len(self.token_bytes)} "
                "token byte values given"
            )
        self.eos_ids = np.asarray(sorted(set(int(e) for e in eos_ids)), dtype=np.int64)
        for e in self.eos_ids:
            if not 0 <= e < self.size:
                raise ValueError(f"EOS id {e} is outside the vocabulary (size {self.size})")
        self._eos_set = frozenset(self.eos_ids.tolist())

    def is_eos(self, token: int) -> bool:
        return token in self._eos_set

    def bytes_of(self, token: int) -> bytes:
        """The token's bytes; special tokens and ids past the tokenizer give ``b""``."""
        if token < len(self.token_bytes):
            return self.token_bytes[token] or b""
        return b""

    def decode(self, tokens: Iterable[int]) -> bytes:
        return b"".join(self.bytes_of(t) for t in tokens)

    @cached_property
    def trie(self) -> TokenTrie:
        return TokenTrie(self.token_bytes)

    def longest_match(self, data: bytes) -> list[int]:
        """Token ids of ``data`` by greedy longest match over the token trie (the lowest id
        where several tokens have the same bytes); ``ValueError`` where no token starts.

        >>> Vocabulary([b"a", b"ab", b"b"]).longest_match(b"abab")
        [1, 1]
        """
        ids, pos = [], 0
        while pos < len(data):
            found = self.matches_at(data, pos)
            if not found:
                raise ValueError(f"cannot encode {data[pos:pos + 10]!r}: no token starts there")
            token, pos = found[-1]
            ids.append(token)
        return ids

    def matches_at(self, data: bytes, pos: int) -> list[tuple[int, int]]:
        """The tokens whose bytes ``data`` holds at ``pos``, shortest first, as (id, end)
        pairs (the lowest id where several tokens have the same bytes).

        >>> Vocabulary([b"a", b"ab", b"b"]).matches_at(b"abab", 0)
        [(0, 1), (1, 2)]
        """
        trie, node, out = self.trie, 0, []
        for i in range(pos, len(data)):
            step = trie.children[node].get(data[i])
            if step is None:
                break
            node = step
            if len(trie.ends[node]):
                out.append((int(trie.ends[node][0]), i + 1))
        return out

    def tokens_holding(self, data: bytes) -> np.ndarray:
        """Sorted ids of the text tokens that contain any byte of ``data`` (terminators)."""
        if not data:
            return np.empty(0, dtype=np.int64)
        wanted = set(data)
        return np.asarray([i for i in self.text_ids.tolist()
                           if not wanted.isdisjoint(self.bytes_of(i))], dtype=np.int64)

    @cached_property
    def max_token_len(self) -> int:
        """Bytes of the longest token (0 for none): a suffix this long spans no token.

        >>> Vocabulary([b"a", b"abc", None]).max_token_len
        3
        """
        return max((len(b) for b in self.token_bytes if b), default=0)

    @cached_property
    def first_bytes(self) -> np.ndarray:
        """Each id's first byte, -1 for special tokens, ids past the tokenizer and EOS (what
        decides whether a token can continue a text at all: the ``leave`` end policy).

        >>> Vocabulary([b"ab", b"b", None, b"<e>"], eos_ids=[3]).first_bytes.tolist()
        [97, 98, -1, -1]
        """
        out = np.full(self.size, -1, dtype=np.int16)
        for i, data in enumerate(self.token_bytes):
            if data:
                out[i] = data[0]
        out[self.eos_ids] = -1
        return out

    @cached_property
    def text_ids(self) -> np.ndarray:
        """Ids of all tokens with bytes (what an unconstrained step may emit besides EOS)."""
        return np.asarray([i for i, b in enumerate(self.token_bytes) if b], dtype=np.int64)
