"""Fast-forward inside the samplers: forced chains cost one model call and enter Q exactly;
forced, they condition the target on canonical tokenization of forced bytes; prefilled (the
searching methods' default), they change no sample (design.md §2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chi2

import adaptrack as at
from adaptrack.constraints import choice, json_schema
from adaptrack.sampling.engine import expand
from adaptrack.sampling.fastforward import FastForward
from adaptrack.sampling.qtable import QTable
from adaptrack.sampling.tree import PrefixTree
from adaptrack.sampling.treeoptions import TreeOptions
from adaptrack.testing import hashed_weights
from adaptrack.tokenization.tokenizer import Tokenizer

# "xyzw" is forced at the start. Greedy (TableLM's canonical) tokens: "xyz" "w"; "w1" could
# span the end, so "w" is held back and only "xyz" is forced.
VOCAB = [b"x", b"y", b"z", b"w", b"xy", b"zw", b"xyz", b"w1", b"1", b"2", b"<eos>"]
EOS = len(VOCAB) - 1
NAMES = choice(["xyzw1", "xyzw2", "xyzw12"])
# "xyzxyzw" is forced: the chain is "xyz" "xyz", and "w" is held back.
LONG = choice(["xyzxyzw1", "xyzxyzw2", "xyzxyzw12"])
FORCE = FastForward(force=True)


class CountingLM(at.TableLM):
    """A TableLM that records how often it is asked, per entry point."""

    def __init__(self) -> None:
        super().__init__(VOCAB, hashed_weights(len(VOCAB), b"ff"), eos=EOS)
        self.along_calls = 0

    def _logprobs_along_many(self, requests):
        self.along_calls += len(requests)
        return super()._logprobs_along_many(requests)


def test_the_forced_chain_is_canonical_and_one_call() -> None:
    lm = CountingLM()
    res = at.generate(lm, [], NAMES, method="cd", n=20, seed=0, max_new_tokens=6)
    assert all(s.valid for s in res.samples)
    assert all(s.tokens[0] == VOCAB.index(b"xyz") for s in res.samples)
    assert res.stats["ff_sequences"] >= 1 and res.stats["forced_tokens"] >= 1
    assert lm.along_calls == res.stats["ff_sequences"]
    plain = at.generate(CountingLM(), [], NAMES, method="cd", n=20, seed=0, max_new_tokens=6,
                        fast_forward=False)
    assert plain.stats["ff_sequences"] == 0
    assert res.stats["lm_calls"] < plain.stats["lm_calls"]
    # The chain's head counts as one request; the forced node does not count again.
    for s in res.samples:
        assert s.lm_requests <= len(s.tokens)


def test_target_is_conditioned_on_canonical_forced_tokens() -> None:
    lm = CountingLM()
    full = at.exact_distribution(lm, [], NAMES, max_new_tokens=6, fast_forward=False)
    assert at.exact_distribution(lm, [], NAMES, max_new_tokens=6) == full  # prefilled
    ff = at.exact_distribution(lm, [], NAMES, max_new_tokens=6, fast_forward=FORCE)
    assert set(ff) < set(full)
    assert all(seq[0] == VOCAB.index(b"xyz") for seq in ff)
    ratios = [ff[s] / full[s] for s in ff]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-12)  # P_ff ∝ P on its support
    assert ratios[0] == pytest.approx(1 / sum(full[s] for s in ff), rel=1e-12)


@pytest.mark.parametrize("method, options", [("exact", {}), ("adaptrack", {"share_q": True}),
                                             ("asap", {})])
def test_samplers_follow_the_conditioned_target(method: str, options: dict) -> None:
    lm = CountingLM()
    target = at.exact_distribution(lm, [], NAMES, max_new_tokens=6, fast_forward=FORCE)
    n = 3000 if method != "asap" else 6000
    res = at.generate(lm, [], NAMES, method=method, n=n, seed=1, max_new_tokens=6,
                      fast_forward=FORCE, **options)
    counts: dict = {}
    for s in res.samples:
        counts[s.tokens] = counts.get(s.tokens, 0) + 1
    assert set(counts) <= set(target)
    stat = sum((counts.get(s, 0) - p * n) ** 2 / (p * n) for s, p in target.items())
    assert chi2.sf(stat, len(target) - 1) > 1e-3, (counts, target)


@pytest.mark.parametrize("method, options", [
    ("exact", {}), ("adaptrack", {}), ("adaptrack", {"share_q": True}),
    ("adaptrack", {"share_q": True, "max_backtrack": 1}), ("asap", {})])
def test_searching_methods_prefill_chains_without_changing_samples(method: str,
                                                                   options: dict) -> None:
    """By default asap, adaptrack and exact only prefill a forced chain: every tokenization
    of the forced bytes stays valid, so they draw the samples of fast_forward=False (the
    model is exact), and a walk along the canonical tokens finds their distributions in the
    chain's one call."""
    kw = dict(method=method, n=200, seed=2, max_new_tokens=8, **options)
    off = at.generate(CountingLM(), [], LONG, fast_forward=False, **kw)
    lm = CountingLM()
    on = at.generate(lm, [], LONG, **kw)
    assert [s.tokens for s in on.samples] == [s.tokens for s in off.samples]
    assert [s.logprob for s in on.samples] == pytest.approx([s.logprob for s in off.samples])
    xyz = VOCAB.index(b"xyz")
    assert {s.tokens[:1] for s in on.samples} > {(xyz,)}  # other tokenizations are drawn
    assert on.stats["ff_sequences"] >= 1 and on.stats["forced_tokens"] >= 2
    assert on.stats["lm_calls"] < off.stats["lm_calls"]
    forced = at.generate(CountingLM(), [], LONG, fast_forward=FORCE, **kw)
    assert {s.tokens[:2] for s in forced.samples} == {(xyz, xyz)}


