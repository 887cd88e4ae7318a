"""AdapTrack's crawl at the length limit: forward passes, model rows and CPU time until the
search has opened a fixed number of prefixes (a budget that does not depend on the
machine's load), on one request of benchmarks/everyday.py, for each ``crawl_ahead``
(docs/benchmarks/crawl.md; docs/design.md §3).

The search stops at its OPENED+1-th opened prefix (``QTable.open``); the table gives the
passes (``forward_calls``), the rows the model evaluated, CPU seconds and a hash of the
opened prefixes in order (equal hashes: the same walk). ``--one-row`` evaluates each row in
a pass of its own: then every ``crawl_ahead`` opens the same prefixes (batched rows change
float rounding by ~1e-6, which can part the walks after a few hundred openings). The last
columns split the passes that open a prefix by how many of its parent's children were open
in Q before it: none (a first child: the walk descending, one new prefix a position, as cd),
one, or more (the parent crawled: such a pass carries the siblings fetched ahead).

Run:  OMP_NUM_THREADS=1 python benchmarks/crawl.py "Github_easy---o44231 (raw)"
      [--seed 0] [--opened 400] [--rows 1,8] [--one-row]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any

import everyday  # benchmarks/everyday.py (the script's directory)
from machine import cpu_name, load

import adaptrack as at
from adaptrack.sampling import qtable
from adaptrack.sampling.adaptrack import AdapTrack
from adaptrack.serve.preprocess import hf_chat_template


class _Stop(Exception):
    """The search opened its budget of prefixes."""


def _kind(Q: qtable.QTable, s: Any) -> str:
    """Which column of the table a pass that opens ``s`` counts in."""
    x = s.parent  # open in Q: the walk drew s from it (None: s is the root)
    return ("first", "second", "crawled")[0 if x is None else min(Q.lowered(x), 2)]


def run(lm: Any, req: everyday.Request, seed: int, opened: int, rows: int) -> dict[str, Any]:
    AdapTrack.crawl_ahead = rows
    prompt: Any = req.prompt
    if req.chat:
        prompt = hf_chat_template(lm)([{"role": "user", "content": req.prompt}])
    seen: list[tuple[int, ...]] = []
    original = qtable.QTable.open

    def counted(self: qtable.QTable, node: Any) -> None:
        if not self.is_open(node):
            seen.append(node.tokens)
            if len(seen) > opened:
                raise _Stop
        original(self, node)

    kinds = {"first": 0, "second": 0, "crawled": 0}
    ahead = AdapTrack._siblings_ahead

    def sorted_pass(self: AdapTrack, Q: qtable.QTable, s: Any, races: Any) -> list[Any]:
        if s.expansion is None:  # this opening needs a pass
            kinds[_kind(Q, s)] += 1
        return ahead(self, Q, s, races)

    qtable.QTable.open = counted  # type: ignore[method-assign]
    AdapTrack._siblings_ahead = sorted_pass  # type: ignore[method-assign]
    lm.clear_cache()  # every run from a cold KV cache, as a process of its own
    passes, calls = lm.forward_calls, lm.calls
    cpu = time.process_time()
    try:
        at.generate(lm, prompt, req.constraint("default"), method="adaptrack", n=1,
                    seed=seed, max_new_tokens=req.max_new_tokens, max_seconds=None,
                    search_budget=None)
        ended = "finished"
    except _Stop:
        ended = "budget"
    finally:
        qtable.QTable.open = original  # type: ignore[method-assign]
        AdapTrack._siblings_ahead = ahead  # type: ignore[method-assign]
    return {"rows": rows, "passes": lm.forward_calls - passes, "calls": lm.calls - calls,
            "cpu": time.process_time() - cpu, "opened": min(len(seen), opened),
            "hash": hashlib.sha1(repr(seen[:opened]).encode()).hexdigest()[:10],
            "ended": ended, **kinds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request", help="a request name of benchmarks/everyday.py")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--opened", type=int, default=400)
    parser.add_argument("--rows", default="1,8", help="crawl_ahead values, comma-separated")
    parser.add_argument("--one-row", action="store_true", help="one row per forward pass")
    args = parser.parse_args()
    found = [r for r in everyday.requests(False) if r.name == args.request]
    if not found:
        parser.error(f"no request named {args.request!r}")
    lm: Any = at.load_model()
    if args.one_row:
        lm.max_batch = 1
    print(f"# {args.request}, seed {args.seed}, {args.opened} opened; CPU: {cpu_name()}; "
          f"load average at start: {load()}")
    print("\n| crawl_ahead | passes | rows | CPU s | opened | hash | ended "
          "| passes opening a first child | a second | a crawled parent's |")
    print("|--:|--:|--:|--:|--:|---|---|--:|--:|--:|")
    for rows in (int(r) for r in args.rows.split(",")):
        o = run(lm, found[0], args.seed, args.opened, rows)
        print(f"| {o['rows']} | {o['passes']} | {o['calls']} | {o['cpu']:.1f} | {o['opened']} "
              f"| {o['hash']} | {o['ended']} | {o['first']} | {o['second']} | {o['crawled']} |",
              flush=True)


if __name__ == "__main__":
    main()
