"""The JSON scanner of the token bound (:mod:`.jsonbound`): reads a JSON prefix under its
schema into a hashable snapshot and gives the prefix's *obligations*.

A prefix's obligations are *pieces* every completion must still write, in this order, each
piece's bytes side by side and anything between two pieces: the ``"`` that closes an open
string, then for each open object (innermost first) the members of its required
properties not yet written (``,`` where a member comes before, the key ``"k"`` as one
piece, ``:``, the pieces of a minimal value; after a ``,`` with none pending, the quotes
and ``:`` of the member that must follow), then its ``}`` (an array's ``]``). A minimal
value is ``"`` ``"`` for a string, ``[`` ``]`` for an array, ``{`` … ``}`` with its
required members for an object, a digit for a number (written ``0``: :data:`DIGIT`),
``null``, ``true`` or ``false``, and a ``const`` or ``enum`` value's own text. Where a
value may take one of several forms (a list of types, ``anyOf``, ``enum``) the
obligations are *options*, one per form (at most :data:`MAX_OPTIONS`), and a completion
writes one of them. In a fixed layout (``x-guidance`` with ``whitespace_flexible: false``)
a member's separators and key are one piece, ``, "k": ``, and the value's first piece
follows it side by side. llguidance writes an object's properties in the schema's order
and its keys without escapes, so a completion's text holds an option's pieces in this
order, each contiguous. Anything the scanner does not read with certainty (``allOf``,
``not``, ``if``, a ``$ref`` beside other keywords or outside the schema, pattern
properties, keys with escapes or non-ASCII bytes, a key being written) gives fewer pieces,
which is always sound: dropping a piece, or splitting one, only asks less.
"""

from __future__ import annotations

import json
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
"""Byte strings a completion writes in order, each contiguous (module doc)."""
Options = tuple[Pieces, ...]
"""Obligations: a completion writes the pieces of one of these options."""
#: Options kept at most: past it, options are merged into the pieces they all share.
MAX_OPTIONS = 8
_NOTHING: Options = ((),)
#: A value the scanner knows nothing of: it is one of these.
_ANY: Options = ((b'"', b'"'), (DIGIT,), (b"{", b"}"), (b"[", b"]"), (b"null",), (b"true",),
                (b"false",))
#: Keywords that do not constrain a value: a ``$ref`` beside only these is its target.
_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly", "$id", "$schema",
                          "x-guidance"})

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


def _shared(options: Options) -> Pieces:
    """The pieces every option starts with, then those every option ends with: one option
    that each of ``options`` holds."""
    shortest = min(len(o) for o in options)
    head = 0
    while head < shortest and all(o[head] == options[0][head] for o in options):
        head += 1
    tail = 0
    while tail < shortest - head and all(o[-1 - tail] == options[0][-1 - tail]
                                         for o in options):
        tail += 1
    return options[0][:head] + options[0][len(options[0]) - tail:]


def _join(left: Options, right: Options) -> Options:
    """Each option of ``left`` followed by each of ``right``; where that makes more than
    :data:`MAX_OPTIONS`, ``left``'s options (then ``right``'s) are first merged into the
    pieces they share (owing less is sound)."""
    if len(left) * len(right) > MAX_OPTIONS:
        left = (_shared(left),)
        if len(right) > MAX_OPTIONS:
            right = (_shared(right),)
    return tuple(a + b for a in left for b in right)


def _after(sep: bytes, value: Options, layout: tuple[bytes, bytes] | None) -> Options:
    """A key separator's piece, then a value's options: in a fixed layout the value's first
    piece follows it side by side, unless it is a digit (a number may start with ``-``)."""
    if layout is None:
        return _join(((sep,),), value)
    return tuple((sep + v[0], *v[1:]) if v and v[0] != DIGIT else (sep, *v) for v in value)


def _capped(options: Iterable[Pieces]) -> Options:
    """``options`` without repeats; any JSON value's where none or more than
    :data:`MAX_OPTIONS` are left."""
    found = tuple(dict.fromkeys(options))
    return found if 0 < len(found) <= MAX_OPTIONS else _ANY


