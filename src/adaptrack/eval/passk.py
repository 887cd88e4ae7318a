"""Functional correctness: the unbiased pass@k / EM@k estimator of Chen et al. (2021),
equation 5 of the AdapTrack paper (:mod:`adaptrack.eval.metrics` gathers every metric).

>>> round(pass_at_k(n=10, c=3, k=1), 6)
0.3
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import numpy as np


def as_int(name: str, value: object) -> int:
    """``value`` as an int (``operator.index``), or a ``TypeError`` naming ``name``."""
    # bool is an int subclass, but pass_at_k(n=True, ...) is almost certainly a bug.
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of pass@k from ``n`` samples of which ``c`` are correct.

    Computes ``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021; AdapTrack eq. 5), the
    probability that at least one of ``k`` samples drawn without replacement from the ``n``
    generated ones is correct. It is evaluated as
    ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``, which avoids the huge binomial
    coefficients of the textbook formula.

    Args:
        n: Number of generated samples, ``n >= 1``.
        c: Number of correct samples, ``0 <= c <= n``.
        k: Budget of attempts, ``1 <= k <= n``.

    Returns:
        The estimate, in ``[0, 1]``; exactly ``1.0`` when ``n - c < k``.

    Raises:
        TypeError: If an argument is not an integer.
        ValueError: If the arguments are out of range.

    Example:
        >>> pass_at_k(n=5, c=0, k=2)
        0.0
        >>> round(pass_at_k(n=5, c=2, k=2), 6)  # 1 - C(3, 2) / C(5, 2) = 1 - 3/10
        0.7
        >>> pass_at_k(n=5, c=4, k=2)
        1.0
    """
    n, c, k = as_int("n", n), as_int("c", c), as_int("k", k)
    if n < 1:
        raise ValueError(f"n (number of samples) must be >= 1, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"c (number of correct samples) must satisfy 0 <= c <= n={n}, got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must satisfy 1 <= k <= n={n}, got k={k}")
    if n - c < k:
        # Every size-k subset contains a correct sample; the product below would also give 1,
        # but returning the exact value avoids a rounding residue.
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def em_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of EM@k (exact match at k), AdapTrack eq. 5.

    Identical to :func:`pass_at_k`, with ``c`` counting the samples that exactly match the
    reference instead of the samples that pass the tests.

    Args:
        n: Number of generated samples, ``n >= 1``.
        c: Number of samples that exactly match the reference, ``0 <= c <= n``.
        k: Budget of attempts, ``1 <= k <= n``.

    Returns:
        ``1 - C(n - c, k) / C(n, k)``.

    Example:
        >>> round(em_at_k(n=4, c=1, k=2), 6)  # 1 - C(3, 2) / C(4, 2) = 1 - 3/6
        0.5
    """
    return pass_at_k(n, c, k)


def mean_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems, the usual benchmark-level pass@k / EM@k.

    Args:
        counts: One ``(n, c)`` pair per problem: samples generated and samples correct.
        k: Budget of attempts; must satisfy ``1 <= k <= n`` for every problem.

    Returns:
        The average estimate over problems.

    Raises:
        ValueError: If ``counts`` is empty, a pair is malformed, or a pair is out of range
            for ``k``.

    Example:
        >>> mean_at_k([(10, 10), (10, 0), (10, 5)], k=1)
        0.5
    """
    values: list[float] = []
    for index, pair in enumerate(counts):
        try:
            n, c = pair
        except (TypeError, ValueError):
            raise ValueError(f"counts[{index}] must be an (n, c) pair, got {pair!r}") from None
        try:
            values.append(pass_at_k(n, c, k))
        except ValueError as error:
            raise ValueError(f"counts[{index}] = {pair!r}: {error}") from None
    if not values:
        raise ValueError("counts is empty: need at least one (n, c) pair to average")
    return math.fsum(values) / len(values)
