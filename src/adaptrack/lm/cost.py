"""What one more row costs in a forward pass: the cost model a search's width comes from
(docs/design.md §3, width).

A pass over k rows of the same short context costs about ``t(1) · (1 + (k − 1) · c)``; the
*row cost* c is the price of one more row as a fraction of a one-row pass. On a CPU rows
are real work (c ≈ 0.06-0.12 for the default model, timed at 8 rows; the first extra row
costs ~0.6 of a pass, the next ones little: docs/benchmarks/width.md); on a GPU a pass is
mostly the weights' reads, and a few dozen rows cost nearly what one does (c close to 0).
A model measures c once, the first time a search asks (``LanguageModel.measured_row_cost``),
by timing a few passes of short prefixes; a model whose cost is known declares it
(``TableLM``: 0, and a test then times nothing).

>>> width_for(0.4), width_for(0.17), width_for(0.0), width_for(5.0)
(3, 6, 32, 1)
>>> ticks = iter([0.0, 1.0, 1.0, 2.4] * 3)    # one row: 1 s; 8 rows: 1.4 s
>>> c = measure_row_cost(lambda rows: None, (5, 6), iter(range(100)), clock=lambda: next(ticks))
>>> round(c, 4)                               # 0.4 s more for 7 more rows
0.0571
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

#: Rows of the wide pass timed: enough that the per-row part shows over the pass's fixed
#: part, few enough that timing costs well under a second on a CPU.
ROWS = 8
#: Timed pairs of passes (one row, ``ROWS`` rows); the fastest of each counts, as another
#: process on the machine can only slow a pass down.
REPEATS = 3
#: The widest width a cost model gives: the engine's default ``batch_size`` and the
#: transformers backend's ``max_batch``, past which a wider step is split into several
#: passes anyway (the fixed lookahead of ``exact`` before the cost model, too).
MAX_WIDTH = 32


def width_for(row_cost: float) -> int:
    """The width a search spends by default for ``row_cost``: the most rows whose pass
    costs at most two one-row passes, ``1 + 1/c``, within [1, :data:`MAX_WIDTH`].

    Why two: the rows past the first are attempts followed ahead, used only if the ones
    before them are rejected. A pass of that many rows pays for itself as soon as one of
    them is used (it saves a pass of its own), and when none is used it costs at most one
    pass more than the row the search waits for: the waste is bounded by the pass it
    might save. On a CPU (c ≈ 0.06 to 0.12) that is 9 to 16 rows, on a GPU the cap.

    >>> [width_for(c) for c in (1.0, 0.5, 0.1)]
    [2, 3, 11]
    """
    if not row_cost >= 0:  # also refuses nan
        raise ValueError(f"a row cost must be >= 0, got {row_cost}")
    if row_cost == 0:
        return MAX_WIDTH
    return max(1, min(MAX_WIDTH, int(1 + 1 / row_cost)))


def measure_row_cost(forward: Callable[[list[tuple[int, ...]]], object],
                     base: Sequence[int], fresh: Iterator[int], *, rows: int = ROWS,
                     repeats: int = REPEATS,
                     clock: Callable[[], float] = time.perf_counter) -> float:
    """The row cost of ``forward`` (one pass over a list of prefixes), from ``repeats``
    pairs of passes: one row ``base + (u,)``, then ``rows`` rows ``base + (u_i,)``, as a
    search's rows extend one shared prefix by a token each; ``fresh`` gives the tokens u,
    new ones each pass so that no kept state answers for them. ``(t(rows) − t(1)) /
    ((rows − 1) · t(1))`` of the fastest of each, at least 0. The caller has run ``base``
    once (its state kept, as a search's prompt is) and a wide pass to warm the backend.
    """
    if rows < 2 or repeats < 1:
        raise ValueError(f"rows must be at least 2 and repeats at least 1, got {rows}, "
                         f"{repeats}")
    base = tuple(base)
    one, wide = float("inf"), float("inf")
    for _ in range(repeats):
        for k in (1, rows):
            prefixes = [(*base, next(fresh)) for _ in range(k)]
            start = clock()
            forward(prefixes)
            took = clock() - start
            one, wide = (min(one, took), wide) if k == 1 else (one, min(wide, took))
    if not one > 0:  # a clock too coarse to see a pass: rows as good as free
        return 0.0
    return max(0.0, (wide - one) / ((rows - 1) * one))