def _literal(value: Any) -> Pieces:
    """The pieces of a ``const`` or ``enum`` value: its JSON text where llguidance writes
    only that (a string of plain ASCII, ``true``, ``false``, ``null``), a digit for a
    number, and the brackets or quotes of the rest."""
    if value is None or isinstance(value, bool):
        return (json.dumps(value).encode(),)
    if isinstance(value, int | float):
        return (DIGIT,)
    if isinstance(value, str) and _clean_key(value) and "/" not in value:
        return (b'"' + value.encode().translate(DIGITS_AS_ONE) + b'"',)
    return (b"{", b"}") if isinstance(value, dict) else (b"[", b"]") \
        if isinstance(value, list) else (b'"', b'"')


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
    ((b'"', b',', b'"b"', b':', b'"', b'"', b'}'),)
    >>> s = JsonScanner({"type": "object", "properties": {"a": {"enum": ["x", None]}},
    ...                  "required": ["a"], "x-guidance": {"whitespace_flexible": False}})
    >>> s.obligations(s.step(s.start(), b'{'))
    ((b'"a":"x"', b'}'), (b'"a":null', b'}'))
    """

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        #: The schemas of open containers, by index (snapshots hold the index: hashable).
        self.schemas: list[Any] = []
        self._index: dict[int, int] = {}
        self._obligations: dict[Snapshot, Options] = {}
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

    def _resolve(self, schema: Any) -> Any:
        """``schema`` with a local ``$ref`` (``#/…``) followed where nothing but annotations
        stands beside it; else as it is."""
        for _ in range(8):
            if not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str) or \
                    not schema["$ref"].startswith("#") or schema.keys() - _ANNOTATIONS - {"$ref"}:
                return schema
            target: Any = self.schema
            for part in schema["$ref"][1:].split("/")[1:]:
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    return schema
                target = target[part]
            schema = target
        return schema

    def _value_schema(self, frames: tuple[Frame, ...]) -> Any:
        """The schema of a value that starts now, None where unknown."""
        if not frames:
            return self._resolve(self.schema)
        kind, index, _, cur, _ = frames[-1]
        schema = _known(self.schemas[index]) if index >= 0 else None
        if schema is None:
            return None
        if kind == 0x7B:
            props = schema.get("properties")
            found = props.get(cur) if isinstance(props, dict) and cur is not None else None
        else:
            found = schema.get("items")
        return self._resolve(found) if isinstance(found, dict) else None

    def _minimal(self, schema: Any, depth: int = 0) -> Options:
        """The options of pieces one of which every value of ``schema`` writes (module
        doc); those of any JSON value where the scanner does not know more."""
        schema = self._resolve(schema)
        if not isinstance(schema, dict) or depth > 4:
            return _ANY
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list) or not values:
                return _ANY
            return tuple(dict.fromkeys(_literal(v) for v in values)) \
                if len(values) <= MAX_OPTIONS else _ANY
        branches = schema.get("anyOf", schema.get("oneOf"))
        if isinstance(branches, list) and branches and \
                not schema.keys() - _ANNOTATIONS - {"anyOf", "oneOf"}:
            return _capped(o for b in branches for o in self._minimal(b, depth + 1))
        if _known(schema) is None:
            return _ANY
        kinds = schema.get("type")
        out: list[Pieces] = []
        for kind in kinds if isinstance(kinds, list) else [kinds]:
            if kind == "string":
                out.append((b'"', b'"'))
            elif kind == "array":
                out.append((b"[", b"]"))
            elif kind == "object":
                members = self._members(schema, _required(schema), False, depth + 1)
                out += _join(((b"{",),), _join(members, ((b"}",),)))
            elif kind in ("integer", "number"):
                out.append((DIGIT,))
            elif kind == "null":
                out.append((b"null",))
            elif kind == "boolean":
                out += ((b"true",), (b"false",))
            else:
                return _ANY
        return _capped(out)

    def _members(self, schema: dict[str, Any], pending: Iterable[str], comma: bool,
                 depth: int) -> Options:
        """The obligations of an object's ``pending`` required members: ``,`` before each
        one a member precedes (``comma``: the first too), ``"k"``, ``:`` and its minimal
        value; in a fixed layout the separators and the key are one piece."""
        props = schema.get("properties") or {}
        layout, out = self.layout, _NOTHING
        for i, key in enumerate(pending):
            quoted = b'"' + key.encode().translate(DIGITS_AS_ONE) + b'"'
            value = self._minimal(props.get(key), depth)
            if len(out) * len(value) > MAX_OPTIONS:
                value = (_shared(value),)  # the key still owes its pieces
            if layout is None:
                head: Options = ((b",", quoted) if i or comma else (quoted,),)
                member = _join(head, _after(b":", value, None))
            else:
                member = _after((layout[0] if i or comma else b"") + quoted + layout[1],
                                value, layout)
            out = _join(out, member)
        return out

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

    def obligations(self, snap: Snapshot | None) -> Options:
        """The options of pieces one of which every completion of the prefix writes (module
        doc)."""
        if snap is None:
            return _NOTHING
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

    def _find_obligations(self, snap: Snapshot) -> Options:
        mode, frames, key, _, is_key = snap
        in_key = mode == IN_STRING and is_key
        layout, colon = self.layout, b":" if self.layout is None else self.layout[1]
        # A key's closing '"', ":" and a value (in a fixed layout '"' and ":" side by side).
        key_end = _join(((b'"',),), _after(b":", _ANY, None)) if layout is None \
            else _after(b'"' + colon, _ANY, layout)
        out: Options = _NOTHING
        if mode == IN_STRING and not in_key:
            out = ((b'"',),)
        elif in_key:
            out = key_end
        elif mode == _COLON:
            out = _after(colon, self._minimal(self._value_schema(frames)), layout)
        elif mode in (_VALUE, _VALUEA):
            out = self._minimal(self._value_schema(frames))
        for depth, (kind, index, written, _, sep) in enumerate(reversed(frames)):
            if kind == 0x5B:
                out = _join(out, ((b"]",),))
                continue
            found = _known(self.schemas[index]) if index >= 0 else None
            if depth == 0 and mode == _KEY and (found is None or not [
                    k for k in self._required_of(index, found) if k not in written]):
                # After "," a member follows: a key (quoted), ":" and a value.
                out = _join(out, _join(((b'"',),), key_end))
            if found is not None:
                pending = [k for k in self._required_of(index, found) if k not in written]
                if depth == 0 and in_key:
                    # The key being written may be any of those it is a prefix of.
                    pending = [k for k in pending if key is not None and not k.startswith(key)]
                out = _join(out, self._members(found, pending, sep or (depth == 0 and in_key),
                                               0))
            out = _join(out, ((b"}",),))
        return out
