"""How much the model wants each TFv1 oracle: log P(text | prompt) of the v1 and the v2
answer (with "("), per problem, on the default model (or --model). Prints a table.

Explains the TFv1 results (docs/results/README.md): AdapTrack can only lift the v2 answer to
the top of the constrained distribution if the model gives `.compat.v1.…` real mass.

    python benchmarks/tfv1_oracle_mass.py [--model SPEC] [--limit N]
"""

from __future__ import annotations

import argparse
import math
import statistics

import adaptrack as at
from adaptrack.eval import tfv1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--limit", type=int)
    args = parser.parse_args()
    lm = at.load_model(args.model)
    rows = []
    for p in tfv1.problems(limit=args.limit):
        texts = [p.oracle[s] + "(" for s in tfv1.SETTINGS]
        rows.append(dict(zip(tfv1.SETTINGS, at.score(lm, p.prompt, texts), strict=True)))
    print(f"{len(rows)} TFv1 problems, model {getattr(lm, 'name', args.model)}\n")
    print("| answer | median log P | mean P | share of problems with P > 1e-3 |")
    print("|---|---|---|---|")
    for s in tfv1.SETTINGS:
        lps = [r[s] for r in rows]
        share = sum(lp > math.log(1e-3) for lp in lps) / len(lps)
        print(f"| {s} (`.{'compat.v1.' if s == 'v2' else ''}…(`) | {statistics.median(lps):.1f} "
              f"| {statistics.fmean(math.exp(x) for x in lps):.2e} | {100 * share:.1f}% |")
    ratio = [r["v2"] - r["v1"] for r in rows]
    print(f"\nmedian log P(v2 answer) − log P(v1 answer): {statistics.median(ratio):.1f}")


if __name__ == "__main__":
    main()
