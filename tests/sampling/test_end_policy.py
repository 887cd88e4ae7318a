"""Where a constrained text ends (docs/design.md §2), the search's dead-before-call rule and
the CD fallback of a search past its budget (docs/design.md §6)."""

from __future__ import annotations

import itertools
import json
import math
import warnings

import numpy as np
import pytest

import adaptrack as at
from adaptrack.constraints.grammar import JSON_WHITESPACE
from adaptrack.sampling.engine import expand
from adaptrack.sampling.treeoptions import TreeOptions
from adaptrack.testing import ends_or_goes_on, hashed_weights


def leave_target_by_brute_force(lm: at.TableLM, strings: list[bytes], max_new: int) -> dict:
    """P(s) · P(leave | s) over the accepted texts s, normalized, written from the definition
    with no prefix tree: a token leaves an accepted text when it is EOS or its first byte
    continues none of the strings; a token whose first byte continues a string but whose
    whole bytes do not is invalid (the whole-token version)."""
    vocab = lm.vocab
    size, eos = vocab.size, int(vocab.eos_ids[0])
    texts = list(strings)
    out: dict[bytes, float] = {}
    for k in range(max_new):  # k text tokens, then the one that leaves (within max_new)
        for seq in itertools.product(range(size), repeat=k):
            if eos in seq:
                continue
            text, p = b"", 1.0
            for i, tok in enumerate(seq):
                text += vocab.bytes_of(tok)
                if not any(t.startswith(text) for t in texts):
                    break
                w = np.asarray(lm.next_probs(seq[:i]), dtype=float)
                p *= w[tok] / w.sum()
            else:
                if text not in texts:
                    continue
                w = np.asarray(lm.next_probs(seq), dtype=float)
                w /= w.sum()
                goes_on = {t[len(text)] for t in texts if len(t) > len(text)
                           and t.startswith(text)}
                leave = sum(w[u] for u in range(size)
                            if u == eos or vocab.bytes_of(u)[0] not in goes_on)
                out[text] = out.get(text, 0.0) + p * leave
    total = math.fsum(out.values())
    return {t: p / total for t, p in out.items()}


def by_text(lm: at.TableLM, dist: dict) -> dict:
    out: dict[bytes, float] = {}
    for seq, p in dist.items():
        text = lm.vocab.decode(seq[:-1])
        out[text] = out.get(text, 0.0) + p
    return out


def test_leave_target_is_the_definition():
    lm, c, max_new = ends_or_goes_on()
    want = leave_target_by_brute_force(lm, c.strings, max_new)
    got = by_text(lm, at.exact_distribution(lm, [], c, max_new_tokens=max_new))
    assert got.keys() == want.keys()
    for text, p in want.items():
        assert got[text] == pytest.approx(p, rel=1e-9), text
    eos = by_text(lm, at.exact_distribution(lm, [], c, max_new_tokens=max_new, end="eos"))
    # The two policies weigh the texts differently: "ab" is where the model leaves most.
    assert abs(eos[b"ab"] - got[b"ab"]) > 0.1


def test_leave_moves_the_leaving_mass_onto_eos():
    lm, c, max_new = ends_or_goes_on()
    tree = at.sampling.tree.PrefixTree([], c.bind(lm.vocab), TreeOptions(max_new_tokens=max_new))
    expand(lm, tree, tree.root)  # the test is the driver: it asks the model
    a = tree.child(tree.root, 0)  # "a": accepted, may go on with a, b or ab
    exp = expand(lm, tree, a)
    probs = np.asarray(lm.next_probs((0,)), dtype=float)
    probs /= probs.sum()
    ids = exp.ids.tolist()
    assert ids == [0, 1, 2, 5]  # "ba" crosses the end: invalid; "c" left with EOS
    assert exp.p[ids.index(5)] == pytest.approx(probs[5] + probs[4])
    assert exp.p[ids.index(0)] == pytest.approx(probs[0])


