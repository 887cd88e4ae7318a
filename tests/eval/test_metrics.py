"""Tests for adaptrack.eval.metrics."""

from __future__ import annotations

import doctest
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from adaptrack.eval import metrics
from adaptrack.eval.metrics import (
    em_at_k,
    empirical_distribution,
    kl_divergence,
    kl_to_distribution,
    mean_at_k,
    pass_at_k,
    sample_kl,
    sliding_kl,
)

LN2 = math.log(2.0)
# KL({a: .5, b: .5} || {a: .25, b: .75}) = 0.5 ln 2 + 0.5 ln(2/3) = 0.5 ln(4/3)
HALF_VS_QUARTER = 0.5 * math.log(4.0 / 3.0)


def test_docstring_examples_run() -> None:
    result = doctest.testmod(metrics, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


# --------------------------------------------------------------------------------------------
# pass@k / EM@k
# --------------------------------------------------------------------------------------------

SMALL_GRID = [(n, c, k) for n in range(1, 13) for c in range(n + 1) for k in range(1, n + 1)]


@pytest.mark.parametrize(("n", "c", "k"), SMALL_GRID)
def test_pass_at_k_matches_binomial_formula(n: int, c: int, k: int) -> None:
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [t for t in SMALL_GRID if t[0] <= 7])
def test_pass_at_k_matches_subset_enumeration(n: int, c: int, k: int) -> None:
    # Samples 0..c-1 are the correct ones; count k-subsets containing at least one of them.
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(any(i < c for i in subset) for subset in subsets)
    assert pass_at_k(n, c, k) == pytest.approx(hits / len(subsets), abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(200, 7, 10), (2000, 1000, 100), (500, 1, 499)])
def test_pass_at_k_is_accurate_for_large_n(n: int, c: int, k: int) -> None:
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-10, abs=1e-12)


def test_pass_at_k_edge_cases() -> None:
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 6, 5) == 1.0  # n - c = 4 < k = 5
    assert pass_at_k(10, 1, 10) == 1.0
    assert pass_at_k(1, 1, 1) == 1.0
    assert pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


def test_pass_at_k_is_monotone_in_c_and_k() -> None:
    n = 20
    for k in range(1, n + 1):
        by_c = [pass_at_k(n, c, k) for c in range(n + 1)]
        assert all(a <= b + 1e-15 for a, b in itertools.pairwise(by_c))
    for c in range(n + 1):
        by_k = [pass_at_k(n, c, k) for k in range(1, n + 1)]
        assert all(a <= b + 1e-15 for a, b in itertools.pairwise(by_k))


def test_pass_at_k_accepts_numpy_integers_and_returns_python_float() -> None:
    value = pass_at_k(np.int64(10), np.int32(3), np.int16(2))
    assert type(value) is float
    assert value == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))


