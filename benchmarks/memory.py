"""Peak memory of sampling against the number of samples, on the default model (CPU).

Each row runs in a fresh subprocess, which loads the default model with the transformers
backend, notes its resident set (``VmRSS``: the model alone) and its peak so far (loading),
runs one ``adaptrack.generate`` call and reports the process's peak resident set
(``VmHWM``, loading included) and what the backend and the sampler hold at the end: the
bytes of the KV states the backend keeps (``lm.kv_cache_bytes_used``: the storage they pin)
and the prefix tree's node count.

Rows: unconstrained sampling of 32 new tokens (EOS disabled so that every sample has 32
tokens and the tree grows the same way whatever the model's habit of stopping), and cd with
a small JSON schema (EOS allowed, as the constraint needs it).

Run:  python benchmarks/memory.py                      (see --n; minutes per 100 samples)
      python benchmarks/memory.py --n 100,500 --only unconstrained
      python benchmarks/memory.py --kv-cache-bytes 100000000 --cache-bytes 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

PROMPT = "The old harbour town was quiet that morning. Anna walked down to the"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
JSON_PROMPT = "A person as JSON with a name and an age:\n"
ROWS = ("unconstrained", "cd-json")


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def child(row: str, n: int, cache_bytes: int | None, kv_cache_bytes: int | None) -> dict[str, Any]:
    import numpy as np
    import torch

    import adaptrack as at

    torch.set_num_threads(1)
    options = {} if kv_cache_bytes is None else {"kv_cache_bytes": kv_cache_bytes}
    lm = at.load_model(backend="transformers", device="cpu", **options)
    model_rss, load_peak = _status("VmRSS"), _status("VmHWM")
    kwargs: dict[str, Any] = {"n": n, "seed": 0, "max_new_tokens": 32}
    if cache_bytes is not None:
        kwargs["max_cache_bytes"] = cache_bytes
    if row == "unconstrained":
        inner = lm._next_logprobs
        eos = lm.vocab.eos_ids

        def no_eos(prefixes: Any) -> np.ndarray:
            out = inner(prefixes)
            out[:, eos] = -np.inf
            return out

        lm._next_logprobs = no_eos  # type: ignore[method-assign]
        res = at.generate(lm, PROMPT, None, method="unconstrained", fast_forward=False,
                          **kwargs)
    else:
        res = at.generate(lm, JSON_PROMPT, at.constraints.json_schema(SCHEMA), method="cd",
                          **kwargs)
    kv = getattr(lm, "kv_cache_bytes_used", None)
    if kv is None:  # a backend without the counter: add up the storage its states pin
        seen: dict[int, int] = {}
        for state in getattr(lm, "_states", {}).values():
            for k, v in state:
                for t in (k, v):
                    s = t.untyped_storage()
                    seen[s.data_ptr()] = s.nbytes()
        kv = sum(seen.values())
    return {"row": row, "n": n, "model_rss": model_rss, "load_peak": load_peak,
            "peak_rss": _status("VmHWM"),
            "kv_bytes": int(kv), "tree_nodes": res.stats.get("tree_nodes"),
            "tokens": sum(len(s.tokens) for s in res.samples), "seconds": res.stats["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="50,200,500", help="sample counts, comma-separated")
    ap.add_argument("--only", default=",".join(ROWS), help=f"rows among {', '.join(ROWS)}")
    ap.add_argument("--json-n", default="100,500", help="sample counts of the cd-json rows")
    ap.add_argument("--cache-bytes", type=int, default=None,
                    help="generate(max_cache_bytes=...); default: generate's default")
    ap.add_argument("--kv-cache-bytes", type=int, default=None,
                    help="load_model(kv_cache_bytes=...); default: the backend's default")
    ap.add_argument("--child", nargs=2, metavar=("ROW", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.cache_bytes,
                               args.kv_cache_bytes)))
        return
    print(f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, python {platform.python_version()}")
    print(f"cache_bytes={args.cache_bytes}, kv_cache_bytes={args.kv_cache_bytes}\n")
    print("| row | n | tokens | model RSS (GB) | peak while loading (GB) | peak RSS (GB) "
          "| peak - model (GB) | KV kept (MB) | tree nodes | s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    plan = [(row, int(n)) for row in args.only.split(",")
            for n in (args.n if row == "unconstrained" else args.json_n).split(",")]
    for row, n in plan:
        cmd = [sys.executable, __file__, "--child", row, str(n)]
        for flag in ("cache_bytes", "kv_cache_bytes"):
            if getattr(args, flag) is not None:
                cmd += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"| {row} | {n} | failed: {done.stderr.strip().splitlines()[-1:]} |")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {row} | {n} | {r['tokens']} | {r['model_rss'] / 1e9:.2f} | "
              f"{r['load_peak'] / 1e9:.2f} | {r['peak_rss'] / 1e9:.2f} | "
              f"{(r['peak_rss'] - r['model_rss']) / 1e9:.2f} | "
              f"{r['kv_bytes'] / 1e6:.0f} | {r['tree_nodes']} | {r['seconds']:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
