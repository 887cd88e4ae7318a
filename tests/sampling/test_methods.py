"""The methods through ``generate``: seeds, greedy decoding, the best-first search's batched
calls, terminators, model calls per distinct prefix, backtrack limits, top-p and temperature."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2

import adaptrack as at
from adaptrack.sampling.engine import expand
from adaptrack.sampling.tree import PrefixTree
from adaptrack.sampling.treeoptions import TreeOptions
from adaptrack.testing import PROBLEMS, hashed_weights


@pytest.mark.parametrize("method", sorted(at.METHODS))
def test_same_seed_same_samples(method):
    lm, constraint, max_new = PROBLEMS["api_names"]()

    def tokens(seed):
        res = at.generate(lm, [], constraint, method=method, n=20, seed=seed,
                          max_new_tokens=max_new)
        return [s.tokens for s in res.samples]

    assert tokens(5) == tokens(5)
    assert tokens(5) != tokens(6)


def test_greedy_methods():
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    dist = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    best = max(dist, key=dist.get)
    for method in at.METHODS:
        res = at.generate(lm, [], constraint, method=method, n=3, temperature=0,
                          max_new_tokens=max_new)
        again = at.generate(lm, [], constraint, method=method, n=3, temperature=0,
                            max_new_tokens=max_new)
        assert [s.tokens for s in res.samples] == [s.tokens for s in again.samples]
        if method != "asap":  # ASAp's argmax moves as its shared Q learns
            assert len({s.tokens for s in res.samples}) == 1, method
        if method == "exact":
            assert res.samples[0].tokens == best
        if method == "cd":  # argmax of the masked distribution at every step
            tree = PrefixTree([], constraint.bind(lm.vocab), TreeOptions(max_new_tokens=max_new))
            node = tree.root
            for tok in res.samples[0].tokens:
                exp = expand(lm, tree, node)
                assert tok == exp.ids[np.argmax(exp.p)]
                node = tree.child(node, tok)


@pytest.mark.parametrize("seed", range(6))
def test_exact_greedy_is_the_most_probable_valid_sequence_with_batched_calls(seed):
    """The best-first search expands the prefixes it would visit next together (one model
    call for several rows); the answer stays the argmax of the enumerated target."""
    rng = random.Random(seed)
    vocab = [b"a", b"b", b"c", b"ab", b"bc", b"<eos>"]
    lm = at.TableLM(vocab, hashed_weights(len(vocab), bytes([seed])), eos=5)
    strings = sorted({"".join(rng.choice("abc") for _ in range(rng.randint(1, 5)))
                      for _ in range(12)})
    c = at.constraints.choice(strings)
    dist = at.exact_distribution(lm, [], c, max_new_tokens=6)
    best = max(dist.values())
    calls = []
    ask = lm.next_logprobs
    lm.next_logprobs = lambda prefixes: calls.append(len(prefixes)) or ask(prefixes)  # type: ignore[method-assign]
    res = at.generate(lm, [], c, method="exact", n=1, temperature=0, max_new_tokens=6)
    assert dist[res.samples[0].tokens] == pytest.approx(best)
    assert max(calls) > 1  # several prefixes in one call


def test_terminator_ends_the_sequence_inside_a_token_and_text_is_cut():
    vocab = [b"tf", b".", b"nn", b"relu", b"relu(x", b"(", b"<eos>"]
    lm = at.TableLM(vocab, lambda p: [1, 1, 1, 1, 30, 1, 1], eos=6)
    c = at.constraints.choice([".nn.relu", ".nn"], terminators="(")
    res = at.generate(lm, "tf", c, method="exact", n=50, seed=0, max_new_tokens=6)
    texts = Counter(s.text for s in res.samples)
    assert set(texts) <= {".nn.relu(", ".nn("}
    assert texts[".nn.relu("] > 0
    assert any(s.tokens[-1] == 4 for s in res.samples)  # "relu(x" ended it; "x" was cut


def test_unconstrained_ignores_the_constraint_and_reports_validity():
    lm, bits, _ = PROBLEMS["binary"]()
    res = at.generate(lm, [], bits, method="unconstrained", n=300, seed=0, max_new_tokens=6)
    assert any(not s.valid for s in res.samples)
    for s in res.samples:
        assert s.valid == (s.complete and s.text in {"00000"} | {f"1{i:04b}" for i in range(16)})
        assert s.complete == (s.tokens[-1] == 2)
        assert len(s.tokens) <= 6
    assert any(not s.complete for s in res.samples)  # ran out of tokens


def test_lm_calls_count_distinct_prefixes_shared_by_all_samples():
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    before = lm.calls
    res = at.generate(lm, [], constraint, method="cd", n=500, seed=0, max_new_tokens=max_new,
                      fast_forward=False)
    assert res.stats["lm_calls"] == lm.calls - before
    distinct_prefixes = {s.tokens[:k] for s in res.samples for k in range(len(s.tokens))}
    assert res.stats["lm_calls"] == len(distinct_prefixes)
    assert all(s.lm_requests == len(s.tokens) for s in res.samples)
    # Fast-forward: a forced chain is one call however many prefixes it evaluates.
    before = lm.calls
    ff = at.generate(lm, [], constraint, method="cd", n=500, seed=0, max_new_tokens=max_new)
    chain_prefixes = lm.calls - before - (ff.stats["lm_calls"] - ff.stats["ff_sequences"])
    assert ff.stats["ff_sequences"] > 0
    assert chain_prefixes == ff.stats["ff_sequences"] + ff.stats["forced_tokens"]
    assert ff.stats["lm_calls"] < res.stats["lm_calls"]


def test_backtrack_limits():
    lm, constraint, max_new = PROBLEMS["api_names"]()
    runs = {}
    for opts in ({}, {"max_backtrack": 0}, {"max_backtrack": 1}, {"min_backtrack_prob": 0.9}):
        res = at.generate(lm, [], constraint, method="adaptrack", n=300, seed=0,
                          max_new_tokens=max_new, **opts)
        assert all(s.valid for s in res.samples)
        runs[tuple(opts.items())] = res.stats["backtracks"]
    assert runs[()] > runs[(("max_backtrack", 1),)] >= runs[(("max_backtrack", 0),)]
    assert runs[(("min_backtrack_prob", 0.9),)] < runs[()]


def test_exact_with_top_p_samples_the_truncated_target():
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    target = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new, top_p=0.7)
    full = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    assert len(target) < len(full)
    n = 5000
    res = at.generate(lm, [], constraint, method="exact", n=n, seed=1, top_p=0.7,
                      max_new_tokens=max_new)
    seen = Counter(s.tokens for s in res.samples)
    assert set(seen) <= set(target)
    stat = sum((seen.get(s, 0) - p * n) ** 2 / (p * n) for s, p in target.items())
    assert chi2.sf(stat, len(target) - 1) > 1e-3


def test_temperature_sharpens_the_target():
    lm = at.TableLM([b"a", b"b", b"<eos>"], hashed_weights(3, b"t"), eos=2)
    c = at.constraints.choice(["a", "b", "ab", "ba"])
    cold = at.exact_distribution(lm, [], c, max_new_tokens=3, temperature=0.3)
    warm = at.exact_distribution(lm, [], c, max_new_tokens=3)
    assert max(cold.values()) > max(warm.values())
