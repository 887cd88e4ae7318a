"""Regex bounds: the fewest bytes, and so tokens, any full match of a regex needs.

Python's own regex parser reads the pattern where it reads it as the Rust ``regex`` crate
does (llguidance's syntax); anything else gets no bound, which is always sound.
"""

from __future__ import annotations

import math
import re
import re._constants as _sre
import re._parser as _sre_parse
import warnings
from typing import Any

from .tokenizer import LLVocab

#: ``min_new_tokens`` of a language no token sequence reaches (larger than any budget).
_UNREACHABLE = 1 << 62

# Rust regex syntax that Python's parser reads differently (nested classes and set
# operations, POSIX classes, some flags, spaces in counted repetitions); a pattern holding
# any of these gets no bound.
_RUST_ONLY = re.compile(r"\[\[|\[:|&&|--|~~|\(\?[a-zA-Z]*[xuRU]|\{[\d\s,]*\s[\d\s,]*\}")


def _nested_class(pattern: str) -> bool:
    """Whether a ``[`` occurs inside a character class (a nested class in Rust, a literal
    in Python)."""
    depth, i = 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            if depth:
                return True
            depth = 1
            i += 1
            if pattern[i:i + 1] == "^":
                i += 1
            if pattern[i:i + 1] == "]":  # a leading "]" is a literal
                i += 1
            continue
        if c == "]":
            depth = 0
        i += 1
    return False


class _Width:
    """The walk of :func:`regex_min_bytes` over a parsed pattern: the fewest bytes of a
    match, and the bytes a match can hold (``alphabet``; None: any)."""

    def __init__(self, ignore_case: bool) -> None:
        self.ignore_case = ignore_case
        self.alphabet: set[int] | None = set()

    def char(self, c: int) -> None:
        if self.alphabet is None:
            return
        if c >= 0x80 or self.ignore_case:  # other encodings and case folds: any byte
            self.alphabet = None
        else:
            self.alphabet.add(c)

    def char_class(self, items: Any) -> None:
        for op, av in items:
            if op is _sre.LITERAL:
                self.char(av)
            elif op is _sre.RANGE and av[1] < 0x80 and not self.ignore_case:
                if self.alphabet is not None:
                    self.alphabet.update(range(av[0], av[1] + 1))
            else:  # NEGATE, CATEGORY, non-ASCII ranges
                self.alphabet = None

    def width(self, items: Any) -> int | None:
        """The fewest bytes of a match of ``items`` (a parsed sequence), None if unknown."""
        total = 0
        for op, av in items:
            found = self.item(op, av)
            if found is None:
                return None
            total += found
        return total

    def item(self, op: Any, av: Any) -> int | None:
        """The fewest bytes of one parsed item, None if unknown."""
        if op is _sre.LITERAL:
            self.char(av)
            return 1 if self.ignore_case else len(chr(av).encode("utf-8", "surrogatepass"))
        if op is _sre.IN:
            self.char_class(av)
            return 1
        if op in (_sre.ANY, _sre.NOT_LITERAL):
            self.alphabet = None
            return 1
        if op is _sre.BRANCH:
            widths = [self.width(b) for b in av[1]]
            known = [w for w in widths if w is not None]
            return min(known) if len(known) == len(widths) else None
        if op is _sre.SUBPATTERN:
            return self.width(av[-1])
        if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
            inner = self.width(av[2])
            return None if inner is None else av[0] * inner
        return None  # anchors, lookarounds, backreferences, …: not in the Rust syntax


def regex_min_bytes(pattern: str) -> tuple[int, frozenset[int] | None] | None:
    """The fewest bytes a full match of ``pattern`` has, and the bytes a match can hold
    (None: any), where Python's parser reads the pattern as the Rust ``regex`` crate does;
    None where it cannot tell (then no bound is sound).

    >>> width, alphabet = regex_min_bytes("[ab]{3}x?")
    >>> width, bytes(sorted(alphabet))
    (3, b'abx')
    >>> regex_min_bytes(r"é+|\\d"), regex_min_bytes("[[:alpha:]]")
    ((1, None), None)
    """
    if _RUST_ONLY.search(pattern) or _nested_class(pattern):
        return None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parsed = _sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None
    if caught:  # "possible nested set", "possible set difference": Rust reads it otherwise
        return None
    walk = _Width(bool(parsed.state.flags & re.IGNORECASE) or "(?" in pattern)
    found = walk.width(parsed)
    if found is None:
        return None
    return found, None if walk.alphabet is None else frozenset(walk.alphabet)


