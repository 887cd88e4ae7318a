"""Grammar sources: a regex, a JSON schema, a Lark or a GBNF grammar, each checked by
llguidance and turned into the Lark text it runs (a :class:`Grammar`).

Building a grammar compiles it once without a vocabulary (llguidance's validation), so an
invalid one is a :class:`~adaptrack.errors.GrammarError` before any model work. The verdicts
are kept (:data:`VALIDATED`: 256 texts, least recently used out), so a server that gets the
same schema in every request checks it once; its warnings are given again each time.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

from llguidance import LLMatcher, regex_to_lark
from llguidance.gbnf_to_lark import any_to_lark

from ...cache import LRU
from ...errors import GrammarError, JSONDepthError
from ...limits import check_json_depth, loads
from ...tokenization.vocab import Vocabulary
from ..base import Constraint, show, utf8
from .matcher import GrammarMatcher

# llguidance normally turns forced bytes into one forced token and returns a singleton mask;
# the samplers need every valid token (the model decides the tokenization), so turn it off.
# Appended (not prepended) so that line numbers in error messages match the user's text.
_NO_FORCING = '\n%llguidance {"no_forcing": true}\n'


class Grammar(Constraint):
    """A language given by an llguidance grammar (build it with :func:`regex`,
    :func:`json_schema`, :func:`lark` or :func:`gbnf`). ``kind`` names the source format and
    ``lark_text`` is the Lark grammar llguidance runs."""

    def __init__(self, kind: str, lark_text: str, pattern: str | None = None,
                 final_bytes: bytes | None = None, schema: Any = None) -> None:
        self.kind = kind
        self.lark_text = lark_text + _NO_FORCING
        #: The source of a :func:`regex` (``min_new_tokens`` reads it), else None.
        self.pattern = pattern
        #: Where known, bytes one of which every accepted text ends with, whitespace after
        #: it aside (a JSON object: ``}``); :meth:`GrammarMatcher.closing` then tries only
        #: tokens that hold one, or are whitespace. None: not known.
        self.final_bytes = final_bytes
        #: The schema of a :func:`json_schema` (its token bound reads it,
        #: :mod:`.jsonbound`), else None.
        self.schema = schema

    @property
    def key(self) -> tuple[str, str, str | None, bytes | None]:
        """What makes two grammars one language to llguidance and to
        :class:`GrammarMatcher`: the Lark text (a JSON schema's whitespace options in it),
        the regex source and the final bytes. Compiled grammars are shared under it.

        >>> regex("a+").key == regex("a+").key != regex("a*").key
        True
        """
        return self.kind, self.lark_text, self.pattern, self.final_bytes

    def bind(self, vocab: Vocabulary) -> GrammarMatcher:
        """A matcher over the compiled grammar of this language and ``vocab``, which every
        other matcher of both shares (:func:`~adaptrack.constraints.grammar.compiled`)."""
        return GrammarMatcher(self, vocab, shared=True)

    def __repr__(self) -> str:
        return f"Grammar({self.kind}, {self.lark_text[:60]!r}…)"


def _one_line(message: str) -> str:
    """llguidance's message on one line: its caret display (a line of the source, then a line
    of ``^``) becomes ``|``-separated parts, and marker-only lines are dropped."""
    parts = [line.strip() for line in message.splitlines()]
    return " | ".join(p for p in parts if p.strip("^~- "))


def source_text(kind: str, text: object) -> str:
    """The grammar text, checked: a str that UTF-8 can encode (llguidance reads UTF-8)."""
    if not isinstance(text, str):
        raise TypeError(f"{kind} takes the grammar as a str, got {show(text)} "
                        f"({type(text).__name__})")
    utf8(text, kind)
    return text


#: llguidance's verdicts on grammar texts (whether invalid, and its messages).
VALIDATED: LRU[str, tuple[bool, tuple[str, ...]]] = LRU(256)


def check_source(kind: str, grammar: str) -> None:
    """Compile ``grammar`` (no vocabulary needed) and raise :class:`GrammarError` with
    llguidance's message, on one line, if it is invalid; pass its warnings on."""
    found = VALIDATED.get(grammar)
    if found is None:
        invalid, said = LLMatcher.validate_grammar_with_warnings(grammar)
        found = bool(invalid), tuple(said)
        VALIDATED.put(grammar, found)
    is_error, messages = found
    if is_error:
        raise GrammarError(f"invalid {kind}: {_one_line(messages[0])}")
    for msg in messages:
        warnings.warn(f"{kind}: {_one_line(msg)}", stacklevel=3)


def regex(pattern: str) -> Grammar:
    """The text must match ``pattern`` entirely (Rust ``regex`` crate syntax, Unicode).

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b"a", b"b", b"ab", b"<eos>"], lambda p: [1] * 4, eos=3)
    >>> m = regex("a+b").bind(lm.vocab)
    >>> m.allowed(m.start()).tolist()                 # "a" or "ab"
    [0, 2]
    >>> m.accepts([0, 2, 3]), m.accepts([2, 2, 3])
    (True, False)
    """
    source_text("regex", pattern)
    check_source("regex", LLMatcher.grammar_from_regex(pattern))
    return Grammar("regex", f"start: /{regex_to_lark(pattern, '')}/", pattern)


