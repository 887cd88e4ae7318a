"""Drawing one token index from unnormalized weights, with the seeded generator."""

from __future__ import annotations

import numpy as np


def draw(weights: np.ndarray, rng: np.random.Generator, exclude: int | None = None,
         cdf: np.ndarray | None = None) -> int:
    """An index i with probability weights[i] / Σ weights (``exclude`` gets weight 0).

    At least one weight must be positive. Zero weights are never returned. ``cdf``:
    ``np.cumsum(weights)`` where the caller keeps it (used unless ``exclude`` has weight).

    >>> rng = np.random.default_rng(0)
    >>> sorted({draw(np.array([0.0, 1.0, 3.0]), rng, exclude=2) for _ in range(20)})
    [1]
    """
    if exclude is not None and weights[exclude] != 0:
        weights = weights.copy()
        weights[exclude] = 0.0
        cdf = None
    if cdf is None:
        cdf = np.cumsum(weights, dtype=np.float64)  # float32 would err by ~len · 6e-8
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    # Rounding can land on the end or on a zero-weight entry; step back to a positive one.
    i = min(i, len(weights) - 1)
    while weights[i] <= 0:
        i -= 1
    return i


def argmax(weights: np.ndarray, exclude: int | None = None) -> int:
    """The index of the largest weight (the lowest index among ties).

    >>> argmax(np.array([1.0, 3.0, 3.0])), argmax(np.array([1.0, 3.0, 3.0]), exclude=1)
    (1, 2)
    """
    if exclude is not None:
        weights = weights.copy()
        weights[exclude] = -1.0
    return int(np.argmax(weights))


class Race:
    """The draws at one node as exponential races: draw v takes the index i that maximizes
    weights[i] / E_v[i], where E_v is a vector of unit exponentials fixed by ``(seed, v)``
    alone. A race picks i with probability weights[i] / Σ weights, like :func:`draw`, and
    since its keys are known before the draw is made, a caller can read which index draw v
    will take for weights it expects (:meth:`winner`); the winner does not move when other
    indices' weights fall, where an inverse CDF's would.

    >>> race = Race(seed=7)
    >>> w = np.array([0.0, 1.0, 3.0])
    >>> first = race.winner(w, 0)
    >>> race.draw(w) == first, race.drawn   # the draw the reading foretold
    (True, 1)
    >>> race.draw(w, exclude=2)
    1
    """

    __slots__ = ("drawn", "seed")

    def __init__(self, seed: int) -> None:
        self.seed, self.drawn = seed, 0  # draws made so far: the next one is number drawn

    def winner(self, weights: np.ndarray, v: int, exclude: int | None = None) -> int:
        """The index draw ``v`` takes over ``weights`` (``exclude`` gets weight 0); at
        least one weight must be positive."""
        keys = np.random.default_rng((self.seed, v)).standard_exponential(len(weights))
        score = weights / keys
        if exclude is not None:
            score[exclude] = 0.0
        i = int(np.argmax(score))
        if score[i] <= 0:
            raise ValueError("a race needs a positive weight")
        return i

    def draw(self, weights: np.ndarray, exclude: int | None = None) -> int:
        """The next draw: :meth:`winner` for draw number :attr:`drawn`, which then counts it."""
        i = self.winner(weights, self.drawn, exclude)
        self.drawn += 1
        return i
