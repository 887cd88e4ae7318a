"""When ``max_new_tokens`` binds: the person schema of ``benchmarks/everyday.py`` after its raw
prompt at a few length limits, each method from a few seeds, CPU time and model calls.

The typical answer (``{"name": "John", "age": 30}``) is 15 to 19 tokens with EOS, so at 16
tokens the limit decides which texts are in the target and at 40 it does not. Prints one
row per limit, method and seed: CPU seconds (one torch thread: set ``OMP_NUM_THREADS=1``),
model calls (distinct prefixes), whether the CD fallback drew the sample, and the text.

    OMP_NUM_THREADS=1 python benchmarks/length_limit.py
    OMP_NUM_THREADS=1 python benchmarks/length_limit.py --tokens 16,40 --seeds 0 --methods exact
"""

from __future__ import annotations

import argparse
import datetime
import time
import warnings

import adaptrack as at

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="16,18,20,40", help="max_new_tokens values")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--methods", default="cd,adaptrack,exact")
    parser.add_argument("--max-seconds", type=float, default=120.0,
                        help="the search budget before the CD fallback (wall seconds)")
    args = parser.parse_args()
    lm = at.load_model()
    c = at.constraints.json_schema(PERSON)
    at.generate(lm, "Hello", c, method="cd", max_new_tokens=40)  # warm the caches
    print(f"# {datetime.date.today()}, the default model, prompt 'A person as JSON: ', n = 1")
    print("| max_new_tokens | method | seed | CPU s | model calls | fallback | text |")
    print("|--:|---|--:|--:|--:|--:|---|")
    for tokens in [int(t) for t in args.tokens.split(",")]:
        for method in args.methods.split(","):
            for seed in [int(s) for s in args.seeds.split(",")]:
                cpu = time.process_time()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res = at.generate(lm, "A person as JSON: ", c, method=method, n=1,
                                      seed=seed, max_new_tokens=tokens,
                                      max_seconds=args.max_seconds, search_budget=None)
                text = res.texts[0].replace("\n", "\\n").replace("|", "\\|")
                print(f"| {tokens} | {method} | {seed} | {time.process_time() - cpu:.1f} | "
                      f"{res.stats['lm_calls']} | {res.stats['fallback_samples']} | "
                      f"`{text}` |", flush=True)


if __name__ == "__main__":
    main()
