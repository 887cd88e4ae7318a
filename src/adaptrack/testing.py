"""Helpers for testing samplers and constraints: toy problems small enough to enumerate
(shared by the demo, the tests and the benchmarks), and contract checks that any custom
constraint can run.

Each toy problem returns ``(lm, constraint, max_new_tokens)``.

>>> from adaptrack import exact_distribution
>>> lm, bits, max_new = binary()
>>> len(exact_distribution(lm, [], bits, max_new_tokens=max_new))
17
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence

from . import constraints
from .lm.table import TableLM

Problem = tuple[TableLM, constraints.Choice, int]


def hashed_weights(width: int, salt: bytes = b"") -> Callable[[Sequence[int]], list[int]]:
    """Next-token weights in 1..8 that depend on the whole prefix (a context-dependent model)."""

    def next_probs(prefix: Sequence[int]) -> list[int]:
        digest = hashlib.sha256(salt + repr(tuple(prefix)).encode()).digest()
        return [1 + digest[i % len(digest)] % 8 for i in range(width)]

    return next_probs


def binary() -> Problem:
    """Paper RQ4: five random bits, valid iff 00000 or starting with 1, uniform model."""
    lm = TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    bits = constraints.choice(["00000"] + [f"1{i:04b}" for i in range(16)])
    return lm, bits, 6


def no_ab() -> Problem:
    """docs/design.md §3: {a,b,c}^4 without "ab", ending in "c" or equal to "aaaa"."""
    lm = TableLM([b"a", b"b", b"c", b"<eos>"], hashed_weights(4, b"no_ab"), eos=3)
    words = ("".join(t) for t in itertools.product("abc", repeat=4))
    valid = [w for w in words if "ab" not in w and (w.endswith("c") or w == "aaaa")]
    return lm, constraints.choice(valid), 5


API_VOCAB = [b"matrix", b"_", b"rank", b"power", b"exp", b"l", b"inalg", b".", b"(", b"matrix_",
             b"rank(", b"_power", b"linalg.", b"ma", b"trix", b"<eos>"]


def api_names() -> Problem:
    """Figure 1: the model wants ``matrix_rank``, which does not exist; multi-byte tokens
    span the names' branches and a terminator "(" ends the sequence inside a token."""
    base = hashed_weights(len(API_VOCAB), b"api")

    def next_probs(prefix: Sequence[int]) -> list[float]:
        w = [float(x) for x in base(prefix)]
        text = b"".join(API_VOCAB[t] for t in prefix)
        if text == b"":
            w[0] *= 6  # "matrix" first, as in Figure 1
        if text.endswith(b"matrix_") or text.endswith(b"matrix"):
            w[2] *= 40  # "rank": the model's intent
            w[10] *= 40
        return w

    lm = TableLM(API_VOCAB, next_probs, eos=len(API_VOCAB) - 1)
    names = ["linalg.matrix_rank", "matrix_power", "matrix_exp", "linalg.matrix_exp"]
    return lm, constraints.choice(names, terminators="("), 8


def length_bound() -> Problem:
    """max_new_tokens cuts some tokenizations: the target is length-conditioned."""
    lm = TableLM([b"a", b"aa", b"b", b"ab", b"<eos>"], hashed_weights(5, b"len"), eos=4)
    return lm, constraints.choice(["aaaa", "aab", "b", "aaaab", "ba"]), 3


PROBLEMS = {"binary": binary, "no_ab": no_ab, "api_names": api_names,
            "length_bound": length_bound}
