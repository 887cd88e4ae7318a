"""``adaptrack report``: markdown tables (and PNG plots) from an ``adaptrack eval`` results file.

A results file's header names its task; the task's declaration
(:mod:`~adaptrack.eval.registry`) gives its report section: TFv1 and TFv1Real
(:mod:`~adaptrack.eval.apireport`: Tables 1, 2 and 5, the sweeps' Figures 5 and 7), binary
(:mod:`~adaptrack.eval.binary`: Table 4's exact and sample KL, Figure 4), DSL
(:mod:`~adaptrack.eval.dslreport`: Table 4 per dataset, Figure 4) and HumanEval and MBPP
(:mod:`~adaptrack.eval.codespec`: Table 3). The names below stay importable from here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import AdaptrackError
from . import registry
from .apireport import API_TASKS as API_TASKS
from .apireport import SWEEP_KS as SWEEP_KS
from .apireport import api_report
from .apireport import records_at as records_at
from .apireport import sweep_points as sweep_points
from .apireport import tfv1_scores as tfv1_scores
from .binary import binary_report as binary_report
from .binary import binary_scores as binary_scores
from .codespec import CODE_KS as CODE_KS
from .codespec import CODE_TASKS as CODE_TASKS
from .codespec import code_report as code_report
from .codespec import code_scores as code_scores
from .dslreport import DSL_COLUMNS as DSL_COLUMNS
from .dslreport import dsl_report as dsl_report
from .dslreport import dsl_scores as dsl_scores
from .dslreport import excess_kl as excess_kl
from .jobs import Record
from .runner import read_results
from .sweeps import backtrack_label as backtrack_label
from .tables import KS as KS
from .tables import METHOD_NAMES as METHOD_NAMES
from .tables import METHOD_ORDER as METHOD_ORDER
from .tables import iid_kls as iid_kls
from .tables import wall_seconds as wall_seconds

__all__ = ["binary_report", "binary_scores", "code_report", "code_scores", "dsl_report",
           "dsl_scores", "report", "tfv1_report", "tfv1_scores"]


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
