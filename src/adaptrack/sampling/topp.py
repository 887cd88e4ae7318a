"""The top-p cut (docs/design.md §2, top-p): validity-aware nucleus sampling as the
AdapTrack paper states it (§6.3), for eager masks and for lazy, token-by-token checks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def nucleus(probs: np.ndarray, valid: np.ndarray, top_p: float) -> np.ndarray:
    """Validity-aware top-p (the AdapTrack paper §6.3, docs/design.md §2): the sorted ids
    of ``valid`` that survive the cut.

    Scan tokens from the most probable down; once known-valid mass / (known-valid mass +
    unchecked mass) exceeds ``top_p``, the rest counts as invalid. Without a constraint
    (every token valid) the ratio is the cumulative mass: ordinary nucleus sampling.

    >>> probs = np.array([0.5, 0.3, 0.15, 0.05])
    >>> nucleus(probs, np.arange(4), 0.7).tolist()       # plain nucleus: .5 + .3 > .7
    [0, 1]
    >>> nucleus(probs, np.array([1, 2, 3]), 0.5).tolist()  # .3 / (.3 + .2) > .5
    [1]
    """
    order = np.argsort(-probs, kind="stable")
    is_valid = np.zeros(len(probs), dtype=bool)
    is_valid[valid] = True
    is_valid = is_valid[order]
    ranked = probs[order]
    known_valid = np.cumsum(np.where(is_valid, ranked, 0.0))
    unchecked = np.clip(1.0 - np.cumsum(ranked), 0.0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = known_valid / (known_valid + unchecked)
    over = np.flatnonzero(ratio > top_p)
    stop = over[0] + 1 if len(over) else len(order)
    return np.sort(order[:stop][is_valid[:stop]])


def checked_nucleus(
    probs: np.ndarray, candidates: np.ndarray, check: Callable[[int], bool], top_p: float
) -> np.ndarray:
    """:func:`nucleus` for a lazy matcher: validity is asked token by token, most probable
    first, and asking stops at the cutoff (paper §6.3), so with ``top_p < 1`` most of the
    vocabulary is never checked. Tokens outside ``candidates`` are invalid without asking.

    >>> probs = np.array([0.5, 0.3, 0.15, 0.05])
    >>> asked = []
    >>> checked_nucleus(probs, np.arange(4), lambda t: asked.append(t) or t > 0, 0.5).tolist()
    [1]
    >>> asked                                            # token 2 and 3 were never asked
    [0, 1]
    """
    order = np.argsort(-probs, kind="stable")
    order = order[probs[order] > 0]
    ranked = probs[order]
    unchecked = np.clip(1.0 - np.cumsum(ranked), 0.0, None)
    is_candidate = np.zeros(len(probs), dtype=bool)
    is_candidate[candidates] = True
    valid: list[int] = []
    known_valid = 0.0
    for i, tok in enumerate(order.tolist()):
        if is_candidate[tok] and check(tok):
            valid.append(tok)
            known_valid += ranked[i]
        if known_valid > 0 and known_valid / (known_valid + unchecked[i]) > top_p:
            break
    return np.asarray(sorted(valid), dtype=np.int64)
