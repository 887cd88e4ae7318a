"""``choice``: the text must be one of a set of strings (API names, labels, enum values)."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import cast

import numpy as np

from ..cache import LRU
from ..tokenization.vocab import Vocabulary, trie_insert
from .base import DONE, Constraint, Matcher, State, show, terminator_bytes, utf8


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
        self.strings = sorted(set(_as_bytes(strings)))
        if not self.strings:
            raise ValueError("choice needs at least one string, got none")
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
    """The constraint "the output is one of ``strings``" (see :class:`Choice`).

    >>> choice(["yes", "no"]).strings
    [b'no', b'yes']
    >>> choice("yes")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: choice takes a list of strings, got the single string 'yes': pass ['yes'] ...
    """
    return Choice(strings, terminators)


def _as_bytes(strings: Iterable[str | bytes], what: str = "choice") -> list[bytes]:
    """``strings`` as byte strings; a single string or a non-string item is a TypeError, a
    string UTF-8 cannot encode (a lone surrogate) a ValueError naming it."""
    if isinstance(strings, str | bytes | bytearray):
        raise TypeError(
            f"{what} takes a list of strings, got the single string {strings!r}: pass "
            f"[{strings!r}] for that string, or list({strings!r}) for its characters")
    try:
        items = list(strings)
    except TypeError:
        raise TypeError(f"{what} takes a list of strings, got {type(strings).__name__}") from None
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(utf8(item, what))
        elif isinstance(item, bytes | bytearray):
            out.append(bytes(item))
        else:
            raise TypeError(f"{what} takes strings (str or bytes), got {show(item)} "
                            f"({type(item).__name__}) among them")
    return out


class _VocabTables:
    """Per-vocabulary arrays the choice matchers share (made once, kept while the vocabulary lives).

    In the token trie's depth-first ``order``, the tokens ending at node ``t`` come first in
    ``t``'s subtree, so both "tokens ending at ``t``" (``lo[t]:lo[t] + nend[t]``) and "tokens
    starting with the path to ``t``" (``lo[t]:hi[t]``) are slices of ``order``
    (:class:`~adaptrack.tokenization.vocab.TokenTrie` lists a node's own tokens on entry;
    tests/constraints/test_choice_scale.py checks the masks against a brute-force reference).
    """

    def __init__(self, vocab: Vocabulary) -> None:
        trie = vocab.trie
        span = np.asarray(trie.span, dtype=np.int64).reshape(-1, 2)
        self.lo, self.hi = span[:, 0].copy(), span[:, 1].copy()
        self.nend = np.fromiter((len(e) for e in trie.ends), dtype=np.int64, count=len(span))
        self.order = trie.order
        self.children = trie.children
        self.size = vocab.size
        # EOS ids that have bytes sit in the token trie, but they are never text.
        self.eos_in_trie = np.asarray(
            [e for e in vocab.eos_ids.tolist() if vocab.bytes_of(e)], dtype=np.int64)
        # Tokens whose first byte is a terminator, per terminator set: (sorted ids, bool mask).
        self.starting_with: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def tokens_starting_with(self, terminators: bytes) -> tuple[np.ndarray, np.ndarray]:
        found = self.starting_with.get(terminators)
        if found is None:
            root = self.children[0]
            mask = np.zeros(self.size, dtype=bool)
            for b in terminators:
                t = root.get(b)
                if t is not None:
                    mask[self.order[self.lo[t]:self.hi[t]]] = True
            mask[self.eos_in_trie] = False
            ids = np.flatnonzero(mask)
            ids.flags.writeable = False
            found = self.starting_with[terminators] = (ids, mask)
        return found


_TABLES: weakref.WeakKeyDictionary[Vocabulary, _VocabTables] = weakref.WeakKeyDictionary()
_EMPTY = np.empty(0, dtype=np.int64)
_EMPTY.flags.writeable = False


def _tables(vocab: Vocabulary) -> _VocabTables:
    found = _TABLES.get(vocab)
    if found is None:
        found = _TABLES[vocab] = _VocabTables(vocab)
    return found


def _gather(order: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``order[lo[0]:hi[0]] + order[lo[1]:hi[1]] + ...`` without a Python loop."""
    counts = hi - lo
    keep = counts > 0
    lo, counts = lo[keep], counts[keep]
    if not len(counts):
        return _EMPTY
    if len(counts) == 1:
        return order[lo[0]:lo[0] + counts[0]]
    ends = np.cumsum(counts)
    # Position j of the output reads order[lo[k] + j - start[k]] for the range k it is in.
    idx = np.repeat(lo - (ends - counts), counts) + np.arange(ends[-1])
    out: np.ndarray = order[idx]
    return out


