"""The distributional claims, checked against exact enumeration (docs/design.md §3).

Every run uses a fixed seed; thresholds follow from the sample size: chi-square p-values
(p > 0.001 consistent, p < 1e-9 inconsistent) and binomial z-bounds of 4.5 sigma.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import pytest
from stats import chi_square_p, counts

import adaptrack as at
from adaptrack.sampling.exact import SCHEDULES, Exact
from adaptrack.testing import PROBLEMS, binary, hashed_weights

N = 20_000


def kl(observed: dict, target: dict) -> float:
    return at.metrics.kl_divergence(observed, target)


#: Each problem under both end policies (docs/design.md §2): the exactness claims hold for
#: both; the claims about CD and fresh-state AdapTrack are the paper's, about ``eos``.
CASES = [(name, end) for name in sorted(PROBLEMS) for end in ("eos", "leave")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-{e}" for n, e in CASES])
def problem(request):
    name, end = request.param
    lm, constraint, max_new = PROBLEMS[name]()
    target = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new, end=end)
    runs = {}

    def run(method: str, schedule: str | None = None, **options) -> dict:
        key = (method, schedule, tuple(sorted(options.items())))
        if key not in runs:
            with exact_schedule(schedule):
                res = at.generate(lm, [], constraint, method=method, n=N, seed=7,
                                  max_new_tokens=max_new, end=end, **options)
            # Only CD may stop incomplete, at a dead end (design.md §2).
            assert all(s.valid == s.complete for s in res.samples)
            assert method == "cd" or all(s.complete for s in res.samples)
            runs[key] = counts(res)
        return runs[key]

    return f"{name} ({end})", target, run


def paper(problem):
    """The problem, when it is under the paper's end policy (``eos``); else a skip."""
    if problem[0].endswith("(leave)"):
        pytest.skip("a claim of the AdapTrack paper, about its target (end='eos')")
    return problem


@contextlib.contextmanager
def exact_schedule(schedule: str | None) -> Iterator[None]:
    """``exact`` runs its rounds by ``schedule`` (None: the default) inside the block, with
    the root opened first except under ``fixed`` (the rounds before the schedules)."""
    saved = Exact.schedule, Exact.open_root
    if schedule is not None:
        Exact.schedule, Exact.open_root = schedule, schedule != "fixed"
    try:
        yield
    finally:
        Exact.schedule, Exact.open_root = saved


@pytest.mark.parametrize(("method", "options"), [
    ("exact", {}), *[("exact", {"schedule": s}) for s in SCHEDULES if s != Exact.schedule],
    ("adaptrack", {"share_q": True})])
def test_exact_methods_fit_the_target(problem, method, options):
    name, target, run = problem
    p = chi_square_p(run(method, **options), target)
    assert p > 1e-3, f"{method} {options} on {name}: chi-square p = {p:.2e}"


def test_cd_does_not_fit_the_target(problem):
    name, target, run = paper(problem)
    p = chi_square_p(run("cd"), target)
    assert p < 1e-9, f"cd on {name} unexpectedly fits the target (p = {p:.2e})"


def test_adaptrack_fresh_state_is_closer_than_cd(problem):
    # Not exact (design.md §3); how much closer depends on the model: see the next test.
    name, target, run = paper(problem)
    fresh, cd = kl(run("adaptrack"), target), kl(run("cd"), target)
    assert fresh < cd, f"{name}: KL adaptrack {fresh:.4f} vs cd {cd:.4f}"


def test_adaptrack_fresh_state_kl_is_a_fifth_of_cds_across_models():
    """On the design.md §3 language with 20 random context-dependent models, fresh-state
    AdapTrack's KL is below CD's for every model and at most a fifth of it in the median
    (measured over 30 models at n = 5000: median 0.064, max 0.20; the ``no_ab`` model of
    the fixture is an outlier at 0.44)."""
    _lm0, constraint, max_new = PROBLEMS["no_ab"]()
    ratios = []
    for k in range(20):
        lm = at.TableLM([b"a", b"b", b"c", b"<eos>"], hashed_weights(4, b"m%d" % k), eos=3)
        target = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new, end="eos")
        kls = []
        for method in ("cd", "adaptrack"):
            res = at.generate(lm, [], constraint, method=method, n=4000, seed=k,
                              max_new_tokens=max_new, end="eos")
            kls.append(kl(counts(res), target))
        ratios.append(kls[1] / kls[0])
    assert max(ratios) < 1, ratios
    assert float(np.median(ratios)) <= 1 / 5, ratios


def test_asap_is_closer_than_cd(problem):
    _name, target, run = paper(problem)
    assert kl(run("asap"), target) < kl(run("cd"), target)


def within(observed: int, n: int, p: float) -> bool:
    return abs(observed / n - p) <= 4.5 * math.sqrt(p * (1 - p) / n)


def test_binary_problem_as_in_the_paper():
    lm, bits, max_new = binary()
    zeros = (0, 0, 0, 0, 0, 2)

    def share(method: str, **options) -> int:
        res = at.generate(lm, [], bits, method=method, n=N, seed=3, max_new_tokens=max_new,
                          end="eos", **options)
        return sum(s.tokens == zeros for s in res.samples)

    assert within(share("cd"), N, 1 / 2)
    assert within(share("exact"), N, 1 / 17)
    assert within(share("adaptrack", share_q=True), N, 1 / 17)
    # Fresh state per sample undershoots here (measured 0.011, by an independent naive
    # implementation of Algorithm 2 too): far from CD's 1/2, not 1/17.
    assert share("adaptrack") / N < 0.03


def test_exact_distribution_of_binary_problem():
    lm, bits, max_new = binary()
    dist = at.exact_distribution(lm, [], bits, max_new_tokens=max_new)
    assert len(dist) == 17
    assert np.allclose(list(dist.values()), 1 / 17)
    with pytest.raises(at.NoValidSequenceError):
        at.exact_distribution(lm, [], bits, max_new_tokens=5)  # EOS needs a sixth token
    with pytest.raises(at.TreeLimitError, match="max_nodes"):
        at.exact_distribution(lm, [], bits, max_new_tokens=max_new, max_nodes=10)


def test_length_bound_conditions_the_target():
    lm, constraint, max_new = PROBLEMS["length_bound"]()
    dist = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    assert all(len(s) <= max_new for s in dist)
    texts = {lm.vocab.decode(s) for s in dist}
    # "aaaab" needs aa|aa|b|EOS: four tokens, one more than allowed.
    assert texts == {b"aaaa", b"aab", b"b", b"ba"}
    longer = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new + 1)
    assert b"aaaab" in {lm.vocab.decode(s) for s in longer}