@pytest.mark.parametrize(
    ("n", "c", "k", "match"),
    [
        (0, 0, 1, r"n \(number of samples\) must be >= 1, got n=0"),
        (-3, 0, 1, r"n .* must be >= 1"),
        (5, -1, 1, r"0 <= c <= n=5, got c=-1"),
        (5, 6, 1, r"0 <= c <= n=5, got c=6"),
        (5, 2, 0, r"1 <= k <= n=5, got k=0"),
        (5, 2, 6, r"1 <= k <= n=5, got k=6"),
    ],
)
def test_pass_at_k_rejects_out_of_range_arguments(n: int, c: int, k: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError, match=match):
        em_at_k(n, c, k)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 5.0, "c": 1, "k": 1}, r"n must be an integer, got float"),
        ({"n": 5, "c": 1.5, "k": 1}, r"c must be an integer, got float"),
        ({"n": 5, "c": 1, "k": True}, r"k must be an integer, got bool"),
        ({"n": "5", "c": 1, "k": 1}, r"n must be an integer, got str"),
    ],
)
def test_pass_at_k_rejects_non_integers(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        pass_at_k(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("n", "c", "k"), SMALL_GRID[::7])
def test_em_at_k_is_the_same_estimator(n: int, c: int, k: int) -> None:
    assert em_at_k(n, c, k) == pass_at_k(n, c, k)


def test_mean_at_k_averages_over_problems() -> None:
    counts = [(10, 10), (10, 0), (10, 5), (4, 1)]
    expected = (1.0 + 0.0 + 0.5 + 0.25) / 4
    assert mean_at_k(counts, 1) == pytest.approx(expected)
    # k = 2: each problem's own estimate, then averaged
    expected_k2 = np.mean([pass_at_k(n, c, 2) for n, c in counts])
    assert mean_at_k(iter(counts), 2) == pytest.approx(expected_k2)


def test_mean_at_k_rejects_empty_and_bad_pairs() -> None:
    with pytest.raises(ValueError, match="counts is empty"):
        mean_at_k([], 1)
    with pytest.raises(ValueError, match=r"counts\[1\] = \(3, 4\): .*got c=4"):
        mean_at_k([(3, 1), (3, 4)], 1)
    with pytest.raises(ValueError, match=r"counts\[0\] = \(3, 1\): .*got k=5"):
        mean_at_k([(3, 1)], 5)
    with pytest.raises(ValueError, match=r"counts\[0\] must be an \(n, c\) pair"):
        mean_at_k([(3, 1, 2)], 1)  # type: ignore[list-item]


# --------------------------------------------------------------------------------------------
# empirical distribution and KL
# --------------------------------------------------------------------------------------------


def test_empirical_distribution_frequencies_and_order() -> None:
    dist = empirical_distribution(iter(["b", "a", "b", "c", "b", "a"]))
    assert list(dist) == ["b", "a", "c"]
    assert dist == pytest.approx({"b": 0.5, "a": 1 / 3, "c": 1 / 6})
    assert math.fsum(dist.values()) == pytest.approx(1.0)


def test_empirical_distribution_handles_arbitrary_hashables() -> None:
    dist = empirical_distribution([(1, 2), (1, 2), None, 3.5])
    assert dist == {(1, 2): 0.5, None: 0.25, 3.5: 0.25}


def test_empirical_distribution_rejects_empty() -> None:
    with pytest.raises(ValueError, match="samples is empty"):
        empirical_distribution([])


def test_kl_to_distribution_hand_computed() -> None:
    samples = ["a", "b"] * 3
    assert kl_to_distribution(samples, {"a": 0.25, "b": 0.75}) == pytest.approx(HALF_VS_QUARTER)
    # Unnormalized target weights give the same value.
    assert kl_to_distribution(samples, {"a": 1, "b": 3}) == pytest.approx(HALF_VS_QUARTER)
    # Target outcomes never sampled only matter through normalization.
    value = kl_to_distribution(["a"], {"a": 0.5, "z": 0.5})
    assert value == pytest.approx(LN2)


def test_kl_to_distribution_is_zero_for_matching_distribution() -> None:
    samples = ["x", "y", "y", "z", "z", "z"]
    assert kl_to_distribution(samples, {"x": 1, "y": 2, "z": 3}) == pytest.approx(0.0, abs=1e-15)
    assert kl_to_distribution(samples, {"x": 1, "y": 2, "z": 3}) >= 0.0


def test_kl_to_distribution_infinite_cases() -> None:
    assert kl_to_distribution(["a", "c"], {"a": 1.0, "b": 1.0}) == math.inf
    assert kl_to_distribution(["a", "b"], {"a": 1.0, "b": 0.0}) == math.inf


def test_kl_to_distribution_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    outcomes = list(range(6))
    target = rng.dirichlet(np.ones(6))
    samples = rng.choice(outcomes, size=500, p=target).tolist()
    emp = np.bincount(samples, minlength=6) / len(samples)
    expected = stats.entropy(emp, target)
    got = kl_to_distribution(samples, dict(zip(outcomes, target, strict=True)))
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ({"a": -0.1, "b": 1.0}, r"finite non-negative weights, got target\['a'\]=-0.1"),
        ({"a": math.nan}, r"finite non-negative weights, got target\['a'\]=nan"),
        ({"a": math.inf}, r"finite non-negative weights"),
        ({"a": 0.0, "b": 0.0}, r"positive total weight"),
        ({}, r"positive total weight"),
    ],
)
def test_kl_to_distribution_rejects_bad_targets(target: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kl_to_distribution(["a"], target)


def test_kl_to_distribution_rejects_empty_samples() -> None:
    with pytest.raises(ValueError, match="samples is empty"):
        kl_to_distribution([], {"a": 1.0})


def test_kl_divergence_hand_computed_and_asymmetric() -> None:
    p = {"a": 0.5, "b": 0.5}
    q = {"a": 0.25, "b": 0.75}
    assert kl_divergence(p, q) == pytest.approx(HALF_VS_QUARTER)
    reverse = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert kl_divergence(q, p) == pytest.approx(reverse)
    assert kl_divergence(q, p) != pytest.approx(kl_divergence(p, q))


def test_kl_divergence_normalizes_and_ignores_zero_mass() -> None:
    assert kl_divergence({"a": 2, "b": 2}, {"a": 1, "b": 3}) == pytest.approx(HALF_VS_QUARTER)
    # p = 0 outcomes contribute nothing, even if q = 0 or absent there.
    assert kl_divergence({"a": 1.0, "b": 0.0}, {"a": 1.0}) == 0.0
    assert kl_divergence({"a": 1.0}, {"a": 1.0, "b": 1.0}) == pytest.approx(LN2)


def test_kl_divergence_infinite_where_q_vanishes() -> None:
    assert kl_divergence({"a": 1.0, "b": 1.0}, {"a": 1.0}) == math.inf
    assert kl_divergence({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 0.0}) == math.inf


def test_kl_divergence_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for _ in range(5):
        p = rng.dirichlet(np.ones(8))
        q = rng.dirichlet(np.ones(8))
        got = kl_divergence(dict(enumerate(p)), dict(enumerate(q)))
        assert got == pytest.approx(stats.entropy(p, q), rel=1e-12)


def test_kl_divergence_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"p must have a positive total weight"):
        kl_divergence({"a": 0.0}, {"a": 1.0})
    with pytest.raises(ValueError, match=r"got q\['b'\]=-1"):
        kl_divergence({"a": 1.0}, {"a": 1.0, "b": -1})


