"""JSON bounds: the fewest tokens any completion of a JSON prefix still needs under its
schema (docs/design.md §2, "the tokens a text still needs").

The scanner (:mod:`.jsonscan`) gives a prefix's *obligations*: bytes every completion holds,
in order, as a subsequence. The fewest vocabulary tokens whose concatenation holds a byte
string as a subsequence is found greedily (each token takes the longest prefix of what is
left that it holds as a subsequence: the further along, the fewer tokens remain, so the
greedy choice is optimal), and that count plus the end token is the bound.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import numpy as np

from ...cache import LRU
from ...tokenization.vocab import Vocabulary
from .jsonscan import IN_STRING, JsonScanner, Snapshot

#: A bound larger than any token budget: what :meth:`TokenCover.count` gives for bytes no
#: token holds.
UNREACHABLE = 1 << 62


class TokenCover:
    """The fewest tokens of a vocabulary whose concatenation holds a byte string as a
    subsequence (:meth:`count`), over every token with bytes (EOS aside): a superset of
    those a grammar allows, so the count is a lower bound for them.

    >>> v = Vocabulary([b'"', b'",', b'"a', b'":', b'}', b'<e>'], eos_ids=[5])
    >>> TokenCover(v).count(b'","a":}')   # '",' '"a' '":' '}'
    4
    """

    def __init__(self, vocab: Vocabulary) -> None:
        tokens = [vocab.bytes_of(i) for i in range(vocab.size) if not vocab.is_eos(i)]
        tokens = [t for t in tokens if t]
        width = max((len(t) for t in tokens), default=0)
        self.tokens = np.frombuffer(b"".join(t.ljust(width, b"\0") for t in tokens),
                                    dtype=np.uint8).reshape(len(tokens), width)
        self.lengths = np.asarray([len(t) for t in tokens], dtype=np.int64)
        self._holding: dict[int, np.ndarray] = {}
        self._counts: LRU[bytes, int] = LRU(1 << 14)
        plain = np.zeros(vocab.size, dtype=bool)
        ascii_only = np.zeros(vocab.size, dtype=bool)
        for i in range(min(vocab.size, len(vocab.token_bytes))):
            data = vocab.bytes_of(i)
            plain[i] = bool(data) and not vocab.is_eos(i) and b'"' not in data and \
                b"\\" not in data and min(data) >= 0x20
            ascii_only[i] = plain[i] and max(data) < 0x80
        #: Tokens made only of plain JSON string bytes (no quote, backslash or control
        #: byte): inside a value string they leave the obligations as they are.
        self.plain = plain
        #: Those of ASCII bytes only: inside a key being read they can only rule out
        #: required keys it may still become (a non-ASCII byte makes the key unreadable).
        self.plain_ascii = ascii_only

    def _tokens_holding(self, byte: int) -> np.ndarray:
        found = self._holding.get(byte)
        if found is None:
            found = self._holding[byte] = np.flatnonzero((self.tokens == byte).any(axis=1))
        return found

    def count(self, data: bytes) -> int:
        """The fewest tokens holding ``data`` as a subsequence (:data:`UNREACHABLE` if no
        sequence does); 0 for no bytes."""
        found = self._counts.get(data)
        if found is not None:
            return found
        # -1 past the end matches no token byte, nor does a 0 byte of padding ``data`` lacks.
        want = np.asarray([*data, -1], dtype=np.int16)
        at, steps = 0, 0
        while at < len(data):
            ids = self._tokens_holding(data[at])
            if not len(ids):
                steps = UNREACHABLE
                break
            rows = self.tokens[ids, : int(self.lengths[ids].max())]
            ptr = np.full(len(ids), at, dtype=np.int64)
            for col in range(rows.shape[1]):
                ptr += rows[:, col] == want[ptr]
            at, steps = int(ptr.max()), steps + 1
        self._counts.put(data, steps)
        return steps


_COVERS: weakref.WeakKeyDictionary[Vocabulary, TokenCover] = weakref.WeakKeyDictionary()


def token_cover(vocab: Vocabulary) -> TokenCover:
    """The :class:`TokenCover` of ``vocab``, built once per vocabulary."""
    found = _COVERS.get(vocab)
    if found is None:
        found = _COVERS[vocab] = TokenCover(vocab)
    return found


_EMPTY = np.empty(0, dtype=np.int64)
_MISSING = object()
#: ``x-guidance`` options under which llguidance still writes JSON with ``,`` and ``:``.
_PLAIN_OPTIONS = frozenset({"whitespace_flexible", "whitespace_pattern"})
#: Separators the scanner reads as ``,`` and ``:`` with whitespace around them.
_SEPARATORS = {"item_separator": ",", "key_separator": ":"}


def bounded(schema: Any) -> bool:
    """Whether the scanner reads ``schema``'s texts as llguidance writes them: its
    ``x-guidance`` options, if any, change only the whitespace (separators included: ``", "``
    is ``,`` and a space).

    >>> bounded({"type": "object"}), bounded({"x-guidance": {"key_separator": "="}})
    (True, False)
    >>> bounded({"x-guidance": {"whitespace_flexible": False, "item_separator": ", "}})
    True
    """
    options = schema.get("x-guidance") if isinstance(schema, dict) else None
    if options is None:
        return True
    if not isinstance(options, dict):
        return False
    return all(key in _PLAIN_OPTIONS or (
        key in _SEPARATORS and isinstance(value, str)
        and value.strip(" \t\n\r") == _SEPARATORS[key]) for key, value in options.items())


class JsonBound:
    """The token bound of one JSON schema on one vocabulary: :meth:`need` of a state (a
    token tuple), and :meth:`within`, the allowed tokens after which a completion may
    still fit. Snapshots are kept by state (16 384, least recently used out), so a state's
    is one step past its parent's. Schemas whose ``x-guidance`` sets more than the
    whitespace (separators of their own, say) get no bound (:func:`bounded`).

    >>> v = Vocabulary([b'{"a":"', b'x', b'"', b'}', b'"}', b'<e>'], eos_ids=[5])
    >>> b = JsonBound({"type": "object", "properties": {"a": {"type": "string"}},
    ...                "required": ["a"]}, v)
    >>> b.need((0, 1))                              # '"}' then EOS
    2
    >>> b.within((0, 1), 3, np.asarray([1, 2, 4])).tolist()  # 'x' '"}' EOS fits
    [1, 2, 4]
    >>> b.within((0, 1), 2, np.asarray([1, 2, 4])).tolist()  # only '"}' leaves room for EOS
    [4]
    """

    #: Allowed tokens checked one by one at most (beyond, all are kept: a superset).
    CHECK_LIMIT = 4096

    def __init__(self, schema: Any, vocab: Vocabulary) -> None:
        self.scanner, self.vocab = JsonScanner(schema), vocab
        self.cover = token_cover(vocab)
        self.plain = self.cover.plain
        self._snaps: LRU[tuple[int, ...], object] = LRU(1 << 14)
        # The prefix tree asks a node twice (whether it is dead, then its expansion).
        self._recent: LRU[tuple[tuple[int, ...], int], np.ndarray] = LRU(64)
        self._lock = threading.Lock()
        self.seconds = 0.0

    def snapshot(self, state: tuple[int, ...]) -> Snapshot | None:
        """The scanner after ``state``'s bytes (None: not read)."""
        with self._lock:
            found = self._snaps.get(state, _MISSING)
            if found is not _MISSING:
                return found  # type: ignore[return-value]
            k = len(state) - 1
            while k >= 0:
                found = self._snaps.get(state[:k], _MISSING)
                if found is not _MISSING:
                    break
                k -= 1
            snap: Snapshot | None = self.scanner.start() if k < 0 else found  # type: ignore[assignment]
            for j in range(max(k, 0), len(state)):
                snap = self.scanner.step(snap, self.vocab.bytes_of(state[j]))
                self._snaps.put(state[: j + 1], snap)
            return snap

    def need(self, state: tuple[int, ...]) -> int:
        """A lower bound on the tokens (EOS included) of any completion of ``state``."""
        return self._need(self.snapshot(state))

    def _need(self, snap: Snapshot | None) -> int:
        return self.cover.count(self.scanner.obligations(snap)) + 1

    def within(self, state: tuple[int, ...], tokens: int, allowed: np.ndarray) -> np.ndarray:
        """Of ``allowed`` (the tokens the grammar allows after ``state``), those after which
        a completion may still fit in ``tokens - 1`` more tokens, EOS included: none where
        ``state`` itself needs more than ``tokens``; inside a string where the string's
        bound leaves no room, no plain string token (in a key being read, no ASCII one);
        others checked one by one (all where there are many and the bound leaves room to
        spare): a superset of the exact set."""
        with self._lock:
            found = self._recent.get((state, tokens))
        if found is not None and len(found) <= len(allowed):
            return found
        t0 = time.perf_counter()
        try:
            found = self._within(state, tokens, allowed)
        finally:
            self.seconds += time.perf_counter() - t0
        with self._lock:
            self._recent.put((state, tokens), found)
        return found

    def _within(self, state: tuple[int, ...], tokens: int, allowed: np.ndarray) -> np.ndarray:
        snap = self.snapshot(state)
        need, room = self._need(snap), tokens - 1
        if need > tokens:
            return _EMPTY
        keep = np.ones(len(allowed), dtype=bool)
        # Plain tokens in a value string leave the obligations as they are (kept unless the
        # string's bound leaves no room); in a key being read an ASCII one only lengthens the
        # key, so fewer required keys may be the one it becomes: at least the obligations
        # of ``state`` (ruled out where those leave no room, else checked as the others).
        plain = np.zeros(len(allowed), dtype=bool)
        if snap is not None and snap[0] == IN_STRING and not snap[3]:
            key = snap[4] and snap[2] is not None
            plain = (self.cover.plain_ascii if key else self.plain)[allowed]
            if need > room:
                keep[plain] = False
            elif key:
                plain[:] = False
        eos = np.isin(allowed, self.vocab.eos_ids)
        others = np.flatnonzero(~plain & ~eos)
        if len(others) <= 256 or (need >= room - 2 and len(others) <= self.CHECK_LIMIT):
            step, bytes_of = self.scanner.step, self.vocab.bytes_of
            for j in others.tolist():
                if self._need(step(snap, bytes_of(int(allowed[j])))) > room:
                    keep[j] = False
        return allowed if keep.all() else allowed[keep]
