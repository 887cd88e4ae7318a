"""What every report section shares: method names and their order, markdown tables, the
header's summary line, wall time over workers and resumed runs, the problems every method
finished, the sampling noise of a perfect sampler, and matplotlib (optional).

>>> print("\\n".join(method_table(["EM@1"], {"cd": ["50.00%"]})))
| Method | EM@1 |
|---|---|
| Constrained decoding | 50.00% |
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import AdaptrackError
from .jobs import Record

__all__ = ["KS", "METHOD_NAMES", "METHOD_ORDER", "coverage", "header_line", "iid_kls",
           "method_table", "ordered_methods", "pct", "pyplot", "wall_seconds"]

KS = (1, 3, 5, 10, 20)
METHOD_NAMES = {"unconstrained": "Unconstrained decoding", "cd": "Constrained decoding",
                "asap": "ASAp", "adaptrack": "AdapTrack", "exact": "Exact"}
METHOD_ORDER = ("unconstrained", "cd", "asap", "adaptrack", "exact")


def ordered_methods(methods: Sequence[str]) -> list[str]:
    """The paper's methods in the paper's order, then any others by name.

    >>> ordered_methods(["exact", "mine", "cd"])
    ['cd', 'exact', 'mine']
    """
    known = [m for m in METHOD_ORDER if m in methods]
    return known + sorted(m for m in methods if m not in METHOD_ORDER)


def pct(x: float) -> str:
    """A share as a percentage with two decimals (``0.5`` is ``50.00%``)."""
    return f"{100 * x:.2f}%"


def method_table(columns: list[str], rows: dict[str, list[str]]) -> list[str]:
    """Markdown lines of a table with a "Method" column, one row per method."""
    return (["| Method | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
            + [f"| {METHOD_NAMES.get(m, m)} | " + " | ".join(cells) + " |"
               for m, cells in rows.items()])


def header_line(header: dict[str, Any]) -> str:
    """The model, backend, temperature and seed a results file ran with, for a report."""
    return (f"model `{header.get('model')}` (backend {header.get('backend')}), "
            f"temperature {header.get('temperature')}, seed {header.get('seed')}")


def wall_seconds(records: list[Record]) -> float:
    """Wall time of the jobs: the length of the union of their [started_at, finished_at]
    intervals, so parallel workers count once and pauses between resumed runs not at all."""
    spans = sorted((r["started_at"], r["finished_at"]) for r in records if "started_at" in r)
    total, end = 0.0, -math.inf
    for start, finish in spans:
        if finish > end:
            total += finish - max(start, end)
            end = finish
    return total


def coverage(cells: Mapping[Any, dict[str, Record]]) -> tuple[set[str], int, list[Record],
                                                                  int]:
    """Over cells of {problem: record}: the problems every cell has, how many problems some
    cell lacks, the records that finished without an error, and the smallest sample count
    among them (the n every record can score EM@k or pass@k for)."""
    common = set.intersection(*(set(c) for c in cells.values()))
    every = set().union(*(set(c) for c in cells.values()))
    finished = [r for c in cells.values() for r in c.values() if "error" not in r]
    n = min((len(r["samples"]) for r in finished), default=0)
    return common, len(every - common), finished, n


def pyplot() -> Any:
    """matplotlib's pyplot on a file backend; AdaptrackError when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise AdaptrackError(
            "plots need matplotlib: pip install matplotlib (or 'adaptrack[eval]')"
        ) from None
    return plt


def iid_kls(target: dict[Any, float], n: int, reps: int = 1000, seed: int = 0) -> Any:
    """KL(empirical ‖ target) of ``reps`` simulated sets of ``n`` independent draws from
    ``target`` itself: what a perfect sampler shows from sampling noise alone (an array).

    >>> bool(0.0003 < iid_kls({"a": 0.5, "b": 0.5}, 1000).mean() < 0.0008)  # (K - 1) / (2n)
    True
    """
    outcomes = list(target)
    p = np.array([target[o] for o in outcomes], dtype=float)
    p /= p.sum()
    draws = np.random.default_rng(seed).multinomial(n, p, size=reps) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(draws > 0, draws * np.log(draws / p), 0.0)
    return terms.sum(axis=1)
