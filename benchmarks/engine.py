"""The engine on the default model (transformers, CPU): shared-Q methods with their walks in
parallel against one walk at a time, and many prompts in one ``generate`` call against one
call per prompt.

- **parallel**: ``n`` samples (default 20) on the Figure 3 prompt (``FIGURE3_PROMPT``) under
  the TFv1 v2 setting's constraint (``setting_constraint("v2")``: every TF 2.16 name, or
  ``--constraint figure3`` for the 69 names of ``figure3_constraint()``), T = 1, for
  ``exact``, ``asap`` and ``adaptrack`` with ``share_q``, each with ``parallel=False`` (one
  walk at a time over the shared Q) and ``parallel=True`` (``batch_size`` walks over it, in
  batched model calls). The samples differ between the two (a walk sees another Q), so the
  table also gives lm_calls and forward passes: the speed-up is fewer, fuller passes, not
  less search. The issue's target is a speed-up of at least 2.5×.
- **many prompts**: ``cd``, ``n`` samples each on the first ``--prompts`` TFv1 problems'
  prompts (v2 constraint): one ``generate(lm, prompts, ...)`` call (one engine, every
  prompt's waiting prefixes in one batched call) against one ``generate`` per prompt.

Every run starts with ``lm.clear_cache()``, so each prefills its prompts; ``max_seconds`` is
off. Runs alternate between the two sides (A B B A …) and the table gives the median wall
time of ``--repeat`` runs per side; the counts come from the last run.

Run:  python benchmarks/engine.py                       (full run; about 5-10 min on 2 cores)
      python benchmarks/engine.py --quick               (smoke run: n = 4, 2 prompts, 1 run)
      python benchmarks/engine.py --threads 1 --repeat 5
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

import adaptrack as at
from adaptrack.eval.tfv1 import FIGURE3_PROMPT, figure3_constraint, problems, setting_constraint

# (label, method, extra generate options) of the parallel table.
SHARED_Q = (
    ("exact", "exact", {}),
    ("asap", "asap", {}),
    ("adaptrack share_q", "adaptrack", {"share_q": True}),
)
TARGET = 2.5


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def require_engine() -> None:
    """Exit with a message when this adaptrack has no ``parallel`` switch or does not take a
    list of prompts: the benchmark then measures nothing meaningful."""
    options = getattr(at, "SamplingOptions", None)
    declared = {f.name for f in dataclasses.fields(options)} if options is not None else set()
    if "parallel" not in set(inspect.signature(at.generate).parameters) | declared:
        sys.exit(f"benchmarks/engine.py: adaptrack.generate ({at.__file__}) has no `parallel` "
                 "parameter, so shared-Q methods cannot be run in parallel; run it on a tree "
                 "whose generate has the engine")
    toy = at.TableLM([b"a", b"<eos>"], lambda prefix: [1, 1], eos=1)
    try:
        out = at.generate(toy, [[0], [0, 0]], at.constraints.choice(["a"]), method="cd")
    except (TypeError, ValueError) as err:
        out = err
    if not isinstance(out, list):
        sys.exit(f"benchmarks/engine.py: adaptrack.generate ({at.__file__}) does not take a "
                 f"list of prompts (a probe got {type(out).__name__}: {out!s:.80})")


class Run:
    """One timed ``generate`` call (or a sequence of them): wall seconds and summed counts."""

    def __init__(self, lm: Any, work: Callable[[], list[at.GenerationResult]]) -> None:
        lm.clear_cache()
        passes = getattr(lm, "forward_calls", 0)
        started = time.perf_counter()
        results = work()
        self.seconds = time.perf_counter() - started
        self.passes = getattr(lm, "forward_calls", 0) - passes
        self.lm_calls = sum(r.stats["lm_calls"] for r in results)
        self.samples = sum(len(r.samples) for r in results)
        self.valid = sum(s.valid for r in results for s in r.samples)
        self.tokens = sum(len(s.tokens) for r in results for s in r.samples)


def compare(lm: Any, a: Callable[[], list[at.GenerationResult]],
            b: Callable[[], list[at.GenerationResult]], repeat: int,
            label: str) -> tuple[Run, Run, float, float]:
    """Run ``a`` and ``b`` ``repeat`` times each, alternating (A B B A …); the last runs and
    the median wall times."""
    times: dict[str, list[float]] = {"a": [], "b": []}
    last: dict[str, Run] = {}
    for r in range(repeat):
        for side in ("ab" if r % 2 == 0 else "ba"):
            run = Run(lm, a if side == "a" else b)
            times[side].append(run.seconds)
            last[side] = run
        log(f"{label} run {r + 1}: {times['a'][-1]:.1f} s / {times['b'][-1]:.1f} s")
    return last["a"], last["b"], statistics.median(times["a"]), statistics.median(times["b"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=20, help="samples per prompt (default 20)")
    ap.add_argument("--constraint", choices=("v2", "figure3"), default="v2",
                    help="v2: every TF 2.16 name (the TFv1 v2 setting; default); figure3: "
                         "figure3_constraint()'s 69 names")
    ap.add_argument("--prompts", type=int, default=8,
                    help="prompts of the many-prompts row (default 8)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side (default 3)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="default 32 (as TFv1)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="generate's batch_size (default: generate's own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--only", default="parallel,many", help="sections: parallel,many")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: n = 4, 2 prompts, 1 run per side")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.prompts, args.repeat = 4, 2, 1
    sections = set(args.only.split(","))
    require_engine()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = at.load_model(backend="transformers", device="cpu")
    constraint = (setting_constraint("v2") if args.constraint == "v2"
                  else figure3_constraint())
    options: dict[str, Any] = dict(n=args.n, temperature=1.0, seed=args.seed,
                                   max_new_tokens=args.max_new_tokens, max_seconds=None)
    if args.batch_size is not None:
        options["batch_size"] = args.batch_size
    # Warm-up: torch's first passes and the constraint's first masks are not the engine's.
    at.generate(lm, FIGURE3_PROMPT, constraint, method="cd", n=2, seed=99,
                max_new_tokens=args.max_new_tokens)

    print(f"# engine, {datetime.date.today()}, {cpu_name()}, load {load()} at start, "
          f"torch threads {torch.get_num_threads()}, adaptrack {at.__file__}")
    print(f"n = {args.n}, T = 1, max_new_tokens {args.max_new_tokens}, constraint "
          f"{args.constraint}, batch_size {options.get('batch_size', 'default')}, seed "
          f"{args.seed}; wall times are medians of {args.repeat} run(s) per side, counts from "
          "the last run\n")

    if "parallel" in sections:
        rows = []
        for label, method, extra in SHARED_Q:
            def one(parallel: bool, method: str = method,
                    extra: dict[str, Any] = extra) -> list[at.GenerationResult]:
                return [at.generate(lm, FIGURE3_PROMPT, constraint, method=method,
                                    parallel=parallel, **extra, **options, search_budget=None)]

            seq, par, seq_s, par_s = compare(lm, lambda one=one: one(False),
                                             lambda one=one: one(True), args.repeat, label)
            rows.append((label, seq, par, seq_s, par_s))
        print(f"## shared-Q methods: parallel=False vs parallel=True (Figure 3 prompt, "
              f"{args.constraint} constraint)\n")
        print("| method | sequential s | parallel s | speed-up | lm_calls seq / par | "
              f"forward passes seq / par | valid seq / par | target ≥ {TARGET}× |")
        print("|---|--:|--:|--:|--:|--:|--:|:-:|")
        for label, seq, par, seq_s, par_s in rows:
            ratio = seq_s / par_s
            print(f"| {label} | {seq_s:.2f} | {par_s:.2f} | {ratio:.2f}× | {seq.lm_calls} / "
                  f"{par.lm_calls} | {seq.passes} / {par.passes} | {seq.valid}/{seq.samples} "
                  f"/ {par.valid}/{par.samples} | {'yes' if ratio >= TARGET else 'no'} |")
        print()

    if "many" in sections:
        prompts = [p.prompt for p in problems(limit=args.prompts)]

        def one_by_one() -> list[at.GenerationResult]:
            return [at.generate(lm, p, constraint, method="cd", **options) for p in prompts]

        def together() -> list[at.GenerationResult]:
            return list(at.generate(lm, prompts, constraint, method="cd", **options))

        each, joint, each_s, joint_s = compare(lm, one_by_one, together, args.repeat,
                                               "many prompts")
        print(f"## many prompts: {len(prompts)} TFv1 prompts, cd, {args.constraint} "
              "constraint: one call per prompt vs one call\n")
        print("| method | prompts × n | one by one s | one call s | speed-up | "
              "lm_calls each / one | forward passes each / one |")
        print("|---|--:|--:|--:|--:|--:|--:|")
        print(f"| cd | {len(prompts)} × {args.n} | {each_s:.2f} | {joint_s:.2f} | "
              f"{each_s / joint_s:.2f}× | {each.lm_calls} / {joint.lm_calls} | "
              f"{each.passes} / {joint.passes} |")
        print()
    print(f"load {load()} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
