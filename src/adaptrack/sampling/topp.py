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
    is_candidate = np.zeros(len(probs), dtype=bool)
    is_candidate[candidates] = True
    valid: list[int] = []
    known_valid = 0.0
    positive = int(np.count_nonzero(probs > 0))
    done, k = 0, HEAD
    while done < positive:
        # The ranking's head only: a nucleus rarely reaches far, and sorting the whole
        # vocabulary (49k tokens: ~3 ms) cost more than the checks at every step.
        order = _ranked_head(probs, k, positive)
        ranked = probs[order]
        unchecked = np.clip(1.0 - np.cumsum(ranked), 0.0, None)
        for i in range(done, len(order)):
            tok = int(order[i])
            if is_candidate[tok] and check(tok):
                valid.append(tok)
                known_valid += ranked[i]
            if known_valid > 0 and known_valid / (known_valid + unchecked[i]) > top_p:
                return np.asarray(sorted(valid), dtype=np.int64)
        done, k = len(order), k * 16
    return np.asarray(sorted(valid), dtype=np.int64)


#: Tokens ranked at first by :func:`checked_nucleus`; it ranks 16 times more each time the
#: cutoff lies further down.
HEAD = 256


def _ranked_head(probs: np.ndarray, k: int, positive: int) -> np.ndarray:
    """The first ids of ``argsort(-probs, kind="stable")`` restricted to positive
    probabilities: at least ``k`` of them (every id tied with the k-th too), or all
    ``positive``. Exactly a prefix of the full ranking, so the running sums over it match.

    >>> _ranked_head(np.array([0.1, 0.4, 0.1, 0.4, 0.0]), 3, 4).tolist()
    [1, 3, 0, 2]
    """
    if k >= positive:
        order = np.argsort(-probs, kind="stable")
        return order[:positive]
    kth = probs[np.argpartition(-probs, k - 1)[k - 1]]
    head = np.flatnonzero(probs >= kth)  # in id order: a stable sort keeps ties by id
    return head[np.argsort(-probs[head], kind="stable")]
