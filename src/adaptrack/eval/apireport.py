"""The report section of the API tasks (TFv1, TFv1Real): Table 1 or 2 (EM@k per method and
setting: EM@1 from the greedy completion, EM@k for k > 1 from the ``n`` samples by eq. 5)
and Table 5 (calls to the LM per sample: the mean over problems of each problem's
average, minimum and maximum), the cost per problem and wall time, and for a sweep EM@k
against each swept value (the paper's Figures 5 and 7). Only problems with a record for
every method and setting in the file are counted, so a partial run compares methods on
the same problems.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import AdaptrackError
from . import metrics
from .jobs import Record
from .sweeps import backtrack_label
from .tables import (
    KS,
    METHOD_NAMES,
    coverage,
    header_line,
    method_table,
    ordered_methods,
    pct,
    pyplot,
    wall_seconds,
)

__all__ = ["API_TASKS", "api_report", "records_at", "sweep_points", "tfv1_scores"]

#: A line about where a task's problems come from, after the report's first paragraph.
About = Callable[[dict[str, Any], list[Record]], str]


def tfv1_scores(records: list[Record]) -> dict[str, Any]:
    """Per (method, setting): EM@k, calls per sample and time over the problems that every
    (method, setting) in ``records`` has. A job that raised an error scores as a miss (it
    stays in EM's denominator, so a method's failures cannot shrink its problem set); it
    is left out of the call and time averages, and counted in ``errors``."""
    cells: dict[tuple[str, str], dict[str, Record]] = defaultdict(dict)
    settings = sorted({s for r in records for s in r["oracle"]})
    for r in records:
        for setting in ([r["setting"]] if r["setting"] else settings):
            if setting in r["oracle"]:
                cells[(r["method"], setting)][r["problem"]] = r
    if not cells:
        raise AdaptrackError("the results file has no finished TFv1 jobs yet")
    common, dropped, _, n = coverage(cells)
    out: dict[str, Any] = {"problems": len(common), "dropped": dropped,
                           "n": n, "settings": settings,
                           "methods": ordered_methods(sorted({m for m, _ in cells})), "cells": {},
                           "errors": {}, "wall_seconds": wall_seconds(records),
                           "job_seconds": sum(r.get("seconds", 0.0) for r in records)}
    for (method, setting), by_problem in cells.items():
        rows = [by_problem[p] for p in sorted(common)]
        ok = [r for r in rows if "error" not in r]
        if len(ok) < len(rows):
            out["errors"][(method, setting)] = len(rows) - len(ok)
        if not rows:
            continue
        oracle = [r["oracle"][setting] for r in rows]
        em = {1: sum("error" not in r and r["greedy"] == o
                     for r, o in zip(rows, oracle, strict=True)) / len(rows)}
        # EM@k by eq. 5 from the samples, k = 1 included (the sweeps use it: the greedy
        # completion does not depend on the temperature).
        sampled = {k: metrics.mean_at_k(
            ((n, 0) if "error" in r else (len(r["samples"]), sum(x == o for x in r["samples"]))
             for r, o in zip(rows, oracle, strict=True)), k) for k in KS if k <= n}
        em.update({k: v for k, v in sampled.items() if k > 1})
        calls = [r["lm_requests"] for r in ok]
        nan = float("nan")
        out["cells"][(method, setting)] = {
            "em": em, "sampled": sampled,
            "calls": tuple(sum(f(c) for c in calls) / len(calls) if calls else nan
                           for f in (lambda c: sum(c) / len(c), min, max)),
            "seconds": sum(r["seconds"] for r in ok) / len(ok) if ok else nan,
            "lm_calls": sum(r["lm_calls"] for r in ok) / len(ok) if ok else nan,
            "backtracks": sum(r.get("backtracks", 0) for r in ok) / len(ok) if ok else nan,
        }
    return out


#: The TFv1-style tasks: their title and the paper's table of their exact matches.
API_TASKS = {"tfv1": ("TFv1", "Table 1"), "tfv1real": ("TFv1Real", "Table 2")}
#: EM@k of the sweep tables and plots (those with k <= n).
SWEEP_KS = (1, 5, 10)


def _backtrack_key(b: int | None) -> tuple[bool, int]:
    return (b is None, b or 0)  # no limit sorts last


def sweep_points(header: dict[str, Any], records: list[Record]
                 ) -> tuple[list[Any], list[int | None], Any, int | None]:
    """The temperatures and AdapTrack max_backtrack values ``records`` hold (a record
    without them, from a run without sweeps, has the header's temperature and no limit),
    and the point the main tables use: temperature 1.0 if swept, else the highest, and
    no backtrack limit if swept, else the highest."""
    default = header.get("temperature")
    temps = sorted({r.get("temperature", default) for r in records},
                   key=lambda t: (t is None, t or 0))
    backs = sorted({r.get("max_backtrack") for r in records if r["method"] == "adaptrack"},
                   key=_backtrack_key) or [None]
    base_t = 1.0 if 1.0 in temps else temps[-1] if temps else default
    base_b = None if None in backs else backs[-1]
    return temps, backs, base_t, base_b


def records_at(header: dict[str, Any], records: list[Record], temperature: Any,
               max_backtrack: int | None) -> list[Record]:
    """The records of one sweep point: at ``temperature``, and AdapTrack's at
    ``max_backtrack`` (the other methods ignore it and run once)."""
    default = header.get("temperature")
    return [r for r in records if r.get("temperature", default) == temperature
            and (r["method"] != "adaptrack" or r.get("max_backtrack") == max_backtrack)]


def api_report(header: dict[str, Any], records: list[Record],
               plots: str | os.PathLike[str] | None = None, about: About | None = None) -> str:
    """Table 1 (TFv1) or Table 2 (TFv1Real), Table 5 and the cost per problem at the base
    point of :func:`sweep_points`, then, for a sweep, EM@k against each swept value (the
    paper's Figures 5 and 7); ``about`` adds a line on where the problems come from."""
    task, table = API_TASKS.get(header.get("task", ""), API_TASKS["tfv1"])
    temps, backs, base_t, base_b = sweep_points(header, records)
    s = tfv1_scores(records_at(header, records, base_t, base_b)
                    or records_at(header, records, base_t, backs[0]))
    s["wall_seconds"] = wall_seconds(records)
    s["job_seconds"] = sum(r.get("seconds", 0.0) for r in records)
    settings, methods, cells = s["settings"], s["methods"], s["cells"]
    ks = [k for k in KS if k == 1 or k <= s["n"]]
    lines = [f"# {task}: {s['problems']} problems, n = {s['n']}",
             "", f"{header_line(header)}, max_new_tokens {header.get('max_new_tokens')}, "
             f"TensorFlow {header.get('tf_version')}. Wall time {s['wall_seconds'] / 60:.1f} "
             f"min ({s['job_seconds'] / 60:.1f} min of job time over all workers)."]
    if about is not None:
        lines.append(about(header, records))
    if len(temps) > 1 or len(backs) > 1:
        lines.append(f"The tables below are at temperature {base_t} and AdapTrack "
                     f"max_backtrack {backtrack_label(base_b)}; the sweeps follow them.")
    if s["dropped"]:
        lines.append(f"{s['dropped']} more problems lack some method or setting (the run "
                     "has not finished them) and are left out.")
    if s["errors"]:
        shown = ", ".join(f"{m} {st}: {c}" for (m, st), c in sorted(s["errors"].items()))
        lines.append(f"Jobs that raised an error, scored as misses: {shown} (the records "
                     "say why).")
    def per_setting(fmt: Any, width: int = 1) -> dict[str, list[str]]:
        """Each method's cells, ``width`` per setting (blank where it did not run)."""
        blank = " | ".join([""] * width)
        return {m: [fmt(cells[(m, st)]) if (m, st) in cells else blank for st in settings]
                for m in methods}

    em = per_setting(lambda c: " | ".join(pct(c["em"][k]) for k in ks), len(ks))
    calls = per_setting(lambda c: "{:.2f} ({:.2f}, {:.2f})".format(*c["calls"]))
    cost = per_setting(lambda c: f"{c['seconds']:.2f} | {c['lm_calls']:.1f} | "
                                 f"{c['backtracks']:.1f}", 3)
    lines += ["", f"## Exact match ({table})", "",
              "EM@1 is the greedy completion; EM@k for k > 1 is eq. 5 over the samples.", "",
              *method_table([f"{st} EM@{k}" for st in settings for k in ks], em),
              "", "## Calls to the LM per sample (Table 5)", "",
              "avg (min, max): the mean over problems of each problem's average, minimum "
              "and maximum over its samples.", "",
              *method_table([f"{st} avg (min, max)" for st in settings], calls),
              "", "## Cost per problem", "",
              "Seconds for the greedy and the sampled completions; distinct prefixes the "
              "model evaluated (`lm_calls`) and backtracks, for the samples only.", "",
              *method_table([f"{st} {c}" for st in settings
                             for c in ("s", "lm_calls", "backtracks")], cost)]
    if plots is not None:
        lines += ["", f"![EM@k per method and setting]({_plot_tfv1(s, ks, Path(plots), task)})"]
    for name, values, at, figure in (
            ("temperature", temps, lambda v: (v, base_b), "Figure 5"),
            ("max_backtrack", backs, lambda v: (base_t, v), "Figure 7")):
        if len(values) > 1:
            lines += _sweep_section(header, records, task, name, values, at, figure, plots)
    return "\n".join(lines)


def _sweep_section(header: dict[str, Any], records: list[Record], task: str, name: str,
                   values: list[Any], at: Any, figure: str,
                   plots: str | os.PathLike[str] | None) -> list[str]:
    """EM@k (from the samples) per method and setting against each value of one sweep."""
    points = {}
    for v in values:
        subset = records_at(header, records, *at(v))
        if subset:
            points[v] = tfv1_scores(subset)
    if not points:
        return []
    first = next(iter(points.values()))
    n = min(p["n"] for p in points.values())
    ks = [k for k in SWEEP_KS if k <= n]
    other = (f"AdapTrack's max_backtrack {backtrack_label(at(values[0])[1])}"
             if name == "temperature" else f"temperature {at(values[0])[0]}")
    counts = sorted({p["problems"] for p in points.values()})
    lines = ["", f"## EM@k against {name} ({figure})", "",
             f"EM@k by eq. 5 from the {n} samples at each {name} ({other}); EM@1 here is "
             "the share of correct samples (the greedy completion does not depend on the "
             f"temperature). {'/'.join(map(str, counts))} problems per point."]
    if name == "max_backtrack":
        lines[-1] += " Only AdapTrack takes the limit: the other methods ran once."
    labels = [backtrack_label(v) if name == "max_backtrack" else str(v) for v in points]
    symbol = "B" if name == "max_backtrack" else "T"
    for st in first["settings"]:
        lines += ["", "| Method | EM@k | " + " | ".join(f"{symbol}={x}" for x in labels)
                  + " |", "|---" * (2 + len(labels)) + "|"]
        for m in first["methods"]:
            for k in ks:
                row = [pct(p["cells"][(m, st)]["sampled"][k]) if (m, st) in p["cells"] else ""
                       for p in points.values()]
                lines.append(f"| {METHOD_NAMES.get(m, m)} ({st}) | {k} | " + " | ".join(row)
                             + " |")
    if name == "max_backtrack":  # the limit exists to save model calls (paper §7.2.2)
        lines += ["", "AdapTrack's cost at each max_backtrack: model calls per sample and "
                  "backtracks per problem (the samples only).", "",
                  "| Setting | cost | " + " | ".join(f"{symbol}={x}" for x in labels) + " |",
                  "|---" * (2 + len(labels)) + "|"]
        costs: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
            ("calls/sample", lambda c: f"{c['calls'][0]:.2f}"),
            ("backtracks", lambda c: f"{c['backtracks']:.1f}"))
        for st in first["settings"]:
            for what, fmt in costs:
                row = [fmt(p["cells"][("adaptrack", st)])
                       if ("adaptrack", st) in p["cells"] else "" for p in points.values()]
                lines.append(f"| {st} | {what} | " + " | ".join(row) + " |")
    if plots is not None:
        path = _plot_sweep(points, labels, ks, name, Path(plots), task)
        lines += ["", f"![EM@k against {name}]({path})"]
    return lines


def _plot_sweep(points: dict[Any, dict[str, Any]], labels: list[str], ks: list[int],
                name: str, out: Path, task: str) -> Path:
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    first = next(iter(points.values()))
    settings = first["settings"]
    fig, axes = plt.subplots(len(settings), len(ks), figsize=(4 * len(ks), 3.2 * len(settings)),
                             sharex=True, squeeze=False)
    xs = list(range(len(labels)))
    for row, st in enumerate(settings):
        for col, k in enumerate(ks):
            ax = axes[row][col]
            for m in first["methods"]:
                ys = [100 * p["cells"][(m, st)]["sampled"][k] if (m, st) in p["cells"]
                      else float("nan") for p in points.values()]
                ax.plot(xs, ys, marker="o", label=METHOD_NAMES.get(m, m))
            ax.set_xticks(xs, labels)
            ax.set_title(f"{st} setting, EM@{k}", fontsize=9)
            ax.grid(alpha=0.3)
            if row == len(settings) - 1:
                ax.set_xlabel(name)
        axes[row][0].set_ylabel("EM@k (%)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"{task}: EM@k against {name}, {first['problems']} problems", fontsize=10)
    fig.tight_layout()
    path = out / f"{task.lower()}-{name.replace('_', '-')}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_tfv1(s: dict[str, Any], ks: list[int], out: Path, task: str = "TFv1") -> Path:
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    settings = s["settings"]
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 3.8), sharey=True,
                             squeeze=False)
    for ax, st in zip(axes[0], settings, strict=True):
        for m in s["methods"]:
            if (m, st) in s["cells"]:
                em = s["cells"][(m, st)]["em"]
                ax.plot(ks, [100 * em[k] for k in ks], marker="o", label=METHOD_NAMES.get(m, m))
        ax.set_xscale("log")
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.set_title(f"TensorFlow {st} setting")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("EM@k (%)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"{task}, {s['problems']} problems, n = {s['n']}", fontsize=10)
    fig.tight_layout()
    path = out / f"{task.lower()}-em.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
