"""``adaptrack demo``: on the default model, the paper's Figure 3 (what each method writes
when the model's intent is invalid) and the five-bit task (how far each method's
distribution is from the exact target, docs/design.md §2); with ``--problem``, every method
on a toy problem against the exact target.

>>> import io
>>> out = io.StringIO()
>>> run_demo("binary", n=200, seed=0, out=out)
>>> print(out.getvalue().splitlines()[0])
problem binary: five random bits; valid: 00000 or anything starting with 1; uniform model.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from typing import Any, TextIO

from . import testing
from .eval import binary, metrics
from .eval.tfv1 import (
    FIGURE3_PROMPT,
    FIGURE3_V1_INTENT,
    FIGURE3_V2_ANSWER,
    TF2_NAMES,
    figure3_constraint,
)
from .generate import exact_distribution, generate
from .lm.base import LanguageModel
from .scoring import score

RUNS: list[tuple[str, dict[str, Any]]] = [
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
             "(docs/design.md §3).",
    "length_bound": "max_new_tokens=3 rules some tokenizations out: the target is conditioned\n"
                    "on finishing in time.",
}


def run_demo(
    problem: str = "binary", n: int = 2000, seed: int = 0, out: TextIO | None = None
) -> None:
    """Print, per method, the share of the top texts, KL to the exact target and the cost."""
    out = out or sys.stdout
    lm, constraint, max_new = testing.PROBLEMS[problem]()
    target = exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    by_text: dict[str, float] = {}
    for s, p in target.items():
        text = lm.vocab.decode(s).decode()
        by_text[text] = by_text.get(text, 0.0) + p
    top = sorted(by_text, key=by_text.__getitem__, reverse=True)[:3]
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


#: Samples per method in the model demo's five-bit task: the n samples share one prefix tree
#: of about 33 prefixes, so their cost is in the sampler, not in the model.
BITS_SAMPLES = 2000

#: The methods of the five-bit task; AdapTrack shares Q across samples (paper RQ4).
BITS_RUNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("cd", {}), ("adaptrack", {"share_q": True}), ("exact", {}))


def run_model_demo(
    model: str | None = None,
    backend: str = "auto",
    device: str = "auto",
    n: int = 10,
    seed: int = 0,
    out: TextIO | None = None,
    bits_n: int | None = None,
    dtype: str = "auto",
) -> None:
    """On a real model: the paper's Figure 3 (what unconstrained decoding, CD and AdapTrack
    write after ``return tf`` when only TF 2 names are valid; ``n`` samples each) and the
    five-bit task (:func:`five_bits`, ``bits_n`` samples per method, default
    :data:`BITS_SAMPLES`)."""
    out = out or sys.stdout
    from .lm.load import load_model

    started = time.perf_counter()
    lm = load_model(model, backend=backend, device=device, dtype=dtype)
    name = getattr(lm, "name", model) or "the default model"
    print(f"model: {name} ({type(lm).__name__}, loaded in "
          f"{time.perf_counter() - started:.1f} s)\n", file=out)
    figure3(lm, n, seed, out)
    print(file=out)
    five_bits(lm, bits_n or BITS_SAMPLES, seed, out)


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        print(f"  {text}".ljust(40), end="\r", file=sys.stderr, flush=True)


def figure3(lm: LanguageModel, n: int = 10, seed: int = 0, out: TextIO | None = None) -> None:
    """The paper's Figure 3 in the v2 setting: the model's probability of its TF 1 intent
    and of the v2 answer, then per method the greedy text and ``n`` samples."""
    out = out or sys.stdout
    print("== The paper's Figure 3: the model's intent does not exist ==\n", file=out)
    print("prompt (paper Figure 3):\n    " + FIGURE3_PROMPT.replace("\n", "\n    ") + "\n",
          file=out)
    print(f"constraint: '.' + one of {len(TF2_NAMES)} TensorFlow 2 API names + '('. The "
          "model's\nintent in TF 1 is `tf.losses.mean_pairwise_squared_error`, which TF 2 "
          "only has as\n`tf.compat.v1.losses.mean_pairwise_squared_error`.\n", file=out)
    prompt = lm.encode(FIGURE3_PROMPT)
    for label, text in (("v1 intent (invalid in TF 2)", FIGURE3_V1_INTENT),
                        ("v2 answer", FIGURE3_V2_ANSWER)):
        lp = score(lm, FIGURE3_PROMPT, [text])[0]
        print(f"  P(`{text}` | prompt) = {math.exp(lp):.2e}   ({label})", file=out)
    print(f"\n| method | greedy | {n} samples (count × text) | valid | lm_calls/sample |",
          file=out)
    print("|---|---|---|---|---|", file=out)
    constraint = figure3_constraint()
    for method in ("unconstrained", "cd", "adaptrack"):
        _progress(f"Figure 3: {method}…")
        kw: dict[str, Any] = {"method": method, "max_new_tokens": 24, "seed": seed}
        greedy = generate(lm, prompt, constraint, temperature=0, **kw).samples[0]
        res = generate(lm, prompt, constraint, n=n, **kw)
        counts = Counter(s.text for s in res.samples)
        shown = ", ".join(f"{c} × `{t}`" for t, c in counts.most_common(4))
        if len(counts) > 4:
            shown += f", {len(counts) - 4} more"
        valid = sum(s.valid for s in res.samples)
        calls = sum(s.lm_requests for s in res.samples) / n
        print(f"| {method} | `{greedy.text}` | {shown} | {valid}/{n} | {calls:.1f} |",
              file=out, flush=True)
    print("\nvalid: the text is '.' + a TF 2 name + '('. lm_calls/sample counts the prefixes "
          "whose\ndistribution a sample used (paper Table 5).", file=out)
    _progress("")


def five_bits(lm: LanguageModel, n: int = BITS_SAMPLES, seed: int = 0,
              out: TextIO | None = None) -> None:
    """The five-bit task (paper RQ4, :mod:`adaptrack.eval.binary`): per method of
    :data:`BITS_RUNS`, the share of ``00000`` in ``n`` samples and KL(samples ‖ target), the
    target P(s | c) enumerated exactly (docs/design.md §2)."""
    out = out or sys.stdout
    constraint = binary.constraint()
    started = time.perf_counter()
    _progress("five bits: exact target…")
    target = exact_distribution(lm, binary.PROMPT, constraint, end="eos",
                                max_new_tokens=binary.MAX_NEW_TOKENS)
    target_seconds = time.perf_counter() - started
    decode = lm.vocab.decode
    p_zeros = sum(p for s, p in target.items() if decode(s) == b"00000")
    print("== Five random bits (paper RQ4): CD's distortion, measured ==\n", file=out)
    print(f"prompt: {binary.PROMPT!r}\nvalid: 00000, or five bits starting with 1. CD "
          "draws the first bit by the model's\nlocal odds, and a leading 0 leaves only 00000: "
          "CD gives 00000 the whole share of a\nleading 0. The target gives 00000 only its own "
          "probability.\n"
          f"Exact target by enumeration: {len(target)} token sequences ({target_seconds:.1f} s); "
          f"{n} samples per method, seed {seed}.\n", file=out)
    print("| method | P(00000) | KL to target | lm_calls | seconds |", file=out)
    print("|---|---|---|---|---|", file=out)
    print(f"| exact target | {p_zeros:.4f} | 0 | | |", file=out)
    for method, options in BITS_RUNS:
        label = method + (" (share_q)" if options else "")
        _progress(f"five bits: {label}…")
        res = generate(lm, binary.PROMPT, constraint, method=method, n=n, seed=seed,
                       max_new_tokens=binary.MAX_NEW_TOKENS, end="eos", **options)
        drawn = [s for s in res.samples if s.complete]
        seen = Counter(s.tokens for s in drawn)
        kl = metrics.kl_divergence(seen, target) if seen else math.inf
        zeros = sum(s.text == "00000" for s in drawn) / n
        print(f"| {label} | {zeros:.4f} | {kl:.4f} | {res.stats['lm_calls']} | "
              f"{res.stats['seconds']:.1f} |", file=out, flush=True)
    _progress("")
    noise = (len(target) - 1) / (2 * n)
    print(f"\nKL is KL(empirical ‖ target) in nats. Sampling noise alone: KL about {noise:.4f} "
          f"on average\n((k − 1)/(2n), k = {len(target)}), and a standard error of at most "
          f"{0.5 / math.sqrt(n):.4f} on P(00000);\nan unbiased method's P(00000) is "
          f"{p_zeros:.4f} up to that. docs/results/binary.md has the full study.", file=out)
