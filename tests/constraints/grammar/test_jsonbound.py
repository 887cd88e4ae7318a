"""The JSON token bound (constraints/grammar/jsonbound.py, docs/design.md §2): never above
the tokens a valid text actually still takes, the same exact distribution with it and
without it, and a JSON prefix that cannot finish in time dead before any model call."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest
from paths import SHARED

import adaptrack as at
from adaptrack.constraints import json_schema
from adaptrack.constraints.base import Matcher
from adaptrack.constraints.grammar import JSON_WHITESPACE
from adaptrack.constraints.grammar.jsonbound import TokenCover
from adaptrack.constraints.grammar.matcher import GrammarMatcher
from adaptrack.sampling.expander import Expander
from adaptrack.sampling.nodes import Node
from adaptrack.sampling.treeoptions import TreeOptions
from adaptrack.tokenization.vocab import Vocabulary

NESTED = {"type": "object", "properties": {
    "id": {"type": "integer"},
    "user": {"type": "object", "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "tags"], "additionalProperties": False},
    "note": {"type": "string"}},
    "required": ["id", "user"], "additionalProperties": False}
OPEN = {"type": "object", "properties": {
    "a": {"type": "string"},
    "b": {"type": "object", "properties": {"c": {"type": "string"}}, "required": ["c"]}},
    "required": ["a", "b"]}
ROWS = {"type": "array", "items": {"type": "object", "properties": {
    "k": {"type": "string"}, "v": {"type": "number"}}, "required": ["k", "v"]}}
EITHER = {"type": "object", "properties": {
    "x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}, "y": {"type": "string"}},
    "required": ["x", "y"]}
ACCENT = {"type": "object", "properties": {"héllo": {"type": "string"},
                                           "b": {"type": "string"}}, "required": ["héllo", "b"]}
KINDS = {"type": "object", "$defs": {"t": {"type": "string"}, "u": {"$ref": "#/$defs/t"}},
         "properties": {
             "r": {"$ref": "#/$defs/u", "description": "a string, twice removed"},
             "e": {"enum": ["on", "off", 3, None, True, "a/b"]},
             "n": {"type": ["integer", "null"]}, "b": {"type": "boolean"},
             "c": {"const": "fixed"},
             "o": {"oneOf": [{"type": "string"},
                             {"type": "array", "items": {"type": "number"}}]},
             "z": {"type": "null"}},
         "required": ["r", "e", "n", "b", "c", "o", "z"]}
HAND = [
    (NESTED, [{"id": 1, "user": {"name": 'a "q" \\ b', "tags": ["x", "y,}]"]}},
              {"id": -2, "user": {"name": "", "tags": []}, "note": "né\n\t{"}]),
    (OPEN, [{"a": "x", "b": {"c": "y", "z": 1}, "extra": {"k": [1, 2]}},
            {"a": "", "b": {"c": "}\""}}]),
    (ROWS, [[{"k": "a", "v": 1.5}, {"k": "b\n", "v": -3e2}], []]),
    (EITHER, [{"x": "s", "y": "t"}, {"x": 12, "y": ""}]),
    (ACCENT, [{"héllo": "x", "b": "y"}]),
    (KINDS, [{"r": "x", "e": "off", "n": None, "b": False, "c": "fixed", "o": [1.5, -2],
              "z": None},
             {"r": "", "e": 3, "n": -12, "b": True, "c": "fixed", "o": "s", "z": None},
             {"r": "q", "e": None, "n": 0, "b": True, "c": "fixed", "o": [], "z": None},
             {"r": "q", "e": True, "n": 7, "b": False, "c": "fixed", "o": "", "z": None},
             {"r": "q", "e": "a/b", "n": 7, "b": False, "c": "fixed", "o": "", "z": None}]),
]


def texts(doc: object) -> list[str]:
    """``doc`` written compactly, as ``json.dumps`` does, pretty-printed, unescaped, and with
    blanks before the separators."""
    return [json.dumps(doc, separators=(",", ":")), json.dumps(doc),
            json.dumps(doc, indent=2), json.dumps(doc, ensure_ascii=False),
            json.dumps(doc, separators=(" ,", " : "))]


def segmentations(vocab: Vocabulary, data: bytes, rng: random.Random) -> list[list[int]]:
    """``data`` as the longest-match tokens and as two random segmentations into tokens."""
    out = [vocab.longest_match(data)]
    for _ in range(2):
        ids, pos = [], 0
        while pos < len(data):
            tok, pos = rng.choice(vocab.matches_at(data, pos))
            ids.append(tok)
        out.append(ids)
    return out


def check_sound(m: GrammarMatcher, ids: list[int]) -> int:
    """Assert at every prefix of the complete sequence ``ids`` + EOS that the bound is at
    most the tokens that follow (EOS included) and that ``within`` keeps the next token;
    the number of prefixes checked (0 where the grammar rejects the text)."""
    eos = int(m.vocab.eos_ids[0])
    if not m.accepts([*ids, eos]):
        return 0
    bound = m.compiled.json_bound()
    assert bound is not None
    state = m.start()
    for k in range(len(ids) + 1):
        left = len(ids) - k + 1
        assert bound.need(state) <= left, (m.vocab.decode(state), left)
        nxt = ids[k] if k < len(ids) else eos
        assert nxt in m.within(state, left), (m.vocab.decode(state), left, nxt)
        if k < len(ids):
            state = m.advance(state, ids[k])
    return len(ids) + 1


def test_bound_never_exceeds_what_valid_texts_take(default_vocab):
    rng, checked = random.Random(0), 0
    for schema, docs in HAND:
        for layout in (None, {"whitespace_pattern": JSON_WHITESPACE},  # ours, multi-line
                       {"whitespace_flexible": False},  # compact
                       {"whitespace_flexible": True},  # any whitespace
                       {"whitespace_flexible": False, "item_separator": " ,",
                        "key_separator": " : "}):
            m = json_schema(schema if layout is None else {**schema, "x-guidance": layout}
                            ).bind(default_vocab)
            for doc in docs:
                for text in texts(doc):
                    for ids in segmentations(default_vocab, text.encode(), rng):
                        checked += check_sound(m, ids)
    assert checked > 5000


def test_bound_on_maskbench_documents(default_vocab):
    path = SHARED / "data" / "maskbench-dev.jsonl.gz"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    rows = [json.loads(line) for line in gzip.open(path)]
    rng = random.Random(1)
    rng.shuffle(rows)
    docs = checked = 0
    for row in rows:
        tests = [t["data"] for t in row.get("tests", []) if t.get("valid")]
        if not tests:
            continue
        try:
            m = json_schema(row["schema"]).bind(default_vocab)
        except (ValueError, at.errors.GrammarError):
            continue
        for doc in tests[:2]:
            text = rng.choice(texts(doc)).encode()
            try:
                ids = rng.choice(segmentations(default_vocab, text, rng))
            except IndexError:  # a byte no token starts with
                continue
            found = check_sound(m, ids)
            docs, checked = docs + bool(found), checked + found
        if docs >= 15:
            break
    assert docs >= 15 and checked > 700


def test_token_cover_is_a_lower_bound():
    rng = random.Random(2)
    tokens = [b'"', b'",', b'":', b"a", b"ab", b"ba", b"}", b'"}', b" ", b'"a"', b"b\"",
              b"<e>"]
    vocab = Vocabulary(tokens, eos_ids=[11])
    cover = TokenCover(vocab)
    tight = 0
    for _ in range(2000):
        seq = [rng.randrange(11) for _ in range(rng.randrange(1, 8))]
        text = vocab.decode(seq)
        pieces, at = [], 0  # pieces of the text, in order, with gaps between
        while at < len(text):
            size = rng.randrange(1, 5)
            if rng.random() < 0.6:
                pieces.append(text[at:at + size])
            at += size
        found = cover.count(tuple(pieces))
        assert found <= len(seq), (seq, pieces)
        tight += found == len(seq)
    assert tight > 300
    assert cover.count((b'"a"', b"}")) == 2 and cover.count(()) == 0
    assert cover.count((b"c",)) > 10**9  # no token writes it
    assert TokenCover(Vocabulary([b"<e>"], eos_ids=[0])).count((b"c",)) > 10**9


def test_token_cover_keeps_a_piece_side_by_side():
    vocab = Vocabulary([b'"ba"', b'"', b"a", b"<e>"], eos_ids=[3])
    cover = TokenCover(vocab)
    # '"ba"' holds '"a"' with a gap, not side by side: '"' 'a' '"' (or '"ba"' 'a' '"').
    assert cover.count((b'"a"',)) == 3
    assert cover.count((b'"', b"a", b'"')) == 1
    # Digits are one byte to the cover: '"7"' writes the key "0" of a schema.
    assert TokenCover(Vocabulary([b'"7"', b"<e>"], eos_ids=[1])).count((b'"0"',)) == 1


TINY = [b'{"a":"', b'x', b'xx', b'"', b'",', b'"b":"', b'"}', b'}', b' ', b'<eos>']
TINY_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"},
                                                "b": {"type": "string"}},
               "required": ["a", "b"], "additionalProperties": False,
               "x-guidance": {"whitespace_flexible": False}}


@pytest.mark.parametrize("end", ["leave", "eos"])
def test_exact_distribution_is_the_same_without_the_bound(monkeypatch, end):
    def weights(prefix):
        return [1 + (sum(prefix) * 7 + i * 3) % 5 for i in range(len(TINY))]

    def run() -> tuple[dict[tuple[int, ...], float], int]:
        lm = at.TableLM(TINY, weights, eos=9)
        dist = at.exact_distribution(lm, [], json_schema(TINY_SCHEMA), max_new_tokens=7,
                                     end=end, fast_forward=False)
        return dist, lm.calls

    with_bound, calls = run()
    monkeypatch.setattr(GrammarMatcher, "within", Matcher.within)
    without, calls_without = run()
    assert with_bound.keys() == without.keys() and len(without) > 10
    for seq, p in without.items():
        assert abs(with_bound[seq] - p) < 1e-12
    assert calls < calls_without  # prefixes that cannot finish were never evaluated


JME = {"type": "object", "properties": {"name": {"type": "string"},
                                        "email": {"type": "string"},
                                        "shippingAddress": {"type": "string"}},
       "required": ["name", "email", "shippingAddress"]}


def test_string_that_cannot_close_in_time_is_dead(default_vocab, monkeypatch):
    m = json_schema({**JME, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}
                    ).bind(default_vocab)
    node = Node(None, None, m.start(), False, 0.0)
    for tok in default_vocab.longest_match(b'{"name": "John", "email": "john.doe@example'):
        state = m.advance(node.state, tok)
        assert state is not None
        node = Node(node, tok, state, False, 0.0)
    # '","shippingAddress":""}' takes six tokens ('","' 'ship' 'ping' 'Address' '":"' '"}'),
    # then EOS: seven. The key is written side by side, so no token holding its letters
    # apart can stand for it.
    assert m.compiled.json_bound().need(node.state) == 7
    at_six = Expander(m, TreeOptions(max_new_tokens=node.depth + 6))
    assert at_six.dead(node) and not len(at_six.valid(node))
    at_seven = Expander(m, TreeOptions(max_new_tokens=node.depth + 7))
    kept = at_seven.valid(node)
    assert 0 < len(kept) < 100  # no plain string token: each would leave six for seven
    assert not np.isin(kept, np.flatnonzero(m.compiled.json_bound().plain)).any()
    monkeypatch.setattr(GrammarMatcher, "within", Matcher.within)
    assert len(Expander(m, TreeOptions(max_new_tokens=node.depth + 6)).valid(node)) > 40000


def test_a_key_being_written_keeps_the_required_keys_it_cannot_become():
    tokens = [b'{"', b"a", b"b", b'":"', b'"', b'","', b'b":"', b'"}', b"<e>"]
    vocab = Vocabulary(tokens, eos_ids=[8])
    schema = {"type": "object", "properties": {"a": {"type": "string"},
                                               "b": {"type": "string"}}, "required": ["b"],
              "x-guidance": {"whitespace_flexible": False}}  # compact: '{"a":"x"}'
    m = json_schema(schema).bind(vocab)
    state = m.advance(m.start(), 0)
    for left in range(3, 8):
        within = m.within(state, left).tolist()
        assert set(within) <= set(m.allowed(state).tolist())
        # After 'a', "b" is still required: '":"' '","' 'b":"' '"}' EOS at the least.
        assert (1 in within) == (left >= 6)
        # 'b' may be the required key itself: '":"' '"}' EOS.
        assert (2 in within) == (left >= 4)


def test_key_that_cannot_close_in_time_has_no_plain_child(default_vocab):
    # An extra key being written: whatever ASCII bytes follow, it still needs its '":', a
    # value and '}' (a walk once opened 834 such children of one prefix, each dead at its
    # own check).
    m = json_schema(JME).bind(default_vocab)
    bound = m.compiled.json_bound()
    node = Node(None, None, m.start(), False, 0.0)
    text = b'{"name": "J", "email": "j", "shippingAddress": "x", "innerReprocClass'
    for tok in default_vocab.longest_match(text):
        state = m.advance(node.state, tok)
        assert state is not None
        node = Node(node, tok, state, False, 0.0)
    need = bound.need(node.state)
    tight = Expander(m, TreeOptions(max_new_tokens=node.depth + need)).valid(node)
    assert 0 < len(tight) < 2000
    assert not np.isin(tight, np.flatnonzero(bound.cover.plain_ascii)).any()
    roomy = Expander(m, TreeOptions(max_new_tokens=node.depth + need + 1)).valid(node)
    assert np.isin(roomy, np.flatnonzero(bound.cover.plain_ascii)).sum() > 40000
    for tok in tight.tolist():  # each kept token leaves a text that may still fit
        assert bound.need(m.advance(node.state, tok)) <= need - 1


def test_a_value_the_scanner_does_not_know_still_owes_a_token():
    vocab = Vocabulary([b'{"x":', b"}", b"0", b'"', b"<e>"], eos_ids=[4])
    m = json_schema({"type": "object", "x-guidance": {"whitespace_flexible": True}}
                    ).bind(vocab)
    state = m.advance(m.start(), 0)
    assert state is not None
    # '0' '}' then EOS: "}" alone would not be JSON, and no token writes a value and "}".
    assert m.compiled.json_bound().need(state) == 3
    assert m.accepts([0, 2, 1, 4]) and not len(m.within(state, 2))


def test_an_enum_value_owes_its_text():
    vocab = Vocabulary([b'{"s": ', b'"', b"on", b"off", b'"on"', b"}", b"<e>"], eos_ids=[6])
    schema = {"type": "object", "properties": {"s": {"enum": ["on", "off"]}},
              "required": ["s"], "additionalProperties": False}
    m = json_schema(schema).bind(vocab)
    state = m.advance(m.start(), 0)
    assert state is not None
    assert m.compiled.json_bound().need(state) == 3  # '"on"' '}' EOS
    assert m.within(state, 3).tolist() == [4]  # '"' leaves "on" or "off" and '"}' no room
