"""The DSL task's report section (:mod:`~adaptrack.eval.dsl`): Table 4's KL(Q ‖ P_LM) per
dataset (and the exact KL where a target was enumerated), the excess KL over exact's
samples with its interval, and Figure 4 (KL over sliding windows) per dataset.
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AdaptrackError
from . import metrics
from .jobs import Record
from .tables import (
    METHOD_NAMES,
    METHOD_ORDER,
    header_line,
    iid_kls,
    method_table,
    ordered_methods,
    pyplot,
    wall_seconds,
)

__all__ = ["DSL_COLUMNS", "dsl_report", "dsl_scores", "excess_kl"]


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
    methods = ordered_methods(sorted({r["method"] for r in runs if "error" not in r}))
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
    counts = Counter(s["dataset_of"][p] for p in common)
    many = "problem" if len(common) == 1 else "problems"
    lines = [f"# DSL benchmarks (RQ4): {len(common)} {many}, n = {header.get('n')}", "",
             f"{header_line(header)}, top_p {header.get('top_p')}, max_new_tokens "
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
              *method_table(columns, {m: [f"{s['table'][m][d]:.2f}" if d in s["table"][m] else ""
                                    for d in [*datasets, "average"]] for m in methods})]
    lines += _per_problem_section(s) + _excess_section(s) + _exact_sections(s)
    if plots is not None:
        lines += ["", "## KL over sliding windows (Figure 4)", ""]
        lines += [f"![{DSL_COLUMNS[d]}]({_plot_dsl(s, d, header, Path(plots))})"
                  for d in datasets]
    return "\n".join(lines)


def _per_problem_section(s: dict[str, Any]) -> list[str]:
    """KL(Q ‖ P_LM) per problem and method, with the share of samples inside the grammar."""
    methods, cells = s["methods"], s["cells"]
    lines = ["", "## Per problem", "",
             "KL(Q ‖ P_LM) per method; in brackets the share of samples inside the grammar "
             "that ended (samples that did not end are left out of the KL).", "",
             "| Problem | " + " | ".join(METHOD_NAMES.get(m, m) for m in methods) + " |",
             "|---" * (1 + len(methods)) + "|"]
    for p in sorted(s["common"], key=lambda p: list(DSL_COLUMNS).index(s["dataset_of"][p])):
        lines.append(f"| {p} | " + " | ".join(
            (f"{cells[p][m]['kl']:.2f}" if "kl" in cells[p].get(m, {}) else "–")
            + (f" ({100 * cells[p][m]['valid']:.0f}%)" if m in cells[p] else "")
            for m in methods) + " |")
    return lines


def _exact_sections(s: dict[str, Any]) -> list[str]:
    """The exact KL to the target of each problem whose target was enumerated."""
    cells, required, lines = s["cells"], s["required"], []
    exact = {p: s["targets"][p] for p in s["common"] if p in s["targets"]}
    for p, target in exact.items():
        noise = iid_kls(target, min(cells[p][m]["used"] for m in required))
        lines += ["", f"## Exact KL to the enumerated target: {p}", "",
                  f"The target P(· | c) enumerated: {len(target)} token sequences. KL(Q ‖ "
                  f"P(· | c)) in nats, with no unknown offset; a perfect sampler shows "
                  f"{noise.mean():.4f} on average from sampling noise alone.", "",
                  *method_table(["exact KL", "samples outside the target"],
                          {m: [f"{cells[p][m].get('exact_kl', math.nan):.4f}",
                               str(cells[p][m].get("outside_target", 0))]
                           for m in required})]
    return lines


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
             *method_table([DSL_COLUMNS[d] for d in datasets],
                     {m: [f"{s['excess'][m][d][0]:+.2f} ± {s['excess'][m][d][1]:.2f}"
                          if d in s["excess"][m] else "" for d in datasets] for m in shown})]
    return lines


def _plot_dsl(s: dict[str, Any], dataset: str, header: dict[str, Any], out: Path) -> Path:
    plt = pyplot()
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
