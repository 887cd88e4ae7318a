"""Walks in flight against the transformers backend's kept KV states (default model, CPU).

The engine keeps every walk of every prompt in flight and asks the model for all their next
prefixes each step. The backend extends a kept KV state by one token per prefix; a walk
whose state was dropped (more walks than ``max_states``, or their states past
``kv_cache_bytes``) has its whole prefix, prompt included, fed again. This script runs one
``generate`` call over the first ``--prompts`` HumanEval prompts (unconstrained, n samples
each, ``--new`` tokens, EOS allowed) for each pair of bounds, each in a fresh process, and
prints the wall time, the milliseconds per generated token, the tokens fed through the
model (prompt and re-feeds included) and the peak resident memory.

Run:  python benchmarks/kv_states.py                       (about 5 minutes on 2 cores)
      python benchmarks/kv_states.py --bounds 64:1,1024:4 --prompts 8 -n 20 --new 48
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

BOUNDS = "64:1,1024:4"


def _row(max_states: int, gib: float, prompts: int, n: int, new: int, limit: float) -> dict:
    """One configuration in this process (run by ``--child``)."""
    import adaptrack as at
    from adaptrack.eval import humaneval

    lm = at.load_model(None, backend="transformers", max_states=max_states,
                       kv_cache_bytes=int(gib * 2**30))
    problems = humaneval.problems()[:prompts]
    started = time.perf_counter()
    try:
        out = at.generate(lm, [p.prompt for p in problems], None, method="unconstrained", n=n,
                          seed=1, max_new_tokens=new, top_p=0.95, max_seconds=limit)
    except at.SearchTimeoutError:
        out = None
    seconds = time.perf_counter() - started
    tokens = None if out is None else sum(len(s.tokens) for r in out for s in r.samples)
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    return {"max_states": max_states, "gib": gib, "seconds": seconds, "tokens": tokens,
            "fed": lm.fed_tokens, "passes": lm.forward_calls, "peak_gb": peak / 1e9,
            "timed_out": out is None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bounds", default=BOUNDS,
                    help=f"max_states:GiB pairs, comma-separated (default {BOUNDS})")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--new", type=int, default=48, help="max_new_tokens (default 48)")
    ap.add_argument("--limit", type=float, default=300.0,
                    help="seconds a configuration may take before it counts as timed out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        states, gib = args.child.split(":")
        print(json.dumps(_row(int(states), float(gib), args.prompts, args.n, args.new,
                              args.limit)))
        return
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d')}; {args.prompts} HumanEval prompts x n = {args.n}, "
          f"{args.new} new tokens, unconstrained, top-p 0.95, seed 1\n")
    print("| max_states | kv_cache_bytes | wall s | ms/token | tokens fed / generated "
          "| forward passes | peak GB |")
    print("|--:|--:|--:|--:|--:|--:|--:|")
    for pair in args.bounds.split(","):
        child = subprocess.run(
            [sys.executable, __file__, "--child", pair, "--prompts", str(args.prompts),
             "-n", str(args.n), "--new", str(args.new), "--limit", str(args.limit)],
            capture_output=True, text=True, check=True)
        r = json.loads(child.stdout.strip().splitlines()[-1])
        if r["timed_out"]:
            print(f"| {r['max_states']} | {r['gib']:g} GiB | > {args.limit:g} (timed out) | "
                  f"| {r['fed']} fed | {r['passes']} | {r['peak_gb']:.2f} |")
        else:
            print(f"| {r['max_states']} | {r['gib']:g} GiB | {r['seconds']:.1f} | "
                  f"{1000 * r['seconds'] / r['tokens']:.1f} | {r['fed']} / {r['tokens']} | "
                  f"{r['passes']} | {r['peak_gb']:.2f} |")


if __name__ == "__main__":
    main()
