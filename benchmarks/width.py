"""Width: ``exact``'s attempts followed at once against the forward passes and CPU time they
cost, on requests of the frozen set (benchmarks/frozen_requests.json, read as
``everyday.py --set frozen`` reads it), on the default model (docs/benchmarks/width.md;
docs/design.md §3, width).

First the model's row cost as the cost model measures it (``lm/cost.py``: the relative
cost of one more row in a pass) and the width it maps to; then, per request and width, one
``exact`` call (n, seed; the library's default budgets) from a fresh tree and an empty KV
cache: CPU seconds of the process, wall seconds, forward passes (``lm.forward_calls``),
model calls (prefixes evaluated), rejected attempts, samples drawn by the fallback and
whether the samples are those of width 1 (they should be: exact's samples do not depend
on the width). With one torch thread (``OMP_NUM_THREADS=1``) CPU time is the work done,
which other jobs on a shared machine do not inflate.

Run:  OMP_NUM_THREADS=1 python benchmarks/width.py [--widths 1,4,16,32,auto] [--n 3]
      [--seed 0] [--requests "config line (chat, Lark)" "book (raw)" ...]
"""

from __future__ import annotations

import argparse
import datetime
import time
import warnings
from typing import Any

import everyday  # benchmarks/everyday.py (the script's directory)
from machine import cpu_name, load

import adaptrack as at
from adaptrack.lm.cost import width_for
from adaptrack.serve.preprocess import hf_chat_template

REQUESTS = ["config line (chat, Lark)", "SQL query (chat, Lark)", "book (raw)"]


def run(lm: Any, prompt: str, req: everyday.Request, width: int | None, n: int,
        seed: int) -> dict[str, Any]:
    """One exact call at ``width`` (None: the cost model's) from an empty KV cache."""
    lm.clear_cache()
    passes, cpu, wall = lm.forward_calls, time.process_time(), time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning: counted below
        res = at.generate(lm, prompt, req.constraint("default"), method="exact", n=n,
                          seed=seed, max_new_tokens=req.max_new_tokens, width=width)
    return {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
            "passes": lm.forward_calls - passes, "calls": res.stats["lm_calls"],
            "width": res.stats["width"], "restarts": res.stats["restarts"],
            "fallback": res.stats["fallback_samples"], "tokens": [s.tokens for s in res.samples]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="1,4,16,32,auto",
                        help="comma-separated widths; 'auto': the cost model's")
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", nargs="+", default=REQUESTS,
                        help="names of requests of the frozen set")
    args = parser.parse_args()
    widths = [None if w == "auto" else int(w) for w in args.widths.split(",")]
    lm = at.load_model()
    chat = hf_chat_template(lm)
    started = time.perf_counter()
    cost = lm.measured_row_cost()
    print(f"# width, {datetime.date.today()}; default model, CPU: {cpu_name()}; load average "
          f"at start: {load()}; n = {args.n}, seed {args.seed}\n")
    print(f"row cost (measured in {time.perf_counter() - started:.1f} s): {cost:.3f} of a "
          f"one-row pass per extra row; cost-model width: {width_for(cost)}\n")
    by_name = {r.name: r for r in everyday.frozen_requests()}
    print("| request | width | CPU s | wall s | passes | calls | rejected | fallback | "
          "same samples |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|---|")
    for name in args.requests:
        req = by_name[name]
        prompt = chat([{"role": "user", "content": req.prompt}]) if req.chat else req.prompt
        at.generate(lm, prompt, req.constraint("default"), method="cd",  # warm-up
                    max_new_tokens=req.max_new_tokens)
        first: list[Any] | None = None
        for width in widths:
            r = run(lm, prompt, req, width, args.n, args.seed)
            first = r["tokens"] if first is None else first
            label = f"{r['width']}" + (" (auto)" if width is None else "")
            print(f"| {name} | {label} | {r['cpu']:.2f} | {r['wall']:.2f} | {r['passes']} | "
                  f"{r['calls']} | {r['restarts']} | {r['fallback']} | "
                  f"{'yes' if r['tokens'] == first else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