#: The layout of a JSON text unless the schema's ``"x-guidance"`` says otherwise:
#: ``json.dumps``'s, one line with ``", "`` between items, ``": "`` after a key and no other
#: whitespace. The exact target then lies over texts a person writes; a layout with free
#: whitespace spreads it over layouts nobody writes, which a search must visit
#: (docs/benchmarks/json-layout.md).
JSON_LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ",
                               "key_separator": ": "}

#: A multi-line layout to ask for with ``{"x-guidance": {"whitespace_pattern":
#: JSON_WHITESPACE}}``: none, one space, or a newline and up to 20 spaces or tabs between any
#: two tokens (llama.cpp's JSON grammar does the same), so a model cannot pad forever.
JSON_WHITESPACE = r"(?:[ ]|\n[ \t]{0,20})?"

#: ``x-guidance`` keys that choose the whitespace; a schema that sets one keeps llguidance's
#: separators unless it sets them too.
_WHITESPACE_KEYS = frozenset({"whitespace_flexible", "whitespace_pattern"})


def json_schema(schema: str | dict[str, Any]) -> Grammar:
    """The text must be JSON valid under ``schema``, laid out as :data:`JSON_LAYOUT` says
    (``json.dumps``'s one line); an ``"x-guidance"`` key in the schema changes that
    (``{"whitespace_flexible": true}``: any whitespace, ``","`` and ``":"``;
    ``{"whitespace_flexible": false}``: none, compact; ``{"whitespace_pattern": "..."}``:
    that pattern between tokens, :data:`JSON_WHITESPACE` for pretty-printed text;
    ``item_separator`` and ``key_separator`` replace ``", "`` and ``": "``).

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b'{"', b'a', b'":', b'1', b'}', b' ', b'<eos>'], lambda p: [1] * 7, eos=6)
    >>> m = json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
    ...                  "required": ["a"], "additionalProperties": False}).bind(lm.vocab)
    >>> m.accepts(lm.vocab.eos_ids.tolist()), m.accepts([0, 1, 2, 5, 3, 4, 6])  # {"a": 1}
    (False, True)
    >>> m.accepts([0, 1, 2, 3, 4, 6])                                       # {"a":1}
    False
    >>> m.forced_bytes(m.start())
    b'{"a": '
    """
    if isinstance(schema, str):
        utf8(schema, "json_schema")
        try:
            schema = loads(schema, "the JSON schema")
        except JSONDepthError:
            raise
        except ValueError as err:
            raise GrammarError(f"invalid JSON schema: not JSON: {err}") from None
    else:
        check_json_depth(schema, "the JSON schema")
    if not isinstance(schema, dict | bool):
        raise GrammarError(
            f"invalid JSON schema: expected an object, got {type(schema).__name__}")
    if isinstance(schema, dict):
        options = schema.get("x-guidance")
        if options is None or (isinstance(options, dict) and not _WHITESPACE_KEYS & options.keys()):
            schema = {**schema, "x-guidance": {**JSON_LAYOUT, **(options or {})}}
    check_source("JSON schema", LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    # An object ends with "}", then whitespace or none (a pattern of the caller's may
    # match anything, so then nothing is known).
    final = None
    if isinstance(schema, dict) and schema.get("type") == "object":
        options = schema.get("x-guidance")
        if isinstance(options, dict) and options.get(
                "whitespace_pattern", JSON_WHITESPACE) == JSON_WHITESPACE:
            final = b"}"
    return Grammar("JSON schema", f"start: %json {json.dumps(schema)}", final_bytes=final,
                   schema=schema)


def lark(grammar: str) -> Grammar:
    """The text must be derived from ``grammar``'s ``start`` rule (llguidance's Lark dialect:
    https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md).

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b"1", b"+", b"1+", b"<eos>"], lambda p: [1] * 4, eos=3)
    >>> m = lark('start: NUM ("+" NUM)*\\nNUM: /[0-9]+/').bind(lm.vocab)
    >>> m.accepts([2, 0, 3]), m.accepts([2, 3])
    (True, False)
    """
    check_source("Lark grammar", LLMatcher.grammar_from_lark(source_text("lark", grammar)))
    return Grammar("Lark grammar", grammar)


def gbnf(grammar: str) -> Grammar:
    """The text must be derived from ``grammar``'s ``root`` rule (llama.cpp's GBNF, converted
    to Lark by llguidance).

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b"0", b"1", b"<eos>"], lambda p: [1] * 3, eos=2)
    >>> m = gbnf('root ::= "1" [01]*').bind(lm.vocab)
    >>> m.allowed(m.start()).tolist(), m.accepts([1, 0, 2])
    ([1], True)
    """
    source_text("gbnf", grammar)
    try:
        converted = any_to_lark(grammar)
    except RecursionError:
        raise GrammarError("invalid GBNF grammar: nested too deeply for llguidance's "
                           "converter (its parentheses or rules); flatten it") from None
    except Exception as err:  # the converter raises its own error type (and others)
        raise GrammarError(f"invalid GBNF grammar: {err}") from None
    check_source("GBNF grammar", LLMatcher.grammar_from_lark(converted))
    return Grammar("GBNF grammar", converted)