def test_cd_forces_by_default() -> None:
    kw = dict(method="cd", n=50, seed=3, max_new_tokens=8)
    on = at.generate(CountingLM(), [], LONG, **kw)
    assert [s.tokens for s in on.samples] == [
        s.tokens for s in at.generate(CountingLM(), [], LONG, fast_forward=FORCE, **kw).samples]
    prefilled = at.generate(CountingLM(), [], LONG, fast_forward=FastForward(force=False),
                            **kw)
    off = at.generate(CountingLM(), [], LONG, fast_forward=False, **kw)
    assert [s.tokens for s in prefilled.samples] == [s.tokens for s in off.samples]
    with pytest.raises(TypeError, match="force"):
        FastForward(force=1)  # type: ignore[arg-type]


def test_q_uses_the_forced_tokens_probabilities() -> None:
    """Formula 2 through a forced chain: Q[root] = P(xyz | root) · Q[xyz], with the forced
    token's own model probability, once the chain's end is opened."""
    lm = CountingLM()
    tree = PrefixTree([], NAMES.bind(lm.vocab),
                      TreeOptions(max_new_tokens=6, fast_forward=FastForward()),
                      tokenizer=Tokenizer.for_model(lm))
    q = QTable(tree)
    expand(lm, tree, tree.root)  # the test is the driver: it asks the model
    q.open(tree.root)
    xyz = VOCAB.index(b"xyz")
    p_root = np.exp(lm.next_logprobs([()])[0])
    assert tree.root.expansion.ids.tolist() == [xyz]
    assert q.q(tree.root) == pytest.approx(p_root[xyz], rel=1e-12)
    head = tree.child(tree.root, xyz)
    assert head.in_chain and head.expansion is not None  # from the same call
    assert tree.lm_calls == 1 and tree.ff_sequences == 1
    expand(lm, tree, head)  # the test is the driver: it asks the model
    q.open(head)
    assert q.q(tree.root) == pytest.approx(p_root[xyz] * head.expansion.p.sum(), rel=1e-12)


