"""Many samples of one long prompt on the transformers backend: wall time, CPU time and peak
memory with and without the per-pass bound on assembled KV states (``pass_kv_bytes``) and
with and without kept states sharing the prompt's positions (``share_tokens``).

Each of n walks reuses the prompt's kept KV state; a forward pass copies every row's state
into one left-padded batch, extends it by the new tokens and keeps each row's state again.
Unbounded, 20 rows of a 3 000-token prompt assemble 2.8 GB per pass; kept as copies, the 20
states hold the prompt 20 times; attended in place (``shared_attention``), a pass holds the
prompt once and each row's own positions. Each configuration runs
in a fresh process (peak RSS is per process): the default model, ``unconstrained``, n = 20,
24 new tokens, a prompt cut from the standard library's ``argparse.py`` to ``--tokens``.

Run:  python benchmarks/long_prompt.py [--tokens 3000] [-n 20] [--repeat 2] [--configs 'A;B']
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import subprocess
import sys
import time

from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

UNBOUNDED = 1 << 40
NEVER = 1 << 30  # share_tokens past any prompt: every state a copy
CONFIGS = {  # name: (pass_kv_bytes, share_tokens, shared_attention)
    "unbounded, copies": (UNBOUNDED, NEVER, 0),
    "1 GiB, copies": (1 << 30, NEVER, 0),
    "1 GiB, shared, copied per pass": (1 << 30, 64, 0),
    "1 GiB, shared, attended in place (default)": (1 << 30, 64, 1),
}


def child(budget: int, share: int, in_place: int, tokens: int, n: int) -> None:
    import argparse as source

    import adaptrack as at

    lm = at.load_model(pass_kv_bytes=budget, share_tokens=share, shared_attention=bool(in_place))
    ids = lm.encode(open(source.__file__).read())[:tokens]  # type: ignore[attr-defined]
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    res = at.generate(lm, ids, None, method="unconstrained", n=n, seed=0, max_new_tokens=24)
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"s": time.perf_counter() - started, "user": after.ru_utime - before.ru_utime,
                      "sys": after.ru_stime - before.ru_stime, "peak_gb": after.ru_maxrss / 1e6,
                      "passes": lm.forward_calls, "texts": res.texts}))  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--child", type=int, nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--configs", default=";".join(CONFIGS),
                        help="the configurations to run, by name, ';'-separated (default: all)")
    args = parser.parse_args()
    if args.child is not None:
        return child(*args.child, args.tokens, args.n)
    print(f"# {args.n} samples of a {args.tokens}-token prompt, {datetime.date.today()}; "
          f"CPU: {cpu_name()}; load average at start: {load()}\n")
    names = args.configs.split(";")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(args.repeat):  # alternating, so that load drifts hit both
        for name in names:
            budget, share, in_place = CONFIGS[name]
            out = subprocess.run([sys.executable, __file__, "--child", str(budget), str(share),
                                  str(in_place), "--tokens", str(args.tokens), "-n", str(args.n)],
                                 capture_output=True, text=True, check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    print("| pass_kv_bytes, states | wall s | user s | sys s | peak RSS GB | passes | same texts |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    base = runs[names[0]][0]["texts"]
    for name, rs in runs.items():
        def mean(key: str, rs: list[dict] = rs) -> float:
            return sum(r[key] for r in rs) / len(rs)
        same = sum(a == b for a, b in zip(rs[0]["texts"], base, strict=True))
        print(f"| {name} | {mean('s'):.1f} | {mean('user'):.1f} | {mean('sys'):.1f} | "
              f"{max(r['peak_gb'] for r in rs):.2f} | {rs[0]['passes']} | {same}/{len(base)} |")
    print(f"\nmeans over {args.repeat} runs each (peak: the largest); load average at end: "
          f"{load()}")


if __name__ == "__main__":
    sys.exit(main())