def regex_min_tokens(pattern: str, ll: LLVocab) -> int:
    """A lower bound on the tokens (EOS included) of any complete sequence matching
    ``pattern`` over the vocabulary ``ll``: its shortest match in bytes over the longest
    token made only of bytes the pattern can match, plus EOS; 1 where unknown, and
    :data:`_UNREACHABLE` where no token is made of those bytes.

    >>> from adaptrack.tokenization.vocab import Vocabulary
    >>> from .tokenizer import ll_vocab
    >>> regex_min_tokens("[ab]{10}", ll_vocab(Vocabulary([b"ab", b"xxxx", b"<e>"],
    ...                                                  eos_ids=[2])))
    6
    """
    found = regex_min_bytes(pattern)
    if found is None or found[0] <= 0:
        return 1
    width, alphabet = found
    longest = ll.longest if alphabet is None else ll.longest_over(alphabet)
    if longest == 0:
        return _UNREACHABLE
    return min(_UNREACHABLE, math.ceil(width / longest) + 1)


#: Schema keywords under which :func:`json_min_bytes` claims nothing (0 bytes): they may
#: admit values its walk does not see.
_JSON_OPAQUE = frozenset({
    "anyOf", "oneOf", "allOf", "not", "$ref", "$dynamicRef", "if", "then", "else", "enum",
    "const", "prefixItems", "dependentSchemas", "dependencies"})


def _count(value: object) -> int:
    """A schema's count keyword (``minLength``, ``minItems``) as a non-negative int; 0 for
    anything else (llguidance refuses what it cannot read before this runs)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 0
    return max(0, min(int(value), _UNREACHABLE))


def json_min_bytes(schema: Any, depth: int = 0, sep: int = 1) -> int:
    """A lower bound on the bytes of any JSON text ``schema`` accepts, whitespace left out:
    a string holds its quotes and ``minLength`` characters (one byte at least each), an
    array its brackets and ``minItems`` items with their commas, an object its braces and
    required members (``"key":`` and a value); 0 wherever the schema is not one of these
    plain forms. Separators count as many bytes as the shorter of the root's ``x-guidance``
    separators has (``","`` and ``":"`` by default). Unlike the token bound of
    :mod:`.jsonbound`, it never writes the bytes out, so ``minLength: 1e9`` costs nothing.

    >>> json_min_bytes({"type": "string", "minLength": 1_000_000_000})
    1000000002
    >>> json_min_bytes({"type": "object", "properties": {"a": {"type": "array",
    ...     "minItems": 2, "items": {"type": "string"}}}, "required": ["a"]})  # {"a":["",""]}
    13
    """
    if not isinstance(schema, dict) or depth > 32 or _JSON_OPAQUE & schema.keys():
        return 0
    options = schema.get("x-guidance")
    if depth == 0 and isinstance(options, dict):
        found = [options.get(k, d) for k, d in (("item_separator", ","), ("key_separator", ":"))]
        sep = min(len(x.encode()) if isinstance(x, str) else 0 for x in found)
    kind = schema.get("type")
    if kind == "string":
        return min(_UNREACHABLE, 2 + _count(schema.get("minLength")))
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return 4
    if kind == "array":
        items = _count(schema.get("minItems"))
        each = json_min_bytes(schema.get("items"), depth + 1, sep) if items else 0
        return min(_UNREACHABLE, 2 + items * max(each, 1) + sep * max(items - 1, 0))
    if kind == "object":
        props, required = schema.get("properties"), schema.get("required")
        if not isinstance(required, list):
            return 2
        props = props if isinstance(props, dict) else {}
        keys = [k for k in dict.fromkeys(required) if isinstance(k, str)]
        members = sum(len(k.encode()) + 2 + sep
                      + max(json_min_bytes(props.get(k), depth + 1, sep), 1) for k in keys)
        return min(_UNREACHABLE, 2 + members + sep * max(len(keys) - 1, 0))
    return 0


def json_min_tokens(schema: Any, ll: LLVocab) -> int:
    """A lower bound on the tokens (EOS included) of any complete sequence of ``schema``:
    :func:`json_min_bytes` over the longest token, plus EOS; 1 where nothing is known.

    >>> from adaptrack.tokenization.vocab import Vocabulary
    >>> from .tokenizer import ll_vocab
    >>> json_min_tokens({"type": "string", "minLength": 9}, ll_vocab(Vocabulary(
    ...     [b'"', b"abc", b"<e>"], eos_ids=[2])))   # 11 bytes over tokens of <= 3: 4 + EOS
    5
    """
    width = json_min_bytes(schema)
    if width <= 0 or ll.longest == 0:
        return 1
    return min(_UNREACHABLE, math.ceil(width / ll.longest) + 1)
