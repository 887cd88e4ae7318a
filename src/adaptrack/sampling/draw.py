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
