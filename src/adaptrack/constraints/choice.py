"""``choice``: the text must be one of a set of strings (API names, labels, enum values)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..tokenization.vocab import Vocabulary, trie_insert
from .base import DONE, Constraint, Matcher, State, terminator_bytes


class Choice(Constraint):
    """Text equal to one of ``strings``; with ``terminators``, one of them followed by a
    terminator byte (then the sequence ends inside that token and the rest is cut off).

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b"ma", b"trix", b"matrix_", b"rank", b"("], lambda p: [1] * 5)
    >>> m = choice(["matrix_rank"], terminators="(").bind(lm.vocab)
    >>> m.allowed(m.start()).tolist()
    [0, 2]
    >>> m.accepts(lm.encode("matrix_rank("))
    True
    """

    def __init__(
        self,
        strings: Iterable[str | bytes],
        terminators: str | bytes | Iterable[str] | None = None,
    ) -> None:
        self.strings = sorted({s.encode() if isinstance(s, str) else bytes(s) for s in strings})
        self.terminators = terminator_bytes(terminators)
        for s in self.strings:
            clash = set(s) & set(self.terminators)
            if clash:
                raise ValueError(
                    f"terminator {bytes(sorted(clash))!r} occurs inside the choice {s!r}: a "
                    "terminator must be a byte that cannot continue any string"
                )
        # The string trie: children[n] maps a byte to a node; accepting[n] ends a string.
        self.children: list[dict[int, int]] = [{}]
        ends = [trie_insert(self.children, s) for s in self.strings]
        self.accepting = [False] * len(self.children)
        for node in ends:
            self.accepting[node] = True

    def bind(self, vocab: Vocabulary) -> Matcher:
        return ChoiceMatcher(self, vocab)


def choice(
    strings: Iterable[str | bytes], terminators: str | bytes | Iterable[str] | None = None
) -> Choice:
    """The constraint "the output is one of ``strings``" (see :class:`Choice`)."""
    return Choice(strings, terminators)


class ChoiceMatcher(Matcher):
    """States are string-trie nodes. Masks are computed once per trie node and cached."""

    def __init__(self, choice: Choice, vocab: Vocabulary) -> None:
        self.c, self.vocab, self.terminators = choice, vocab, choice.terminators
        self._masks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def start(self) -> State:
        return 0

    def _mask(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        cached = self._masks.get(node)
        if cached is not None:
            return cached
        c, trie = self.c, self.vocab.trie
        valid: list[np.ndarray] = []
        finishing: list[np.ndarray] = []
        # Walk the string trie and the token trie together: a token is valid when its bytes
        # stay inside the string trie, or leave it through a terminator at an accepting node.
        stack = [(node, 0)]
        while stack:
            s, t = stack.pop()
            tchildren = trie.children[t]
            for b, s_next in c.children[s].items():
                t_next = tchildren.get(b)
                if t_next is not None:
                    valid.append(trie.ends[t_next])
                    stack.append((s_next, t_next))
            if c.accepting[s]:
                for b in self.terminators:
                    t_next = tchildren.get(b)
                    if t_next is not None:
                        valid.append(trie.subtree(t_next))
                        finishing.append(trie.subtree(t_next))
        if c.accepting[node] and not self.terminators:
            valid.append(self.vocab.eos_ids)
            finishing.append(self.vocab.eos_ids)
        empty = np.empty(0, dtype=np.int64)
        result = (
            np.unique(np.concatenate(valid)) if valid else empty,
            np.unique(np.concatenate(finishing)) if finishing else empty,
        )
        self._masks[node] = result
        return result

    def allowed(self, state: State) -> np.ndarray:
        return self._mask(state)[0]

    def finishing(self, state: State) -> np.ndarray:
        return self._mask(state)[1]

    def advance(self, state: State, token: int) -> State | None:
        c = self.c
        if self.vocab.is_eos(token):
            return DONE if c.accepting[state] and not self.terminators else None
        data = self.vocab.bytes_of(token)
        if not data:
            return None
        for b in data:
            nxt = c.children[state].get(b)
            if nxt is not None:
                state = nxt
            elif c.accepting[state] and b in self.terminators:
                return DONE
            else:
                return None
        return state

    def forced_bytes(self, state: State) -> bytes:
        out = bytearray()
        c = self.c
        while len(c.children[state]) == 1 and not c.accepting[state]:
            (b, state), = c.children[state].items()
            out.append(b)
        return bytes(out)
