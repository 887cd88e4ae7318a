"""Grammar constraints through llguidance: ``regex``, ``json_schema``, ``lark``, ``gbnf``.

Semantics are those of docs/design.md §2: a sequence ends with EOS, EOS (every id in
``vocab.eos_ids``) is valid exactly where the grammar accepts the text, and where the grammar
can continue with nothing else EOS is the only valid token. Special tokens are never valid.

By noun, as XGrammar splits its own; the modules and what each holds: docs/design.md §4.
"""

from .bounds import regex_min_bytes
from .compiler import COMPILED_GRAMMARS, CompiledGrammar, compiled
from .matcher import GrammarMatcher
from .sources import JSON_LAYOUT, JSON_WHITESPACE, Grammar, gbnf, json_schema, lark, regex
from .tokenizer import byte_tokenizer, ll_vocab

__all__ = [
    "COMPILED_GRAMMARS",
    "JSON_LAYOUT",
    "JSON_WHITESPACE",
    "CompiledGrammar",
    "Grammar",
    "GrammarMatcher",
    "byte_tokenizer",
    "compiled",
    "gbnf",
    "json_schema",
    "lark",
    "ll_vocab",
    "regex",
    "regex_min_bytes",
]
