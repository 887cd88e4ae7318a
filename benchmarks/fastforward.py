"""Fast-forward on the default model: LM calls and wall time per sample with and without it,
for cd and adaptrack on a JSON-schema prompt (issue "fast-forward tokens", item 6).

The schema forces most of the text (keys, quotes, separators); the model chooses the
values. With fast-forward each forced chain is one model call (a short prefill that returns
every position's distribution); without it each forced token is a call of its own. Each
configuration runs n samples in one ``generate`` call after ``clear_cache()``, so the model
evaluates the prompt once per configuration. ``lm_calls`` counts model calls (a chain is
one), ``calls/sample`` is ``lm_calls / n``, ``requests/sample`` the mean of
``Sample.lm_requests`` (prefixes a sample used, a chain counting once), and ``valid`` the
samples that are complete and parse under the schema.

Run:  python benchmarks/fastforward.py [--backend llamacpp|transformers] [-n 10] [--seed 0]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="llamacpp", choices=["llamacpp", "transformers"])
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    lm = at.load_model(backend=args.backend, device="cpu")
    constraint = at.constraints.json_schema(SCHEMA)
    print(f"# fast-forward, {datetime.date.today()}, {cpu_name()}, load {load()}, "
          f"backend {args.backend}, n={args.n}, max_new_tokens={args.max_new_tokens}")
    print("| method | fast-forward | calls/sample | requests/sample | forced tokens/sample | "
          "s/sample | valid | tokens/sample |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for method in ("cd", "adaptrack"):
        for ff in (False, True):
            lm.clear_cache()
            started = time.perf_counter()
            res = at.generate(lm, PROMPT, constraint, method=method, n=args.n, seed=args.seed,
                              max_new_tokens=args.max_new_tokens, fast_forward=ff)
            seconds = time.perf_counter() - started
            n = len(res.samples)
            valid = 0
            for s in res.samples:
                try:
                    valid += s.valid and isinstance(json.loads(s.text), dict)
                except ValueError:
                    pass
            print(f"| {method} | {'on' if ff else 'off'} | {res.stats['lm_calls'] / n:.1f} | "
                  f"{statistics.mean(s.lm_requests for s in res.samples):.1f} | "
                  f"{res.stats['forced_tokens'] / n:.1f} | {seconds / n:.2f} | {valid}/{n} | "
                  f"{statistics.mean(len(s.tokens) for s in res.samples):.1f} |")
    print("example:", res.samples[0].text)


if __name__ == "__main__":
    main()