class ChoiceMatcher(Matcher):
    """States are string-trie nodes. Masks are computed per trie node, without a loop over
    the vocabulary: the string trie and the token trie are walked together (the work is
    proportional to the number of valid tokens, not the vocabulary), and the tokens that
    start with a terminator, valid at every accepting node, are precomputed once per
    vocabulary. Masks are cached, least recently used first out, up to ``cache_bytes``.
    """

    def __init__(self, choice: Choice, vocab: Vocabulary, cache_bytes: int = 64 << 20) -> None:
        self.c, self.vocab, self.terminators = choice, vocab, choice.terminators
        self._t = _tables(vocab)
        self._is_term = [False] * 256
        for b in self.terminators:
            self._is_term[b] = True
        self._masks: LRU[int, tuple[np.ndarray, np.ndarray]] = LRU(
            cache_bytes, size=lambda v: v[0].nbytes + v[1].nbytes, keep_one=True)
        self._min_tokens: int | None = None

    def start(self) -> State:
        return 0

    def _mask(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        cached = self._masks.get(node)
        if cached is not None:
            return cached
        result = self._compute(node)
        self._masks.put(node, result)
        return result

    def _compute(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        c, tab, is_term = self.c, self._t, self._is_term
        schildren, accepting, tchildren = c.children, c.accepting, tab.children
        # Walk the string trie and the token trie together from (node, token root): a token
        # is valid when its bytes stay inside the string trie (it ends at a visited token
        # node), or leave it through a terminator at an accepting node (then every token
        # below that terminator edge is valid and finishing). Each token node is visited at
        # most once, so the pieces are disjoint.
        visited: list[int] = []  # token nodes whose tokens end inside the string trie
        through: list[int] = []  # token nodes reached by a terminator edge
        stack = [(node, 0)]
        while stack:
            s, t = stack.pop()
            sc, tc = schildren[s], tchildren[t]
            if len(sc) <= len(tc):
                for b, s_next in sc.items():
                    t_next = tc.get(b)
                    if t_next is not None:
                        visited.append(t_next)
                        if tchildren[t_next]:
                            stack.append((s_next, t_next))
            else:
                for b, t_next in tc.items():
                    s_hit = sc.get(b)
                    if s_hit is not None:
                        visited.append(t_next)
                        if tchildren[t_next]:
                            stack.append((s_hit, t_next))
            if t and accepting[s]:  # at t == 0 (only the start) the precomputed set serves
                for b, t2 in tc.items():
                    if is_term[b]:
                        through.append(t2)
        lo, hi, nend = tab.lo, tab.hi, tab.nend
        v = np.asarray(visited, dtype=np.int64)
        starts, stops = lo[v], lo[v] + nend[v]
        if through:
            th = np.asarray(through, dtype=np.int64)
            ends = _gather(tab.order, lo[th], hi[th])
            starts, stops = np.concatenate([starts, lo[th]]), np.concatenate([stops, hi[th]])
        else:
            ends = _EMPTY
        valid = _gather(tab.order, starts, stops)
        valid = np.sort(valid) if len(valid) > 1 else valid
        finishing = np.sort(ends) if len(ends) > 1 else ends
        if len(tab.eos_in_trie):
            valid = valid[~np.isin(valid, tab.eos_in_trie)]
            finishing = finishing[~np.isin(finishing, tab.eos_in_trie)]
        if accepting[node]:
            if self.terminators:
                ids, mask = tab.tokens_starting_with(self.terminators)
                valid, finishing = _merge(ids, mask, valid), _merge(ids, mask, finishing)
            else:
                eos = self.vocab.eos_ids  # special tokens: never among the token ids
                valid = np.sort(np.concatenate([valid, eos]))
                finishing = eos.copy()
        for arr in (valid, finishing):  # cached and shared: nobody may change them
            arr.flags.writeable = False
        return valid, finishing

    def allowed(self, state: State) -> np.ndarray:
        return _EMPTY if state is DONE else self._mask(cast(int, state))[0]

    def finishing(self, state: State) -> np.ndarray:
        return _EMPTY if state is DONE else self._mask(cast(int, state))[1]

    def advance(self, state: State, token: int) -> State | None:
        if state is DONE:
            return None
        node, c = cast(int, state), self.c
        if self.vocab.is_eos(token):
            return DONE if c.accepting[node] and not self.terminators else None
        data = self.vocab.bytes_of(token)
        if not data:
            return None
        children, accepting, is_term = c.children, c.accepting, self._is_term
        for b in data:
            nxt = children[node].get(b)
            if nxt is not None:
                node = nxt
            elif accepting[node] and is_term[b]:
                return DONE
            else:
                return None
        return node

    def forced_bytes(self, state: State, limit: int | None = None) -> bytes:
        if state is DONE:
            return b""
        node, c, out = cast(int, state), self.c, bytearray()
        while (len(c.children[node]) == 1 and not c.accepting[node]
               and (limit is None or len(out) < limit)):
            (b, node), = c.children[node].items()
            out.append(b)
        return bytes(out)


    def min_new_tokens(self) -> int:
        """The fewest tokens of a complete sequence, exactly: breadth first over string-trie
        nodes, a layer per token, until a node has a finishing token.

        >>> from adaptrack import TableLM
        >>> lm = TableLM([b"ab", b"a", b"b", b"c", b"<e>"], lambda p: [1] * 5, eos=4)
        >>> choice(["abab", "cccc"]).bind(lm.vocab).min_new_tokens()  # ab ab <e>
        3
        """
        if self._min_tokens is None:
            self._min_tokens = self._fewest_tokens()
        return self._min_tokens

    def _fewest_tokens(self) -> int:
        layer, seen, depth = {0}, {0}, 0
        while layer:
            depth += 1
            nxt: set[int] = set()
            for node in layer:
                valid, finishing = self._walk(node)
                if finishing:
                    return depth
                nxt.update(valid)
            layer = nxt - seen
            seen |= layer
        return _UNREACHABLE

    def _walk(self, node: int) -> tuple[list[int], bool]:
        """The string-trie nodes one token leads to from ``node``, and whether a token
        finishes there (the joint walk of :meth:`_compute`, without the id lists)."""
        c, tab, is_term = self.c, self._t, self._is_term
        schildren, accepting, tchildren, nend = c.children, c.accepting, tab.children, tab.nend
        if accepting[node]:
            if not self.terminators and len(self.vocab.eos_ids):
                return [], True
            if self.terminators and any(is_term[b] for b in tchildren[0]):
                return [], True
        out: list[int] = []
        stack = [(node, 0)]
        while stack:
            s, t = stack.pop()
            for b, s_next in schildren[s].items():
                t_next = tchildren[t].get(b)
                if t_next is None:
                    continue
                if nend[t_next]:
                    out.append(s_next)
                if tchildren[t_next]:
                    stack.append((s_next, t_next))
            if t and accepting[s] and any(is_term[b] for b in tchildren[t]):
                return out, True
        return out, False


#: ``min_new_tokens`` of a language no token sequence reaches (larger than any budget).
_UNREACHABLE = 1 << 62


def _merge(ids: np.ndarray, mask: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """The sorted union of a large precomputed id set (``ids``, as ``mask``) and ``extra``."""
    if not len(extra):
        return ids
    both = mask.copy()
    both[extra] = True
    return np.flatnonzero(both)