def test_prefilled_chain_nodes_belong_to_the_canonical_tokens_only() -> None:
    """Prefilled, the root keeps every valid token; the forced tokens' nodes come with their
    expansions from the one call, and a walk that leaves the chain by another token starts
    afresh: its node is not in the chain and computes its own forced bytes."""
    lm = CountingLM()
    tree = PrefixTree([], LONG.bind(lm.vocab),
                      TreeOptions(max_new_tokens=8, fast_forward=FastForward(force=False)),
                      tokenizer=Tokenizer.for_model(lm))
    xyz, x = VOCAB.index(b"xyz"), VOCAB.index(b"x")
    expand(lm, tree, tree.root)
    assert tree.root.pending == (xyz, xyz)
    assert set(tree.root.expansion.ids.tolist()) == {x, VOCAB.index(b"xy"), xyz}
    assert tree.lm_calls == 1 and tree.num_nodes == 3  # the root and the chain's two nodes
    head = tree.child(tree.root, xyz)
    assert head.in_chain and head.pending == (xyz,) and head.expansion is not None
    other = tree.child(tree.root, x)
    assert not other.in_chain and other.pending is None and other.expansion is None
    expand(lm, tree, other)
    y, z = VOCAB.index(b"y"), VOCAB.index(b"z")
    assert other.pending == (y, z, xyz) and tree.lm_calls == 2  # "yzxyzw" less the held "w"


def test_chain_longer_than_the_budget() -> None:
    lm = at.TableLM([b"a", b"b", b"<eos>"], hashed_weights(3, b"len"), eos=2)
    long = choice(["aaaaab", "aaaaaa"])
    for method in ("exact", "cd"):  # refused up front: both texts need 7 tokens
        with pytest.raises(at.NoValidSequenceError, match="at least 7 tokens"):
            at.generate(lm, [], long, method=method, max_new_tokens=4, seed=0)
    assert lm.calls == 0
    ok = at.generate(lm, [], long, method="adaptrack", max_new_tokens=7, n=5, seed=0)
    assert {s.text for s in ok.samples} <= {"aaaaab", "aaaaaa"}


def test_json_schema_fast_forward_on_a_toy_vocabulary() -> None:
    vocab = [b'{"', b"name", b'":', b'"', b"a", b"b", b'"}', b"}", b":", b"na", b"me",
             b'{', b"<eos>"]
    lm = at.TableLM(vocab, hashed_weights(len(vocab), b"json"), eos=len(vocab) - 1)
    schema = json_schema({"type": "object", "properties": {"name": {"enum": ["a", "b"]}},
                          "required": ["name"], "additionalProperties": False,
                          "x-guidance": {"whitespace_flexible": False}})
    for method in ("cd", "adaptrack", "exact"):
        res = at.generate(lm, [], schema, method=method, n=10, seed=0, max_new_tokens=12)
        assert all(s.valid for s in res.samples if s.complete)
        assert {s.text for s in res.samples if s.complete} <= {'{"name":"a"}', '{"name":"b"}'}
        assert res.stats["forced_tokens"] >= 2


def test_fast_forward_options() -> None:
    lm = CountingLM()
    never = at.exact_distribution(lm, [], NAMES, max_new_tokens=6,
                                  fast_forward=at.FastForward(max_tokens=0, force=True))
    # max_tokens=0 holds nothing back: "xyz" "w" is forced, so "w1" never starts a name.
    assert all(seq[:2] == (VOCAB.index(b"xyz"), VOCAB.index(b"w")) for seq in never)
    careful = at.exact_distribution(lm, [], NAMES, max_new_tokens=6,
                                    fast_forward=at.FastForward(conservative=True, force=True))
    assert set(careful) == set(at.exact_distribution(lm, [], NAMES, max_new_tokens=6,
                                                     fast_forward=FORCE))
    with pytest.raises(TypeError, match="fast_forward"):
        at.generate(lm, [], NAMES, fast_forward="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tokens"):
        at.FastForward(max_tokens=-1)


