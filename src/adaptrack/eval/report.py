"""``adaptrack report``: markdown tables (and PNG plots) from an ``adaptrack eval`` results file.

TFv1 results give Table 1 (EM@k per method and setting: EM@1 from the greedy completion,
EM@k for k > 1 from the ``n`` samples by eq. 5) and Table 5 (calls to the LM per sample:
the mean over problems of each problem's average, minimum and maximum), plus wall time.
Only problems with a record for every method and setting in the file are counted, so a
partial run compares methods on the same problems. Binary results give Table 4's KL, both
exact (to the enumerated target) and the paper's sample-based estimate, and Figure 4's KL
over sliding windows of a quarter of the samples. DSL results give Table 4's KL(Q ‖ P_LM)
per dataset (and the exact KL where a target was enumerated) and Figure 4 per dataset.
HumanEval and MBPP results give Table 3:
per method, pass@1 from the greedy completion, pass@k from the ``n`` samples by eq. 5, and
the shares of samples that parse and that pass the name check.
"""

from __future__ import annotations

import math
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AdaptrackError
from . import metrics
from .runner import Record, read_results
from .tfv1 import backtrack_label

KS = (1, 3, 5, 10, 20)
METHOD_NAMES = {"unconstrained": "Unconstrained decoding", "cd": "Constrained decoding",
                "asap": "ASAp", "adaptrack": "AdapTrack", "exact": "Exact"}
METHOD_ORDER = ("unconstrained", "cd", "asap", "adaptrack", "exact")


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
    if kind in ("tfv1", "tfv1real"):
        return tfv1_report(header, records, plots)
    if kind == "binary":
        return binary_report(header, records, plots)
    if kind == "dsl":
        return dsl_report(header, records, plots)
    if kind in CODE_TASKS:
        if plots is not None:
            print(f"adaptrack report: {kind} results have no plots; --plots is ignored",
                  file=sys.stderr)
        return code_report(header, records)
    raise AdaptrackError(f"{path}: unknown task {kind!r} in the header (tfv1, tfv1real, binary, "
                         f"dsl, {', '.join(CODE_TASKS)})")


