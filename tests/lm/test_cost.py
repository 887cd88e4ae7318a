"""The cost model of a row in a forward pass (lm/cost.py): the mapping to a width, the
measurement (on a clock the test drives, never a timed assertion), and that a model times
it once, leaves its counters as they were and that a declared cost is never timed."""

from __future__ import annotations

import math

import numpy as np
import pytest

import adaptrack as at
from adaptrack.lm.cost import MAX_WIDTH, ROWS, measure_row_cost, width_for


def test_width_is_the_rows_whose_pass_costs_two_one_row_passes() -> None:
    for c in (0.01, 0.05, 0.17, 0.4, 0.9, 1.0, 3.0):
        w = width_for(c)
        assert 1 <= w <= MAX_WIDTH
        assert 1 + (w - 1) * c <= 2 + 1e-12  # w rows cost at most two one-row passes
        assert w == MAX_WIDTH or 1 + w * c > 2  # and one more row would cost more
    assert width_for(0.0) == MAX_WIDTH and width_for(1e-9) == MAX_WIDTH
    assert width_for(100.0) == 1
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="row cost"):
            width_for(bad)


def test_measure_takes_the_fastest_pass_of_each_width() -> None:
    """Passes of one row take 1.0 s at best, of ROWS rows 2.4 s at best (noise only slows a
    pass): the row cost is 1.4 / (ROWS - 1). Each pass gets tokens of its own."""
    times = iter([1.3, 2.4, 1.0, 3.0, 1.1, 2.5])  # (one, wide) per repeat
    now, seen = [0.0], []

    def clock() -> float:
        return now[0]

    def forward(prefixes: list[tuple[int, ...]]) -> None:
        seen.extend(prefixes)
        now[0] += next(times)

    c = measure_row_cost(forward, (5, 6), iter(range(1000)), clock=clock)
    assert c == pytest.approx(1.4 / (ROWS - 1))
    assert len(seen) == 3 * (1 + ROWS) == len(set(seen))
    assert all(p[:2] == (5, 6) and len(p) == 3 for p in seen)
    # A clock too coarse to see a pass: rows count as free.
    assert measure_row_cost(lambda _: None, (1,), iter(range(99)), clock=lambda: 0.0) == 0.0
    with pytest.raises(ValueError, match="rows"):
        measure_row_cost(forward, (1,), iter(range(9)), rows=1)


class Timed(at.TableLM):
    """A table that does not declare its cost: it is timed."""

    row_cost = None
    passes = 0
    counters = ("calls", "passes")

    def _next_logprobs(self, prefixes):  # type: ignore[no-untyped-def]
        self.passes += 1
        return super()._next_logprobs(prefixes)


def test_a_model_times_its_row_cost_once_and_leaves_its_counters() -> None:
    lm = Timed([b"a", b"b", b"<eos>"], lambda prefix: [1, 2, 1], eos=2)
    assert lm.row_cost is None
    c = lm.measured_row_cost()
    assert c >= 0 and lm.row_cost == c
    assert (lm.calls, lm.passes) == (0, 0)  # timing is not the requests' work
    lm.row_cost = 0.25  # declared (say, measured before): never timed again
    assert lm.measured_row_cost() == 0.25 and lm.passes == 0


def test_a_search_sizes_its_width_by_the_model_and_measures_it_once() -> None:
    lm = Timed([b"a", b"b", b"<eos>"], lambda prefix: [1, 2, 1], eos=2)
    words = at.constraints.choice(["ab", "ba", "bb"])
    first = at.generate(lm, [], words, method="exact", n=3, seed=0)
    assert lm.row_cost is not None
    assert first.stats["width"] == width_for(lm.row_cost)
    lm.row_cost = 0.5
    again = at.generate(lm, [], words, method="exact", n=3, seed=0)
    assert again.stats["width"] == 3 and lm.row_cost == 0.5  # not measured again
    assert again.samples == first.samples  # exact's samples: the same at every width
    cd = at.generate(lm, [], words, method="cd", n=2, seed=0)  # no search: nothing to size
    assert cd.stats["width"] == 2


def test_declared_costs_are_never_timed() -> None:
    lm = at.TableLM([b"a", b"<eos>"], lambda prefix: [1, 1], eos=1)
    assert lm.row_cost == 0.0 == lm.measured_row_cost()
    assert np.isfinite(lm.next_logprobs([(0,)])).any()