def test_logprobs_along_default_rows() -> None:
    lm = CountingLM()
    rows = lm.logprobs_along((0,), (1, 2))
    want = lm.next_logprobs([(0,), (0, 1), (0, 1, 2)])
    assert rows.shape == want.shape and np.allclose(rows, want)
    assert math.isclose(float(np.exp(rows[0]).sum()), 1.0)


def test_logprobs_along_many_default_rows() -> None:
    lm = CountingLM()
    got = lm.logprobs_along_many([((0,), (1, 2)), ((3,), ()), ((4, 5), (6,))])
    assert [g.shape[0] for g in got] == [3, 1, 2]
    assert np.allclose(got[2], lm.next_logprobs([(4, 5), (4, 5, 6)]))


class FailingForcing(at.constraints.Constraint):
    """``NAMES`` whose matcher raises ``GrammarError`` when asked for forced bytes (as a
    grammar matcher does past llguidance's resource limits)."""

    def bind(self, vocab):
        m = NAMES.bind(vocab)

        def forced_bytes(state, limit=None):
            raise at.GrammarError("llguidance failed on this grammar: (a test)")

        m.forced_bytes = forced_bytes
        return m


@pytest.mark.parametrize("method", ["cd", "asap", "adaptrack", "exact"])
def test_a_constraints_error_in_forced_tokens_reaches_the_caller(method: str) -> None:
    # It is a ValueError too: a catch of ValueError around forced_tokens dropped the chain
    # in silence (cd's samples then follow another target).
    with pytest.raises(at.GrammarError, match="a test"):
        at.generate(CountingLM(), [], FailingForcing(), method=method, n=3, seed=0,
                    max_new_tokens=6)


def spaced_tokenizer() -> at.Tokenizer:
    """A tokenizer whose ids do not reproduce the text: it puts a ``1`` first, as a
    SentencePiece tokenizer puts a space."""
    vocab = CountingLM().vocab
    return at.Tokenizer(vocab, lambda text: [VOCAB.index(b"1"),
                                             *vocab.longest_match(text.encode())])


@pytest.mark.parametrize("method", ["cd", "asap", "adaptrack", "exact"])
def test_forced_bytes_the_tokenizer_cannot_encode_get_no_chain_and_change_nothing(
        method: str) -> None:
    # The documented fallback: no chain at such a prefix, counted; every valid token stays
    # valid there, so the samples are those without fast-forward, forced or prefilled.
    for force in (True, False, None):
        ff = FastForward(tokenizer=spaced_tokenizer(), force=force)
        res = at.generate(CountingLM(), [], LONG, method=method, n=12, seed=3,
                          max_new_tokens=8, fast_forward=ff)
        plain = at.generate(CountingLM(), [], LONG, method=method, n=12, seed=3,
                            max_new_tokens=8, fast_forward=False)
        assert res.stats["ff_unencodable"] >= 1 and res.stats["ff_sequences"] == 0
        assert plain.stats["ff_unencodable"] == 0
        assert [s.tokens for s in res.samples] == [s.tokens for s in plain.samples]
    dist = at.exact_distribution(CountingLM(), [], LONG, max_new_tokens=8,
                                 fast_forward=FastForward(tokenizer=spaced_tokenizer(),
                                                          force=True))
    assert dist == at.exact_distribution(CountingLM(), [], LONG, max_new_tokens=8,
                                         fast_forward=False)


def test_a_chain_is_fed_whole_where_asked_though_not_eager() -> None:
    """``plan(eager=False)`` leaves a chain's head a plain prefix (a search walk may leave
    it); the fallback's CD walks, named in ``eager_for``, feed the chain at once as cd
    does."""
    lm = CountingLM()
    tree = PrefixTree([], LONG.bind(lm.vocab),
                      TreeOptions(max_new_tokens=8, fast_forward=FastForward(force=False)),
                      tokenizer=Tokenizer.for_model(lm))
    root = tree.root
    assert tree.plan([root], eager=False) == ([root], [])
    assert tree.plan([root], eager=False, eager_for=[root]) == ([], [root])
    assert tree.plan([root]) == ([], [root])