@pytest.mark.parametrize("method", ["cd", "asap", "adaptrack", "exact"])
def test_every_method_samples_text_that_ends_where_the_model_leaves(method):
    lm, c, max_new = ends_or_goes_on()
    res = at.generate(lm, [], c, method=method, n=40, seed=1, max_new_tokens=max_new)
    assert all(s.valid and s.text.encode() in c.strings for s in res.samples)
    # The token that left is reported as EOS, and the sample's log-probability counts
    # P(leave | text), not P(EOS | text).
    dist = at.exact_distribution(lm, [], c, max_new_tokens=max_new)
    for s in res.samples:
        assert s.tokens[-1] == 5 and s.tokens in dist


def test_unconstrained_sampling_ignores_the_end_policy():
    lm, c, max_new = ends_or_goes_on()
    kw = dict(method="unconstrained", n=20, seed=0, max_new_tokens=max_new)
    assert (at.generate(lm, [], c, end="leave", **kw).texts
            == at.generate(lm, [], c, end="eos", **kw).texts)


def test_a_bad_end_policy_is_refused_by_name():
    lm, c, _ = ends_or_goes_on()
    with pytest.raises(ValueError, match="end must be one of 'leave', 'eos'"):
        at.generate(lm, [], c, end="stop")
    with pytest.raises(ValueError, match="end must be one of"):
        at.exact_distribution(lm, [], c, end=None)


def test_lazy_matchers_end_only_at_eos():
    lm, c, max_new = ends_or_goes_on()
    strings = [s.decode() for s in c.strings]
    oracle = at.constraints.predicate(lambda t: any(s.startswith(t) for s in strings),
                                      lambda t: t in strings)
    kw = dict(max_new_tokens=max_new, fast_forward=False)
    assert (at.exact_distribution(lm, [], oracle, end="leave", **kw)
            == at.exact_distribution(lm, [], oracle, end="eos", **kw))


# --- dead before any model call ---------------------------------------------------------


def test_a_prefix_that_cannot_finish_in_time_is_never_sent_to_the_model():
    asked: list[tuple[int, ...]] = []
    weights = hashed_weights(4, b"dead")

    def next_probs(prefix):
        asked.append(tuple(prefix))
        return weights(prefix)

    lm = at.TableLM([b"a", b"b", b"aa", b"<eos>"], next_probs, eos=3)
    c = at.constraints.choice(["aaa", "b"])
    dist = at.exact_distribution(lm, [], c, max_new_tokens=3)
    assert {lm.vocab.decode(s) for s in dist} == {b"aaa", b"b"}
    # "a a" is two tokens in, one left: only EOS may follow there, and "aa" is not a
    # string, so the constraint alone says it is dead.
    assert (0, 0) not in asked
    assert set(asked) == {(), (0,), (2,), (1,), (0, 2), (2, 0)}


def test_the_second_to_last_position_keeps_only_tokens_that_can_close():
    # regex("aaaa|b") is choice(["aaaa", "b"]) as a grammar, whose matcher knows the tokens
    # after which the text can end (Matcher.closing); the choice's default knows nothing.
    asked: list[tuple[int, ...]] = []
    weights = hashed_weights(4, b"closing")

    def next_probs(prefix):
        asked.append(tuple(prefix))
        return weights(prefix)

    lm = at.TableLM([b"a", b"b", b"aa", b"<eos>"], next_probs, eos=3)
    for end in ("leave", "eos"):
        asked.clear()
        grammar = at.exact_distribution(lm, [], at.constraints.regex("aaaa|b"),
                                        max_new_tokens=3, end=end)
        # One token in, two left: "a" closes with no token ("aa", "aaa" are not accepted)
        # and so is never sent; after "aa" only "aa" is kept, so "aaa" is never made.
        assert (0,) not in asked and (2, 0) not in asked
        assert set(asked) == {(), (1,), (2,), (2, 2)}
        asked.clear()
        plain = at.exact_distribution(lm, [], at.constraints.choice(["aaaa", "b"]),
                                      max_new_tokens=3, end=end)
        assert (0,) in asked
        assert grammar.keys() == plain.keys() == {(1, 3), (2, 2, 3)}
        for seq, p in plain.items():
            assert grammar[seq] == pytest.approx(p, rel=1e-12)


# --- the fallback of a search past its budget -------------------------------------------


def bits():
    lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    return lm, at.constraints.choice(["00000"] + [f"1{i:04b}" for i in range(16)])


