"""JSON bounds: the fewest tokens any completion of a JSON prefix still needs under its
schema (docs/design.md §2, "the tokens a text still needs").

The scanner (:mod:`.jsonscan`) gives a prefix's *obligations*: options of pieces, one of
which every completion writes in order, each piece's bytes side by side. :class:`TokenCover`
counts the fewest vocabulary tokens whose concatenation writes an option so; the fewest
over the options, plus the end token, is the bound.
"""

from __future__ import annotations

import bisect
import threading
import time
import weakref
from typing import Any

import numpy as np

from ...cache import LRU
from ...tokenization.vocab import Vocabulary
from .jsonscan import DIGITS_AS_ONE, IN_STRING, JsonScanner, Pieces, Snapshot

#: A bound larger than any token budget: what :meth:`TokenCover.count` gives for pieces no
#: tokens write.
UNREACHABLE = 1 << 62


def _reach(pieces: Pieces, token: bytes) -> int:
    """How many bytes of ``pieces`` one ``token`` writes from a point between two pieces:
    the whole pieces it holds, in order and each side by side (each at its first place,
    which leaves the most after it), then the longest start of the next one that it ends
    with."""
    at = done = 0
    for piece in pieces:
        found = token.find(piece, at)
        if found < 0:
            for m in range(min(len(piece) - 1, len(token) - at), 0, -1):
                if token.endswith(piece[:m]):
                    return done + m
            return done
        at, done = found + len(piece), done + len(piece)
    return done


class TokenCover:
    """The fewest tokens of a vocabulary whose concatenation writes pieces in order, each
    side by side (:meth:`count`), over every token with bytes (EOS aside): a superset of
    those a grammar allows, so the count is a lower bound for them.

    Positions are the bytes of the pieces written so far. From a position inside a piece,
    a token must go on with that piece; between pieces it may write anything first. Taking
    the furthest position each token reaches is not optimal as it stands (being further
    into a piece can rule out a token that an earlier position could use), so the count
    lets every position also move as any earlier one can. Then being further along never
    costs more, the greedy walk is optimal, and it still counts no more than any real
    sequence of tokens takes. Every digit counts as ``0`` (:data:`~.jsonscan.DIGIT`), on
    both sides.

    >>> v = Vocabulary([b'"', b'",', b'"a', b'":', b'}', b'<e>'], eos_ids=[5])
    >>> TokenCover(v).count((b",", b'"a"', b":", b"}"))   # '",' '"a' '":' '}'
    4
    >>> TokenCover(v).count((b'"a"', b'"a"'))             # '"a' '"' '"a' '"'
    4
    """

    #: Bytes of pieces read at most: the count costs a step per byte, and the pieces left
    #: out only ask less (1 024 bytes are about 250 tokens or more of JSON).
    LIMIT = 1024

    def __init__(self, vocab: Vocabulary) -> None:
        tokens = {vocab.bytes_of(i).translate(DIGITS_AS_ONE) for i in range(vocab.size)
                  if not vocab.is_eos(i)} - {b""}
        self._tokens = frozenset(tokens)
        #: The longest token's bytes.
        self.width = max((len(t) for t in tokens), default=0)
        self._sorted = sorted(tokens)
        self._holding: dict[bytes, list[bytes]] = {}
        self._best: LRU[tuple[Pieces, int], int] = LRU(1 << 16)
        self._counts: LRU[Pieces, int] = LRU(1 << 14)
        self._lock = threading.Lock()
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

    def _starting(self, piece: bytes) -> list[bytes]:
        """The tokens that can begin to write ``piece`` from a point between pieces: those
        holding it whole hold its first two bytes; the others end with its first byte
        (or with more of it, and then hold its first two bytes too)."""
        key = piece[:2]
        found = self._holding.get(key)
        if found is None:
            found = self._holding[key] = [
                t for t in self._sorted if key in t or t[-1] == piece[0]]
        return found

    def _furthest(self, pieces: Pieces, j: int) -> int:
        """The furthest position (bytes of ``pieces``) one token reaches from byte ``j`` of
        the first piece (``j`` = 0: before it, where anything may come first)."""
        key = (pieces, j)
        found = self._best.get(key)
        if found is not None:
            return found
        first = pieces[0]
        if j == 0:
            found = max((_reach(pieces, t) for t in self._starting(first)), default=0)
        else:
            rest = first[j:]
            found = j + next((m for m in range(len(rest) - 1, 0, -1)
                              if rest[:m] in self._tokens), 0)
            at = bisect.bisect_left(self._sorted, rest)
            while at < len(self._sorted) and self._sorted[at].startswith(rest):
                token = self._sorted[at]
                found = max(found, len(first) + _reach(pieces[1:], token[len(rest):]))
                at += 1
        self._best.put(key, found)
        return found

    def count(self, pieces: Pieces) -> int:
        """The fewest tokens writing ``pieces`` in order, each side by side (as this class
        counts them; :data:`UNREACHABLE` if no tokens do); 0 for no pieces."""
        with self._lock:
            found = self._counts.get(pieces)
            if found is not None:
                return found
            found = self._count(pieces[:self._within_limit(pieces)])
            self._counts.put(pieces, found)
            return found

    def _within_limit(self, pieces: Pieces) -> int:
        """How many of ``pieces`` the count reads: those that start within
        :attr:`LIMIT` bytes (fewer pieces ask less, so the count stays a lower bound)."""
        size = 0
        for k, piece in enumerate(pieces):
            if size >= self.LIMIT:
                return k
            size += len(piece)
        return len(pieces)

    def _count(self, pieces: Pieces) -> int:
        # furthest[k]: the furthest position from any position up to k. A token reaches
        # no piece that starts more than its length on, so one step is looked up by
        # the pieces within that much (``end``), whatever follows them.
        furthest: list[int] = []
        start = end = ahead = 0
        for b, piece in enumerate(pieces):
            for j in range(len(piece)):
                while end < len(pieces) and (end <= b or ahead - j < self.width):
                    ahead, end = ahead + len(pieces[end]), end + 1
                reach = start + self._furthest(pieces[b:end], j)
                furthest.append(max(reach, furthest[-1]) if furthest else reach)
            start, ahead = start + len(piece), ahead - len(piece)
        at, steps = 0, 0
        while at < start:
            if furthest[at] <= at:
                steps = UNREACHABLE
                break
            at, steps = furthest[at], steps + 1
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
        return min(self.cover.count(option) for option in self.scanner.obligations(snap)) + 1

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
