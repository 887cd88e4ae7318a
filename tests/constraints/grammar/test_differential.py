"""Grammar matchers against fresh llguidance matchers (constraints/grammar.py, docs/design.md
§4): random walks over the prefix trees of real grammars, on the Llama 3 vocabulary.

A walk follows a valid text's canonical tokens (a *spine*), steps off it on random valid
tokens, goes back to earlier states and jumps ahead along the spine by several tokens at
once, so that the matcher moves there with no mask in between (llguidance refills its
lexer's fuel only when it computes a mask). At every state the mask, every accept decision
and the forced bytes must be those of a new llguidance matcher that consumed the same
tokens, and ``forced_tokens`` must answer: a matcher that has spent its lexer must never
fail where a fresh one does not.

The grammars are dev-set JSON schemas of MaskBench (heavy string patterns such as
``^(?:\\S+\\s+){0,199}\\S+$``, ``$ref``, enums), a regex and Lark grammars; the shared test
data (``../shared``) holds the schemas and the tokenizer, and the tests skip without them.
"""

from __future__ import annotations

import gzip
import json
import random
from functools import cache
from typing import Any

import numpy as np
import pytest
from paths import SHARED

pytest.importorskip("llguidance", reason="grammar constraints run on llguidance")
from llguidance import LLMatcher

from adaptrack.constraints import DONE, Grammar, json_schema, lark, regex
from adaptrack.constraints.grammar import GrammarMatcher
from adaptrack.sampling.fastforward import forced_tokens
from adaptrack.tokenization.tokenizer import Tokenizer

LLAMA3 = SHARED / "tokenizers" / "llama3"
MASKBENCH_DEV = SHARED / "data" / "maskbench-dev.jsonl.gz"

#: Dev-set schemas: word-count patterns over long strings (the first failed before: its
#: lexer ran dry in a jump), patterns with ``$ref``, enums and URI formats, length bounds
#: with patterns.
SCHEMAS = ["Github_hard---o21072", "Github_medium---o21194", "JsonSchemaStore---crowdin",
           "Github_medium---o65504"]

WORDS = ("Constrained decoding keeps a model's output valid, and exact sampling keeps "
         "its intent: the prefix tree holds every state the walks have seen so far.")