@pytest.mark.parametrize("method", ["asap", "adaptrack", "exact"])
def test_a_search_past_its_budget_is_finished_by_cd_and_says_so(method):
    lm, c = bits()
    with pytest.warns(at.SearchFallbackWarning, match="drawn by CD"):
        res = at.generate(lm, [], c, method=method, n=6, seed=0, max_nodes=8, end="eos")
    assert len(res.samples) == 6 and all(s.valid for s in res.samples)
    fell = [s.fallback for s in res.samples]
    assert any(fell) and res.stats["fallback_samples"] == sum(fell)
    assert "max_nodes=8" in res.fallback


def test_fallback_none_raises_the_budget_with_the_finished_samples():
    lm, c = bits()
    with pytest.raises(at.TreeLimitError, match="max_nodes") as err:
        at.generate(lm, [], c, method="exact", n=6, seed=0, max_nodes=8, end="eos",
                    fallback=None)
    assert not any(s.fallback for s in err.value.partial.samples)
    with pytest.raises(ValueError, match="fallback must be 'cd' or None"):
        at.generate(lm, [], c, fallback="greedy")


@pytest.mark.parametrize("method, kwargs", [("asap", {}), ("adaptrack", {"share_q": True}),
                                            ("exact", {})])
def test_a_search_makes_at_most_its_budget_of_model_calls_then_cd_finishes(method, kwargs):
    """``search_budget`` x n x max_new_tokens model calls (the tokens counted as at least
    64), the first sample due within (n + 1) / 2 samples' shares of it, then the fallback:
    the request's calls are the search's and at most max_new_tokens a CD walk past them
    (docs/design.md §6). Under the *eos* target the binary problem's searches need every
    prefix (31), so no sample comes by the due; without the fallback the request's budget
    holds."""
    lm, c = bits()
    with pytest.warns(at.SearchFallbackWarning, match="drawn by CD"):
        res = at.generate(lm, [], c, method=method, n=4, seed=0, max_new_tokens=6,
                          end="eos", search_budget=0.02, **kwargs)
    budget, due = math.ceil(0.02 * 4 * 64), math.ceil(0.02 * 64 * (4 + 1) / 2)
    fell = sum(s.fallback for s in res.samples)
    assert fell == 4 and all(s.valid for s in res.samples)
    assert f"max_calls={due} (no sample yet: the first is due" in res.fallback
    assert due < budget and res.stats["lm_calls"] <= due + fell * 6
    with pytest.raises(at.CallLimitError, match=f"max_calls={budget}") as err:
        at.generate(lm, [], c, method=method, n=4, seed=0, max_new_tokens=6, end="eos",
                    search_budget=0.02, fallback=None, **kwargs)
    assert not any(s.fallback for s in err.value.partial.samples)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for budget_ in (None, float("inf"), at.SEARCH_BUDGET):
            res = at.generate(lm, [], c, method=method, n=4, seed=0, max_new_tokens=6,
                              end="eos", search_budget=budget_, **kwargs)
            assert res.fallback is None
    # CD never searches: no call budget, however small.
    assert at.generate(lm, [], c, method="cd", n=4, seed=0, max_new_tokens=6,
                       search_budget=0.01).fallback is None


def test_without_a_fallback_independent_walks_keep_the_requests_budget():
    """AdapTrack with a Q per sample and ``fallback=None``: the request's budget holds as
    for the other searches (the tree has 31 prefixes: 6 x 4 calls are too few)."""
    lm, c = bits()
    with pytest.raises(at.CallLimitError, match="max_calls=24"):
        at.generate(lm, [], c, method="adaptrack", n=6, seed=0, max_new_tokens=6, end="eos",
                    search_budget=4 / 64, fallback=None)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1.0, ValueError),
                                        (float("nan"), ValueError), ("3", TypeError),
                                        (True, TypeError)])
def test_a_bad_search_budget_is_refused_by_name(bad, error):
    lm, c = bits()
    with pytest.raises(error, match="search_budget"):
        at.generate(lm, [], c, search_budget=bad)


def test_a_search_within_its_budget_draws_no_fallback():
    lm, c = bits()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = at.generate(lm, [], c, method="exact", n=6, seed=0)
    assert res.fallback is None and res.stats["fallback_samples"] == 0
    assert not any(s.fallback for s in res.samples)


