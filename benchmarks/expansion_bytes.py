"""Bytes an opened prefix holds at the default model's vocabulary (49 152 tokens), and how
many opened prefixes ``max_opened_bytes`` (1 GiB by default) admits (issue: exact at scale).

No model is loaded: each row builds one :class:`adaptrack.sampling.Expansion` from a
softmax of random logits over 49 152 tokens, with a given number of valid tokens, and
stores the probabilities as the default model's backend declares (``probs_dtype``), and
reports ``Expansion.nbytes`` (what ``PrefixTree.opened_bytes`` counts per opened prefix).
"mask shared" is a matcher's mask seen at an earlier prefix (its ids are counted once, by
the tree, not per prefix); "own ids" is a prefix whose valid tokens are its own array.

Run:  python benchmarks/expansion_bytes.py
"""

from __future__ import annotations

import numpy as np

from adaptrack.lm.hf import TransformersLM
from adaptrack.sampling import Expansion

VOCAB = 49_152
GIB = 1 << 30


def main() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=VOCAB)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    print("| valid tokens | ids | bytes per opened prefix | MB | prefixes in 1 GiB |")
    print("|--:|---|--:|--:|--:|")
    for valid in (VOCAB, VOCAB // 2, 1000, 10):
        ids = np.sort(rng.choice(VOCAB, size=valid, replace=False)).astype(np.int64)
        for shared in ((True, False) if valid == VOCAB else (False,)):
            nbytes = Expansion(probs, ids, shared_ids=shared,
                                dtype=TransformersLM.probs_dtype).nbytes
            print(f"| {valid} | {'mask shared' if shared else 'own ids'} | {nbytes} | "
                  f"{nbytes / 1e6:.3f} | {GIB // max(nbytes, 1)} |")


if __name__ == "__main__":
    main()
