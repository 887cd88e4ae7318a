"""The compiled-grammar cache: a grammar's setup per call, before and after it.

Every ``generate`` call (and server request) builds its grammar and binds it to the model's
vocabulary. Before the cache each bind compiled the grammar into a new llguidance matcher
and found masks, closing tokens and forced bytes from nothing; now :meth:`Grammar.bind`
shares a compiled grammar per grammar and vocabulary (constraints/grammar/compiler.py), and
building a grammar finds llguidance's verdict on its text. "before" runs each call on a
matcher of its own (``GrammarMatcher(grammar, vocab)``, what ``bind`` made before) with the
verdicts dropped first; "after" is a second call through ``bind`` (the first one filled the
cache), each call with a new :class:`Grammar` object, as a server request makes one.

Per grammar on the default model's vocabulary (49 152 tokens), median ms of ``--repeat``
calls:

- ``build``: ``json_schema(...)``, ``regex(...)``, ``lark(...)`` (validation);
- ``bind``: ``grammar.bind(vocab)`` (the compile);
- ``setup``: bind, then what a search asks first: ``min_new_tokens``, the start's mask and
  its forced bytes (limit 64);
- ``walk``: setup, then along a valid text's tokens (a sample's path) each state's mask and
  forced bytes, and the closing tokens of the last state (where a search whose length
  limit ends one token later asks them);
- ``new walk``: the walk where no state was met before: "after" empties the compiled
  grammar's masks, closing tokens and forced bytes first (it keeps the compiled matchers,
  the closing candidates and the regex bound: what a sample on another path still finds);
- ``generate``: a whole ``at.generate`` call (cd, n=1, max_new_tokens=8, seed 0) on the
  default model, its model calls included.

Run:  OMP_NUM_THREADS=1 python benchmarks/grammar_compile.py [--repeat 9] [--no-generate]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from typing import Any

import llguidance

import adaptrack as at
from adaptrack.constraints import grammar as grammar_package
from adaptrack.constraints.grammar import Grammar, GrammarMatcher, json_schema, lark, regex
from adaptrack.constraints.grammar import sources as sources_module
from adaptrack.tokenization.vocab import Vocabulary

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                         "role": {"enum": ["admin", "user", "guest"]}},
          "required": ["name", "age", "role"], "additionalProperties": False}
LARK = r"""
start: expr
?expr: term (("+" | "-") term)*
?term: factor (("*" | "/") factor)*
?factor: NUMBER | NAME | "(" expr ")"
NAME: /[a-z_][a-z0-9_]*/
NUMBER: /[0-9]+/
%ignore " "
"""
#: name → (how to build it, a valid text to walk, a prompt for generate)
CASES: dict[str, tuple[Callable[[], Grammar], bytes, str]] = {
    "JSON schema": (lambda: json_schema(SCHEMA),
                    b'{"name": "Ann Lee", "age": 30, "tags": ["a", "b"], "role": "user"}',
                    "A user as JSON: "),
    "regex": (lambda: regex(r"[A-Z][a-z]{2,8} [0-9]{1,3}(, [A-Z][a-z]+)*"),
              b"Alice 42, Bob, Carol", "A name and an age: "),
    "Lark": (lambda: lark(LARK), b"(price + 12) * count - 3 / rate", "An expression: "),
}


def unshared(grammar: Grammar) -> Grammar:
    """``grammar`` binding as before the cache: a matcher with a compiled grammar of its own."""

    class Unshared(Grammar):
        def bind(self, vocab: Vocabulary) -> GrammarMatcher:
            return GrammarMatcher(self, vocab)

    found = object.__new__(Unshared)
    found.__dict__.update(grammar.__dict__)
    return found


def call(make: Callable[[], Grammar], vocab: Vocabulary, path: list[int], shared: bool,
         stage: str, lm: Any, prompt: str) -> float:
    """Seconds of one call up to ``stage``."""
    if not shared:
        sources_module.VALIDATED.clear()
    t0 = time.perf_counter()
    grammar = make()
    if stage == "build":
        return time.perf_counter() - t0
    if not shared:
        grammar = unshared(grammar)
    if stage == "generate":
        at.generate(lm, prompt, grammar, method="cd", n=1, max_new_tokens=8, seed=0)
        return time.perf_counter() - t0
    m = grammar.bind(vocab)
    if stage == "bind":
        return time.perf_counter() - t0
    if stage == "new walk" and shared:
        t1 = time.perf_counter()
        for found in (m.compiled.masks, m.compiled.closing, m.compiled.forced):
            found.clear()
        t0 += time.perf_counter() - t1
    state = m.start()
    m.min_new_tokens()
    m.allowed(state)
    m.forced_bytes(state, limit=64)
    if stage in ("walk", "new walk"):
        for token in path:
            state = m.advance(state, token)
            assert state is not None, "the walk's text is valid"
            m.allowed(state)
            m.forced_bytes(state, limit=64)
        m.closing(state)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--no-generate", action="store_true", help="leave out the model column")
    args = ap.parse_args()
    lm = at.load_model()
    vocab = lm.vocab
    grammar_package.ll_vocab(vocab)  # the tokenizer, once per vocabulary in both designs
    stages = ["build", "bind", "setup", "walk", "new walk"]
    if not args.no_generate:
        stages.append("generate")
    print(f"{date.today()}, {cpu_name()}, load {load()}, Python {sys.version.split()[0]}, "
          f"llguidance {llguidance.__version__}, vocabulary {vocab.size} ids, "
          f"median of {args.repeat} calls (ms; before → after)\n")
    print(f"| grammar | {' | '.join(stages)} |")
    print("|---|" + "---:|" * len(stages))
    for name, (make, text, prompt) in CASES.items():
        path = vocab.longest_match(text)
        cells = []
        for stage in stages:
            got = {}
            for shared in (False, True):
                call(make, vocab, path, shared, stage, lm, prompt)  # the first call fills caches
                times = [call(make, vocab, path, shared, stage, lm, prompt)
                         for _ in range(args.repeat)]
                got[shared] = 1000 * statistics.median(times)
            cells.append(f"{got[False]:.2f} → {got[True]:.2f}")
        print(f"| {name} ({len(path)} tokens) | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
