"""Compiled grammars shared between matchers (constraints/grammar/compiler.py, docs/design.md
§4): one per grammar and vocabulary, bounded, and never a change in what a matcher says."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

pytest.importorskip("llguidance", reason="grammar constraints run on llguidance")

import adaptrack as at
from adaptrack.constraints.grammar import (
    COMPILED_GRAMMARS,
    GrammarMatcher,
    compiled,
    json_schema,
    lark,
    regex,
)
from adaptrack.constraints.grammar import compiler as compiler_module

TOKENS = [b"{", b"}", b'"', b'{"', b'":', b'",', b'"}', b"a", b"b", b"ab", b"1", b"2", b"12",
          b"-", b",", b":", b" ", b"[", b"]", b"[1", b"true", b"x", b"\n", None, None]
SCHEMA = {"type": "object",
          "properties": {"a": {"type": "integer"}, "b": {"type": "array",
                                                         "items": {"type": "boolean"}},
                         "ab": {"type": "string", "maxLength": 3}},
          "required": ["a"], "additionalProperties": False}
LARK = 'start: item ("," item)*\nitem: NUM | "[" start "]" | "x"\nNUM: /-?[0-9]+/\n'
GRAMMARS = {
    "json_schema": lambda: json_schema(SCHEMA),
    "regex": lambda: regex(r"(ab|ba)+(1|12)?|-?[0-9]{1,3}"),
    "lark": lambda: lark(LARK),
}


def vocab() -> at.Vocabulary:
    return at.Vocabulary(TOKENS, eos_ids=[len(TOKENS) - 1], size=len(TOKENS) + 2)


@pytest.mark.parametrize("make", GRAMMARS.values(), ids=GRAMMARS.keys())
def test_one_grammar_on_one_vocabulary_shares_its_compiled_grammar(make):
    v = vocab()
    a, b = make().bind(v), make().bind(v)  # two Grammar objects of one text
    assert a.compiled is b.compiled and a._tokens.root is b._tokens.root
    a.allowed(a.start())
    b.allowed(b.start())  # found, not computed
    assert (a.stats()["grammar_masks"], b.stats()["grammar_masks"]) == (1, 0)
    assert a._tokens.cursor is not b._tokens.cursor  # the cursors are each matcher's own
    assert make().bind(vocab()).compiled is not a.compiled  # another vocabulary
    assert GrammarMatcher(make(), v).compiled is not a.compiled  # not shared: its own
    assert GrammarMatcher(make(), v, cache_bytes=1 << 20, shared=True).compiled is not a.compiled


def test_other_options_are_another_grammar():
    v = vocab()
    plain = json_schema(SCHEMA).bind(v)
    flexible = json_schema({**SCHEMA, "x-guidance": {"whitespace_flexible": True}}).bind(v)
    assert flexible.compiled is not plain.compiled
    assert 16 in flexible.allowed((0,)) and 16 not in plain.allowed((0,))  # " " after "{"


def walk_states(m: GrammarMatcher, rng: random.Random, steps: int) -> list[tuple[int, ...]]:
    """States of a random walk that backs up now and then (jumps on the cursor)."""
    made = [m.start()]
    for _ in range(steps):
        state = made[rng.randrange(len(made))] if rng.random() < 0.3 else made[-1]
        text = [t for t in m.allowed(state).tolist() if not m.vocab.is_eos(t)]
        if text:
            made.append(m.advance(state, rng.choice(text)))
    return made


def view(m: GrammarMatcher, state: tuple[int, ...]) -> tuple[list[int], list[int], bytes]:
    return m.allowed(state).tolist(), m.closing(state).tolist(), m.forced_bytes(state, limit=8)


@pytest.mark.parametrize("make", GRAMMARS.values(), ids=GRAMMARS.keys())
def test_walks_over_a_shared_compiled_grammar_see_what_separate_matchers_see(make):
    v = vocab()
    grammar = make()
    for seed in range(4):
        rng = random.Random(seed)
        separate = GrammarMatcher(grammar, v, cache_bytes=1, checkpoints=2)
        states = walk_states(separate, rng, 60)
        # Two shared matchers (one mask kept, so both compute), in turns at random states.
        one, two = (GrammarMatcher(grammar, v, cache_bytes=1, checkpoints=2, shared=True)
                    for _ in range(2))
        assert one.compiled is two.compiled
        for state in rng.sample(states, len(states)):
            for m in (one, two) if rng.random() < 0.5 else (two, one):
                assert view(m, state) == view(separate, state), (seed, state)
        assert one.stats()["grammar_masks"] and two.stats()["grammar_masks"]


def test_the_bound_evicts_the_least_recently_used():
    v = vocab()
    first = [regex(f"a{i}").bind(v).compiled for i in range(COMPILED_GRAMMARS)]
    assert regex("a0").bind(v).compiled is first[0]  # all kept; "a0" now the most recent
    regex("b").bind(v)  # one more: "a1", the least recently used, goes
    assert len(compiler_module._COMPILED) == COMPILED_GRAMMARS
    assert regex("a0").bind(v).compiled is first[0]
    assert regex("a1").bind(v).compiled is not first[1]
    assert compiled(regex("a0"), v) is first[0]


def test_a_spent_lexer_is_replaced_for_the_next_matchers():
    # llguidance's lexer limit: after it, the matcher starts from a new compile, which the
    # later matchers of the grammar start from too.
    v = at.Vocabulary([b"a" * 250, b"b", None], eos_ids=[2])
    m = regex("a{9999999}|b").bind(v)
    with pytest.raises(at.errors.GrammarError):
        for n in range(2000):
            m.allowed((0,) * n)
    assert m.stats()["grammar_restarts"] >= 1
    fresh = regex("a{9999999}|b").bind(v)
    assert fresh._tokens.root is m.compiled.root is m._tokens.root
    assert fresh.allowed((0,) * 3).tolist() == [0] and fresh.stats()["grammar_restarts"] == 0


def test_shared_masks_are_read_only():
    m = json_schema(SCHEMA).bind(vocab())
    bits, _ = m._mask(m.start())
    closing = m.closing((3,))
    with pytest.raises(ValueError, match="read-only"):
        bits[0] = 0
    with pytest.raises(ValueError, match="read-only"):
        closing[:] = 0


def test_matchers_in_threads_share_a_compiled_grammar_safely():
    v = vocab()
    grammar = json_schema(SCHEMA)
    separate = GrammarMatcher(grammar, v)
    states = walk_states(separate, random.Random(0), 80)
    want = {s: separate.allowed(s).tolist() for s in states}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            m = GrammarMatcher(grammar, v, cache_bytes=1 << 12, shared=True)  # few masks kept
            for s in random.Random(seed).choices(states, k=200):
                assert m.allowed(s).tolist() == want[s]
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_grammars_warnings_come_each_time_it_is_built():
    for _ in range(2):
        with pytest.warns(UserWarning, match="Lark grammar"):
            lark('start: "a" <[0]>')


def test_masks_equal_across_a_shared_and_a_separate_matcher_on_the_default_vocab(default_vocab):
    grammar = json_schema(SCHEMA)
    shared, separate = grammar.bind(default_vocab), GrammarMatcher(grammar, default_vocab)
    state = shared.start()
    for _ in range(6):
        ids = shared.allowed(state)
        assert np.array_equal(ids, separate.allowed(state))
        state = shared.advance(state, int(ids[len(ids) // 2]))
