"""Which JSON layout the exact target should lie over: each layout's search cost and the values
it samples, on the JSON requests of ``everyday.py``'s tuned set (``--set tuned``; the frozen set
is kept for the figure after the choice) plus the weather request of the search issue.

A layout is a schema's ``"x-guidance"`` options. ``newline`` is the whitespace the library
allowed before (none, a space, or a newline and up to 20 spaces or tabs between any two
tokens); ``single line`` is ``json.dumps``'s (``", "`` and ``": "``, nothing else); ``compact``
is ``json.dumps(separators=(",", ":"))``; ``space`` allows one optional space anywhere. For
each request, layout and method: CPU time as a ratio to ``cd``'s under the same layout and to
``cd``'s under ``newline``, model calls, samples the fallback drew (of n x seeds), and, where
every sample parses, the share of the most frequent value (the text parsed, layout dropped):
a layout that moves the model's values shows there.

``--weather N`` instead draws N exact samples of the weather request under each layout, with no
fallback, and gives the share of each ``sky`` and the median ``temp_c``.

Run:  OMP_NUM_THREADS=1 python benchmarks/json_layout.py [--n 3] [--seeds 0,1]
      [--methods cd,adaptrack,exact] [--only TEXT] [--maskbench 4] [--weather 64]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import statistics
import sys
import time
import warnings
from typing import Any

from everyday import PERSON, Request, maskbench_schemas
from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

import adaptrack as at
from adaptrack.constraints.grammar.sources import JSON_WHITESPACE

LAYOUTS: dict[str, dict[str, Any]] = {
    "newline": {"whitespace_pattern": JSON_WHITESPACE},
    "single line": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    "compact": {"whitespace_flexible": False},
    "space": {"whitespace_pattern": "[ ]?"},
}
WEATHER = {"type": "object", "properties": {
    "sky": {"enum": ["sunny", "cloudy", "rain"]},
    "temp_c": {"type": "integer", "minimum": -40, "maximum": 50}},
    "required": ["sky", "temp_c"], "additionalProperties": False}


def json_requests(maskbench: int) -> list[Request]:
    out = [Request("weather (raw)", "Weather report as JSON: ", False, "json", WEATHER, 40),
           Request("person (raw)", "A person as JSON: ", False, "json", PERSON, 40),
           Request("person (chat)", "Give me a person as a JSON object with a name and an age.",
                   True, "json", PERSON, 40)]
    for k, (name, schema) in enumerate(maskbench_schemas(maskbench)):
        chat = k % 2 == 1
        prompt = ("Fill in this JSON schema with an example: " + json.dumps(schema)
                  if chat else "An example of a JSON object matching the schema "
                  + json.dumps(schema) + ":\n")
        out.append(Request(f"{name} ({'chat' if chat else 'raw'})", prompt, chat, "json",
                           schema, 160, maskbench=True))
    return out


def run(lm: at.LanguageModel, prompt: str, schema: dict[str, Any], layout: dict[str, Any],
        method: str, n: int, seeds: list[int], max_new_tokens: int) -> dict[str, Any]:
    constraint = at.constraints.json_schema({**schema, "x-guidance": layout})
    cpu, calls, fell, texts = 0.0, 0, 0, []
    for seed in seeds:
        started = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = at.generate(lm, prompt, constraint, method=method, n=n, seed=seed,
                              max_new_tokens=max_new_tokens)
        cpu += time.process_time() - started
        calls += res.stats["lm_calls"]
        fell += res.stats["fallback_samples"]
        texts += [s.text for s in res.samples if s.complete]
    values = []
    for text in texts:
        try:
            values.append(json.dumps(json.loads(text), sort_keys=True))
        except ValueError:
            pass
    top = (collections.Counter(values).most_common(1)[0][1] / len(values)
           if values and len(values) == n * len(seeds) else None)
    return {"cpu": cpu, "calls": calls, "fallback": fell, "top": top, "values": values}


def weather_values(lm: at.LanguageModel, n: int, max_seconds: float) -> None:
    """``exact``'s n samples of the weather request under each layout, searched alone (no
    fallback, ``max_seconds`` at most): the share of each ``sky`` and the median ``temp_c``,
    the values a layout should leave as the model means them."""
    print(f"\n| layout ({n} exact samples, weather) | sky: sunny | cloudy | rain | median temp_c "
          "| CPU s |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, layout in LAYOUTS.items():
        started = time.process_time()
        try:
            res = at.generate(lm, "Weather report as JSON: ", at.constraints.json_schema(
                {**WEATHER, "x-guidance": layout}), method="exact", n=n, seed=0,
                max_new_tokens=40, fallback=None, search_budget=None, max_seconds=max_seconds)
        except at.SearchLimitError as err:
            print(f"| {name} | {type(err).__name__} after "
                  f"{time.process_time() - started:.0f} s | | | | |")
            continue
        got = [json.loads(s.text) for s in res.samples]
        sky = collections.Counter(g["sky"] for g in got)
        temp = statistics.median(g["temp_c"] for g in got)
        shares = " | ".join(f"{sky[k] / n:.2f}" for k in ("sunny", "cloudy", "rain"))
        print(f"| {name} | {shares} | {temp:g} | {time.process_time() - started:.0f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--methods", default="cd,adaptrack,exact")
    parser.add_argument("--only", default=None, help="requests whose name contains this")
    parser.add_argument("--maskbench", type=int, default=4,
                        help="how many of the tuned set's MaskBench schemas (default 4)")
    parser.add_argument("--values", action="store_true", help="print the sampled values")
    parser.add_argument("--weather", type=int, default=0, metavar="N",
                        help="only exact's N samples of the weather request under each layout")
    parser.add_argument("--max-seconds", type=float, default=120.0,
                        help="the time budget of each --weather search")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    if "cd" not in methods:
        methods.insert(0, "cd")
    seeds = [int(x) for x in args.seeds.split(",")]
    lm = at.load_model()
    from adaptrack.serve.preprocess import hf_chat_template

    chat = hf_chat_template(lm)
    print(f"# JSON layouts, {datetime.date.today()}; default model, CPU: {cpu_name()}; load "
          f"average at start: {load()}; n = {args.n}; seeds: {args.seeds}; library defaults "
          "otherwise\n")
    at.generate(lm, "Hello", at.constraints.json_schema({"type": "object"}), method="cd",
                max_new_tokens=4)
    if args.weather:
        weather_values(lm, args.weather, args.max_seconds)
        return
    print("| request | layout | " + " | ".join(
        f"{m}: × cd, × newline cd, calls, fb, top value" for m in methods) + " |")
    print("|---|---|" + "---|" * len(methods))
    ratios: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    fallback: dict[tuple[str, str], int] = collections.defaultdict(int)
    for req in json_requests(args.maskbench):
        if args.only and args.only not in req.name:
            continue
        prompt = chat([{"role": "user", "content": req.prompt}]) if req.chat else req.prompt
        at.generate(lm, prompt, None, method="unconstrained", max_new_tokens=1)
        base = None
        for name, layout in LAYOUTS.items():
            got = {m: run(lm, prompt, req.spec, layout, m, args.n, seeds, req.max_new_tokens)
                   for m in methods}
            cd = got["cd"]["cpu"]
            base = cd if base is None else base
            cells = []
            for m in methods:
                r = got[m]
                ratios[m, name].append(r["cpu"] / base)
                fallback[m, name] += r["fallback"]
                top = "-" if r["top"] is None else f"{r['top']:.2f}"
                cells.append(f"{r['cpu'] / cd:.2f}, {r['cpu'] / base:.2f}, {r['calls']}, "
                             f"{r['fallback']}, {top}")
                if args.values:
                    print(f"    {req.name}, {name}, {m}: {r['values']}", file=sys.stderr)
            print(f"| {req.name} | {name} | " + " | ".join(cells) + " |", flush=True)
    print("\n| method | layout | median × newline cd | worst | samples by the fallback |")
    print("|---|---|--:|--:|--:|")
    for (m, name), xs in ratios.items():
        print(f"| {m} | {name} | {statistics.median(xs):.2f} | {max(xs):.2f} "
              f"| {fallback[m, name]} |")
    print(f"\nload average at end: {load()}")


if __name__ == "__main__":
    sys.exit(main())
