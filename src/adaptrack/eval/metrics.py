"""Evaluation metrics for constrained decoding.

Two families of metrics are provided:

* **Functional correctness** -- the unbiased pass@k / EM@k estimator of Chen et al. (2021),
  equation 5 of the AdapTrack paper: :func:`pass_at_k`, :func:`em_at_k`, :func:`mean_at_k`.
* **Distributional fidelity** -- KL divergences between the empirical distribution of a
  sampler's outputs and a reference distribution: :func:`empirical_distribution`,
  :func:`kl_to_distribution`, :func:`kl_divergence`, :func:`sample_kl` (the sample-based KL
  used by ASAp and by AdapTrack's RQ4) and :func:`sliding_kl` (KL over a sliding window of
  samples, as in the paper's Figure 4).

All KL divergences are in nats. They live in :mod:`adaptrack.eval.kl`, pass@k in
:mod:`adaptrack.eval.passk`; this module gathers them (``at.metrics`` at the top level).
They depend only on NumPy and the standard library.

Example:
    >>> round(pass_at_k(n=10, c=3, k=1), 6)
    0.3
    >>> round(kl_to_distribution(["a", "b"], {"a": 0.25, "b": 0.75}), 4)
    0.1438
"""

from __future__ import annotations

from .kl import LogProb as LogProb
from .kl import empirical_distribution as empirical_distribution
from .kl import kl_divergence as kl_divergence
from .kl import kl_to_distribution as kl_to_distribution
from .kl import kl_to_lm as kl_to_lm
from .kl import sample_kl as sample_kl
from .kl import sliding_kl as sliding_kl
from .passk import em_at_k as em_at_k
from .passk import mean_at_k as mean_at_k
from .passk import pass_at_k as pass_at_k

__all__ = [
    "em_at_k",
    "empirical_distribution",
    "kl_divergence",
    "kl_to_distribution",
    "mean_at_k",
    "pass_at_k",
    "sample_kl",
    "sliding_kl",
]
