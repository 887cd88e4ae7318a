"""What the code tasks (HumanEval, MBPP) declare alike: their options, which make their
flags; the fields of their header and records; and their report section, Table 3: per
method, pass@1 from the greedy completion, pass@k from the ``n`` samples by eq. 5, and the
shares of samples that parse and that pass the name check.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from ..errors import AdaptrackError
from . import checks, metrics
from .checks import BOOL, INT, NUMBER, POSITIVE, STAMPS, STR, Check, fields
from .codetask import MAX_SECONDS, METHODS
from .jobs import Record
from .sandbox import STATUSES
from .tables import coverage, header_line, method_table, ordered_methods, pct, wall_seconds
from .taskspec import Option, Sampling, TaskOption, methods_option

__all__ = ["CODE_HEADER", "CODE_KS", "CODE_OPTIONS", "CODE_TASKS", "code_record",
           "code_report", "code_scores"]

#: The options every code task has, after its own (flags in this order).
CODE_OPTIONS: tuple[TaskOption, ...] = (
    methods_option(METHODS, after="; the constrained ones decode with "
                            "adaptrack.constraints.python"),
    Sampling("n", 10, note="per problem and method, besides the greedy one"),
    Option(("--limit",), type="count", metavar="N", help="run the first N problems"),
    Sampling("max_new_tokens", 256),
    Sampling("top_p", 0.95, note="validity-aware for the constraint (the python constraint "
                                 "checks tokens one by one, and 1 checks the whole vocabulary "
                                 "at every step)"),
    Sampling("max_seconds", MAX_SECONDS,
             note="counted from the start of a problem's jobs (all methods share one "
                  "engine); a job past it is recorded as an error and scored as a miss"),
    Option(("--must-end",), flag=True, keyword="allow_truncated", convert=lambda v: not v,
           help="the searching methods sample only completions that end within "
                "--max-new-tokens (by default a completion is cut there, as unconstrained "
                "sampling cuts it, and still run)"),
    Option(("--timeout",), type="positive", default=10.0, metavar="S",
           help="seconds each program may run in the sandbox (default: 10)"),
    Option(("--memory",), type="count", default=1024, metavar="MIB",
           keyword="memory_bytes", convert=lambda mib: mib * 2**20,
           help="address-space limit of each program in MiB (default: 1024)"),
    Option(("--exec-workers",), type="count", default=2, metavar="N",
           help="programs run at once, each in its own process (default: 2)"),
    Option(("--unsafe-run-code",), flag=True, keyword="allow_unsandboxed",
           help="where bubblewrap cannot isolate the generated programs, run them anyway "
                "as your user, with your files and network (by default the run refuses "
                "to start; docs/sandbox.md)"))

#: The fields of a code task's header (:meth:`~adaptrack.eval.codetask.CodeTask.config`).
CODE_HEADER: dict[str, Check] = {
    "model": STR, "backend": STR, "device": STR, "n": POSITIVE, "temperature": NUMBER,
    "top_p": NUMBER, "max_new_tokens": POSITIVE, "seed": INT, "timeout": NUMBER,
    "max_seconds": checks.optional_number(), "allow_truncated": BOOL,
    "memory_bytes": POSITIVE, "data": STR}


def _completion(x: Any) -> bool:
    """One scored completion of a code record (eval/codetask.py CodeTask._score)."""
    return (isinstance(x, dict) and isinstance(x.get("text"), str)
            and x.get("status") in STATUSES and isinstance(x.get("detail"), str)
            and isinstance(x.get("parses"), bool)
            and "names" in x and (x["names"] is None or isinstance(x["names"], bool)))


_COMPLETION = "an object {text, status (" + "|".join(STATUSES) + "), detail, parses, names}"
_DONE: dict[str, Check] = {
    "greedy": (_completion, _COMPLETION),
    "samples": (checks.list_of(_completion), f"a non-empty list of {_COMPLETION}"),
    "lm_requests": (checks.list_of(checks.is_int), "a non-empty list of integers"),
    "lm_calls": INT, "seconds": NUMBER}
_MORE: dict[str, Check] = {
    "backtracks": NUMBER, "incomplete": INT, "exec_seconds": NUMBER,
    "isolated": (lambda x: isinstance(x, bool), "a boolean")}


def code_record(prefix: str) -> Callable[[Record], str | None]:
    """The record check of a code task whose problem ids start with ``prefix``.

    >>> code_record("MBPP/")({"key": "k", "problem": "HumanEval/0", "method": "cd"})
    "'problem' is not a MBPP/N problem id"
    """
    problem: Check = (lambda x: isinstance(x, str) and x.startswith(prefix),
                      f"a {prefix}N problem id")

    def check(r: Record) -> str | None:
        wrong = fields(r, {"problem": problem, "method": STR}, STAMPS)
        if wrong or "error" in r:  # a job that raised keeps its error and no results
            return wrong or fields(r, {"error": STR})
        return fields(r, _DONE, _MORE) or checks.samples_match(r, "lm_requests")

    return check


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
    common, dropped, finished, n = coverage(by_method)
    out: dict[str, Any] = {"problems": len(common), "dropped": dropped, "n": n,
                           "ks": [k for k in CODE_KS if k <= n],
                           "methods": ordered_methods(list(by_method)), "cells": {}, "errors": {},
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


def code_report(header: dict[str, Any], records: list[Record], plots: Any = None) -> str:
    """Table 3 of a HumanEval or MBPP results file (markdown; no plots)."""
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
        rows[m] = ([pct(c["pass"]["greedy"]), *[pct(c["pass"][k]) for k in ks],
                    pct(c["parses"])]
                   + ([pct(c["names"]) if c["names"] is not None else "n/a"]
                      if with_names else [])
                   + [" / ".join(pct(st.get(x, 0.0)) for x in ("fail", "timeout", "error")),
                      f"{c['calls']:.1f}", f"{c['seconds']:.1f}"])
    shots = f", {header['shots']}-shot" if "shots" in header else ""
    seconds = header.get("max_seconds", 600.0)  # files without it ran at the default
    budget = "none" if seconds is None else f"{seconds:g} s"
    # Files without the key ran before completions could be cut: they had to end in time.
    ends = ("cut there" if header.get("allow_truncated", False)
            else "the searching methods' completions end within it")
    lines = [f"# {title}: {s['problems']} problems, n = {s['n']}", "",
             f"{header_line(header)}, top-p {header.get('top_p')}, max_new_tokens "
             f"{header.get('max_new_tokens')} ({ends}), search budget {budget}, data "
             f"{header.get('data')}{shots}; sandbox limits {header.get('timeout')} s and "
             f"{(header.get('memory_bytes') or 0) / 2**20:.0f} MiB per program"
             f"{'' if s['isolated'] else ', unsandboxed (as the harness user, with network)'}. "
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
              "times overlap).", "", *method_table(columns, rows)]
    return "\n".join(lines)
