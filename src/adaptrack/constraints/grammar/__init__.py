"""Grammar constraints through llguidance: ``regex``, ``json_schema``, ``lark``, ``gbnf``.

Semantics are those of docs/design.md §2: a sequence ends with EOS, EOS (every id in
``vocab.eos_ids``) is valid exactly where the grammar accepts the text, and where the grammar
can continue with nothing else EOS is the only valid token. Special tokens are never valid.

By noun, as XGrammar splits its own:

- :mod:`.sources`: the grammar texts (regex, JSON schema and its whitespace bound, Lark,
  GBNF), checked and turned into the Lark text llguidance runs (a :class:`Grammar`);
- :mod:`.tokenizer`: our vocabulary as llguidance's tokenizer, once per vocabulary;
- :mod:`.compiler`: a grammar compiled for a vocabulary, and what its matchers share (the
  last :data:`COMPILED_GRAMMARS` kept, as XGrammar keeps compiled grammars);
- :mod:`.cursor`: one llguidance matcher moved to any state, with checkpoints;
- :mod:`.matcher`: :class:`GrammarMatcher` (masks, closing and finishing tokens);
- :mod:`.forced`: forced bytes, walked on a matcher over bytes;
- :mod:`.bounds`: the fewest bytes and tokens of a regex's matches.
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