def _order(methods: Sequence[str]) -> list[str]:
    known = [m for m in METHOD_ORDER if m in methods]
    return known + sorted(m for m in methods if m not in METHOD_ORDER)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _table(columns: list[str], rows: dict[str, list[str]]) -> list[str]:
    """Markdown lines of a table with a "Method" column, one row per method."""
    return (["| Method | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
            + [f"| {METHOD_NAMES.get(m, m)} | " + " | ".join(cells) + " |"
               for m, cells in rows.items()])


def _about(header: dict[str, Any]) -> str:
    return (f"model `{header.get('model')}` (backend {header.get('backend')}), "
            f"temperature {header.get('temperature')}, seed {header.get('seed')}")


# -- TFv1 -------------------------------------------------------------------------------


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


def _coverage(cells: Mapping[Any, dict[str, Record]]) -> tuple[set[str], int, list[Record],
                                                                  int]:
    """Over cells of {problem: record}: the problems every cell has, how many problems some
    cell lacks, the records that finished without an error, and the smallest sample count
    among them (the n every record can score EM@k or pass@k for)."""
    common = set.intersection(*(set(c) for c in cells.values()))
    every = set().union(*(set(c) for c in cells.values()))
    finished = [r for c in cells.values() for r in c.values() if "error" not in r]
    n = min((len(r["samples"]) for r in finished), default=0)
    return common, len(every - common), finished, n


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
    common, dropped, _, n = _coverage(cells)
    out: dict[str, Any] = {"problems": len(common), "dropped": dropped,
                           "n": n, "settings": settings,
                           "methods": _order(sorted({m for m, _ in cells})), "cells": {},
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


def tfv1_report(header: dict[str, Any], records: list[Record],
                plots: str | os.PathLike[str] | None = None) -> str:
    """Table 1 (TFv1) or Table 2 (TFv1Real), Table 5 and the cost per problem at the base
    point of :func:`sweep_points`, then, for a sweep, EM@k against each swept value (the
    paper's Figures 5 and 7)."""
    task, table = API_TASKS.get(header.get("task", ""), API_TASKS["tfv1"])
    temps, backs, base_t, base_b = sweep_points(header, records)
    s = tfv1_scores(records_at(header, records, base_t, base_b)
                    or records_at(header, records, base_t, backs[0]))
    s["wall_seconds"] = wall_seconds(records)
    s["job_seconds"] = sum(r.get("seconds", 0.0) for r in records)
    settings, methods, cells = s["settings"], s["methods"], s["cells"]
    ks = [k for k in KS if k == 1 or k <= s["n"]]
    lines = [f"# {task}: {s['problems']} problems, n = {s['n']}",
             "", f"{_about(header)}, max_new_tokens {header.get('max_new_tokens')}, "
             f"TensorFlow {header.get('tf_version')}. Wall time {s['wall_seconds'] / 60:.1f} "
             f"min ({s['job_seconds'] / 60:.1f} min of job time over all workers)."]
    if header.get("task") == "tfv1real":
        lines.append(_tfv1real_about(header, records))
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

    em = per_setting(lambda c: " | ".join(_pct(c["em"][k]) for k in ks), len(ks))
    calls = per_setting(lambda c: "{:.2f} ({:.2f}, {:.2f})".format(*c["calls"]))
    cost = per_setting(lambda c: f"{c['seconds']:.2f} | {c['lm_calls']:.1f} | "
                                 f"{c['backtracks']:.1f}", 3)
    lines += ["", f"## Exact match ({table})", "",
              "EM@1 is the greedy completion; EM@k for k > 1 is eq. 5 over the samples.", "",
              *_table([f"{st} EM@{k}" for st in settings for k in ks], em),
              "", "## Calls to the LM per sample (Table 5)", "",
              "avg (min, max): the mean over problems of each problem's average, minimum "
              "and maximum over its samples.", "",
              *_table([f"{st} avg (min, max)" for st in settings], calls),
              "", "## Cost per problem", "",
              "Seconds for the greedy and the sampled completions; distinct prefixes the "
              "model evaluated (`lm_calls`) and backtracks, for the samples only.", "",
              *_table([f"{st} {c}" for st in settings for c in ("s", "lm_calls", "backtracks")],
                      cost)]
    if plots is not None:
        lines += ["", f"![EM@k per method and setting]({_plot_tfv1(s, ks, Path(plots), task)})"]
    for name, values, at, figure in (
            ("temperature", temps, lambda v: (v, base_b), "Figure 5"),
            ("max_backtrack", backs, lambda v: (base_t, v), "Figure 7")):
        if len(values) > 1:
            lines += _sweep_section(header, records, task, name, values, at, figure, plots)
    return "\n".join(lines)


def _tfv1real_about(header: dict[str, Any], records: list[Record]) -> str:
    """Where TFv1Real's problems come from, and how many oracles the constraint lacks."""
    from .tfapi import DEFAULT_VERSION
    from .tfv1 import setting_names

    packages = header.get("packages") or []
    text = (f"Problems from {len(packages)} PyPI packages, prompts of at most "
            f"{header.get('max_prompt_tokens')} tokens (tokenizer {header.get('tokenizer')}).")
    if header.get("tf_version", DEFAULT_VERSION) == DEFAULT_VERSION:  # shipped: no download
        names = set(setting_names("v2"))
        outside = {r["problem"] for r in records
                   if "v2" in r["oracle"] and r["oracle"]["v2"][1:] not in names}
        if outside:
            many = "problems call" if len(outside) != 1 else "problem calls"
            text += (f" {len(outside)} {many} a name that TensorFlow "
                     f"{DEFAULT_VERSION}'s API modules do not list (Keras-backed "
                     "`compat.v1.layers.*` and `compat.v1.keras.*`, methods of classes, "
                     "`estimator`): the constrained methods cannot match them.")
    return text


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
                row = [_pct(p["cells"][(m, st)]["sampled"][k]) if (m, st) in p["cells"] else ""
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
    plt = _pyplot()
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


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise AdaptrackError(
            "plots need matplotlib: pip install matplotlib (or 'adaptrack[eval]')"
        ) from None
    return plt


def _plot_tfv1(s: dict[str, Any], ks: list[int], out: Path, task: str = "TFv1") -> Path:
    plt = _pyplot()
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


# -- code: HumanEval, MBPP ---------------------------------------------------------------

CODE_TASKS = {"humaneval": "HumanEval", "mbpp": "MBPP"}
CODE_KS = (1, 3, 5, 10, 20, 100)  # the paper's Table 3 (1 to 20), and 100 for large n


def code_scores(records: list[Record]) -> dict[str, Any]:
    """Per method, over the problems every method in ``records`` has: pass@1 of the greedy
    completion, pass@k of the samples by eq. 5 (k <= n), the shares of samples that parse
    and that pass the name check (``None`` where the records hold no name check), sample
    outcomes by status, and calls per sample. A job that raised an error scores as a miss,
    as in :func:`tfv1_scores`.

    >>> def rec(p, m, ok):
    ...     row = {"status": "pass" if ok else "fail", "parses": True, "names": ok}
    ...     return {"problem": p, "method": m, "greedy": row, "samples": [row, row],
    ...             "lm_requests": [3, 5], "seconds": 1.0}
    >>> s = code_scores([rec("a", "cd", True), rec("b", "cd", False), rec("a", "x", True)])
    >>> s["problems"], s["cells"]["cd"]["pass"], s["cells"]["cd"]["names"]
    (1, {'greedy': 1.0, 1: 1.0}, 1.0)
    """
    by_method: dict[str, dict[str, Record]] = defaultdict(dict)
    for r in records:
        by_method[r["method"]][r["problem"]] = r
    if not by_method:
        raise AdaptrackError("the results file has no finished jobs yet")
    common, dropped, finished, n = _coverage(by_method)
    out: dict[str, Any] = {"problems": len(common), "dropped": dropped, "n": n,
                           "ks": [k for k in CODE_KS if k <= n],
                           "methods": _order(list(by_method)), "cells": {}, "errors": {},
                           "wall_seconds": wall_seconds(records),
                           "isolated": all(r.get("isolated", True) for r in finished)}
    nan = float("nan")
    for method, by_problem in by_method.items():
        rows = [by_problem[p] for p in sorted(common)]
        ok = [r for r in rows if "error" not in r]
        if len(ok) < len(rows):
            out["errors"][method] = len(rows) - len(ok)
        if not rows:
            continue
        passed: dict[Any, float] = {
            "greedy": sum("error" not in r and r["greedy"]["status"] == "pass"
                          for r in rows) / len(rows)}
        for k in out["ks"]:
            passed[k] = metrics.mean_at_k(
                ((n, 0) if "error" in r else
                 (len(r["samples"]), sum(s["status"] == "pass" for s in r["samples"]))
                 for r in rows), k)
        samples = [s for r in ok for s in r["samples"]]
        named = [s["names"] for s in samples if s.get("names") is not None]
        statuses = Counter(s["status"] for s in samples)
        calls = [sum(r["lm_requests"]) / len(r["lm_requests"]) for r in ok]
        out["cells"][method] = {
            "pass": passed,
            "parses": sum(s["parses"] for s in samples) / len(samples) if samples else nan,
            "names": sum(named) / len(named) if named else None,
            "statuses": {k: v / len(samples) for k, v in statuses.items()} if samples else {},
            "calls": sum(calls) / len(calls) if calls else nan,
            "seconds": sum(r["seconds"] for r in ok) / len(ok) if ok else nan,
        }
    return out


def code_report(header: dict[str, Any], records: list[Record]) -> str:
    """Table 3 of a HumanEval or MBPP results file (markdown)."""
    s = code_scores(records)
    title = CODE_TASKS.get(header.get("task", ""), header.get("task"))
    cells, ks = s["cells"], s["ks"]
    with_names = any(c["names"] is not None for c in cells.values())
    columns = (["pass@1 (greedy)", *[f"pass@{k}" + (" (samples)" if k == 1 else "")
                                      for k in ks], "parse"]
               + (["name check"] if with_names else [])
               + ["fail / timeout / error", "calls/sample", "s/problem"])
    rows = {}
    for m in s["methods"]:
        if m not in cells:
            continue
        c = cells[m]
        st = c["statuses"]
        rows[m] = ([_pct(c["pass"]["greedy"]), *[_pct(c["pass"][k]) for k in ks],
                    _pct(c["parses"])]
                   + ([_pct(c["names"]) if c["names"] is not None else "n/a"]
                      if with_names else [])
                   + [" / ".join(_pct(st.get(x, 0.0)) for x in ("fail", "timeout", "error")),
                      f"{c['calls']:.1f}", f"{c['seconds']:.1f}"])
    shots = f", {header['shots']}-shot" if "shots" in header else ""
    seconds = header.get("max_seconds", 600.0)  # files without it ran at the default
    budget = "none" if seconds is None else f"{seconds:g} s"
    # Files without the key ran before completions could be cut: they had to end in time.
    ends = ("cut there" if header.get("allow_truncated", False)
            else "the searching methods' completions end within it")
    lines = [f"# {title}: {s['problems']} problems, n = {s['n']}", "",
             f"{_about(header)}, top-p {header.get('top_p')}, max_new_tokens "
             f"{header.get('max_new_tokens')} ({ends}), search budget {budget}, data "
             f"{header.get('data')}{shots}; sandbox limits {header.get('timeout')} s and "
             f"{(header.get('memory_bytes') or 0) / 2**20:.0f} MiB per program"
             f"{'' if s['isolated'] else ', with network (no namespace isolation here)'}. "
             f"Wall time {s['wall_seconds'] / 60:.1f} min."]
    if s["dropped"]:
        lines.append(f"{s['dropped']} more problems lack some method (the run has not "
                     "finished them) and are left out.")
    if s["errors"]:
        shown = ", ".join(f"{m}: {c}" for m, c in sorted(s["errors"].items()))
        lines.append(f"Jobs that raised an error, scored as misses: {shown} (the records "
                     "say why).")
    lines += ["", "## Functional correctness (Table 3)", "",
              "pass@1 (greedy) is the greedy completion; pass@k is eq. 5 over the samples. "
              "Parse: samples whose program up to the completion parses; name check: samples "
              "the python constraint (names=True) accepts as a whole program (a completion "
              "cut at max_new_tokens is not one); fail / timeout / error: how the other "
              "samples ended in the sandbox; s/problem: seconds from a problem's start until "
              "the method's last sample (a problem's methods share one engine, so their "
              "times overlap).", "", *_table(columns, rows)]
    return "\n".join(lines)


# -- binary ------------------------------------------------------------------------------


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


def binary_scores(records: list[Record]) -> dict[str, Any]:
    """KL of each method's samples to the exact target, the paper's sample KL (support: the
    union of every method's samples), P(00000), and sliding-window KL (window n/4)."""
    by_key = {r["key"]: r for r in records}
    if "target" not in by_key:
        raise AdaptrackError("the results file has no exact target yet (the 'target' job)")
    target = {tuple(t): p for t, p, _ in by_key["target"]["target"]}
    text_of = {tuple(t): text for t, _, text in by_key["target"]["target"]}
    runs = {k: r for k, r in by_key.items() if k != "target" and "samples" in r}
    # A sample outside the target (incomplete, or invalid) would make every KL infinite:
    # it is counted apart and the KLs are over the rest.
    logprob: dict[tuple[int, ...], float] = {}
    for r in runs.values():
        for t, lp in zip(r["samples"], r["logprobs"], strict=True):
            if tuple(t) in target:
                logprob[tuple(t)] = lp
    support = list(logprob)
    out: dict[str, Any] = {"target": target, "text_of": text_of, "methods": {},
                           "support": len(support)}
    for method in _order(list(runs)):
        r = runs[method]
        seqs = [tuple(t) for t in r["samples"] if tuple(t) in target]
        n = len(seqs)
        if not n:
            continue
        window, step = max(1, n // 4), max(1, n // 200)
        out["methods"][method] = {
            "n": n,
            "kl": metrics.kl_divergence(Counter(seqs), target),
            "sample_kl": metrics.sample_kl(seqs, logprob, support=support),
            "p00000": sum(text_of[t] == "00000" for t in seqs) / n,
            "lm_calls": r["lm_calls"],
            "calls_per_sample": sum(r["lm_requests"]) / len(r["lm_requests"]),
            "seconds": r["seconds"],
            "window": window,
            "step": step,
            "sliding": metrics.sliding_kl(seqs, window, target=target, step=step),
            "outside": len(r["samples"]) - n,
        }
    return out


def binary_report(header: dict[str, Any], records: list[Record],
                  plots: str | os.PathLike[str] | None = None) -> str:
    s = binary_scores(records)
    target, methods = s["target"], s["methods"]
    p0 = sum(p for t, p in target.items() if s["text_of"][t] == "00000")
    lines = [f"# Binary (RQ4): five random bits, {header.get('n')} samples per method", "",
             f"{_about(header)}; prompt {header.get('prompt')!r}.", "",
             f"Exact target by enumeration: {len(target)} token sequences, "
             f"P(00000 | c) = {p0:.4f}.", ""]
    if not methods:
        return "\n".join([*lines, "No method has finished yet."])
    lines += _table(["KL to target (exact)", "sample KL (paper)", "P(00000)", "calls/sample",
                     "lm_calls", "seconds"],
                    {m: [f"{r['kl']:.4f}", f"{r['sample_kl']:.4f}", f"{r['p00000']:.4f}",
                         f"{r['calls_per_sample']:.2f}", str(r["lm_calls"]),
                         f"{r['seconds']:.1f}"] for m, r in methods.items()})
    n = min(r["n"] for r in methods.values())
    noise = iid_kls(target, n)
    lines += ["", "KL to target: KL(empirical ‖ P(· | c)) in nats, the target enumerated. "
              f"Sampling noise alone gives {noise.mean():.4f} on average and less than "
              f"{float(np.quantile(noise, 0.99)):.4f} in 99 % of cases (KL of {n} independent "
              "draws from the target, 1000 simulations). "
              "Sample KL: the paper's estimate, the model's "
              f"sequence probabilities renormalized over the {s['support']} sequences any "
              "method drew; it differs from the exact KL by a constant shared by all "
              "methods, so only differences between rows mean something."]
    outside = {m: r["outside"] for m, r in methods.items() if r["outside"]}
    if outside:
        lines.append(f"Samples outside the target's support (incomplete or invalid), left "
                     f"out of the KLs: {outside}.")
    if plots is not None:
        lines += ["", f"![KL over sliding windows]({_plot_binary(s, header, Path(plots))})"]
    return "\n".join(lines)


def _plot_binary(s: dict[str, Any], header: dict[str, Any], out: Path) -> Path:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for m, r in s["methods"].items():
        xs = [i * r["step"] for i in range(len(r["sliding"]))]
        ax.plot(xs, r["sliding"], label=METHOD_NAMES.get(m, m))
    window = next(iter(s["methods"].values()))["window"]
    ax.axhline(iid_kls(s["target"], window).mean(), color="gray", linestyle=":",
               label="sampling noise (i.i.d. from the target)")
    ax.set_yscale("log")
    ax.set_xlabel(f"first sample of the window ({window} samples)")
    ax.set_ylabel("KL to the exact target (nats)")
    ax.set_title(f"Binary, {header.get('model')}: KL over sliding windows", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "binary-kl.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -- DSL (Table 4, Figure 4) -------------------------------------------------------------

#: Table 4's columns: the datasets in the paper's order (eval/dsl.py DATASETS).
DSL_COLUMNS = {"slia": "SLIA", "invbv": "INV-BV", "cp": "CP", "binary": "binary"}


def _kept(r: Record) -> list[int]:
    """The samples a DSL record's KL is over: those that ended, inside the grammar (for
    unconstrained, any that ended)."""
    valid: list[bool] = r["valid"] if "valid" in r else r["complete"]
    return [k for k, (ok, c) in enumerate(zip(valid, r["complete"], strict=True))
            if c and (ok or r["method"] == "unconstrained")]


def _dsl_run(r: Record, target: dict[tuple[int, ...], float] | None) -> dict[str, Any]:
    """One problem × method: the paper's KL(Q ‖ P_LM) over the samples that ended (for the
    constrained methods: inside the grammar; unconstrained: any that ended), its sliding
    windows of a quarter of them, and the exact KL to an enumerated target."""
    valid: list[bool] = r["valid"] if "valid" in r else r["complete"]
    keep = _kept(r)
    seqs = [tuple(r["samples"][k]) for k in keep]
    out: dict[str, Any] = {
        "n": len(r["samples"]), "used": len(seqs),
        "valid": sum(valid) / len(r["samples"]),
        "calls_per_sample": sum(r["lm_requests"]) / len(r["lm_requests"]),
        "lm_calls": r["lm_calls"], "seconds": r["seconds"]}
    if not seqs:
        return out
    logprob: dict[tuple[int, ...], float] = {}
    for k, t in zip(keep, seqs, strict=True):
        logprob.setdefault(t, r["logprobs"][k])
    window, step = max(1, len(seqs) // 4), max(1, len(seqs) // 200)
    out.update(kl=metrics.kl_to_lm(seqs, logprob), window=window, step=step,
               sliding=[metrics.kl_to_lm(seqs[i:i + window], logprob)
                        for i in range(0, len(seqs) - window + 1, step)])
    if target is not None and r["method"] != "unconstrained":
        inside = [t for t in seqs if t in target]
        out["outside_target"] = len(seqs) - len(inside)
        if inside:
            out["exact_kl"] = metrics.kl_divergence(Counter(inside), target)
    return out


def excess_kl(seqs: Sequence[Any], logprobs: Sequence[float], ref: Sequence[Any],
              ref_logprobs: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A method's KL(Q ‖ P_LM) minus a reference sampler's on the same problem, and the
    half-width of its normal-approximation interval (``z`` = 1.96: 95 %).

    Both KLs carry the same unknown −log Z, so the difference does not: with exact's
    samples as the reference it is how much farther from the target the method's samples
    are than a perfect sampler's at the same n. KL(Q ‖ P_LM) = Σ Q log Q − mean log P_LM(s);
    the interval comes from the variance of the log-likelihood term (each side's sample
    variance over its n), the entropy term being fixed by the samples' multiplicities.

    >>> a = [("x",), ("y",), ("z",), ("w",)]
    >>> delta, half = excess_kl(a, [-1.0, -2.0, -3.0, -2.0], a, [-1.0, -2.0, -3.0, -2.0])
    >>> delta, round(half, 3)   # the same samples: no excess, an interval around 0
    (0.0, 1.132)
    >>> round(excess_kl(a, [-5.0, -6.0, -7.0, -6.0], a, [-1.0, -2.0, -3.0, -2.0])[0], 6)
    4.0
    """
    def parts(xs: Sequence[Any], lps: Sequence[float]) -> tuple[float, float, float]:
        lp = np.asarray(lps, dtype=float)
        q = np.asarray(list(Counter(xs).values()), dtype=float) / len(xs)
        var = float(lp.var(ddof=1)) if len(lp) > 1 else math.inf
        return float(np.sum(q * np.log(q))), float(lp.mean()), var / len(lp)

    neg_h, mean_lp, v = parts(seqs, logprobs)
    ref_neg_h, ref_mean_lp, ref_v = parts(ref, ref_logprobs)
    delta = (neg_h - mean_lp) - (ref_neg_h - ref_mean_lp)
    return delta, z * math.sqrt(v + ref_v)


def _excess(r: Record, reference: Record) -> tuple[float, float] | None:
    """:func:`excess_kl` of a DSL record against the reference method's record of the same
    problem, over the samples :func:`_kept` keeps."""
    def kept(rec: Record) -> tuple[list[tuple[int, ...]], list[float]]:
        ks = _kept(rec)
        return [tuple(rec["samples"][k]) for k in ks], [rec["logprobs"][k] for k in ks]

    seqs, lps = kept(r)
    ref, ref_lps = kept(reference)
    if len(seqs) < 2 or len(ref) < 2:
        return None
    return excess_kl(seqs, lps, ref, ref_lps)


def dsl_scores(records: list[Record]) -> dict[str, Any]:
    """Per problem and method, :func:`_dsl_run`'s numbers; per dataset and method the mean
    KL over the problems that every method in the file finished (Table 4), and the mean
    sliding-window curve (Figure 4)."""
    targets = {r["problem"]: {tuple(t): p for t, p, _ in r["target"]}
               for r in records if r["method"] == "target" and "target" in r}
    runs = [r for r in records if r["method"] != "target"]
    if not runs:
        raise AdaptrackError("the results file has no finished DSL jobs yet")
    # A method whose every job raised (a search limit) is no column: its errors are listed.
    methods = _order(sorted({r["method"] for r in runs if "error" not in r}))
    dataset_of = {r["problem"]: r["dataset"] for r in runs}
    cells: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    errors: dict[str, list[str]] = defaultdict(list)
    for r in runs:
        if "error" in r:
            errors[r["method"]].append(r["problem"])
        else:
            cells[r["problem"]][r["method"]] = _dsl_run(r, targets.get(r["problem"]))
    # Against exact (the reference: its samples are draws of the target) wherever it ran.
    finished = {(r["problem"], r["method"]): r for r in runs if "error" not in r}
    for (problem, method), r in finished.items():
        ref = finished.get((problem, "exact"))
        if ref is not None and method not in ("exact", "unconstrained"):
            found = _excess(r, ref)
            if found is not None:
                cells[problem][method]["excess"] = found
    # Unconstrained is a reference, often without one sample that ended within the budget:
    # it does not decide which problems the constrained methods are compared on.
    required = [m for m in methods if m != "unconstrained"] or methods
    first = {p: k for k, p in reversed(list(enumerate(r["problem"] for r in runs)))}
    common = sorted((p for p, c in cells.items()
                     if all(m in c and "kl" in c[m] for m in required)), key=first.__getitem__)
    datasets = [d for d in DSL_COLUMNS if any(dataset_of[p] == d for p in common)]
    table: dict[str, dict[str, float]] = {m: {} for m in methods}
    curves: dict[str, dict[str, list[float]]] = {d: {} for d in datasets}
    for d in datasets:
        mine = [p for p in common if dataset_of[p] == d]
        for m in methods:
            if all("kl" in cells[p].get(m, {}) for p in mine):
                table[m][d] = float(np.mean([cells[p][m]["kl"] for p in mine]))
                shortest = min(len(cells[p][m]["sliding"]) for p in mine)
                curves[d][m] = np.mean([cells[p][m]["sliding"][:shortest] for p in mine],
                                       axis=0).tolist()
    for m in methods:  # weighted by problems, as the paper averages
        if common and all("kl" in cells[p].get(m, {}) for p in common):
            table[m]["average"] = float(np.mean([cells[p][m]["kl"] for p in common]))
    excess: dict[str, dict[str, tuple[float, float]]] = {m: {} for m in methods}
    for d in datasets:  # a mean over problems; the half-widths add in quadrature
        mine = [p for p in common if dataset_of[p] == d]
        for m in methods:
            pairs: list[tuple[float, float]] = [
                cells[p][m]["excess"] for p in mine if "excess" in cells[p].get(m, {})]
            if pairs and len(pairs) == len(mine):
                excess[m][d] = (float(np.mean([e for e, _ in pairs])),
                                math.sqrt(sum(h * h for _, h in pairs)) / len(pairs))
    return {"methods": methods, "required": required, "cells": dict(cells), "common": common,
            "excess": excess,
            "datasets": datasets,
            "dataset_of": dataset_of, "table": table, "curves": curves, "targets": targets,
            "errors": dict(errors), "wall_seconds": wall_seconds(records),
            "job_seconds": sum(r.get("seconds", 0.0) for r in records)}


def dsl_report(header: dict[str, Any], records: list[Record],
               plots: str | os.PathLike[str] | None = None) -> str:
    """Table 4 (KL(Q ‖ P_LM) per dataset and weighted over them), the per-problem KLs, the
    exact KL where a target was enumerated, and with ``plots`` Figure 4 (one PNG per
    dataset: KL over sliding windows of a quarter of the samples)."""
    s = dsl_scores(records)
    methods, cells, common, datasets = s["methods"], s["cells"], s["common"], s["datasets"]
    required = s["required"]
    counts = Counter(s["dataset_of"][p] for p in common)
    many = "problem" if len(common) == 1 else "problems"
    lines = [f"# DSL benchmarks (RQ4): {len(common)} {many}, n = {header.get('n')}", "",
             f"{_about(header)}, top_p {header.get('top_p')}, max_new_tokens "
             f"{header.get('max_new_tokens')}, samples end with EOS. Wall time "
             f"{s['wall_seconds'] / 60:.1f} min ({s['job_seconds'] / 60:.1f} min of job time "
             "over all workers)."]
    left = [p for p in cells if p not in common]
    if left:
        lines.append(f"Left out (some method has no finished record or no sample that "
                     f"ended): {', '.join(left)}.")
    if s["errors"]:
        shown = "; ".join(f"{m}: {', '.join(ps)}" for m, ps in sorted(s["errors"].items()))
        lines.append(f"Jobs that raised an error (a search limit; the records say which): "
                     f"{shown}.")
    if not common:
        return "\n".join(lines)
    columns = [f"{DSL_COLUMNS[d]} ({counts[d]})" for d in datasets] + ["average"]
    lines += ["", "## KL(Q ‖ P_LM) (Table 4)", "",
              "Per problem, KL of the empirical distribution Q of a method's samples (token "
              "sequences that ended inside the grammar) to the model's own probabilities, "
              "not renormalized: KL(Q ‖ P(· | c)) − log Z with an unknown log Z per problem, "
              "so only differences between methods on the same problems mean something. "
              "Means over each dataset's problems (their number in brackets) and over all of "
              "them (the paper's average, weighted by problems). With few samples per "
              "problem most samples are distinct and the number is dominated by their mean "
              "negative log-likelihood minus log n. Unconstrained: over every sample that "
              "ended, in the grammar or not (for reference: its target is P_LM itself); "
              "blank where some problem has no unconstrained sample that ended.", "",
              *_table(columns, {m: [f"{s['table'][m][d]:.2f}" if d in s["table"][m] else ""
                                    for d in [*datasets, "average"]] for m in methods})]
    lines += ["", "## Per problem", "",
              "KL(Q ‖ P_LM) per method; in brackets the share of samples inside the grammar "
              "that ended (samples that did not end are left out of the KL).", "",
              "| Problem | " + " | ".join(METHOD_NAMES.get(m, m) for m in methods) + " |",
              "|---" * (1 + len(methods)) + "|"]
    for p in sorted(common, key=lambda p: list(DSL_COLUMNS).index(s["dataset_of"][p])):
        lines.append(f"| {p} | " + " | ".join(
            (f"{cells[p][m]['kl']:.2f}" if "kl" in cells[p].get(m, {}) else "–")
            + (f" ({100 * cells[p][m]['valid']:.0f}%)" if m in cells[p] else "")
            for m in methods) + " |")
    lines += _excess_section(s)
    exact = {p: s["targets"][p] for p in common if p in s["targets"]}
    for p, target in exact.items():
        noise = iid_kls(target, min(cells[p][m]["used"] for m in required))
        lines += ["", f"## Exact KL to the enumerated target: {p}", "",
                  f"The target P(· | c) enumerated: {len(target)} token sequences. KL(Q ‖ "
                  f"P(· | c)) in nats, with no unknown offset; a perfect sampler shows "
                  f"{noise.mean():.4f} on average from sampling noise alone.", "",
                  *_table(["exact KL", "samples outside the target"],
                          {m: [f"{cells[p][m].get('exact_kl', math.nan):.4f}",
                               str(cells[p][m].get("outside_target", 0))]
                           for m in required})]
    if plots is not None:
        lines += ["", "## KL over sliding windows (Figure 4)", ""]
        lines += [f"![{DSL_COLUMNS[d]}]({_plot_dsl(s, d, header, Path(plots))})"
                  for d in datasets]
    return "\n".join(lines)


def _excess_section(s: dict[str, Any]) -> list[str]:
    """The estimate against exact's samples (:func:`excess_kl`) per dataset and problem."""
    shown = [m for m in s["methods"] if s["excess"].get(m)]
    if not shown:
        return []
    datasets = [d for d in s["datasets"] if any(d in s["excess"][m] for m in shown)]
    lines = ["", "## Excess KL over exact, with 95 % intervals", "",
             "A method's KL(Q ‖ P_LM) minus exact's on the same problem: the unknown log Z "
             "cancels, so this estimates how much farther from the target P(· | c) the "
             "method's samples are than draws of the target itself (exact's), at the same "
             "n. ± the half-width of a normal-approximation 95 % interval from the spread "
             "of the samples' log-probabilities; per dataset the mean over its problems. An "
             "interval above 0 is distortion the samples show; one that holds 0 shows none "
             "at this n (not its absence).", "",
             *_table([DSL_COLUMNS[d] for d in datasets],
                     {m: [f"{s['excess'][m][d][0]:+.2f} ± {s['excess'][m][d][1]:.2f}"
                          if d in s["excess"][m] else "" for d in datasets] for m in shown})]
    return lines


def _plot_dsl(s: dict[str, Any], dataset: str, header: dict[str, Any], out: Path) -> Path:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    mine = [p for p in s["common"] if s["dataset_of"][p] == dataset]
    # Unconstrained samples are not the same set (most never end inside the grammar), and
    # its windows are a quarter of the few that do: left out, as the paper's figure does.
    shown = [m for m in s["methods"] if m != "unconstrained" and m in s["curves"][dataset]]
    for m in shown:
        curve = s["curves"][dataset][m]
        step = min(s["cells"][p][m]["step"] for p in mine)
        color = f"C{METHOD_ORDER.index(m)}" if m in METHOD_ORDER else None  # same in every plot
        ax.plot([i * step for i in range(len(curve))], curve, label=METHOD_NAMES.get(m, m),
                marker="." if len(curve) < 30 else None, color=color)
    window = min(s["cells"][p][m]["window"] for p in mine for m in shown)
    ax.set_xlabel(f"first sample of the window ({window} samples, a quarter)")
    ax.set_ylabel("KL(Q ‖ P_LM) (nats)")
    many = f"mean over {len(mine)} problems" if len(mine) > 1 else mine[0]
    ax.set_title(f"{DSL_COLUMNS[dataset]}, {header.get('model')}: {many}, "
                 f"n = {header.get('n')}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"dsl-{dataset}-kl.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["binary_report", "binary_scores", "code_report", "code_scores", "dsl_report",
           "dsl_scores", "report",
           "tfv1_report", "tfv1_scores"]
