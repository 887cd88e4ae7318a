"""Wall time of ``adaptrack eval tfv1`` (four methods, both settings) on a baseline checkout
against this working tree, back to back on one machine: the baseline with one process, the
working tree with one process and with ``--workers 2``.

Each run is a fresh ``python -m adaptrack eval tfv1 --limit L -n N --backend B -o FILE
--no-report`` in a subprocess whose ``PYTHONPATH`` is the checkout's ``src`` (so it imports
that code, not the editable install: the table prints each run's ``adaptrack.__file__``),
with a new results file (nothing resumed). Wall time is the subprocess's, model load
included. The table also gives the records and the errors each file holds and the EM@1 /
EM@n (v1 setting, cd and adaptrack) from the records, as a check that the runs did the
same work; the samples themselves may differ (shared-Q methods in parallel draw other
samples).

Make the baseline once:  git worktree add /work/baseline <commit before the change>
Run:  python benchmarks/tfv1_wall.py --baseline /work/baseline              (--limit 50)
      python benchmarks/tfv1_wall.py --baseline /work/baseline --limit 2 -n 2   (smoke run)
      python benchmarks/tfv1_wall.py --baseline /work/baseline --backend llamacpp
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

HERE = Path(__file__).resolve().parent.parent
TARGET = 0.5


def run_env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def imported_from(src: Path) -> str:
    """Where ``import adaptrack`` resolves with ``src`` first on the path."""
    out = subprocess.run([sys.executable, "-c", "import adaptrack; print(adaptrack.__file__)"],
                         env=run_env(src), capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())
    return out.stdout.strip()


def commit(root: Path) -> str:
    """The checkout's commit, with ``+changes`` when its tracked files differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+changes" if dirty else "")


def summary(path: Path) -> tuple[int, int, dict[str, tuple[float, float]]]:
    """Records, errors, and per method the v1 EM@1 / EM@n (share of problems whose greedy /
    any of the n samples is the oracle) over the records of ``path``."""
    records, errors = 0, 0
    hits: dict[str, list[tuple[bool, bool]]] = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "header" in r:
                continue
            records += 1
            if "error" in r:
                errors += 1
                continue
            if r.get("setting") == "v1":
                oracle = r["oracle"]["v1"]
                hits.setdefault(r["method"], []).append(
                    (r["greedy"] == oracle, oracle in r["samples"]))
    em = {m: (sum(g for g, _ in h) / len(h), sum(a for _, a in h) / len(h))
          for m, h in hits.items()}
    return records, errors, em


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, type=Path,
                    help="root of the baseline checkout (a git worktree)")
    ap.add_argument("--limit", type=int, default=50, help="TFv1 problems (default 50)")
    ap.add_argument("-n", type=int, default=20, help="samples per job (default 20)")
    ap.add_argument("--backend", default="transformers", choices=["transformers", "llamacpp"])
    ap.add_argument("--workers", type=int, default=2,
                    help="workers of the third run (default 2; 0 skips it)")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="where the results files go (default: a new temporary directory)")
    args = ap.parse_args(argv)
    if args.backend == "llamacpp" and importlib.util.find_spec("llama_cpp") is None:
        sys.exit("benchmarks/tfv1_wall.py: llama-cpp-python is not installed here, so there "
                 "is no llama.cpp table (pip install -e '.[llamacpp]')")
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="tfv1_wall_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [("baseline", args.baseline.resolve(), 1), ("working tree", HERE, 1)]
    if args.workers > 1:
        runs.append(("working tree", HERE, args.workers))
    for _, root, _ in runs:
        where = imported_from(root / "src")
        if not where.startswith(str(root / "src")):
            sys.exit(f"benchmarks/tfv1_wall.py: with PYTHONPATH={root / 'src'} adaptrack "
                     f"comes from {where}, not from that checkout")

    print(f"# adaptrack eval tfv1 --limit {args.limit} -n {args.n} --backend {args.backend}, "
          f"{datetime.date.today()}, {cpu_name()}, {os.cpu_count()} CPUs, load {load()} at "
          f"start; results in {out_dir}\n")
    em = f"v1 EM@1 / EM@{args.n}"
    print("| code | commit | adaptrack from | workers | wall s | ratio to baseline | "
          f"records | errors | {em} cd | {em} adaptrack | load at end |")
    print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|")
    base_s = None
    walls = []
    for label, root, workers in runs:
        path = out_dir / f"{'baseline' if root != HERE else 'tree'}-w{workers}.jsonl"
        path.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "adaptrack", "eval", "tfv1", "--limit", str(args.limit),
               "-n", str(args.n), "--backend", args.backend, "--workers", str(workers),
               "-o", str(path), "--no-report"]
        print(f"{label}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        subprocess.run(cmd, env=run_env(root / "src"), check=True, cwd=out_dir,
                       stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        base_s = base_s or wall
        walls.append(wall)
        records, errors, hits = summary(path)

        def pair(method: str, hits: dict[str, tuple[float, float]] = hits) -> str:
            g, a = hits.get(method, (float("nan"), float("nan")))
            return f"{100 * g:.0f} % / {100 * a:.0f} %"

        print(f"| {label} | {commit(root)} | {imported_from(root / 'src')} | {workers} | "
              f"{wall:.0f} | {wall / base_s:.2f} | {records} | {errors} | {pair('cd')} | "
              f"{pair('adaptrack')} | {load()} |", flush=True)
    ratio = walls[1] / walls[0]
    print(f"\nworking tree / baseline, one process each: {ratio:.2f} (target ≤ {TARGET}: "
          f"{'met' if ratio <= TARGET else 'missed'})")
    if len(walls) > 2:
        print(f"--workers {args.workers} / one process, working tree: {walls[2] / walls[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
