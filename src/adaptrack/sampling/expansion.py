"""What a prefix's expansion holds: the valid next tokens and their probabilities
(docs/design.md §3, numerics), shared by the prefix tree, Q and every method."""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=4)
def every_id(size: int) -> np.ndarray:
    """``0 .. size - 1`` as int32, one read-only array per vocabulary size: the ids of an
    expansion whose every token is valid, shared by all of them (counted by none)."""
    out = np.arange(size, dtype=np.int32)
    out.flags.writeable = False
    return out


class Expansion:
    """The expansion of one prefix, computed once from the model's distribution.

    ``ids``: the valid next tokens with positive probability, sorted (constraint, the
    validity-aware top-p cutoff and the length limit all applied); ``p``: their
    probabilities under the model at the sampling temperature (normalized over the whole
    vocabulary, so ``p.sum()`` is the valid mass). The full distribution is not kept: every
    method needs only the valid tokens, and it is most of the memory. Where no token is
    dropped, ``ids`` is the array given (a matcher's mask shared by many prefixes);
    ``shared_ids`` then says not to count its bytes per prefix.

    >>> e = Expansion(np.array([0.5, 0.0, 0.5]), np.array([0, 1, 2]))
    >>> e.ids.tolist(), e.p.tolist(), e.is_valid(1)
    ([0, 2], [0.5, 0.5], False)
    """

    __slots__ = ("ids", "p", "shared_ids")

    def __init__(self, probs: np.ndarray, ids: np.ndarray, *, shared_ids: bool = False,
                 dtype: type = np.float64) -> None:
        self.shared_ids = False
        # ``dtype``: the model's ``probs_dtype``. Every reader (Q, proposals, the nodes'
        # log P, exact_distribution) sees these same numbers and sums them in float64, so
        # the methods stay exact for the model as stored (docs/design.md §3, numerics).
        p: np.ndarray = (probs if len(ids) == len(probs) else probs[ids]).astype(dtype, copy=False)
        keep = p > 0
        if keep.all() and shared_ids:
            self.ids, self.p, self.shared_ids = ids, p, True
        elif keep.all() and len(ids) == len(probs):  # every token valid: ids are 0..V-1
            self.ids, self.p, self.shared_ids = every_id(len(probs)), p, True
        else:  # ids of this prefix alone: int32 (any vocabulary is below 2^31 tokens)
            self.ids = (ids if keep.all() else ids[keep]).astype(np.int32)
            self.p = p if keep.all() else p[keep]

    @property
    def nbytes(self) -> int:
        """Bytes this prefix holds (a shared ``ids`` array is counted by its owner)."""
        return self.p.nbytes + (0 if self.shared_ids else self.ids.nbytes)

    def index(self, token: int) -> int:
        """Position of a valid ``token`` in ``ids``."""
        return int(np.searchsorted(self.ids, token))

    def is_valid(self, token: int) -> bool:
        i = int(np.searchsorted(self.ids, token))
        return i < len(self.ids) and int(self.ids[i]) == token