# --------------------------------------------------------------------------------------------
# sample-based KL
# --------------------------------------------------------------------------------------------

TARGET = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}
LOG_TARGET = {s: math.log(p) for s, p in TARGET.items()}


@pytest.mark.parametrize(
    "samples",
    [["a", "b", "c", "d"], ["d", "d", "c"], ["a"] * 5 + ["d"] * 3, list("abcdddcb")],
)
def test_sample_kl_equals_kl_to_target_with_full_support(samples: list[str]) -> None:
    expected = kl_to_distribution(samples, TARGET)
    assert sample_kl(samples, LOG_TARGET, support=TARGET) == pytest.approx(expected, rel=1e-12)
    # Unnormalized log-probabilities (the LM's mass on a grammar is < 1) give the same value.
    shifted = {s: lp - 7.3 for s, lp in LOG_TARGET.items()}
    assert sample_kl(samples, shifted, support=TARGET) == pytest.approx(expected, rel=1e-12)


def test_sample_kl_default_support_is_distinct_samples() -> None:
    lp = {"x": math.log(0.1), "y": math.log(0.3), "z": math.log(0.6)}
    # Default support {x, y}: p~ = (0.25, 0.75), empirical = (0.5, 0.5).
    assert sample_kl(["x", "y", "y", "x"], lp) == pytest.approx(HALF_VS_QUARTER)
    # With z in the support, p~ = (0.1, 0.3, 0.6).
    expected = 0.5 * math.log(0.5 / 0.1) + 0.5 * math.log(0.5 / 0.3)
    assert sample_kl(["x", "y"], lp, support=["x", "y", "z", "z"]) == pytest.approx(expected)


def test_sample_kl_differences_match_true_kl_differences_on_shared_support() -> None:
    # The LM puts mass 0.5 on a 5-string "grammar"; P_G is that mass renormalized.
    lm = {"a": 0.05, "b": 0.1, "c": 0.15, "d": 0.12, "e": 0.08}
    z = sum(lm.values())
    p_g = {s: v / z for s, v in lm.items()}
    log_lm = {s: math.log(v) for s, v in lm.items()}
    method_a = ["a", "b", "b", "c", "c", "c"]
    method_b = ["c", "c", "b", "a", "a", "a"]
    union = sorted(set(method_a) | set(method_b))  # a strict subset of the grammar
    kl_a = sample_kl(method_a, log_lm, support=union)
    kl_b = sample_kl(method_b, log_lm, support=union)
    true_a = kl_to_distribution(method_a, p_g)
    true_b = kl_to_distribution(method_b, p_g)
    # Each value is off by the shared offset log Z_S - log Z ...
    offset = math.log(sum(lm[s] for s in union)) - math.log(z)
    assert kl_a == pytest.approx(true_a + offset)
    assert kl_b == pytest.approx(true_b + offset)
    assert offset < -0.1
    # ... so the difference between methods is exact.
    assert kl_a - kl_b == pytest.approx(true_a - true_b)


def test_sample_kl_callable_and_mapping_agree_and_callable_called_once_per_element() -> None:
    calls: list[str] = []

    def logprob(s: str) -> float:
        calls.append(s)
        return LOG_TARGET[s]

    samples = ["a", "b", "b", "d", "d", "d"]
    got = sample_kl(samples, logprob, support=["a", "b", "c", "d", "a"])
    assert got == pytest.approx(sample_kl(samples, LOG_TARGET, support=TARGET))
    assert sorted(calls) == ["a", "b", "c", "d"]


def test_sample_kl_is_stable_for_very_negative_logprobs() -> None:
    # Whole-program log-likelihoods of hundreds of nats would underflow a naive exp().
    lp = {"x": -1000.0, "y": -1000.0 + math.log(3.0)}
    value = sample_kl(["x", "y"], lp)
    assert math.isfinite(value)
    assert value == pytest.approx(HALF_VS_QUARTER)


