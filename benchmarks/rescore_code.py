"""Re-run a code task's recorded completions (HumanEval, MBPP) in today's sandbox and
compare the verdicts with those the results file holds: every completion recorded as a
pass, and ``--sample`` others chosen at random (seeded; each unique program once, the
recorded timeouts left out as they take the whole limit). Prints each pass that changed
and a count of changes per recorded status.

With ``--write OUT`` it writes the results file with every re-run completion's status and
detail replaced (gzip when OUT ends in .gz), for ``adaptrack report OUT``.

Run:  python benchmarks/rescore_code.py docs/results/humaneval.jsonl.gz [--sample 300]
      python benchmarks/rescore_code.py docs/results/mbpp.jsonl.gz --data mbpp.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from adaptrack.eval import humaneval, mbpp
from adaptrack.eval.codetask import CodeProblem, run_completion


def problems_of(header: dict[str, Any], data: str | None) -> dict[str, CodeProblem]:
    if header["task"] == "humaneval":
        version = header["data"].split()[-1]
        return {p.task_id: p for p in humaneval.problems(version)}
    if data is None:
        raise SystemExit("an MBPP file needs --data (the mbpp.jsonl it was run on)")
    digest, _ = mbpp.read(data)
    if not header["data"].endswith(digest):
        raise SystemExit(f"{data} is not the file the run used ({header['data']})")
    return {p.task_id: p for p in mbpp.problems(data, header.get("shots", 3))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--data", help="MBPP: the mbpp.jsonl the run used")
    parser.add_argument("--sample", type=int, default=300,
                        help="completions re-run besides the passes (default: 300)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--write", metavar="OUT")
    args = parser.parse_args()
    with gzip.open(args.results, "rt") if args.results.endswith(".gz") else open(
            args.results) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    header = lines[0]["header"]
    problems = problems_of(header, args.data)
    rows = [(r["problem"], c) for r in lines[1:] if "error" not in r
            for c in [r["greedy"], *r["samples"]]]
    recorded = {(p, c["text"]): c["status"] for p, c in rows}
    chosen = [k for k, s in recorded.items() if s == "pass"]
    others = sorted(k for k, s in recorded.items() if s not in ("pass", "timeout"))
    chosen += random.Random(0).sample(others, min(args.sample, len(others)))

    def rerun(key: tuple[str, str]) -> Any:
        return run_completion(problems[key[0]], key[1], timeout=header["timeout"],
                              memory_bytes=header["memory_bytes"])

    with ThreadPoolExecutor(args.workers) as pool:
        now = dict(zip(chosen, pool.map(rerun, chosen), strict=True))
    changes = Counter((recorded[k], o.status) for k, o in now.items() if recorded[k] != o.status)
    passes = sum(recorded[k] == "pass" for k in now)
    print(f"{args.results}: re-ran {len(now)} unique completions ({passes} recorded passes); "
          f"isolated: {all(o.isolated for o in now.values())}")
    for k, o in now.items():
        if recorded[k] == "pass" and o.status != "pass":
            print(f"  {k[0]}: pass -> {o.status} ({o.detail})")
    print("  changes (recorded -> now):",
          dict(changes) or "none", f"of {len(now)}")
    if args.write:
        for r in lines[1:]:
            for c in ([r["greedy"], *r["samples"]] if "error" not in r else []):
                if (r["problem"], c["text"]) in now:
                    o = now[(r["problem"], c["text"])]
                    c["status"], c["detail"] = o.status, o.detail
        with gzip.open(args.write, "wt") if args.write.endswith(".gz") else open(
                args.write, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
