"""Mask cost of API-name constraints on a real 49k vocabulary (issue: API names at scale).

What is timed, per constraint:

* ``build``: constructing the constraint (validating the names, the string trie; for
  numpy also listing the names, with numpy's modules already imported by a first call);
* ``bind``: ``constraint.bind(vocab)`` and the first ``allowed`` (the vocabulary's token
  trie and the tables all choice matchers share are built before, timed on their own lines);
* per new node: ``allowed(node)`` and ``finishing(node)`` on a node whose mask is not
  cached (the matcher's cache is cleared before each), in milliseconds. Two node samples:
  ``path``: the string-trie nodes that sampling visits: every prefix of ``prefix + name``
  (token boundaries can fall after any byte) for random names, the start node and the
  accepting end nodes included; ``random``: trie nodes drawn uniformly.

Constraints: (a) ``api_names`` over TensorFlow 2.16.1's names without ``compat.*``,
(b) over all of them, (c) ``from_module("numpy")``. The vocabulary is the default model's
(SmolLM2, 49 152 ids), read from its tokenizer (``adaptrack setup`` must have run), or a
pickled :class:`adaptrack.Vocabulary` given with ``--vocab``.

Run:  python benchmarks/choice_masks.py [--vocab PICKLE] [--nodes 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import pickle
import platform
import random
import sys
import time

import numpy as np
from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

from adaptrack.constraints.api import api_names, from_module
from adaptrack.constraints.choice import Choice, ChoiceMatcher
from adaptrack.eval.tfapi import tensorflow_api_names
from adaptrack.tokenization.vocab import Vocabulary


def default_vocab() -> Vocabulary:
    import transformers

    from adaptrack.lm.default import default_gguf
    from adaptrack.lm.load import converted_gguf
    from adaptrack.tokenization.hf import vocabulary

    path = str(converted_gguf(default_gguf(download=False)))
    config = transformers.AutoConfig.from_pretrained(path)
    return vocabulary(transformers.AutoTokenizer.from_pretrained(path), config.vocab_size,
                      config)


def path_nodes(c: Choice, rng: random.Random, count: int) -> list[int]:
    """Trie nodes along ``prefix + name`` for random names, until ``count`` are collected."""
    nodes: list[int] = [0]
    while len(nodes) < count:
        node = 0
        for b in rng.choice(c.strings):
            node = c.children[node][b]
            nodes.append(node)
    return nodes[:count]


def time_nodes(c: Choice, vocab: Vocabulary, nodes: list[int]) -> np.ndarray:
    m = c.bind(vocab)
    assert isinstance(m, ChoiceMatcher)
    m.allowed(0)
    out = np.empty(len(nodes))
    for i, node in enumerate(nodes):
        m._masks.clear()
        t = time.perf_counter()
        m.allowed(node)
        m.finishing(node)
        out[i] = time.perf_counter() - t
    return out * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", help="a pickled adaptrack Vocabulary (default: the default "
                    "model's tokenizer)")
    ap.add_argument("--nodes", type=int, default=2000, help="nodes per sample (default 2000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    print(f"# choice masks — {cpu_name()}, {platform.python_version()}, load {load()}")
    t = time.perf_counter()
    if args.vocab:
        with open(args.vocab, "rb") as f:
            vocab = pickle.load(f)
    else:
        vocab = default_vocab()
    print(f"vocabulary: {vocab.size} ids, loaded in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    _ = vocab.trie
    print(f"token trie (once per vocabulary): {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    api_names(["x"]).bind(vocab).allowed(0)
    print(f"choice tables (once per vocabulary, on the first bind): "
          f"{time.perf_counter() - t:.3f} s")

    tf = tensorflow_api_names("2.16.1")
    no_compat = [n for n in tf if not n.startswith("compat.")]
    t = time.perf_counter()
    numpy_api = from_module("numpy")
    numpy_list = time.perf_counter() - t
    print(f"from_module('numpy'): {len(numpy_api.names)} names listed in {numpy_list:.2f} s, "
          f"{len(numpy_api.errors)} errors")
    cases = [
        ("tf 2.16 without compat", lambda: api_names(no_compat)),
        ("tf 2.16 all", lambda: api_names(tf)),
        ("numpy (from_module)", lambda: from_module("numpy")),  # imported: listing + trie
    ]
    print()
    header = (f"| {'constraint':<24} | {'names':>6} | {'trie nodes':>10} | {'build s':>7} | "
              f"{'bind s':>6} | {'sample':<6} | {'nodes':>5} | {'median ms':>9} | "
              f"{'p99 ms':>6} | {'max ms':>6} |")
    print(header)
    print("|" + "|".join("-" * (len(part)) for part in header.split("|")[1:-1]) + "|")
    for label, make in cases:
        t = time.perf_counter()
        c = make()
        build = time.perf_counter() - t
        t = time.perf_counter()
        m = c.bind(vocab)
        m.allowed(0)
        bind = time.perf_counter() - t
        rng = random.Random(args.seed)
        samples = {
            "path": path_nodes(c, rng, args.nodes),
            "random": [rng.randrange(len(c.children)) for _ in range(args.nodes)],
        }
        for kind, nodes in samples.items():
            ms = time_nodes(c, vocab, nodes)
            print(f"| {label:<24} | {len(c.strings):>6} | {len(c.children):>10} | "
                  f"{build:>7.2f} | {bind:>6.3f} | {kind:<6} | {len(nodes):>5} | "
                  f"{np.median(ms):>9.4f} | {np.percentile(ms, 99):>6.3f} | {ms.max():>6.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
