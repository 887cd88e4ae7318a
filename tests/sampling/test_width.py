"""Width (docs/design.md §3, width): rows a search spends in one forward pass instead of
depth. ``exact`` follows ``width`` attempts at once, and its samples are the same at every
width; ``adaptrack`` with ``share_q`` has no rows that change no sample, so its width is
its walks in flight over the shared Q, ``parallel``, which do change the samples: both fit
the target at widths 1, 4 and 16 under both end policies, and a seed with a width gives
the same samples every time.

Statistical checks use fixed seeds and chi-square p-values (p > 0.001 consistent, as
tests/sampling/test_distribution.py) on ``no_ab``, the problem where a shared Q learned by
AdapTrack's walks is furthest from the target early on: 20 000 samples (3 000 put
AdapTrack's p near 0.005 at every width: its first samples are off, docs/design.md §3).
"""

from __future__ import annotations

import pytest
from stats import chi_square_p, counts

import adaptrack as at
from adaptrack.testing import no_ab

N = 20_000
#: ``exact``'s samples are the same at every width (checked): fewer suffice for its fit.
N_EXACT = 5_000
WIDTHS = (1, 4, 16)
ENDS = ("eos", "leave")


@pytest.fixture(scope="module", params=ENDS)
def problem(request: pytest.FixtureRequest) -> tuple:
    lm, constraint, max_new = no_ab()
    target = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new,
                                   end=request.param)
    return lm, constraint, dict(max_new_tokens=max_new, end=request.param), target


@pytest.fixture(scope="module")
def exact_runs(problem: tuple) -> dict[int, at.GenerationResult]:
    lm, constraint, kw, _ = problem
    return {w: at.generate(lm, [], constraint, method="exact", n=N_EXACT, seed=7, width=w, **kw)
            for w in WIDTHS}


@pytest.mark.parametrize("width", WIDTHS)
def test_exact_fits_the_target_at_every_width(problem: tuple, exact_runs: dict,
                                              width: int) -> None:
    res = exact_runs[width]
    assert res.stats["width"] == width
    assert all(s.valid and not s.fallback for s in res.samples)
    p = chi_square_p(counts(res), problem[3])
    assert p > 1e-3, f"exact, width={width}, end={problem[2]['end']}: p = {p:.2e}"


def test_exact_samples_are_those_of_every_width_and_wider_takes_fewer_passes(
        exact_runs: dict) -> None:
    one = exact_runs[1]
    for w in WIDTHS[1:]:
        assert exact_runs[w].samples == one.samples
    passes = [exact_runs[w].stats["forward_passes"] for w in WIDTHS]
    assert passes == sorted(passes, reverse=True) and passes[-1] < passes[0] / 2, passes


@pytest.mark.parametrize("walks", WIDTHS)
def test_adaptrack_shared_q_fits_the_target_at_every_width(problem: tuple,
                                                           walks: int) -> None:
    lm, constraint, kw, target = problem
    res = at.generate(lm, [], constraint, method="adaptrack", share_q=True, parallel=walks,
                      n=N, seed=7, **kw)
    assert res.stats["width"] == walks
    assert all(s.valid and not s.fallback for s in res.samples)
    p = chi_square_p(counts(res), target)
    assert p > 1e-3, f"adaptrack share_q, parallel={walks}, end={kw['end']}: p = {p:.2e}"


@pytest.mark.parametrize(("method", "options"), [
    ("exact", {"width": 4}), ("exact", {"width": 4, "parallel": 3}),
    ("adaptrack", {"share_q": True, "parallel": 4})])
def test_a_seed_and_a_width_give_the_same_samples(method: str, options: dict) -> None:
    lm, constraint, max_new = no_ab()
    kw = dict(method=method, n=60, seed=3, max_new_tokens=max_new, **options)
    first, again = (at.generate(lm, [], constraint, **kw) for _ in range(2))
    assert first.samples == again.samples
    assert first.stats["forward_passes"] == again.stats["forward_passes"]


def test_the_width_comes_from_the_option_else_the_model_within_parallel() -> None:
    lm, constraint, max_new = no_ab()

    def width(**options: object) -> int:
        res = at.generate(lm, [], constraint, method="exact", n=5, seed=0,
                          max_new_tokens=max_new, **options)
        return int(res.stats["width"])

    assert width() == at.lm.cost.MAX_WIDTH  # TableLM declares its rows free
    assert width(width=5) == 5
    assert width(width=100) == 100  # past the cost model's widest: asked, so honoured
    assert width(width=5, parallel=3) == 3  # walks given as a number bound it
    assert width(width=5, parallel=True) == 5
    assert width(width=5, parallel=False) == 1  # one attempt at a time
    assert width(width=5, temperature=0) == 1  # the greedy search follows nothing ahead


def test_width_is_checked() -> None:
    lm, constraint, _ = no_ab()
    for bad, error, match in [(0, ValueError, "at least 1"), (2.5, TypeError, "an int"),
                              (1 << 20, ValueError, "at most")]:
        with pytest.raises(error, match=f"width must be {match}"):
            at.generate(lm, [], constraint, method="exact", width=bad)
    with pytest.raises(ValueError, match="width applies to method='exact' only"):
        at.generate(lm, [], constraint, method="adaptrack", share_q=True, width=4)


def test_an_unbounded_search_fills_its_passes_and_a_bounded_one_does_not(monkeypatch) -> None:
    """Where only the search ends the request, an attempt followed ahead that ended gives its
    place in the pass to a later one (``exact.WINDOW``): the same samples in fewer passes
    (no_ab at width 16, n = 200: 11 against 14). Under the default budget the window is as
    before, so a search that hands over wastes no rows on attempts after the hand-over."""
    from adaptrack.sampling import exact

    lm, constraint, max_new = no_ab()

    def run(**budget: object) -> at.GenerationResult:
        return at.generate(lm, [], constraint, method="exact", n=200, seed=7, width=16,
                           max_new_tokens=max_new, **budget)

    wide, bounded = run(search_budget=None), run()
    monkeypatch.setattr(exact, "WINDOW", 1)
    narrow, bounded_narrow = run(search_budget=None), run()
    assert wide.samples == narrow.samples
    assert wide.stats["forward_passes"] < narrow.stats["forward_passes"]
    assert wide.stats["lm_calls"] <= narrow.stats["lm_calls"] * 1.1
    assert bounded.samples == bounded_narrow.samples
    assert [bounded.stats[k] for k in ("forward_passes", "lm_calls")] == \
        [bounded_narrow.stats[k] for k in ("forward_passes", "lm_calls")]