def test_sample_kl_neg_inf_logprob() -> None:
    lp = {"x": math.log(0.5), "y": -math.inf, "z": math.log(0.5)}
    assert sample_kl(["x", "y"], lp) == math.inf
    # -inf on an unsampled support element is fine: it simply carries no mass.
    assert sample_kl(["x", "z"], lp, support=["x", "y", "z"]) == pytest.approx(0.0, abs=1e-15)


def test_sample_kl_rejects_invalid_arguments() -> None:
    lp = {"x": -1.0, "y": -2.0}
    with pytest.raises(ValueError, match=r"support must contain every sample; .* e\.g\. 'y'"):
        sample_kl(["x", "y"], lp, support=["x"])
    with pytest.raises(ValueError, match=r"logprob has no entry for 1 support element.*'w'"):
        sample_kl(["x", "w"], lp)
    with pytest.raises(ValueError, match=r"logprob\('x'\) = nan is not a valid log-probability"):
        sample_kl(["x"], {"x": math.nan})
    with pytest.raises(ValueError, match=r"logprob\('x'\) = inf"):
        sample_kl(["x"], {"x": math.inf})
    with pytest.raises(ValueError, match=r"every support element has log-probability -inf"):
        sample_kl(["x"], {"x": -math.inf})
    with pytest.raises(ValueError, match="support is empty"):
        sample_kl(["x"], lp, support=[])
    with pytest.raises(ValueError, match="samples is empty"):
        sample_kl([], lp)
    with pytest.raises(TypeError, match="logprob must be a Mapping or a callable"):
        sample_kl(["x"], 3.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# sliding KL
# --------------------------------------------------------------------------------------------

SEQ = list("aabbbcabcdddab")


@pytest.mark.parametrize(("window", "step"), [(1, 1), (3, 1), (4, 2), (5, 3), (14, 1), (14, 5)])
def test_sliding_kl_with_target_matches_per_window_kl(window: int, step: int) -> None:
    values = sliding_kl(SEQ, window, target=TARGET, step=step)
    starts = list(range(0, len(SEQ) - window + 1, step))
    assert len(values) == (len(SEQ) - window) // step + 1 == len(starts)
    expected = [kl_to_distribution(SEQ[i : i + window], TARGET) for i in starts]
    assert values == pytest.approx(expected)


def test_sliding_kl_window_count_and_hand_values() -> None:
    values = sliding_kl(["a", "a", "b", "b"], 2, target={"a": 0.5, "b": 0.5})
    assert values == pytest.approx([LN2, 0.0, LN2])
    assert sliding_kl(["a", "b", "c"], 3, target={"a": 1, "b": 1, "c": 1}) == pytest.approx([0.0])
    assert sliding_kl(["a", "z", "a"], 2, target={"a": 1.0}) == [math.inf, math.inf]


def test_sliding_kl_with_logprob_uses_whole_sequence_support_by_default() -> None:
    window = 4
    values = sliding_kl(SEQ, window, logprob=LOG_TARGET)
    support = sorted(set(SEQ))
    expected = [
        sample_kl(SEQ[i : i + window], LOG_TARGET, support=support)
        for i in range(len(SEQ) - window + 1)
    ]
    assert values == pytest.approx(expected)
    # Not the per-window default support, which would give each window its own normalizer.
    per_window = [sample_kl(SEQ[i : i + window], LOG_TARGET) for i in range(len(SEQ) - window + 1)]
    assert values != pytest.approx(per_window)


def test_sliding_kl_with_logprob_and_explicit_support() -> None:
    seq = ["a", "b", "a", "b", "b"]
    values = sliding_kl(seq, 2, logprob=LOG_TARGET.__getitem__, support=TARGET, step=2)
    expected = [kl_to_distribution(seq[i : i + 2], TARGET) for i in (0, 2)]
    assert values == pytest.approx(expected)


def test_sliding_kl_accepts_tuples() -> None:
    values = sliding_kl(tuple(SEQ), 5, target=TARGET)
    assert values == pytest.approx(sliding_kl(SEQ, 5, target=TARGET))
    assert len(values) == len(SEQ) - 5 + 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 2}, r"exactly one of target= or logprob="),
        ({"window": 2, "target": TARGET, "logprob": LOG_TARGET}, r"exactly one of target="),
        ({"window": 2, "target": TARGET, "support": TARGET}, r"support= only applies"),
        ({"window": 0, "target": TARGET}, r"1 <= window <= len\(samples\)=14, got 0"),
        ({"window": 15, "target": TARGET}, r"1 <= window <= len\(samples\)=14, got 15"),
        ({"window": 2, "target": TARGET, "step": 0}, r"step must be >= 1, got 0"),
        ({"window": 2, "logprob": LOG_TARGET, "support": ["a"]}, r"support must contain every"),
        ({"window": 2, "target": {"a": -1.0}}, r"finite non-negative weights"),
    ],
)
def test_sliding_kl_rejects_invalid_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sliding_kl(SEQ, **kwargs)  # type: ignore[arg-type]
