"""The JSON scanner of the token bound (:mod:`.jsonbound`): reads a JSON prefix under its
schema into a hashable snapshot and gives the prefix's *obligations*.

A prefix's obligations are *pieces* every completion must still write, in this order, each
piece's bytes side by side and anything between two pieces: the ``"`` that closes an open
string, then for each open object (innermost first) the members of its required
properties not yet written (``,`` where a member comes before, the key ``"k"`` as one
piece, ``:``, the pieces of a minimal value; after a ``,`` with none pending, the quotes
and ``:`` of the member that must follow), then its ``}`` (an array's ``]``). A minimal
value is ``"`` ``"`` for a string, ``[`` ``]`` for an array, ``{`` … ``}`` with its
required members for an object, a digit for a number (written ``0``: :data:`DIGIT`) and
``null`` for null. llguidance writes an object's properties in the schema's order and its
keys without escapes, so a completion's text holds the pieces in this order, each
contiguous. Anything the scanner does not read with certainty (combinators, ``$ref``,
pattern properties, keys with escapes or non-ASCII bytes, a key being written) gives fewer
pieces, which is always sound: dropping a piece, or splitting one, only asks less.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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
#: The byte a piece writes for "any digit"; the bound reads every digit of a token as it.
DIGIT = b"0"
#: Digits as :data:`DIGIT` (``bytes.translate``).
DIGITS_AS_ONE = bytes.maketrans(b"0123456789", DIGIT * 10)

Pieces = tuple[bytes, ...]
"""Obligations: byte strings a completion writes in order, each contiguous (module doc)."""

# Scanner modes: a value expected (top level or after ":"), after "[" (a value or "]"),
# after "," in an array, after "{" (a key or "}"), after "," in an object, in a string,
# after a key (":" expected), after a value, in a scalar, after the top-level value.
# IN_STRING is public: the bound reads it (a plain token inside a string).
_VALUE, _VALUE0, _VALUEA, _KEY0, _KEY, IN_STRING, _COLON, _AFTER, _SCALAR_M, _END = range(10)

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


def _layout(schema: Any) -> tuple[bytes, bytes] | None:
    """The item and key separators where ``schema``'s ``x-guidance`` fixes the layout (no
    whitespace but the separators'); None where whitespace may come between any tokens."""
    options = schema.get("x-guidance") if isinstance(schema, dict) else None
    if not isinstance(options, dict) or options.get("whitespace_flexible", True) is not False \
            or "whitespace_pattern" in options:
        return None
    item, key = options.get("item_separator", ","), options.get("key_separator", ":")
    if not isinstance(item, str) or not isinstance(key, str):
        return None
    # Blanks before a separator are dropped: the scanner skips blanks, so a prefix may
    # have written them already (a piece's tail is side by side as the piece is).
    return item.lstrip(" \t\n\r").encode(), key.lstrip(" \t\n\r").encode()


def _then(out: list[bytes], value: Pieces, layout: tuple[bytes, bytes] | None) -> None:
    """Append a value's pieces after a key separator: in a fixed layout the first one
    follows it side by side, unless it is a digit (a number may start with ``-``)."""
    if layout is not None and value and value[0] != DIGIT:
        out[-1] += value[0]
        value = value[1:]
    out += value


def _minimal(schema: Any, layout: tuple[bytes, bytes] | None, depth: int = 0) -> Pieces:
    """Pieces every value of ``schema`` writes, in order (module doc); none where the
    scanner does not know the value's type."""
    found = _known(schema)
    if found is None or depth > 4:
        return ()
    kind = found.get("type")
    if kind == "string":
        return (b'"', b'"')
    if kind == "array":
        return (b"[", b"]")
    if kind == "object":
        return (b"{", *_members(found, _required(found), False, layout, depth + 1), b"}")
    if kind in ("integer", "number"):
        return (DIGIT,)
    if kind == "null":
        return (b"null",)
    return ()


def _members(schema: dict[str, Any], pending: Iterable[str], comma: bool,
             layout: tuple[bytes, bytes] | None, depth: int) -> Pieces:
    """The obligations of an object's ``pending`` required members: ``,`` before each one a
    member precedes (``comma``: the first too), ``"k"``, ``:`` and its minimal value; in a
    fixed layout the separators and the key are one piece."""
    props = schema.get("properties") or {}
    out: list[bytes] = []
    for i, key in enumerate(pending):
        quoted = b'"' + key.encode().translate(DIGITS_AS_ONE) + b'"'
        if layout is None:
            out += (b",", quoted, b":") if i or comma else (quoted, b":")
        else:
            out.append((layout[0] if i or comma else b"") + quoted + layout[1])
        _then(out, _minimal(props.get(key), layout, depth), layout)
    return tuple(out)


def _string_byte(b: int, frames: tuple[Frame, ...], key: str | None, esc: bool,
                 is_key: bool) -> tuple[int, tuple[Frame, ...], str | None, bool]:
    """The mode, open containers, key being written and pending escape after byte ``b``
    inside a string (a key's when ``is_key``)."""
    if esc:
        return IN_STRING, frames, None, False
    if b == 0x5C:
        return IN_STRING, frames, None, True
    if b == 0x22:
        if not is_key:
            return _AFTER, frames, key, esc
        kind, index, written, _, _ = frames[-1]
        if key is not None:
            written = written | {key}
        return _COLON, (*frames[:-1], (kind, index, written, key, True)), key, esc
    if is_key and key is not None:
        key = key + chr(b) if 0x20 <= b < 0x80 else None
    return IN_STRING, frames, key, esc


