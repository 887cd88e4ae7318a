"""Grammar constraints through llguidance (constraints/grammar.py, docs/design.md §2).

Masks are checked against llguidance's own token checks and against brute force over the
decoded text; the binary problem as a grammar must give the choice version's distribution.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import warnings

import numpy as np
import pytest

pytest.importorskip("llguidance", reason="grammar constraints run on llguidance")
from llguidance import LLMatcher

import adaptrack as at
from adaptrack.constraints import DONE
from adaptrack.constraints.grammar import (
    GrammarMatcher,
    gbnf,
    json_schema,
    lark,
    ll_vocab,
    regex,
)
from adaptrack.errors import GrammarError
from adaptrack.testing import hashed_weights

# Multi-byte tokens that span lexemes ('{"', '":', '",', '1,', '[1'); two EOS ids, one other
# special token and ids past the tokenizer.
JSON_TOKENS = [b"{", b"}", b'"', b"{\"", b'":', b'",', b'"}', b"a", b"b", b"ab", b"ba", b"1",
               b"2", b"12", b"1,", b"-", b".", b",", b":", b" ", b", ", b"[", b"]", b"[1",
               b"true", b"tr", b"ue", b"null", b"x", b"e", b"\n", b"a\"", None, None, None]

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        "ab": {"type": "string", "maxLength": 3},
    },
    "required": ["a"],
    "additionalProperties": False,
}

LARK = r"""
start: item ("," item)*
item: NUM | "[" start "]" | "x"
NUM: /-?[0-9]+/
%ignore " "
"""


def toy_vocab() -> at.Vocabulary:
    # ids 32, 33, 34 are special; 33 and 34 are EOS; the model's width is 40 (padded).
    return at.Vocabulary(JSON_TOKENS, eos_ids=[33, 34], size=40)


def reference(m: GrammarMatcher) -> LLMatcher:
    """A plain llguidance matcher on the same grammar and tokenizer."""
    return LLMatcher(m.ll.tokenizer, m.grammar.lark_text, log_level=0)


def check_against_llguidance(m: GrammarMatcher, state: tuple, ref: LLMatcher) -> None:
    """At ``state``: token in our mask ⇔ llguidance accepts it (``ref`` is at ``state``)."""
    vocab = m.vocab
    allowed = set(m.allowed(state).tolist())
    assert list(m.allowed(state)) == sorted(allowed) and m.allowed(state).dtype == np.int64
    accepting = ref.is_accepting()
    for tok in range(vocab.size):
        if vocab.is_eos(tok):
            ok = accepting
        elif vocab.bytes_of(tok):
            ok = ref.validate_tokens([tok]) == 1
            copy = ref.deep_copy()
            assert (copy.try_consume_tokens([tok]) == 1) == ok
        else:
            ok = False  # special tokens and ids past the tokenizer
        assert (tok in allowed) == ok, (state, tok, vocab.bytes_of(tok))
        assert (m.advance(state, tok) is not None) == ok
    assert set(m.finishing(state).tolist()) == (set(vocab.eos_ids.tolist()) if accepting
                                                else set())
    if ref.is_stopped():
        assert allowed == set(vocab.eos_ids.tolist())  # docs/design.md §2: EOS only


@pytest.mark.parametrize("grammar", [
    regex(r"(ab|ba)+(1|12)?|-?[0-9]{1,3}(\.[0-9]+)?"),
    json_schema(SCHEMA),
    lark(LARK),
], ids=["regex", "json_schema", "lark"])
def test_masks_agree_with_llguidance_on_random_walks(grammar):
    m = grammar.bind(toy_vocab())
    seen = set()
    for seed in range(4):  # one matcher throughout: its cursor jumps between all branches
        rng = random.Random(seed)
        made = [m.start()]
        for _ in range(30):  # steps that branch and back up, like the samplers
            state = made[rng.randrange(len(made))] if rng.random() < 0.3 else made[-1]
            ref = reference(m)
            assert ref.consume_tokens(list(state))
            check_against_llguidance(m, state, ref)
            seen.add("accepting" if ref.is_accepting() else "not accepting")
            text = [t for t in m.allowed(state).tolist() if not m.vocab.is_eos(t)]
            if not text:
                seen.add("stopped" if ref.is_accepting() else "dead end")
                continue
            made.append(m.advance(state, rng.choice(text)))
        assert max(len(s) for s in made) >= 6
    assert {"accepting", "not accepting"} <= seen


def finite_language(pattern: str, alphabet: str, longest: int) -> set[bytes]:
    words = ("".join(w) for n in range(longest + 1) for w in itertools.product(alphabet, repeat=n))
    return {w.encode() for w in words if re.fullmatch(pattern, w)}


def test_regex_masks_match_brute_force_over_text():
    pattern = r"(ab|a)(ba|b)?1{0,2}"
    language = finite_language(pattern, "ab1", 6)
    vocab = at.Vocabulary([b"a", b"b", b"ab", b"ba", b"1", b"11", b"b1", b"aba", None],
                          eos_ids=[8])
    m = regex(pattern).bind(vocab)
    seen = 0
    # Every token sequence of length <= 4 whose text is a prefix of the language.
    frontier = [m.start()]
    while frontier:
        state = frontier.pop()
        text = vocab.decode(state)
        expect = {t for t in range(8) if any(w.startswith(text + vocab.bytes_of(t))
                                             for w in language)}
        if text in language:
            expect.add(8)
        assert set(m.allowed(state).tolist()) == expect, text
        assert m.finishing(state).tolist() == ([8] if text in language else [])
        seen += 1
        if len(state) < 4:
            frontier.extend(m.advance(state, t) for t in expect if t != 8)
    assert seen > 30


BITS = ["00000"] + [f"1{i:04b}" for i in range(16)]
BITS_LARK = 'start: "00000" | "1" BIT BIT BIT BIT\nBIT: "0" | "1"'
BITS_GBNF = 'root ::= "00000" | "1" bit bit bit bit\nbit ::= [01]'


def bits_lm() -> at.TableLM:
    return at.TableLM([b"0", b"1", b"00", b"<eos>"], hashed_weights(4, b"bits"), eos=3)


@pytest.mark.parametrize("make", [lambda: lark(BITS_LARK), lambda: gbnf(BITS_GBNF),
                                  lambda: regex("00000|1[01]{4}")],
                         ids=["lark", "gbnf", "regex"])
def test_binary_problem_distribution_matches_choice(make):
    lm = bits_lm()
    want = at.exact_distribution(lm, [], at.constraints.choice(BITS), max_new_tokens=6)
    got = at.exact_distribution(lm, [], make(), max_new_tokens=6)
    assert got.keys() == want.keys()
    for seq, p in want.items():
        assert abs(got[seq] - p) < 1e-12
    assert len(want) > 17  # several tokenizations of the same strings


def test_every_method_returns_valid_json():
    tokens = [b'{"a":', b"{", b'"a"', b":", b"1", b"2", b"}", b" ", b'"', b"a", b"<eos>"]
    boost = [1, 1, 1, 1, 3, 3, 6, 1, 1, 1, 6]  # closing and EOS likely: CD finishes

    def next_probs(prefix):
        return [w * h for w, h in zip(boost, hashed_weights(11, b"json")(prefix), strict=True)]

    lm = at.TableLM(tokens, next_probs, eos=10)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    c = json_schema(schema)
    for method in at.METHODS:
        res = at.generate(lm, [], c, method=method, n=6, seed=2, max_new_tokens=12)
        assert len(res.samples) == 6
        for s in res.samples:
            if method == "unconstrained":
                continue
            if method == "cd" and not s.complete:
                continue  # docs/design.md §2: CD may run out of tokens
            assert s.complete and s.valid, (method, s)
            assert set(json.loads(s.text)) == {"a"}
            assert c.bind(lm.vocab).accepts(s.tokens)


def test_eos_ids_several_none_and_not_text():
    two = at.Vocabulary([b"a", b"b", b"ab", None, None, None], eos_ids=[3, 5], size=8)
    m = regex("ab?").bind(two)
    s0 = m.start()
    assert m.allowed(s0).tolist() == [0, 2] and m.finishing(s0).tolist() == []
    assert m.advance(s0, 3) is None and m.advance(s0, 4) is None and m.advance(s0, 7) is None
    s1 = m.advance(s0, 0)
    assert m.allowed(s1).tolist() == [1, 3, 5] and m.finishing(s1).tolist() == [3, 5]
    assert m.advance(s1, 3) is DONE and m.advance(s1, 5) is DONE
    assert m.advance(s1, 4) is None  # special, not EOS
    s2 = m.advance(s0, 2)  # "ab": the grammar is stopped, EOS is the only valid token
    assert m.allowed(s2).tolist() == [3, 5] and m.finishing(s2).tolist() == [3, 5]
    assert m.advance(s2, 0) is None and m.advance(DONE, 3) is None
    assert m.allowed(DONE).tolist() == [] and m.is_complete(DONE)

    none = at.Vocabulary([b"a", b"b", b"ab"])
    m = regex("ab?").bind(none)
    s1 = m.advance(m.start(), 0)
    assert m.allowed(s1).tolist() == [1] and m.finishing(s1).tolist() == []
    assert m.allowed(m.advance(m.start(), 2)).tolist() == []  # accepted, but nothing ends it

    # An EOS id with bytes is EOS only, never text.
    textual = at.Vocabulary([b"a", b"b"], eos_ids=[1])
    m = regex("ab?").bind(textual)
    s1 = m.advance(m.start(), 0)
    assert m.allowed(s1).tolist() == [1] and m.advance(s1, 1) is DONE


def test_dead_ends_have_empty_masks():
    # After "a" the regex needs a digit and no token has one: nothing is valid, not even EOS.
    vocab = at.Vocabulary([b"a", b"b", b"ab", None], eos_ids=[3])
    m = regex(r"a\d|b").bind(vocab)
    dead = m.advance(m.start(), 0)
    assert m.allowed(dead).tolist() == [] and m.finishing(dead).tolist() == []
    assert all(m.advance(dead, t) is None for t in range(4))
    # llguidance's matcher breaks on a dead end; the next masks still work.
    assert m.allowed(m.start()).tolist() == [0, 1]
    assert m.allowed(m.advance(m.start(), 1)).tolist() == [3]
    assert m.accepts([1, 3]) and not m.accepts([0, 1, 3])


def test_forced_bytes_and_masks_not_shrunk_by_forcing():
    vocab = at.Vocabulary([b"{", b'{"', b"n", b"name", b'":"', b'"', b":", b"x", b'"}', b"a",
                           b"me", None], eos_ids=[11])
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "required": ["name"], "additionalProperties": False,
              "x-guidance": {"whitespace_flexible": False}}
    m = json_schema(schema).bind(vocab)
    s0 = m.start()
    assert m.forced_bytes(s0) == b'{"name":"'
    # Every token that fits the forced bytes stays valid (llguidance would force just one).
    assert m.allowed(s0).tolist() == [0, 1]
    s_n = m.advance(m.advance(s0, 1), 2)  # '{"n'
    assert m.forced_bytes(s_n) == b'ame":"'
    assert m.allowed(s_n).tolist() == [9]
    assert m.advance(s_n, 2) is None and m.advance(s_n, 3) is None
    s = m.advance(m.advance(m.advance(s0, 1), 3), 4)  # '{"name":"'
    assert m.forced_bytes(s) == b""
    assert set(m.allowed(s).tolist()) >= {2, 3, 5, 7, 8, 9, 10}
    assert m.forced_bytes(DONE) == b""
    assert regex("a|b").bind(vocab).forced_bytes(()) == b""
    # Forcing ran on a copy: the masks after it are unchanged.
    assert m.allowed(s0).tolist() == [0, 1]
    assert m.accepts([1, 3, 4, 7, 8, 11]) and not m.accepts([1, 3, 4, 7, 8])


def test_invalid_grammars_raise_value_error_at_construction():
    with pytest.raises(GrammarError, match=r"(?s)invalid regex: .*unclosed group"):
        regex("a(b")
    with pytest.raises(ValueError, match=r"(?s)invalid regex: .*unclosed group"):
        regex("a(b")
    with pytest.raises(ValueError, match=r"(?s)invalid JSON schema: .*objectx"):
        json_schema({"type": "objectx"})
    with pytest.raises(ValueError, match=r"(?s)invalid JSON schema: .*'/nope' does not exist"):
        json_schema({"properties": {"a": {"$ref": "#/nope"}}})
    with pytest.raises(ValueError, match=r"(?s)invalid JSON schema: not JSON"):
        json_schema("{not json")
    with pytest.raises(ValueError, match=r'(?s)invalid Lark grammar: .*unknown name: "foo"'):
        lark("start: foo")
    with pytest.raises(ValueError, match=r"(?s)invalid GBNF grammar: .*end of input"):
        gbnf('root ::= "a')
    with pytest.raises(ValueError, match=r"invalid GBNF grammar: Rule 'undefined-rule' not found"):
        gbnf("root ::= undefined-rule")


def test_gbnf_and_string_schema():
    m = gbnf('root ::= "1" [01]*').bind(at.Vocabulary([b"0", b"1", b"10", None], eos_ids=[3]))
    assert m.allowed(()).tolist() == [1, 2] and m.accepts([2, 0, 3])
    c = json_schema('{"type": "integer"}')
    m = c.bind(at.Vocabulary([b"1", b"-", b"x", None], eos_ids=[3]))
    assert m.allowed(()).tolist() == [0, 1] and m.accepts([1, 0, 3])


def test_tokenizer_cached_per_vocabulary_and_stats():
    vocab = toy_vocab()
    assert ll_vocab(vocab) is ll_vocab(vocab)
    a, b = regex("a+").bind(vocab), lark(LARK).bind(vocab)
    assert a.ll is b.ll
    a.allowed(a.start())
    a.allowed(a.start())  # cached
    assert a.stats()["grammar_masks"] == 1


def test_every_grammar_failure_is_a_grammar_error():
    for bad in (lambda: regex("a(b"), lambda: json_schema({"type": "objectx"}),
                lambda: json_schema("{not json"), lambda: json_schema([1]),
                lambda: lark("start: foo"), lambda: gbnf('root ::= "a')):
        with pytest.raises(GrammarError, match=r"invalid (regex|JSON schema|Lark|GBNF)"):
            bad()
    assert issubclass(GrammarError, ValueError)
    with pytest.raises(TypeError, match=r"regex takes the grammar as a str, got 5 \(int\)"):
        regex(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lark takes the grammar as a str"):
        lark(b"start: /a/")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gbnf takes text encodable as UTF-8"):
        gbnf('root ::= "\ud800"')
    with pytest.raises(GrammarError) as bad:
        lark(".")  # llguidance shows the source with a caret under it
    assert "\n" not in str(bad.value)
    # llguidance's lexer limit ("too many expressions constructed") is a GrammarError too.
    vocab = at.Vocabulary([b"a" * 250, b"b", None], eos_ids=[2])
    m = regex("a{9999999}|b").bind(vocab)
    with pytest.raises(GrammarError, match=r"llguidance failed on this regex: .*limits"):
        for n in range(2000):
            m.allowed((0,) * n)
    # The next masks still work, also where none is cached: after the failure the matcher
    # starts from a new llguidance matcher (the old one's copies share its spent lexer).
    assert m.allowed(m.start()).tolist() == [0, 1]
    m._masks.clear()
    assert m.allowed((0,) * 3).tolist() == [0] and m.allowed((1,)).tolist() == [2]
    assert m.stats()["grammar_restarts"] >= 1


# Issue 16: a long-lived llguidance matcher moved by ``rollback`` returned masks of the text
# rolled back (its parser's mask cache outlived the rows it was keyed by).
ISSUE_SCHEMA = {"type": "object",
                "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name", "age"], "additionalProperties": False}
SMALL_JSON = [bytes([c]) for c in b'{}":, nameg12-x'] + [
    b'{"', b'":', b'",', b"name", b"age", b'"age', b'": ', b' "', b"1}", b"12", None]


@pytest.mark.parametrize("grammar", [
    json_schema(ISSUE_SCHEMA),
    regex(r"(ab|ba)+(1|12)?|-?[0-9]{1,3}(\.[0-9]+)?"),
    lark(LARK),
], ids=["json_schema", "regex", "lark"])
def test_masks_equal_a_fresh_matchers_along_walks_with_jumps_and_evictions(grammar):
    small = grammar.kind == "JSON schema"
    vocab = at.Vocabulary(SMALL_JSON, eos_ids=[len(SMALL_JSON) - 1]) if small else toy_vocab()
    longest, root = 0, reference(GrammarMatcher(grammar, vocab))
    for seed in range(16):
        # A one-mask cache and few checkpoints: nearly every step recomputes after a jump.
        m = GrammarMatcher(grammar, vocab, cache_bytes=1, checkpoints=2)
        rng = random.Random(seed)
        made = [m.start()]
        for _ in range(120):
            state = made[rng.randrange(len(made))] if rng.random() < 0.4 else made[-1]
            fresh = root.deep_copy()  # a copy of an unused matcher is a fresh one
            assert fresh.consume_tokens(list(state))
            want = m._compute(fresh)
            got = m._mask(state)
            assert np.array_equal(got[0], want[0]) and got[1] == want[1], (seed, state)
            text = [t for t in m.allowed(state).tolist() if not vocab.is_eos(t)]
            if text:
                made.append(m.advance(state, rng.choice(text)))
        longest = max(longest, *(len(s) for s in made))
    assert longest > 16  # past a checkpoint


def test_forced_bytes_limit_bounds_the_walk():
    vocab = at.Vocabulary([b"a", b"aa", b"b", None], eos_ids=[3])
    m = regex("a{99999999}|b").bind(vocab)
    s = m.advance(m.start(), 1)
    assert m.forced_bytes(s, limit=7) == b"a" * 7
    assert m.forced_bytes(m.advance(s, 1), limit=3) == b"aaa"
    assert m.forced_bytes(s, limit=0) == b""
    masks = m.stats()["grammar_masks"]
    assert m.forced_bytes(m.advance(s, 0), limit=50) == b"a" * 50
    # Walked on the byte matcher: no mask over the vocabulary (at 49k tokens, one a byte
    # cost ~0.4 ms), and 7 + 3 + 50 bytes, not 99 999 998.
    assert m.stats()["grammar_masks"] == masks
    with pytest.raises(ValueError, match="limit must be >= 0"):
        m.forced_bytes(s, limit=-1)


# Token bytes that are not text: halves of 'é' (b"\xc3\xa9"), a lone 0xFF byte; specials 32,
# 33 (EOS) and the last (EOS).
ODD_TOKENS = [*JSON_TOKENS[:34], b"\xc3", b"\xa9", b"\xc3\xa9", b"\xff", b"=", b";", b"ab=",
              b"x;", b"let", b" ", b"<e>", None]
FORCING_LARK = r"""
start: ("let " NAME "=" VALUE ";")+
NAME: /[a-z]+/ | "xyzzy"
VALUE: /[0-9]+/ | "true" | "é"
"""


def odd_vocab() -> at.Vocabulary:
    return at.Vocabulary(ODD_TOKENS, eos_ids=[33, len(ODD_TOKENS) - 1])


def llguidance_forced(m: GrammarMatcher, state: tuple) -> bytes:
    """llguidance's own forced bytes at ``state`` (``compute_ff_bytes``, no bound), on a
    fresh token matcher."""
    ref = reference(m)
    assert ref.consume_tokens(list(state))
    return bytes(ref.compute_ff_bytes())


@pytest.mark.parametrize("grammar,vocab,longest", [
    (json_schema(SCHEMA), toy_vocab(), 2),
    (json_schema({**SCHEMA, "x-guidance": {"whitespace_flexible": False}}), toy_vocab(), 5),
    (json_schema(ISSUE_SCHEMA), at.Vocabulary(SMALL_JSON, eos_ids=[len(SMALL_JSON) - 1]), 5),
    (regex(r"(abab|ab12|x{7})(1,|ba)*e{3}é?"), odd_vocab(), 5),
    (lark(FORCING_LARK), odd_vocab(), 3),
    (lark(LARK), toy_vocab(), 0),
], ids=["json", "json-compact", "json-issue", "regex", "lark-forcing", "lark"])
def test_forced_bytes_are_llguidances_on_random_walks(grammar, vocab, longest):
    # The byte walk (limit) and llguidance's forcing (no limit, on the byte matcher) agree
    # with llguidance's compute_ff_bytes on a fresh token matcher, cut to the limit.
    m = grammar.bind(vocab)
    rng = random.Random(0)
    state, seen, checked = m.start(), set(), 0
    for _ in range(120):
        want = llguidance_forced(m, state)
        for limit in (0, 1, 3, 40, None):
            assert m.forced_bytes(state, limit=limit) == want[:limit], (state, limit, want)
        checked += 1
        seen.add(len(want))
        text = [t for t in m.allowed(state).tolist() if not vocab.is_eos(t)]
        if not text or rng.random() < 0.1:
            state = m.start() if not text or rng.random() < 0.5 else state[:rng.randrange(
                len(state) + 1)]
            continue
        state = m.advance(state, rng.choice(text))
    assert checked == 120 and max(seen) >= longest, seen


def test_forced_bytes_of_a_grammar_naming_tokens():
    # A grammar may name special tokens (<[32]>: special in the toy vocabulary, never valid):
    # the byte walk counts them as another choice and never forces one; llguidance forces
    # their marker bytes (0xFF ...), which no state can consume.
    vocab = toy_vocab()
    with warnings.catch_warnings():  # "no tokenizer - can't validate <[...]>"
        warnings.simplefilter("ignore")
        grammar = lark('start: "ab" ("12" | <[32]>) "x" | "ba" <[32]>')
    m = grammar.bind(vocab)
    s_ab = m.advance(m.start(), 9)
    assert m.allowed(s_ab).tolist() == [11, 13]  # "1", "12": never the special token
    assert llguidance_forced(m, s_ab) == b""
    assert m.forced_bytes(s_ab, limit=10) == m.forced_bytes(s_ab) == b""
    s_ba = m.advance(m.start(), 10)
    assert llguidance_forced(m, s_ba).startswith(b"\xff")  # llguidance: the special's bytes
    assert m.forced_bytes(s_ba, limit=10) == b"" and m.allowed(s_ba).tolist() == []
    s = m.advance(s_ab, 11)  # "ab1"
    assert m.forced_bytes(s, limit=10) == m.forced_bytes(s) == b"2x"
    # Under 8 ids, the special's bit shares a byte with the "accepting" bit.
    tiny = at.Vocabulary([b"a", b"b", None, None], eos_ids=[3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = lark('start: "a" (<[2]> | "bb")').bind(tiny)
    assert m.forced_bytes(m.advance(m.start(), 0), limit=5) == b""
    assert m.forced_bytes(m.advance(m.advance(m.start(), 0), 1), limit=5) == b"b"


def test_unbounded_forcing_leaves_the_matcher_working():
    # llguidance's forcing over 250 000 forced bytes spends the lexer states that a
    # matcher's copies share; it runs on the byte matcher, so the token matcher goes on,
    # and the byte matcher is made anew for the next walk.
    vocab = at.Vocabulary([b"a", b"aa", b"b", None], eos_ids=[3])
    m = regex("a{300000}|b").bind(vocab)
    s = m.advance(m.start(), 1)
    assert set(m.forced_bytes(s)) == {ord("a")}  # llguidance's (it stops at its limit)
    for _ in range(40):
        s = m.advance(s, 1)
        assert m.allowed(s).tolist() == [0, 1]
    assert m.forced_bytes(s, limit=64) == b"a" * 64


def _shortest_complete(m, max_len: int) -> int | None:
    """Breadth-first: the fewest tokens (EOS included) of a complete sequence, or None."""
    frontier, depth = [m.start()], 0
    while frontier and depth < max_len:
        depth += 1
        nxt = []
        for state in frontier:
            if len(m.finishing(state)):
                return depth
            nxt.extend(m.advance(state, t) for t in m.allowed(state).tolist())
        frontier = [s for s in nxt if s is not None and s is not DONE]
    return None


def test_regex_min_new_tokens_is_a_lower_bound_on_random_patterns():
    vocab = at.Vocabulary([b"a", b"b", b"c", b"ab", b"ba", b"aaa", b"bcb", b"1", b"a1",
                           None], eos_ids=[9])
    atoms = ["a", "b", "c", "[ab]", "[a-c]", "1", "(ab|c)", "(a|bc)", ".", "[^a]"]
    rng = random.Random(0)
    checked = exact = 0
    for _ in range(60):
        parts = []
        for _ in range(rng.randint(1, 4)):
            atom = rng.choice(atoms)
            parts.append(atom + rng.choice(["", "", "?", "*", "+", "{2}", "{1,3}", "{3}"]))
        pattern = "".join(parts)
        m = regex(pattern).bind(vocab)
        bound = m.min_new_tokens()
        shortest = _shortest_complete(m, 12)
        assert bound >= 1
        if shortest is not None:
            assert bound <= shortest, (pattern, bound, shortest)
            checked += 1
            exact += bound == shortest
    assert checked > 40 and exact > 10


def test_min_new_tokens_syntax_it_cannot_read_gives_one():
    vocab = toy_vocab()
    for pattern in ["[[:alpha:]]{5}", "[a[bc]]{9}", "a{2, 5}", r"\pL{9}", "x{5}(?i)y",
                    "[a-c--b]{4}"]:
        assert regex(pattern).bind(vocab).min_new_tokens() == 1, pattern
    assert lark('start: "aaaaaaaa"').bind(vocab).min_new_tokens() == 1
    assert regex("x{5}").bind(vocab).min_new_tokens() == 6  # only "x" spells x
    assert regex("zz").bind(vocab).min_new_tokens() > 10**9  # no token holds a z


# --- the default model's vocabulary (49 152 tokens) --------------------------------------


def test_default_vocabulary_min_new_tokens(default_vocab):
    # Issue 16's example: 100 bytes of a and b need more than 8 tokens of SmolLM2's.
    m = regex("[ab]{100}").bind(default_vocab)
    assert 8 < m.min_new_tokens() <= 101
    assert regex("[0-9]{3}").bind(default_vocab).min_new_tokens() == 4  # digits: 1 a token


def test_default_vocabulary_masks(default_vocab):
    vocab = default_vocab
    assert vocab.size == 49152 and vocab.eos_ids.tolist() == [2]
    m = json_schema(SCHEMA).bind(vocab)
    rng = random.Random(0)
    state = m.start()
    for _ in range(25):
        ref = reference(m)
        assert ref.consume_tokens(list(state))
        ids = m.allowed(state)
        want = np.flatnonzero(np.unpackbits(np.frombuffer(ref.compute_bitmask(), np.uint8),
                                             bitorder="little")[: vocab.size])
        specials = [i for i in range(17) if i != 2]
        if ref.is_stopped():  # the object closed and nothing may follow: only EOS
            assert ids.tolist() == [2]
            break
        assert ids.tolist() == [i for i in want.tolist() if i not in specials]
        assert all(vocab.bytes_of(t) for t in ids.tolist() if t != 2)
        text = [t for t in ids.tolist() if t != 2]
        if not text:
            break
        state = m.advance(state, rng.choice(text))
    text = vocab.decode(state)
    assert text.startswith(b"{")


def test_default_vocabulary_generate_lark(default_vocab):
    # A TableLM over the real vocabulary, uniform: exercise the samplers end to end.
    lm = at.TableLM([b if b else b"<s>" for b in default_vocab.token_bytes],
                    lambda prefix: np.ones(default_vocab.size), eos=2)
    res = at.generate(lm, [], lark('start: "yes" | "no" | "maybe"'), method="exact", n=4,
                      seed=0, max_new_tokens=6)
    assert all(s.valid and s.text in {"yes", "no", "maybe"} for s in res.samples)


class _Dry:
    """An llguidance matcher whose lexer runs dry on more than one token consumed at once
    (as a real one does after enough bytes with no mask in between)."""

    def __init__(self, inner: LLMatcher) -> None:
        self.inner, self.failed = inner, False

    def deep_copy(self) -> _Dry:
        return _Dry(self.inner.deep_copy())

    def consume_tokens(self, ids: list[int]) -> bool:
        if len(ids) > 1:
            self.failed = True
            return False
        return self.inner.consume_tokens(ids)

    def compute_bitmask(self) -> bytes:
        return self.inner.compute_bitmask()

    def is_error(self) -> bool:
        return self.failed or self.inner.is_error()

    def get_error(self) -> str:
        return "lexer error: too many expressions constructed" if self.failed else \
            self.inner.get_error()


def test_a_replay_that_fails_again_goes_one_token_at_a_time_with_masks():
    from adaptrack.constraints.grammar.cursor import Track

    vocab = toy_vocab()
    # Any whitespace: a random walk of 20 tokens then never reaches the object's end.
    schema = json_schema({**SCHEMA, "x-guidance": {"whitespace_flexible": True}})
    m = GrammarMatcher(schema, vocab)
    m._tokens = Track(lambda: _Dry(m._new_matcher()), list, 8, "JSON schema")
    want = GrammarMatcher(schema, vocab)
    state = want.start()
    rng = random.Random(3)
    for _ in range(20):
        text = [t for t in want.allowed(state).tolist() if not vocab.is_eos(t)]
        state = want.advance(state, rng.choice(text))
    # A jump of 20 tokens: the copy of the root fails, so does a new matcher; a third,
    # with a mask before each token, gets there.
    assert m.allowed(state).tolist() == want.allowed(state).tolist()
    assert m.stats()["grammar_restarts"] == 2
    # From there on one token at a time works on the cursor as it is.
    nxt = m.advance(state, int(m.allowed(state)[0]))
    assert m.allowed(nxt).tolist() == want.allowed(nxt).tolist()
    assert m.stats()["grammar_restarts"] == 2


def test_a_json_object_schema_knows_its_final_byte_unless_whitespace_is_the_callers():
    from adaptrack.constraints import json_schema
    from adaptrack.constraints.grammar import JSON_WHITESPACE

    obj = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json_schema(obj).final_bytes == b"}"
    compact = {**obj, "x-guidance": {"whitespace_flexible": False}}
    assert json_schema(compact).final_bytes == b"}"
    lines = {**obj, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}
    assert json_schema(lines).final_bytes == b"}"
    flexible = {**obj, "x-guidance": {"whitespace_flexible": True}}
    assert json_schema(flexible).final_bytes == b"}"
    custom = {**obj, "x-guidance": {"whitespace_pattern": r"[ ]*|//[a-z]*"}}
    assert json_schema(custom).final_bytes is None
    assert json_schema({"type": "array"}).final_bytes is None
    assert json_schema({"properties": {"a": {}}}).final_bytes is None  # not only objects


def test_closing_from_the_final_byte_is_the_closing_of_a_full_scan():
    from adaptrack.constraints import json_schema
    from adaptrack.constraints.grammar import JSON_WHITESPACE, GrammarMatcher

    tokens = [b"{", b"}", b'"', b"a", b'":', b"1", b" ", b"\n", b"}\n", b"1}", b'"}', b",",
              b'a"', b" }", b"<eos>"]
    vocab = at.Vocabulary(tokens, eos_ids=[len(tokens) - 1])
    grammar = json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                           "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}})
    fast = grammar.bind(vocab)
    slow = GrammarMatcher(grammar, vocab)
    slow._closing_candidates = lambda: None  # every allowed token tried
    for text in ([0], [0, 2], [0, 2, 3, 4], [0, 2, 3, 4, 5], [0, 1], [0, 6]):
        s_fast, s_slow = fast.start(), slow.start()
        for t in text:
            s_fast, s_slow = fast.advance(s_fast, t), slow.advance(s_slow, t)
        assert fast.closing(s_fast).tolist() == slow.closing(s_slow).tolist(), text
    after_one = fast.start()
    for t in [0, 2, 3, 4, 5]:
        after_one = fast.advance(after_one, t)
    assert set(fast.closing(after_one).tolist()) == {1, 9, 13}  # "}", "1}", " }"
