"""``exact``'s rounds on the default model (transformers, CPU): today's schedule against the
ones that waste fewer attempts (docs/design.md §3, shared Q in parallel).

Variants (``Exact.schedule``, ``Exact.open_root`` and ``Exact.several``, set on the class
for the run):

- ``fixed``: every sample slot in flight (up to 32) makes an attempt each round, and only
  the prefixes the attempts saw are opened (the behaviour before the schedules);
- ``fixed+open``: the same rounds, with the root opened before the first attempt;
- ``useful-1``: the ``useful`` schedule (twice the last round's useful attempts,
  at least half the slots waiting; sampling/exact.py), with the root opened first, one
  attempt per slot and round;
- ``useful``: the same, a slot running several attempts at once when a round
  has more attempts than slots waiting (n = 1, a request's last samples);
- ``lean``: ``useful`` with rounds of once (not twice) the last round's useful attempts and
  at least a quarter (not half) of the slots waiting;
- ``one``: one attempt at a time (``parallel=False``), each on the Q every earlier attempt
  left: the fewest rejections a schedule can reach, in as many passes as model calls.
- ``aheadW`` (W = 1, 2, 4, 8, 16, 32): the ``ahead`` schedule, one attempt at a time like
  ``one`` (each on its own stream), the model calls of the next W - 1 attempts fetched in
  the same passes (``width=W``; ``ahead1`` is ``one`` on per-attempt streams; the default
  is ``ahead``: the width the model's cost model gives, docs/benchmarks/width.md).

Workloads: the binary DSL problem (``binary.jsonl``'s first, the paper's binary study),
one or more SLIA problems (``--slia``, short prompts first), both as the DSL study runs them
(``end="eos"``, no fallback), and the everyday requests of ``benchmarks/everyday.py``
(without MaskBench). The variants run one after another on each workload, alternating
(A B C C B A …) with seeds 0, 1, … (``--repeat`` of them, the same for every variant);
every run starts on a fresh tree, after one untimed ``cd`` sample (the prompt's KV state
and the constraint's first masks). Columns per variant: attempts per sample (1 +
rejections / n; ± the standard error of the mean over the seeds), model calls (prefixes
evaluated), forward passes, CPU time and wall time, each the mean over the seeds, times
also as a ratio to the first variant's; the everyday
table ends with ``cd``'s CPU time on the same seeds. CPU time is the process's (run with
``OMP_NUM_THREADS=1``): on a shared, loaded machine it is the work done.

Run:  OMP_NUM_THREADS=1 python benchmarks/rounds.py [--quick] [--repeat 2]
      [--workloads binary,slia,everyday] [--binary-n 500] [--slia-n 10] [--slia 1]
      [--everyday-n 1,5] [--everyday-repeat R]
      [--variants fixed,fixed+open,useful-1,useful,lean,one,ahead8]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

import adaptrack as at
from adaptrack.eval.dsl import problems, prompt_ids
from adaptrack.eval.modeltask import paper_options
from adaptrack.lm.cost import width_for
from adaptrack.sampling.exact import Exact

DSL_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "dsl"
VARIANTS = {  # label: (schedule, open_root, several, (growth, floor), parallel, lookahead)
    "fixed": ("fixed", False, False, (2.0, 0.5), None, 8),
    "fixed+open": ("fixed", True, False, (2.0, 0.5), None, 8),
    "useful-1": ("useful", True, False, (2.0, 0.5), None, 8),
    "useful": ("useful", True, True, (2.0, 0.5), None, 8),
    "lean": ("useful", True, True, (1.0, 0.25), None, 8),
    "useful-g1": ("useful", True, True, (1.0, 0.5), None, 8),
    "useful-f4": ("useful", True, True, (2.0, 0.25), None, 8),
    "one": ("useful", True, True, (2.0, 0.5), False, 8),
    **{f"ahead{w}": ("ahead", True, True, (2.0, 0.5), None, w) for w in (1, 2, 4, 8, 16, 32)},
    "ahead": ("ahead", True, True, (2.0, 0.5), None, None),  # the default: the cost model's width
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def variant(label: str) -> Iterator[None]:
    """``Exact`` runs the ``label`` variant inside the block."""
    saved = (Exact.schedule, Exact.open_root, Exact.several, (Exact.growth, Exact.floor),
             Exact.lookahead)
    schedule, open_root, several, knobs, _, lookahead = VARIANTS[label]
    (Exact.schedule, Exact.open_root, Exact.several, (Exact.growth, Exact.floor),
     Exact.lookahead) = schedule, open_root, several, knobs, lookahead
    try:
        yield
    finally:
        (Exact.schedule, Exact.open_root, Exact.several, (Exact.growth, Exact.floor),
         Exact.lookahead) = saved


def once(lm: Any, prompt: Any, constraint: Any, n: int, options: at.SamplingOptions,
         label: str, seed: int) -> dict[str, Any]:
    """One ``generate`` of ``exact`` under ``label``: its counts and times."""
    passes = getattr(lm, "forward_calls", 0)
    started, cpu = time.perf_counter(), time.process_time()
    with variant(label), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            schedule, *_, parallel, lookahead = VARIANTS[label]
            # ``aheadW`` runs at width W; ``ahead`` at the cost model's, as a request does.
            width = {"width": lookahead} if schedule == "ahead" and lookahead else {}
            res = at.generate(lm, prompt, constraint, options=replace(
                options, method="exact", n=n, seed=seed, search_budget=None,
                **({} if parallel is None else {"parallel": parallel}), **width))
        except at.AdaptrackError as err:
            return {"error": type(err).__name__, "s": time.perf_counter() - started,
                    "cpu": time.process_time() - cpu}
    return {"attempts": 1 + res.stats["restarts"] / n, "calls": res.stats["lm_calls"],
            "passes": getattr(lm, "forward_calls", 0) - passes,
            "s": time.perf_counter() - started, "cpu": time.process_time() - cpu,
            "fallback": res.stats["fallback_samples"], "width": res.stats["width"]}


def measure(lm: Any, name: str, prompt: Any, constraint: Any, n: int,
            options: at.SamplingOptions, labels: list[str], repeat: int) -> dict[str, Any]:
    """Every variant on one workload with seeds 0 .. ``repeat`` - 1, alternating; the mean
    per variant over the seeds (the samples, so the counts, differ from seed to seed)."""
    with warnings.catch_warnings():  # the prompt's KV state and the constraint's first masks
        warnings.simplefilter("ignore")
        at.generate(lm, prompt, constraint, options=replace(options, method="cd", n=1, seed=0))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in labels}
    for r in range(repeat):
        for m in labels if r % 2 == 0 else labels[::-1]:
            runs[m].append(once(lm, prompt, constraint, n, options, m, r))
            log(f"# {name}, {m}, seed {r}: " + ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in runs[m][-1].items()))
    out: dict[str, Any] = {}
    for m in labels:
        ok = [x for x in runs[m] if "error" not in x]
        if not ok:
            out[m] = {"error": runs[m][0]["error"]}
            continue
        if len(ok) < len(runs[m]):
            log(f"# {name}, {m}: {len(runs[m]) - len(ok)} runs failed")
        out[m] = {k: statistics.mean(x[k] for x in ok) for k in ok[0]}
        attempts = [x["attempts"] for x in ok]
        # The spread between seeds: a fall in attempts smaller than it is not a finding.
        out[m]["se"] = statistics.stdev(attempts) / len(ok) ** 0.5 if len(ok) > 1 else 0.0
        log(f"# {name}, {m}: attempts per sample by seed "
            + ", ".join(f"{a:.2f}" for a in attempts))
    return out


def cd_cpu(lm: Any, prompt: Any, constraint: Any, n: int, options: at.SamplingOptions,
           repeat: int) -> float:
    """``cd``'s mean CPU time for the same request and seeds (everyday's base)."""
    total = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(repeat):
            cpu = time.process_time()
            at.generate(lm, prompt, constraint,
                        options=replace(options, method="cd", n=n, seed=r))
            total += time.process_time() - cpu
    return total / repeat


def row(name: str, n: int, got: dict[str, Any], labels: list[str]) -> str:
    base = got[labels[0]]
    cells = []
    for m in labels:
        r = got[m]
        if "error" in r:
            cells.append(r["error"])
            continue
        cpu = r["cpu"] / base["cpu"] if "cpu" in base else float("nan")
        wall = r["s"] / base["s"] if "s" in base else float("nan")
        cells.append(f"{r['attempts']:.2f} ± {r['se']:.2f}, {r['calls']:.0f}, {r['passes']:.0f}, "
                     f"{r['cpu']:.2f} ({cpu:.2f}), {r['s']:.2f} ({wall:.2f})")
    return f"| {name} | {n} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="binary at n = 100, one SLIA problem at n = 4, two everyday "
                             "requests at n = 5, one run each")
    parser.add_argument("--workloads", default="binary,slia,everyday")
    parser.add_argument("--variants", default=",".join(
                            m for m in VARIANTS
                            if not m.startswith("ahead") or m in ("ahead", "ahead32")),
                        help="labels of VARIANTS; the first is the base of the ratios "
                             "(default: all but the aheadW variants other than ahead32)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--binary-n", type=int, default=500)
    parser.add_argument("--slia-n", type=int, default=10)
    parser.add_argument("--slia", type=int, default=1, help="SLIA problems, shortest first")
    parser.add_argument("--everyday-n", default="1,5")
    parser.add_argument("--everyday-repeat", type=int, default=None,
                        help="seeds for the everyday requests (default: --repeat)")
    args = parser.parse_args()
    labels = [m for m in args.variants.split(",") if m]
    bad = [m for m in labels if m not in VARIANTS]
    if bad:
        sys.exit(f"unknown variant {bad[0]!r}; choose from {', '.join(VARIANTS)}")
    workloads = args.workloads.split(",")
    if args.quick:
        args.binary_n, args.slia_n, args.slia, args.repeat = 100, 4, 1, 1
        args.everyday_n = "5"
    lm = at.load_model()
    # The cost model times its passes once per model (about a second): here, not in a run.
    row_cost = lm.measured_row_cost()
    log(f"# row cost {row_cost:.3f}: default width {width_for(row_cost)}")
    print(f"# exact's rounds, {datetime.date.today()}; default model, CPU: {cpu_name()}; "
          f"load average at start: {load()}; seeds per variant, alternating: "
          f"{args.repeat} (binary, SLIA), {args.everyday_repeat or args.repeat} (everyday)\n")
    head = " | ".join(f"{m}: attempts/sample, calls, passes, CPU s (× {labels[0]}), "
                      f"wall s (× {labels[0]})" for m in labels)
    print(f"| workload | n | {head} |")
    print("|---|--:|" + "---|" * len(labels))
    dsl = paper_options(max_new_tokens=512, truncate_prompt=True, max_seconds=None)
    if ("binary" in workloads or "slia" in workloads) and not DSL_DATA.exists():
        log(f"# {DSL_DATA} is absent: the DSL workloads are skipped")
        workloads = [w for w in workloads if w not in ("binary", "slia")]
    if "binary" in workloads:
        p = problems(str(DSL_DATA), ("binary",))[0]
        got = measure(lm, p.id, prompt_ids(lm, p.prompt), at.constraints.ebnf(p.grammar, p.start),
                      args.binary_n, dsl, labels, args.repeat)
        print(row(f"binary {p.id}", args.binary_n, got, labels), flush=True)
    if "slia" in workloads:
        slia = sorted(problems(str(DSL_DATA), ("slia",)), key=lambda p: len(p.prompt))
        for p in slia[:args.slia]:
            got = measure(lm, p.id, prompt_ids(lm, p.prompt),
                          at.constraints.ebnf(p.grammar, p.start), args.slia_n, dsl, labels,
                          args.repeat)
            print(row(f"SLIA {p.id}", args.slia_n, got, labels), flush=True)
    if "everyday" in workloads:
        from everyday import requests  # benchmarks/everyday.py

        from adaptrack.serve.preprocess import hf_chat_template

        chat = hf_chat_template(lm)
        reqs = [r for r in requests(False) if not r.maskbench]
        if args.quick:
            reqs = reqs[:2]
        ratios: dict[str, list[float]] = {m: [] for m in labels}
        to_cd: dict[str, list[float]] = {m: [] for m in labels}
        print(f"\n| request | n | {head} | cd CPU s |")
        print("|---|--:|" + "---|" * (len(labels) + 1))
        for n in [int(x) for x in args.everyday_n.split(",")]:
            for req in reqs:
                prompt = (chat([{"role": "user", "content": req.prompt}]) if req.chat
                          else req.prompt)
                options = at.SamplingOptions(max_new_tokens=req.max_new_tokens,
                                             max_seconds=120.0)
                repeat = args.everyday_repeat or args.repeat
                got = measure(lm, req.name, prompt, req.constraint("default"), n, options,
                              labels, repeat)
                cd = cd_cpu(lm, prompt, req.constraint("default"), n, options, repeat)
                for m in labels:
                    if "cpu" in got[m] and "cpu" in got[labels[0]]:
                        ratios[m].append(got[m]["cpu"] / got[labels[0]]["cpu"])
                        to_cd[m].append(got[m]["cpu"] / cd)
                print(row(req.name, n, got, labels) + f" {cd:.2f} |", flush=True)
        print(f"\n| variant | everyday: median CPU × {labels[0]} | worst | best | "
              "median CPU × cd | worst × cd |")
        print("|---|--:|--:|--:|--:|--:|")
        for m in labels:
            if ratios[m]:
                print(f"| {m} | {statistics.median(ratios[m]):.2f} | {max(ratios[m]):.2f} | "
                      f"{min(ratios[m]):.2f} | {statistics.median(to_cd[m]):.2f} | "
                      f"{max(to_cd[m]):.2f} |")
    print(f"\nload average at end: {load()}")


if __name__ == "__main__":
    sys.exit(main())
