"""``adaptrack report``: markdown tables (and PNG plots) from an ``adaptrack eval`` results file.

A results file's header names its task; the task's declaration
(:mod:`~adaptrack.eval.registry`) gives its report section: TFv1 and TFv1Real
(:mod:`~adaptrack.eval.apireport`: Tables 1, 2 and 5, the sweeps' Figures 5 and 7), binary
(:mod:`~adaptrack.eval.binary`: Table 4's exact and sample KL, Figure 4), DSL
(:mod:`~adaptrack.eval.dslreport`: Table 4 per dataset, Figure 4) and HumanEval and MBPP
(:mod:`~adaptrack.eval.codespec`: Table 3).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import AdaptrackError
from . import registry
from .apireport import API_TASKS, api_report
from .jobs import Record
from .runner import read_results

__all__ = ["report", "tfv1_report"]


def report(path: str | os.PathLike[str], plots: str | os.PathLike[str] | None = None,
           methods: Sequence[str] | None = None) -> str:
    """The markdown report of a results file; with ``plots``, PNGs are written there; with
    ``methods``, over those methods' records only (an enumerated target is kept): a report
    compares the problems every method in it finished, so leaving out a method that finished
    few widens the comparison. A method the file does not hold is an ``AdaptrackError``."""
    header, records = read_results(path)
    if methods is not None:
        present = {r.get("method") for r in records}
        missing = [m for m in methods if m not in present]
        if missing:
            raise AdaptrackError(
                f"{path}: no records of {', '.join(missing)}; it holds "
                f"{', '.join(sorted(str(m) for m in present if m != 'target'))}")
        records = [r for r in records if r.get("method") in (*methods, "target")]
    kind = header.get("task")
    spec = registry.spec(kind) if isinstance(kind, str) else None
    if spec is None:
        raise AdaptrackError(f"{path}: unknown task {kind!r} in the header "
                             f"({', '.join(registry.names())})")
    if plots is not None and not spec.plots:
        print(f"adaptrack report: {kind} results have no plots; --plots is ignored",
              file=sys.stderr)
        plots = None
    if plots is not None:
        _check_plots_dir(plots)
    return spec.report(header, records, plots)


def _check_plots_dir(plots: str | os.PathLike[str]) -> None:
    """Make the plots directory, or say in one line why it cannot be one (a file there, a
    path through a file, no permission), before any plot is drawn."""
    if Path(plots).exists() and not Path(plots).is_dir():
        raise AdaptrackError(f"--plots {plots} is a file, not a directory; pass a directory "
                             "to write the plots into")
    try:
        Path(plots).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AdaptrackError(f"--plots {plots}: cannot make that directory "
                             f"({err.strerror or err}); pass a directory to write the plots "
                             "into") from None
    if not os.access(plots, os.W_OK):
        raise AdaptrackError(f"--plots {plots}: the directory is not writable; pass another")


def tfv1_report(header: dict[str, Any], records: list[Record],
                plots: str | os.PathLike[str] | None = None) -> str:
    """The report of a TFv1 or TFv1Real results file (Table 1 or 2, Table 5, the sweeps)."""
    spec = registry.spec(header.get("task", ""))
    if header.get("task") in API_TASKS and spec is not None:
        return spec.report(header, records, plots)
    return api_report(header, records, plots)
