"""Top-p (nucleus) truncation, plain and validity-aware (docs/design.md §2)."""

from __future__ import annotations

import numpy as np

from adaptrack.sampling.topp import nucleus


def test_nucleus_is_plain_top_p_without_a_constraint_and_validity_aware_with_one():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    everything = np.arange(4)
    assert nucleus(probs, everything, 0.7).tolist() == [0, 1]
    assert nucleus(probs, everything, 0.85).tolist() == [0, 1, 2]
    # Token 0 invalid: after checking 0, 1 the known-valid share is .3/(.3+.2) = .6;
    # after 2 it is .45/(.45+.05) = .9 > .8, so token 3 counts as invalid.
    assert nucleus(probs, np.array([1, 2, 3]), 0.8).tolist() == [1, 2]
    assert nucleus(probs, np.array([1, 2, 3]), 0.5).tolist() == [1]