SENTENCES_LARK = r"""
start: line ("\n" line)*
line: "say " SENTENCE | "count " NUMBER ("," NUMBER)*
SENTENCE: /[A-Z][a-z']*( [a-z',:]+){0,149}\./
NUMBER: /-?[0-9]{1,12}/
"""
CALC_LARK = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | NAME | "(" expr ")" | NAME "(" expr ("," expr)* ")"
NAME: /[a-z_][a-z_0-9]{0,30}/
NUMBER: /[0-9]+(\.[0-9]+)?/
%ignore " "
"""
OTHERS: dict[str, tuple[Grammar, str]] = {
    "regex-words": (regex(r"(?:\S+\s+){0,199}\S+"), " ".join([WORDS] * 3)),
    "lark-sentences": (lark(SENTENCES_LARK),
                       f"say {WORDS[:-1].replace('.', '')}.\ncount 12,-7,4096\nsay Done."),
    "lark-calc": (lark(CALC_LARK), "max(a_1 * 2.5, (b + 3) / c) - f(x, y, z * 10) + 42"),
}


@cache
def llama3() -> Tokenizer:
    if not (LLAMA3 / "tokenizer.json").is_file():
        pytest.skip(f"the Llama 3 tokenizer is not in the shared test data ({LLAMA3})")
    pytest.importorskip("tokenizers")
    return Tokenizer.from_file(LLAMA3)


@cache
def dev_schemas() -> dict[str, tuple[Any, bytes]]:
    """The schemas of :data:`SCHEMAS` with a valid instance each, laid out as the default
    layout (``json.dumps``'s one line) writes it."""
    if not MASKBENCH_DEV.is_file():
        pytest.skip(f"MaskBench's dev set is not in the shared test data ({MASKBENCH_DEV})")
    found: dict[str, tuple[Any, bytes]] = {}
    with gzip.open(MASKBENCH_DEV, "rt", encoding="utf-8") as f:
        for line in f:
            case = json.loads(line)
            if case.get("name") in SCHEMAS:
                tests = case["tests"]
                tests = json.loads(tests) if isinstance(tests, str) else tests
                valid = next(t["data"] for t in tests if t.get("valid"))
                found[case["name"]] = (case["schema"],
                                       json.dumps(valid, ensure_ascii=False).encode())
    assert sorted(found) == sorted(SCHEMAS), "the dev set lost a schema this test reads"
    return found


def spine_and_grammar(name: str, tok: Tokenizer) -> tuple[Grammar, list[int]]:
    """The grammar and the canonical tokens of a text it accepts."""
    if name in OTHERS:
        grammar, text = OTHERS[name]
        return grammar, tok.encode_bytes(text.encode())
    schema, instance = dev_schemas()[name]
    return json_schema(schema), tok.encode_bytes(instance)


def fresh_view(m: GrammarMatcher, state: tuple[int, ...]) -> tuple[list[int], bool, bytes]:
    """What a new llguidance matcher that consumed ``state`` says: the valid text tokens,
    whether it accepts, and its forced bytes (unpacked here, not by the matcher's code)."""
    ref = LLMatcher(m.ll.tokenizer, m.grammar.lark_text, log_level=0)
    assert ref.consume_tokens(list(state)), ref.get_error()
    raw = ref.compute_bitmask()
    if ref.is_error():
        assert ref.get_error().startswith("NoExtensionBias"), ref.get_error()
        return [], False, b""
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    eos = m.ll.eos
    text = [t for t in np.flatnonzero(bits[:eos]).tolist() if m.vocab.bytes_of(t)
            and not m.vocab.is_eos(t)]
    forced = bytes(ref.deep_copy().compute_ff_bytes())
    return text, bool(bits[eos]), forced


def check(m: GrammarMatcher, tok: Tokenizer, state: tuple[int, ...], rng: random.Random,
          detours: list[tuple[int, ...]]) -> None:
    text, accepting, forced = fresh_view(m, state)
    # forced tokens first: they ask for masks at states ahead, before this state's own
    got, leftover = forced_tokens(tok, m, state, list(state[-8:]), max_tokens=2)
    assert tok.vocab.decode(got) + leftover == forced, state
    assert m.forced_bytes(state) == forced, state
    eos = [int(t) for t in m.vocab.eos_ids]
    assert m.allowed(state).tolist() == sorted(text + (eos if accepting else [])), state
    assert m.finishing(state).tolist() == (eos if accepting else []), state
    assert (m.advance(state, eos[0]) is DONE) == accepting, state
    valid = set(text)
    probes = rng.sample(text, min(4, len(text))) + rng.sample(range(m.vocab.size), 4)
    for t in probes:
        assert (m.advance(state, t) == (*state, t)) == (t in valid), (state, t)
    if text:
        detours.append((*state, rng.choice(text)))


@pytest.mark.parametrize("name", [*SCHEMAS, *OTHERS])
def test_grammar_matcher_equals_fresh_llguidance_on_random_walks(name):
    tok = llama3()
    grammar, spine = spine_and_grammar(name, tok)
    # Few masks kept and few checkpoints: going back recomputes from a checkpoint.
    m = GrammarMatcher(grammar, tok.vocab, cache_bytes=1 << 16, checkpoints=8)
    rng = random.Random(name)
    pos, state, seen = 0, (), [()]
    detours: list[tuple[int, ...]] = []
    jumps = 0
    for _ in range(36):
        check(m, tok, state, rng, detours)
        r = rng.random()
        if r < 0.35 and pos < len(spine):  # ahead along the spine, with no mask between
            pos = min(len(spine), pos + rng.randint(2, 24))
            jumps += 1
            state = tuple(spine[:pos])
        elif r < 0.55:  # back to an earlier state
            state = rng.choice(seen)
            pos = len(state) if state == tuple(spine[:len(state)]) else pos
        elif r < 0.7 and detours:  # off the spine by a valid token
            state = detours[-1]
        elif pos < len(spine):
            pos += 1
            state = tuple(spine[:pos])
        else:
            state = rng.choice(seen)
        seen.append(state)
    assert jumps >= 5
