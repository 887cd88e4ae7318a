"""Fast-forward on the default model: LM calls and wall time per sample with and without it,
for cd and adaptrack on a JSON-schema prompt, and the ratios the targets are stated in.

The schema forces most of the text (keys, quotes, separators); the model chooses the
values. With fast-forward each forced chain is one model call (a short prefill that returns
every position's distribution); without it each forced token is a call of its own. Each
configuration runs n samples in one ``generate`` call after ``clear_cache()``, so the model
evaluates the prompt once per configuration. ``lm_calls`` counts model calls (a chain is
one), ``calls/sample`` is ``lm_calls / n``, ``requests/sample`` the mean of
``Sample.lm_requests`` (prefixes a sample used, a chain counting once), and ``valid`` the
samples that are complete and parse under the schema, and ``same as off`` the samples whose
tokens equal those of the run without fast-forward (same seed and index: cd forces chains,
so its samples differ; adaptrack only prefills them, so they stay the same up to the float
rounding of batched passes). Each configuration runs once per seed (``--seeds``), off and
on alternating (off on, on off, …), and the counts and times are pooled over the seeds. The
second table gives off / on per method and the targets: cd with fast-forward at least 2×
faster than without, adaptrack with it no slower (ratio ≥ 1).

Run:  python benchmarks/fastforward.py [--backend auto|llamacpp|transformers] [-n 10]
                                       [--seeds 0,1,2,3,4]
      python benchmarks/fastforward.py -n 2 --seeds 0          (smoke run)
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

import adaptrack as at

SCHEMA = {
    "type": "object",
    "properties": {
        "name_of_the_person": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "favourite_colour": {"enum": ["red", "green", "blue", "yellow"]},
    },
    "required": ["name_of_the_person", "age", "favourite_colour"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}
PROMPT = ("Describe a fictional person as JSON with the keys name_of_the_person, age and "
          "favourite_colour.\nJSON: ")


TARGETS = {"cd": 2.0, "adaptrack": 1.0}  # s/sample without / with fast-forward


def run(lm: at.LanguageModel, constraint: at.constraints.Constraint, method: str, ff: bool,
        args: argparse.Namespace, seed: int) -> tuple[at.GenerationResult, float]:
    lm.clear_cache()
    started = time.perf_counter()
    res = at.generate(lm, PROMPT, constraint, method=method, n=args.n, seed=seed,
                      max_new_tokens=args.max_new_tokens, fast_forward=ff, search_budget=None)
    return res, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto", choices=["auto", "llamacpp", "transformers"],
                    help="auto: llama.cpp when llama-cpp-python is installed, else transformers")
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--seeds", default="0,1,2,3,4",
                    help="one run per configuration and seed (default 0,1,2,3,4)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    lm = at.load_model(backend=args.backend, device="cpu")
    constraint = at.constraints.json_schema(SCHEMA)
    seeds = [int(x) for x in args.seeds.split(",")]
    run(lm, constraint, "cd", True, argparse.Namespace(**{**vars(args), "n": 1}), 0)  # warm-up
    print(f"# fast-forward, {datetime.date.today()}, {cpu_name()}, load {load()}, "
          f"backend {args.backend} ({type(lm).__name__}), n={args.n} per seed, "
          f"seeds {args.seeds}, max_new_tokens={args.max_new_tokens}")
    print("| method | fast-forward | calls/sample | requests/sample | forced tokens/sample | "
          "s/sample | valid | tokens/sample | slowest sample (requests) | same as off |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = []
    for method in ("cd", "adaptrack"):
        times: dict[bool, list[float]] = {False: [], True: []}
        runs: dict[bool, list[at.GenerationResult]] = {False: [], True: []}
        for r, seed in enumerate(seeds):
            for ff in ((False, True) if r % 2 == 0 else (True, False)):
                res, seconds = run(lm, constraint, method, ff, args, seed)
                runs[ff].append(res)
                times[ff].append(seconds)
        for ff in (False, True):
            samples = [s for res in runs[ff] for s in res.samples]
            n = len(samples)
            valid = 0
            for s in samples:
                try:
                    valid += s.valid and isinstance(json.loads(s.text), dict)
                except ValueError:
                    pass
            calls = sum(res.stats["lm_calls"] for res in runs[ff])
            forced = sum(res.stats["forced_tokens"] for res in runs[ff])
            same = sum(a.tokens == b.tokens for on, off in zip(runs[ff], runs[False],
                                                               strict=True)
                       for a, b in zip(on.samples, off.samples, strict=True))
            print(f"| {method} | {'on' if ff else 'off'} | {calls / n:.1f} | "
                  f"{statistics.mean(s.lm_requests for s in samples):.1f} | "
                  f"{forced / n:.1f} | {sum(times[ff]) / n:.2f} | {valid}/{n} | "
                  f"{statistics.mean(len(s.tokens) for s in samples):.1f} | "
                  f"{max(s.lm_requests for s in samples)} | {same}/{n} |")
        calls_ratio = (sum(r.stats["lm_calls"] for r in runs[False])
                       / sum(r.stats["lm_calls"] for r in runs[True]))
        speed = sum(times[False]) / sum(times[True])
        ratios.append((method, calls_ratio, speed,
                       [a / b for a, b in zip(times[False], times[True], strict=True)]))
    print()
    print("| method | calls off / on | s/sample off / on | per-seed ratios | target | met |")
    print("| --- | ---: | ---: | --- | --- | :-: |")
    for method, calls_ratio, speed, per_seed in ratios:
        target = TARGETS[method]
        print(f"| {method} | {calls_ratio:.2f} | {speed:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in per_seed)} | ≥ {target:g} | "
              f"{'yes' if speed >= target else 'no'} |")
    print("example:", runs[True][0].samples[0].text)


if __name__ == "__main__":
    main()
