"""``adaptrack demo``: every method on a toy problem, against the exact target."""

from __future__ import annotations

import sys
from collections import Counter
from typing import TextIO

from . import metrics, toy
from .generate import exact_distribution, generate

RUNS = [
    ("cd", {}),
    ("asap", {}),
    ("adaptrack", {}),
    ("adaptrack", {"share_q": True}),
    ("exact", {}),
]

ABOUT = {
    "binary": "five random bits; valid: 00000 or anything starting with 1; uniform model.\n"
              "Target P(00000) = 1/17 = 0.0588. Greedy CD picks 0 or 1 first with equal odds.",
    "api_names": "the model wants `matrix_rank(`, which does not exist (paper Figure 1); valid:\n"
                 "linalg.matrix_rank, linalg.matrix_exp, matrix_power, matrix_exp, then `(`.",
    "no_ab": "{a,b,c}^4 without 'ab', ending in 'c' or 'aaaa'; a context-dependent model\n"
             "(design.md §3).",
    "length_bound": "max_new_tokens=3 rules some tokenizations out: the target is conditioned\n"
                    "on finishing in time.",
}


def run_demo(
    problem: str = "binary", n: int = 2000, seed: int = 0, out: TextIO = sys.stdout
) -> None:
    """Print, per method, the share of the top texts, KL to the exact target and the cost."""
    lm, constraint, max_new = toy.PROBLEMS[problem]()
    target = exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    by_text: Counter[str] = Counter()
    for s, p in target.items():
        by_text[lm.vocab.decode(s).decode()] += p
    top = [t for t, _ in by_text.most_common(3)]
    if problem == "binary":
        top = ["00000", "11111"]  # the paper's point: CD gives 00000 about 1/2
    print(f"problem {problem}: {ABOUT[problem]}", file=out)
    print(f"{n} samples per method, seed {seed}; exact target by enumeration "
          f"({len(target)} valid token sequences).\n", file=out)
    heads = [f"P({t})" for t in top]
    print("| method | " + " | ".join(heads) + " | KL to target | lm_calls | backtracks | "
          "restarts | seconds |", file=out)
    print("|---" * (len(heads) + 6) + "|", file=out)
    row = " | ".join(f"{by_text[t]:.4f}" for t in top)
    print(f"| exact target | {row} | 0 | | | | |", file=out)
    show_progress = sys.stderr.isatty()
    for i, (method, options) in enumerate(RUNS, 1):
        name = method + (" (share_q)" if options else "")
        if show_progress:
            print(f"  [{i}/{len(RUNS)}] {name}…", end="\r", file=sys.stderr, flush=True)
        res = generate(lm, [], constraint, method=method, n=n, seed=seed,
                       max_new_tokens=max_new, **options)
        if show_progress:
            print(" " * 40, end="\r", file=sys.stderr, flush=True)
        seen = Counter(s.tokens for s in res.samples if s.complete)
        kl = metrics.kl_divergence(seen, target) if seen else float("inf")
        texts = Counter(s.text for s in res.samples if s.complete)
        row = " | ".join(f"{texts[t] / n:.4f}" for t in top)
        st = res.stats
        print(f"| {name} | {row} | {kl:.4f} | {st['lm_calls']} | {st['backtracks']} | "
              f"{st['restarts']} | {st['seconds']:.2f} |", file=out, flush=True)
    print("\nKL is KL(empirical || target) in nats; sampling noise alone gives about "
          f"{(len(target) - 1) / (2 * n):.4f}.", file=out)