def test_the_fallback_samples_are_cds():
    """Past the budget the missing samples not in flight follow CD's distribution: on the
    paper's binary problem CD puts half its mass on 00000, the target 1/17 (docs/design.md
    §6)."""
    lm, c = bits()
    n = 2000
    with pytest.warns(at.SearchFallbackWarning):
        res = at.generate(lm, [], c, method="exact", n=n, seed=0, max_nodes=8, end="eos")
    drawn = [s for s in res.samples if s.fallback]
    share = sum(s.text == "00000" for s in drawn) / len(drawn)
    assert len(drawn) > n - 10
    assert abs(share - 0.5) < 4.5 * math.sqrt(0.25 / len(drawn))


def test_the_fallback_tries_again_past_a_dead_end():
    """CD walks into "aa", which cannot finish within 4 tokens, with probability 3/4; the
    fallback's later walks mask the dead ends they met and answer "b" (docs/design.md §6),
    where the ``cd`` method returns the dead end."""
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    c = at.constraints.choice(["aaaaa", "b"])
    cd = at.generate(lm, [], c, method="cd", n=40, seed=0, max_new_tokens=4, end="eos")
    assert 0 < sum(not s.complete for s in cd.samples) < 40
    with pytest.warns(at.SearchFallbackWarning):
        res = at.generate(lm, [], c, method="exact", n=40, seed=0, max_nodes=2,
                          max_new_tokens=4, end="eos")
    assert all(s.fallback and s.complete and s.text == "b" for s in res.samples)


def test_the_fallback_answers_from_a_wide_dead_region():
    """Under ``[ab]*ccc`` a walk that has not drawn a c by the seventh token is in a dead
    region as wide as the tree below it, which backing up explores before a new walk
    starts: every search answers (no ``TreeLimitError`` from the fallback's walks) and its
    fallback samples finish (docs/design.md §6)."""
    lm = at.TableLM([b"a", b"b", b"c", b"<eos>"], hashed_weights(4), eos=3)
    for method in ("exact", "adaptrack", "asap"):
        with pytest.warns(at.SearchFallbackWarning):
            res = at.generate(lm, [], at.constraints.regex("[ab]*ccc"), method=method,
                              n=100, seed=0, max_nodes=3, max_new_tokens=10, end="eos")
        assert len(res.samples) == 100 and sum(s.fallback for s in res.samples) > 90
        assert sum(s.complete for s in res.samples) >= 95, method


def test_the_fallback_finishes_a_walk_in_flight_from_where_it_had_reached():
    """A walk that went into "a" when the budget ran out is finished by CD from there
    ("aaaaaa"), where CD from the root would answer "b" half the time (docs/design.md §6)."""
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    c = at.constraints.choice(["aaaaaa", "b"])
    drawn = []
    for seed in range(40):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", at.SearchFallbackWarning)
            res = at.generate(lm, [], c, method="adaptrack", n=1, seed=seed, max_nodes=4,
                              max_new_tokens=8, end="eos")
        drawn += [s.text for s in res.samples if s.fallback]
    assert len(drawn) >= 10 and set(drawn) == {"aaaaaa"}


def test_the_fallback_tries_again_from_where_the_walk_had_reached():
    """From "a" CD walks into "ab", which cannot finish within 4 tokens, with probability
    9/10; the fallback tries "a" again with "ab" masked and answers "ac", where a walk from
    the root would mostly answer "d" (docs/design.md §6)."""
    from adaptrack.sampling.cd import ConstrainedDecoding
    from adaptrack.sampling.engine import Engine
    from adaptrack.sampling.tree import PrefixTree

    table = {(): [1, 0, 0, 9, 1], (0,): [1, 9, 1, 1, 1]}
    lm = at.TableLM([b"a", b"b", b"c", b"d", b"<eos>"],
                    lambda prefix: table.get(tuple(prefix), [1] * 5), eos=4)
    c = at.constraints.choice(["abbbbbb", "ac", "d"])

    class FromA(ConstrainedDecoding):  # a fallback whose search walk had reached "a"
        def walk(self, seen, rng, *, start=None):
            yield from self.expand(self.tree.root)
            reached = self.tree.child(self.tree.root, 0)
            return (yield from super().walk(seen, rng, start=reached))

    def texts(cls: type[ConstrainedDecoding]) -> tuple[list[bytes], int]:
        tree = PrefixTree([], c.bind(lm.vocab), TreeOptions(max_new_tokens=4, end="eos"))
        method, out, engine = cls(tree, greedy=False, tries=4), [], Engine(lm)
        engine.submit(method, 40, 0, lambda i, node, _: out.append(
            lm.vocab.decode(list(node.tokens[:-1]))), width=8)
        engine.run()
        return out, method.restarts

    reached, restarts = texts(FromA)
    assert set(reached) == {b"ac"} and restarts >= 20  # "ab" met ~9 times in 10
    assert texts(ConstrainedDecoding)[0].count(b"d") > 20  # from the root: mostly "d"


