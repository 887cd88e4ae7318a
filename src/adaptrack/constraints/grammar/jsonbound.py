"""JSON bounds: the fewest tokens any completion of a JSON prefix still needs under its
schema (docs/design.md §2, "the tokens a text still needs").

A prefix's *obligations* are bytes every completion must still hold, in this order: the
``"`` that closes an open string, then for each open object (innermost first) the members
of its required properties not yet written (``,`` where a member comes before, the key
``"k"``, ``:``, the fixed bytes of a minimal value; after a ``,`` with none pending, the
quotes and ``:`` of the member that must follow), then its ``}`` (an array's ``]``).
llguidance writes an object's properties in the schema's order and its keys without
escapes, so these bytes come in this order. A completion's text therefore holds the
obligations' concatenation as a *subsequence*; the fewest vocabulary tokens whose
concatenation holds a byte string as a subsequence is found greedily (each token takes the
longest prefix of what is left that it holds as a subsequence: the further along, the
fewer tokens remain, so the greedy choice is optimal), and that count plus the end token
is the bound. Anything the scanner does not read with certainty (combinators, ``$ref``,
pattern properties, keys with escapes or non-ASCII bytes, a key being written) gives
fewer obligations, which is always sound: a subsequence of a subsequence is one.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from ...cache import LRU
from ...tokenization.vocab import Vocabulary

#: Schema keywords under which the scanner gives an object no required members: they may
#: change which properties exist or are required, or how llguidance compiles the object.
_UNKNOWN = frozenset({
    "anyOf", "oneOf", "allOf", "not", "$ref", "$dynamicRef", "if", "then", "else",
    "dependentRequired", "dependentSchemas", "dependencies", "patternProperties",
    "unevaluatedProperties", "propertyNames", "enum", "const", "prefixItems",
    "unevaluatedItems", "contains"})
#: Bytes a JSON scalar (number, ``true``, ``false``, ``null``) is written with.
_SCALAR = frozenset(b"0123456789+-.eEtrufalsnTRUFALSN")
_BLANK = frozenset(b" \t\n\r")
#: A bound larger than any token budget: obligations no token sequence holds.
UNREACHABLE = 1 << 62

# Scanner modes: a value expected (top level or after ":"), after "[" (a value or "]"),
# after "," in an array, after "{" (a key or "}"), after "," in an object, in a string,
# after a key (":" expected), after a value, in a scalar, after the top-level value.
_VALUE, _VALUE0, _VALUEA, _KEY0, _KEY, _STR, _COLON, _AFTER, _SCALAR_M, _END = range(10)

Frame = tuple[int, int, frozenset[str], str | None, bool]
"""An open container: its opening byte, its schema (an index into
:attr:`JsonScanner.schemas`; -1: unknown), the keys written, the
key of the member being written (None: unknown), and whether a member precedes the next
key without a ``,`` yet."""
Snapshot = tuple[int, tuple[Frame, ...], str | None, bool, bool]
"""The scanner after a prefix: mode, open containers (outermost first), the key being
written (in a key string; None: unreadable), an escape pending, and whether the string is
a key."""


def _known(schema: Any) -> dict[str, Any] | None:
    """``schema`` where the scanner reads it with certainty, else None."""
    if isinstance(schema, dict) and not _UNKNOWN & schema.keys():
        return schema
    return None


def _clean_key(key: object) -> bool:
    """Whether llguidance writes ``key`` as exactly its bytes between quotes."""
    return isinstance(key, str) and key.isascii() and all(
        0x20 <= ord(c) and c not in '"\\' for c in key)


def _required(schema: dict[str, Any]) -> list[str]:
    """The required properties of an object ``schema`` that the scanner can hold it to, in
    the order llguidance writes them (the order of ``properties``)."""
    props, required = schema.get("properties"), schema.get("required")
    if not isinstance(props, dict) or not isinstance(required, list):
        return []
    wanted = {k for k in required if isinstance(k, str)}
    return [k for k in props if k in wanted and _clean_key(k)]


def _minimal(schema: Any, depth: int = 0) -> bytes:
    """Bytes every value of ``schema`` holds, in order: ``""`` for a string, ``{…}`` with
    its required members for an object, ``[]`` for an array; else none."""
    found = _known(schema)
    if found is None or depth > 4:
        return b""
    kind = found.get("type")
    if kind == "string":
        return b'""'
    if kind == "array":
        return b"[]"
    if kind == "object":
        return b"{" + _members(found, _required(found), False, depth + 1) + b"}"
    return b""


def _members(schema: dict[str, Any], pending: Iterable[str], comma: bool, depth: int) -> bytes:
    """The obligations of an object's ``pending`` required members: ``,`` before each one a
    member precedes (``comma``: the first too), ``"k":`` and its minimal value."""
    props = schema.get("properties") or {}
    out = bytearray()
    for i, key in enumerate(pending):
        if i or comma:
            out += b","
        out += b'"' + key.encode() + b'":' + _minimal(props.get(key), depth)
    return bytes(out)


class JsonScanner:
    """Reads JSON prefixes under ``schema`` into :data:`Snapshot` values and gives their
    obligations (see the module doc).

    >>> s = JsonScanner({"type": "object", "properties": {"a": {"type": "string"},
    ...                  "b": {"type": "string"}}, "required": ["a", "b"]})
    >>> snap = s.step(s.start(), b'{"a": "xy')
    >>> s.obligations(snap)
    b'","b":""}'
    """

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        #: The schemas of open containers, by index (snapshots hold the index: hashable).
        self.schemas: list[Any] = []
        self._index: dict[int, int] = {}
        self._obligations: dict[Snapshot, bytes] = {}
        self._required: dict[int, list[str]] = {}

    def start(self) -> Snapshot:
        return (_VALUE, (), None, False, False)

    def _schema_index(self, schema: Any) -> int:
        """``schema``'s index in :attr:`schemas` (-1 for None)."""
        if schema is None:
            return -1
        found = self._index.get(id(schema))
        if found is None:
            found = self._index[id(schema)] = len(self.schemas)
            self.schemas.append(schema)  # kept: its id stays its own
        return found

    def _value_schema(self, frames: tuple[Frame, ...]) -> Any:
        """The schema of a value that starts now, None where unknown."""
        if not frames:
            return self.schema
        kind, index, _, cur, _ = frames[-1]
        schema = _known(self.schemas[index]) if index >= 0 else None
        if schema is None:
            return None
        if kind == 0x7B:
            props = schema.get("properties")
            return props.get(cur) if isinstance(props, dict) and cur is not None else None
        items = schema.get("items")
        return items if isinstance(items, dict) else None

    def step(self, snap: Snapshot | None, data: bytes) -> Snapshot | None:
        """The snapshot after ``data`` more bytes; None where the bytes are not JSON as the
        scanner reads it (then nothing is known)."""
        if snap is None:
            return None
        mode, frames, key, esc, is_key = snap
        for b in data:
            if mode == _STR:
                if esc:
                    esc = False
                    key = None
                elif b == 0x5C:
                    esc, key = True, None
                elif b == 0x22:
                    if is_key:
                        kind, index, written, _, _ = frames[-1]
                        if key is not None:
                            written = written | {key}
                        frames = (*frames[:-1], (kind, index, written, key, True))
                        mode = _COLON
                    else:
                        mode = _AFTER
                elif is_key and key is not None:
                    key = key + chr(b) if 0x20 <= b < 0x80 else None
                continue
            if mode == _SCALAR_M:
                if b in _SCALAR:
                    continue
                mode = _AFTER
            if b in _BLANK:
                continue
            if mode in (_VALUE, _VALUE0, _VALUEA):
                if b == 0x7B or b == 0x5B:
                    index = self._schema_index(self._value_schema(frames))
                    frames = (*frames, (b, index, frozenset(), None, False))
                    mode = _KEY0 if b == 0x7B else _VALUE0
                elif b == 0x22:
                    mode, is_key, esc = _STR, False, False
                elif b in _SCALAR:
                    mode = _SCALAR_M
                elif b == 0x5D and mode == _VALUE0:
                    frames, mode = frames[:-1], _AFTER if len(frames) > 1 else _END
                else:
                    return None
            elif mode in (_KEY0, _KEY):
                if b == 0x22:
                    mode, is_key, esc, key = _STR, True, False, ""
                elif b == 0x7D and mode == _KEY0:
                    frames, mode = frames[:-1], _AFTER if len(frames) > 1 else _END
                else:
                    return None
            elif mode == _COLON:
                if b != 0x3A:
                    return None
                mode = _VALUE
            elif mode == _AFTER:
                if not frames:
                    return None
                kind, index, written, cur, _ = frames[-1]
                if b == 0x2C:
                    if kind == 0x7B:
                        frames = (*frames[:-1], (kind, index, written, cur, False))
                        mode = _KEY
                    else:
                        mode = _VALUEA
                elif b == kind + 2:  # "{" + 2 is "}", "[" + 2 is "]"
                    frames, mode = frames[:-1], _AFTER if len(frames) > 1 else _END
                else:
                    return None
            else:  # _END: only whitespace may follow the top-level value
                return None
        return (mode, frames, key, esc, is_key)

    def obligations(self, snap: Snapshot | None) -> bytes:
        """Bytes every completion of the prefix holds as a subsequence (module doc)."""
        if snap is None:
            return b""
        found = self._obligations.get(snap)
        if found is None:
            found = self._obligations[snap] = self._find_obligations(snap)
            if len(self._obligations) > 1 << 16:
                self._obligations.clear()
        return found

    def _required_of(self, index: int, schema: dict[str, Any]) -> list[str]:
        """:func:`_required` of the container schema at ``index``, kept."""
        found = self._required.get(index)
        if found is None:
            found = self._required[index] = _required(schema)
        return found

    def _find_obligations(self, snap: Snapshot) -> bytes:
        mode, frames, key, _, is_key = snap
        out = bytearray()
        in_key = mode == _STR and is_key
        if mode == _STR:
            out += b'"'
            if in_key:
                out += b":"
        elif mode == _COLON:
            out += b":" + _minimal(self._value_schema(frames))
        elif mode in (_VALUE, _VALUEA):
            out += _minimal(self._value_schema(frames))
        for depth, (kind, index, written, _, sep) in enumerate(reversed(frames)):
            if kind == 0x5B:
                out += b"]"
                continue
            found = _known(self.schemas[index]) if index >= 0 else None
            if depth == 0 and mode == _KEY and (found is None or not [
                    k for k in self._required_of(index, found) if k not in written]):
                out += b'"":'  # after "," a member follows: a key (quoted), ":"
            if found is not None:
                pending = [k for k in self._required_of(index, found) if k not in written]
                if depth == 0 and in_key:
                    # The key being written may be any of those it is a prefix of.
                    pending = [k for k in pending if key is not None and not k.startswith(key)]
                out += _members(found, pending, sep or (depth == 0 and in_key), 0)
            out += b"}"
        return bytes(out)


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
        if snap is not None and snap[0] == _STR and not snap[3]:
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
