"""The draws of ``exact``'s ``ahead`` schedule (``sampling/exact.py``, docs/design.md §3):
an attempt's course with its own random keys, one per step, and the exponential race by
which a key picks a token at a prefix, so that a course followed ahead is the course its
attempt takes, except where Q fell on that course's own tokens."""

from __future__ import annotations

import math

import numpy as np

from .expansion import Expansion
from .tree import Node


class Course:
    """One attempt of the ``ahead`` schedule as the current Q takes it: the prefixes from
    the root (the last where it waits, or where it ended when ``ended``) and its own
    stream of random keys, one per step (:class:`Draws`)."""

    __slots__ = ("_keys", "_rng", "ended", "path")

    def __init__(self, root: Node, seed: int) -> None:
        self.path, self.ended = [root], False
        self._rng = np.random.default_rng(seed)
        self._keys: list[int] = []

    def key(self, depth: int) -> int:
        """The random key of the step at ``depth``."""
        while depth >= len(self._keys):
            self._keys += self._rng.integers(0, 2**63, size=64).tolist()
        return self._keys[depth]


class Draws:
    """One step of the ``ahead`` schedule at one prefix: which token a random key picks.

    The pick is an exponential race: each candidate j gets E_j ~ Exp(1), a hash of the key
    and j, and the least E_j / w_j wins, with probability w_j / Σ w. At a prefix not opened
    the candidates are the valid tokens with w = P(· | x) and one for every invalid token
    together, of weight 1 − Σ_valid P (the proposal: -1 when it wins); at an opened prefix
    the valid tokens with w ∝ P_Q(· | x) (``weights``, formula 3). A race keeps its winner
    when the other weights fall and when a candidate leaves it, and Q only falls: so an
    attempt that went from a prefix not yet opened goes the same way once it is opened,
    unless Q lowered that very token, and one that went from an opened prefix goes the
    same way after Q fell below its other tokens: a course followed ahead is the course
    its attempt takes, except where Q fell on that course's own tokens. The race runs in
    two rounds, between blocks of :data:`BLOCK` tokens by their summed weight, then within
    the winning block (the same law): a step costs a few hundred hashes, not one per token
    of the vocabulary (a fall inside the winner's block can then also move it).

    >>> e = Expansion(np.array([0.3, 0.3, 0.4]), np.array([0, 1]))  # token 2 invalid
    >>> free, opened = Draws(e), Draws(e, np.array([0.3, 0.3 * 0.5]))  # Q(x·1) halved
    >>> picks = [(free.pick(k), opened.pick(k)) for k in range(10_000)]
    >>> [round(sum(f == j for f, _ in picks) / 1e4, 1) for j in (0, 1, -1)]  # P, invalid
    [0.3, 0.3, 0.4]
    >>> round(sum(o == 1 for _, o in picks) / 1e4, 1)   # P_Q(1|x) = .15 / .45
    0.3
    >>> all(o == 0 for f, o in picks if f == 0)  # token 0's Q kept: its proposals kept
    True
    """

    __slots__ = ("exp", "invalid", "opened", "over", "over_blocks")

    def __init__(self, exp: Expansion, weights: np.ndarray | None = None) -> None:
        self.exp, self.opened = exp, weights is not None
        w = exp.p.astype(np.float64) if weights is None else np.array(weights, np.float64)
        self.invalid = 0.0 if self.opened else max(0.0, 1.0 - float(w.sum()))
        blocks = np.add.reduceat(w, np.arange(0, len(w), BLOCK)) if len(w) else np.zeros(0)
        with np.errstate(divide="ignore"):  # a dead token or block: 1/0 = inf never wins
            self.over, self.over_blocks = 1.0 / w, 1.0 / blocks
        if len(w) <= SMALL:  # raced in Python: lists are faster than arrays this short
            self.over = self.over.tolist()

    @property
    def nbytes(self) -> int:
        over = self.over
        return (over.nbytes if isinstance(over, np.ndarray) else 8 * len(over)) \
            + self.over_blocks.nbytes

    def pick(self, key: int) -> int:
        """The position of the winning token in the expansion; -1 for an invalid one."""
        over, n = self.over, len(self.over_blocks)
        b = 0
        if n > 1 or self.invalid > 0:
            e = np.asarray(_exponentials(key, 0, n + 1))  # the last: every invalid token
            race = e[:n] * self.over_blocks
            b = int(np.argmin(race)) if n else -1
            if self.invalid > 0 and (b < 0 or e[n] / self.invalid < race[b]):
                return -1
        key ^= _TOKENS
        if isinstance(over, list):
            short = _exponentials(key, 0, len(over))
            return min(range(len(over)), key=lambda j: short[j] * over[j])
        lo = b * BLOCK
        tail = over[lo:lo + BLOCK]
        return lo + int(np.argmin(np.asarray(_exponentials(key, lo, len(tail))) * tail))


#: Tokens per block of :class:`Draws`' first round.
BLOCK = 256
#: Expansions of at most this many tokens race in Python.
SMALL = 24
_TOKENS = 0x5851F42D4C957F2D  # keys a step's second round apart from its first
_GOLDEN, _MIX1, _MIX2, _MASK = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB,
                                (1 << 64) - 1)


def _exponentials(key: int, start: int, count: int) -> np.ndarray | list[float]:
    """Exp(1) variates for the indices ``start`` .. ``start + count - 1``, a fixed function
    of ``key`` (the splitmix64 finalizer of key and index: independent for a random key);
    a list when short (a Python loop beats arrays there)."""
    if count <= SMALL:
        out = []
        for i in range(start, start + count):
            x = ((i * _GOLDEN) & _MASK) ^ key
            x ^= x >> 30
            x = (x * _MIX1) & _MASK
            x ^= x >> 27
            x = (x * _MIX2) & _MASK
            x ^= x >> 31
            out.append(-math.log(((x >> 11) + 0.5) * 2.0**-53))
        return out
    h: np.ndarray = (np.arange(start, start + count, dtype=np.uint64) * np.uint64(_GOLDEN)
                     ^ np.uint64(key))
    h ^= h >> np.uint64(30)
    h *= np.uint64(_MIX1)
    h ^= h >> np.uint64(27)
    h *= np.uint64(_MIX2)
    h ^= h >> np.uint64(31)
    u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    return np.negative(np.log(u))