def test_the_fallback_backs_up_a_token_at_a_dead_end():
    """After "a" CD picks "c" with probability 9/10, and "ac" cannot finish within 4
    tokens. The fallback backs up to "a" and answers "ab" (P = 1/3: every walk that drew
    "a"); a walk started again from the root would answer "ab" with P = 1/3 · (1/10 + 9/10
    · 1/3) = 0.13. Of 300 samples: mean 100 (s.d. 8.2) against 40 (s.d. 5.8), cut at 70."""
    from adaptrack.sampling.cd import ConstrainedDecoding
    from adaptrack.sampling.engine import Engine
    from adaptrack.sampling.tree import PrefixTree

    table = {(): [1, 0, 0, 1, 1, 0], (0,): [0, 1, 9, 0, 0, 0]}
    lm = at.TableLM([b"a", b"b", b"c", b"d", b"e", b"<eos>"],
                    lambda prefix: table.get(tuple(prefix), [1] * 6), eos=5)
    c = at.constraints.choice(["ab", "accccc", "d", "e"])
    tree = PrefixTree([], c.bind(lm.vocab), TreeOptions(max_new_tokens=4, end="eos"))
    method, out = ConstrainedDecoding(tree, greedy=False, tries=4), []
    engine = Engine(lm)
    engine.submit(method, 300, 0, lambda i, node, _: out.append(
        lm.vocab.decode(list(node.tokens[:-1]))), width=8)
    engine.run()
    assert set(out) <= {b"ab", b"d", b"e"} and out.count(b"ab") > 70
    paper = ConstrainedDecoding(PrefixTree([], c.bind(lm.vocab), TreeOptions(
        max_new_tokens=4, end="eos")), greedy=False)  # tries=1: no backing up
    cut: list[bool] = []
    engine = Engine(lm)
    engine.submit(paper, 300, 0, lambda i, node, _: cut.append(node.complete), width=8)
    engine.run()
    assert 60 < cut.count(False) < 120  # "ac", returned as CD's dead end: P = 0.3


# --- JSON whitespace -----------------------------------------------------------------------


def test_the_json_layout_is_json_dumps_and_json_whitespace_keeps_pretty_json_not_padding():
    vocab = [bytes([i]) for i in range(256)] + [b"<eos>"]
    lm = at.TableLM(vocab, lambda prefix: [1] * 257, eos=256)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a"]}

    def accepts(text: str, s=schema) -> bool:
        m = at.constraints.json_schema(s).bind(lm.vocab)
        return m.accepts([*text.encode(), 256])

    for ok in (json.dumps({"a": 1}), json.dumps({"a": 1, "b": "x y"})):  # the default
        assert accepts(ok), ok
    for bad in ('{"a":1}', '{"a": 1,"b": ""}', '{\n  "a": 1\n}', '{ "a": 1}', '{"a": 1} '):
        assert not accepts(bad), bad
    lines = {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}
    for ok in ('{"a":1}', '{"a": 1}', '{\n  "a": 1\n}', '{\n\t"a": 1\n}', json.dumps({"a": 1})):
        assert accepts(ok, lines), ok
    for bad in ('{   "a": 1}', '{\n\n"a": 1}', '{"a": 1' + "\n" + " " * 21 + "}"):
        assert not accepts(bad, lines), bad
    flexible = {**schema, "x-guidance": {"whitespace_flexible": True}}
    assert accepts('{   "a": 1}', flexible)
    compact = {**schema, "x-guidance": {"whitespace_flexible": False}}
    assert not accepts('{"a": 1}', compact)