def _closed(frames: tuple[Frame, ...]) -> tuple[int, tuple[Frame, ...]]:
    """The mode and open containers after the innermost container closes."""
    return _AFTER if len(frames) > 1 else _END, frames[:-1]


class JsonScanner:
    """Reads JSON prefixes under ``schema`` into :data:`Snapshot` values and gives their
    obligations (see the module doc).

    >>> s = JsonScanner({"type": "object", "properties": {"a": {"type": "string"},
    ...                  "b": {"type": "string"}}, "required": ["a", "b"]})
    >>> snap = s.step(s.start(), b'{"a": "xy')
    >>> s.obligations(snap)
    (b'"', b',', b'"b"', b':', b'"', b'"', b'}')
    """

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        #: The schemas of open containers, by index (snapshots hold the index: hashable).
        self.schemas: list[Any] = []
        self._index: dict[int, int] = {}
        self._obligations: dict[Snapshot, Pieces] = {}
        self._required: dict[int, list[str]] = {}
        #: The separators of a fixed layout (None: flexible whitespace).
        self.layout = _layout(schema)

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
            if mode == IN_STRING:
                mode, frames, key, esc = _string_byte(b, frames, key, esc, is_key)
                continue
            if mode == _SCALAR_M:
                if b in _SCALAR:
                    continue
                mode = _AFTER
            if b in _BLANK:
                continue
            was = mode
            moved = self._structural_byte(b, mode, frames)
            if moved is None:
                return None
            mode, frames = moved
            if mode == IN_STRING:
                is_key, esc = was in (_KEY0, _KEY), False
                if is_key:
                    key = ""
        return (mode, frames, key, esc, is_key)

    def _structural_byte(self, b: int, mode: int, frames: tuple[Frame, ...]
                         ) -> tuple[int, tuple[Frame, ...]] | None:
        """The mode and open containers after byte ``b`` (not whitespace) outside a string
        and a scalar; None where it is not JSON as the scanner reads it."""
        if mode in (_VALUE, _VALUE0, _VALUEA):
            if b == 0x7B or b == 0x5B:
                index = self._schema_index(self._value_schema(frames))
                return (_KEY0 if b == 0x7B else _VALUE0,
                        (*frames, (b, index, frozenset(), None, False)))
            if b == 0x22:
                return IN_STRING, frames
            if b in _SCALAR:
                return _SCALAR_M, frames
            return _closed(frames) if b == 0x5D and mode == _VALUE0 else None
        if mode in (_KEY0, _KEY):
            if b == 0x22:
                return IN_STRING, frames
            return _closed(frames) if b == 0x7D and mode == _KEY0 else None
        if mode == _COLON:
            return (_VALUE, frames) if b == 0x3A else None
        if mode == _AFTER and frames:
            kind, index, written, cur, _ = frames[-1]
            if b == 0x2C:
                if kind == 0x7B:
                    return _KEY, (*frames[:-1], (kind, index, written, cur, False))
                return _VALUEA, frames
            if b == kind + 2:  # "{" + 2 is "}", "[" + 2 is "]"
                return _closed(frames)
        return None  # after the top-level value only whitespace may follow

    def obligations(self, snap: Snapshot | None) -> Pieces:
        """The pieces every completion of the prefix writes (module doc)."""
        if snap is None:
            return ()
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

    def _find_obligations(self, snap: Snapshot) -> Pieces:
        mode, frames, key, _, is_key = snap
        out: list[bytes] = []
        in_key = mode == IN_STRING and is_key
        layout, colon = self.layout, b":" if self.layout is None else self.layout[1]
        if mode == IN_STRING:
            out += ((b'"', b":") if layout is None else (b'"' + colon,)) if in_key else (b'"',)
        elif mode == _COLON:
            out.append(colon)
            _then(out, _minimal(self._value_schema(frames), layout), layout)
        elif mode in (_VALUE, _VALUEA):
            out += _minimal(self._value_schema(frames), layout)
        for depth, (kind, index, written, _, sep) in enumerate(reversed(frames)):
            if kind == 0x5B:
                out.append(b"]")
                continue
            found = _known(self.schemas[index]) if index >= 0 else None
            if depth == 0 and mode == _KEY and (found is None or not [
                    k for k in self._required_of(index, found) if k not in written]):
                # After "," a member follows: a key (quoted), ":".
                out += (b'"', b'"', b":") if layout is None else (b'"', b'"' + colon)
            if found is not None:
                pending = [k for k in self._required_of(index, found) if k not in written]
                if depth == 0 and in_key:
                    # The key being written may be any of those it is a prefix of.
                    pending = [k for k in pending if key is not None and not k.startswith(key)]
                out += _members(found, pending, sep or (depth == 0 and in_key), layout, 0)
            out.append(b"}")
        return tuple(out)
