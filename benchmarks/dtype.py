"""The default model's weight precision on this machine: the time of one decode pass (one
new token per row, the rest of each prefix from kept KV states) at 1 and 16 rows, and how
far the bfloat16 model's next-token distributions are from the float32 model's.

Each precision loads the default model on the transformers backend (``load_model(dtype=)``).
A pass is timed through ``next_logprobs``, the path the samplers use: ``rows`` prefixes of a
fixed text are evaluated once (their KV states are kept), then each is extended by one token
and evaluated again; the second call is the decode pass, its median over ``--repeat`` runs.
The distance is KL(float32 ‖ bfloat16) of the next-token distributions at every position of
three texts (JSON, TensorFlow code, a Python function), with the share of positions where
both precisions rank the same token first. Last, per precision, how far a prefix's log-probs
fed token by token through the kept KV states are from one fresh forward over the whole
prefix (the largest absolute difference over the same positions).

Run:  python benchmarks/dtype.py [--repeat 7] [--threads N]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time

import numpy as np
import torch
from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

import adaptrack as at

TEXTS = [
    "Describe a fictional person as JSON.\nJSON: "
    '{"name_of_the_person":"Anna","age":31,"favourite_colour":"green"}',
    "import tensorflow as tf\n\ndef model(x):\n    w = tf.Variable(tf.zeros([3, 3]))\n"
    "    return tf.matmul(x, w)\n",
    'def add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n',
]
DTYPES = ("float32", "bfloat16")


def pass_ms(lm: at.LanguageModel, ids: list[int], rows: int, repeat: int) -> float:
    times = []
    for r in range(repeat):
        lm.clear_cache()
        base = [(*ids[:40], r, k) for k in range(rows)]  # distinct prefixes
        lm.next_logprobs(base)
        step = [(*p, 7) for p in base]
        started = time.perf_counter()
        lm.next_logprobs(step)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    print(f"# weight precision, {datetime.date.today()}; CPU: {cpu_name()}; load average at "
          f"start: {load()}\n")
    models = {d: at.load_model(dtype=d, threads=args.threads) for d in DTYPES}
    ids = models["float32"].tokenizer(TEXTS[1])["input_ids"]  # type: ignore[attr-defined]
    print("| dtype | pass ms, 1 row | pass ms, 16 rows | 1 row vs float32 | 16 rows vs float32 |")
    print("|---|--:|--:|--:|--:|")
    ms = {d: (pass_ms(lm, ids, 1, args.repeat), pass_ms(lm, ids, 16, args.repeat))
          for d, lm in models.items()}
    one, many = ms["float32"]
    for d, (a, b) in ms.items():
        print(f"| {d} | {a:.1f} | {b:.1f} | {one / a:.2f}× | {many / b:.2f}× |")

    kls, same = [], []
    for text in TEXTS:
        ids = models["float32"].tokenizer(text)["input_ids"]  # type: ignore[attr-defined]
        prefixes = [tuple(ids[:k]) for k in range(1, len(ids))]
        full, half = (models[d].next_logprobs(prefixes) for d in DTYPES)
        for x, y in zip(full, half, strict=True):
            kls.append(float(np.sum(np.exp(x) * (x - y))))
            same.append(bool(x.argmax() == y.argmax()))
    path = {}
    for d, lm in models.items():
        worst = 0.0
        for text in TEXTS:
            ids = lm.tokenizer(text)["input_ids"]  # type: ignore[attr-defined]
            lm.clear_cache()
            for k in range(1, len(ids)):
                cached = lm.next_logprobs([tuple(ids[:k])])[0]  # extends the previous state
                with torch.inference_mode():
                    logits = lm.model(torch.tensor([ids[:k]])).logits[0, -1]  # type: ignore
                alone = torch.log_softmax(logits.float(), -1).numpy()[: lm.vocab.size]
                worst = max(worst, float(np.abs(cached - alone).max()))
        path[d] = worst
    k = np.asarray(kls)
    print(f"\nKL(float32 ‖ bfloat16) over {len(k)} positions: median {np.median(k):.1e}, "
          f"p90 {np.quantile(k, 0.9):.1e}, max {k.max():.1e} nats; same first token at "
          f"{100 * np.mean(same):.1f} % of positions.")
    print("Token by token through kept states against one fresh forward, largest |difference| "
          "in log-prob: " + ", ".join(f"{d} {v:.1e}" for d, v in path.items())
          + f" nats. Load average at end: {load()}")


if __name__ == "__main__":
    sys.exit(main())
