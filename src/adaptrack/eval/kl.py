"""Distributional fidelity: KL divergences, in nats, between the empirical distribution of
a sampler's outputs and a reference distribution (:mod:`adaptrack.eval.metrics` gathers
every metric).

>>> round(kl_to_distribution(["a", "b"], {"a": 0.25, "b": 0.75}), 4)
0.1438
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .passk import as_int

LogProb = Mapping[Any, float] | Callable[[Hashable], float]


def _count(samples: Iterable[Hashable]) -> Counter[Any]:
    counts = Counter(samples)
    if not counts:
        raise ValueError("samples is empty: the empirical distribution is undefined")
    return counts


def _normalize(dist: Mapping[Any, float], name: str) -> dict[Hashable, float]:
    for outcome, weight in dist.items():
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(
                f"{name} must have finite non-negative weights, got {name}[{outcome!r}]={weight!r}"
            )
    total = math.fsum(dist.values())
    if not total > 0:
        raise ValueError(f"{name} must have a positive total weight, got {total!r}")
    return {outcome: weight / total for outcome, weight in dist.items()}


def _kl_counts(counts: Counter[Any], log_q: Mapping[Any, float]) -> float:
    """KL(empirical(counts) || q) given log q; outcomes missing from ``log_q`` have q = 0."""
    total = counts.total()
    terms = []
    for outcome, count in counts.items():
        lq = log_q.get(outcome, -math.inf)
        if lq == -math.inf:
            return math.inf
        p = count / total
        terms.append(p * (math.log(p) - lq))
    # KL >= 0 mathematically; clamp the tiny negative values that rounding can produce.
    return max(math.fsum(terms), 0.0)


def empirical_distribution(samples: Iterable[Hashable]) -> dict[Hashable, float]:
    """Relative frequency of each distinct sample.

    Args:
        samples: Observed outcomes (any hashable values, e.g. generated strings).

    Returns:
        A dict from each distinct outcome (in order of first appearance) to its frequency;
        the values sum to 1.

    Raises:
        ValueError: If ``samples`` is empty.

    Example:
        >>> empirical_distribution(["a", "b", "a", "a"])
        {'a': 0.75, 'b': 0.25}
    """
    counts = _count(samples)
    total = counts.total()
    return {outcome: count / total for outcome, count in counts.items()}


def kl_to_distribution(samples: Iterable[Hashable], target: Mapping[Any, float]) -> float:
    """KL(empirical || target) in nats, where *empirical* is the distribution of ``samples``.

    ``target`` is normalized to sum to 1 first, so unnormalized weights are accepted.

    Args:
        samples: Observed outcomes.
        target: Non-negative weights over outcomes, with a positive total.

    Returns:
        The divergence, ``math.inf`` if some sample has zero target probability or is absent
        from ``target``.

    Raises:
        ValueError: If ``samples`` is empty or ``target`` has a negative, non-finite or
            all-zero weight.

    Example:
        >>> round(kl_to_distribution(["a", "b", "a", "b"], {"a": 1, "b": 3}), 6)
        0.143841
        >>> kl_to_distribution(["a", "c"], {"a": 1.0})
        inf
    """
    counts = _count(samples)
    q = _normalize(target, "target")
    log_q = {outcome: math.log(w) if w > 0 else -math.inf for outcome, w in q.items()}
    return _kl_counts(counts, log_q)


def kl_divergence(p: Mapping[Any, float], q: Mapping[Any, float]) -> float:
    """KL(p || q) in nats between two distributions over hashable outcomes.

    Both mappings are normalized to sum to 1 first. Outcomes absent from a mapping have
    probability 0; terms with ``p = 0`` contribute 0.

    Args:
        p: Non-negative weights with a positive total.
        q: Non-negative weights with a positive total.

    Returns:
        The divergence, ``math.inf`` if ``p > 0`` and ``q = 0`` for some outcome.

    Raises:
        ValueError: If a mapping has a negative, non-finite or all-zero weight.

    Example:
        >>> round(kl_divergence({"a": 0.5, "b": 0.5}, {"a": 0.25, "b": 0.75}), 6)
        0.143841
        >>> kl_divergence({"a": 1.0}, {"a": 1.0})
        0.0
        >>> kl_divergence({"a": 1.0, "b": 1.0}, {"a": 1.0})
        inf
    """
    p_norm = _normalize(p, "p")
    q_norm = _normalize(q, "q")
    terms = []
    for outcome, p_i in p_norm.items():
        if p_i == 0:
            continue
        q_i = q_norm.get(outcome, 0.0)
        if q_i == 0:
            return math.inf
        terms.append(p_i * (math.log(p_i) - math.log(q_i)))
    return max(math.fsum(terms), 0.0)


def _logsumexp(values: Sequence[float]) -> float:
    array = np.asarray(values, dtype=np.float64)
    peak = float(array.max())
    if peak == -math.inf:
        return -math.inf
    # Shifting by the maximum keeps exp() from underflowing for very negative sequence
    # log-likelihoods (hundreds of nats are common for whole programs).
    return peak + math.log(float(np.exp(array - peak).sum()))


def _renormalized_logprobs(logprob: LogProb, support: Iterable[Hashable]) -> dict[Hashable, float]:
    """Return log p~(u) = logprob(u) - logsumexp_{v in support} logprob(v) for u in support."""
    outcomes = list(dict.fromkeys(support))
    if not outcomes:
        raise ValueError("support is empty: cannot renormalize the model's log-probabilities")
    if isinstance(logprob, Mapping):
        missing = [u for u in outcomes if u not in logprob]
        if missing:
            raise ValueError(
                f"logprob has no entry for {len(missing)} support element(s), e.g. {missing[0]!r}"
            )
        raw = [float(logprob[u]) for u in outcomes]
    elif callable(logprob):
        raw = [float(logprob(u)) for u in outcomes]
    else:
        raise TypeError(f"logprob must be a Mapping or a callable, got {type(logprob).__name__}")
    for outcome, value in zip(outcomes, raw, strict=True):
        # -inf is a legitimate log-probability (the model cannot produce the sequence);
        # NaN or +inf means the caller passed something that is not a log-probability.
        if math.isnan(value) or value == math.inf:
            raise ValueError(f"logprob({outcome!r}) = {value!r} is not a valid log-probability")
    log_z = _logsumexp(raw)
    if log_z == -math.inf:
        raise ValueError("every support element has log-probability -inf: cannot renormalize")
    return {u: value - log_z for u, value in zip(outcomes, raw, strict=True)}


def sample_kl(
    samples: Iterable[Hashable],
    logprob: LogProb,
    support: Iterable[Hashable] | None = None,
) -> float:
    """Sample-based KL between a sampler's outputs and the LM, as in ASAp and AdapTrack RQ4.

    The exact target of constrained sampling is the grammar-restricted LM distribution
    ``P_G(s) = P_LM(s) / Z`` with ``Z`` the LM's mass on the grammar, which cannot be
    enumerated. Following the ASAp / AdapTrack recipe, the LM's sequence likelihoods are
    instead renormalized over a finite ``support``::

        p~(s) = exp(logprob(s)) / sum_{u in support} exp(logprob(u))

    (computed with a log-sum-exp), and the result is ``KL(Q || p~)`` where ``Q`` is the
    empirical distribution of ``samples``. Writing ``Z_S`` for the LM mass on the support,

        ``sample_kl = KL(Q || P_LM) + log Z_S = KL(Q || P_G) - log Z + log Z_S``

    where ``KL(Q || P_LM) = sum_s Q(s) log(Q(s) / P_LM(s))``. So it equals the true
    divergence ``KL(Q || P_G)`` only up to the offset ``log Z_S - log Z``, which depends on the
    problem and the support but not on the sampler. **Only differences between methods on the
    same problem, computed with the same support, are meaningful**; absolute values, and
    values across problems, are not. For that reason pass as ``support`` the union of the
    sequences observed by all the methods being compared, as the paper does; the default
    (the distinct ``samples``) makes each method's number use its own normalizer.

    Args:
        samples: Sequences drawn by one sampler for one problem.
        logprob: The LM's log-likelihood of a sequence, as a Mapping or a callable; it is
            evaluated once per distinct support element. ``-inf`` is allowed.
        support: The renormalization set; must contain every sample. Duplicates are
            ignored. Defaults to the distinct ``samples``.

    Returns:
        The divergence in nats; ``math.inf`` if a sample has log-probability ``-inf``.

    Raises:
        ValueError: If ``samples`` or ``support`` is empty, a sample is not in ``support``,
            a log-probability is NaN or ``+inf`` or missing from a Mapping, or every support
            element has log-probability ``-inf``.

    Example:
        >>> import math
        >>> lp = {"x": math.log(0.1), "y": math.log(0.3), "z": math.log(0.6)}
        >>> # Over support {x, y}, p~ = (0.25, 0.75); Q = (0.5, 0.5).
        >>> round(sample_kl(["x", "y"], lp), 6)
        0.143841
        >>> round(sample_kl(["x", "y"], lp, support=["x", "y", "z"]), 6)
        1.060132
    """
    counts = _count(samples)
    support_items = list(counts) if support is None else list(support)
    log_p = _renormalized_logprobs(logprob, support_items)
    outside = [s for s in counts if s not in log_p]
    if outside:
        raise ValueError(
            f"support must contain every sample; {len(outside)} sample(s) are missing, "
            f"e.g. {outside[0]!r}"
        )
    return _kl_counts(counts, log_p)


def kl_to_lm(samples: Iterable[Hashable], logprob: LogProb) -> float:
    """The AdapTrack paper's RQ4 metric (Table 4): KL(Q || P_LM) of the empirical
    distribution Q of ``samples`` to the model's own sequence probabilities, not
    renormalized: ``sum_s Q(s) (log Q(s) - logprob(s))``.

    For samples of a constraint c it equals ``KL(Q || P(· | c)) - log Z`` (Z: the model's
    mass on c), so it is never negative, and differences between samplers on one problem
    are differences of their true KL to the target; values of different problems (other Z)
    do not compare. Unlike :func:`sample_kl` no support is needed.

    Example:
        >>> import math
        >>> lp = {"x": math.log(0.1), "y": math.log(0.3)}   # Z = 0.4, P(·|c) = (0.25, 0.75)
        >>> round(kl_to_lm(["x", "y"], lp), 6)              # KL((.5, .5) || P(·|c)) - log Z
        1.060132
        >>> round(kl_to_lm(["y", "y", "y", "x"], lp) + math.log(0.4), 6)  # Q = P(·|c): 0
        0.0
    """
    counts = _count(samples)
    get = logprob.__getitem__ if isinstance(logprob, Mapping) else logprob
    log_p = {}
    for outcome in counts:
        value = float(get(outcome))
        if math.isnan(value) or value == math.inf:
            raise ValueError(f"logprob({outcome!r}) must be a log-probability, got {value!r}")
        log_p[outcome] = value
    return _kl_counts(counts, log_p)


def sliding_kl(
    samples: Sequence[Hashable],
    window: int,
    *,
    target: Mapping[Any, float] | None = None,
    logprob: LogProb | None = None,
    support: Iterable[Hashable] | None = None,
    step: int = 1,
) -> list[float]:
    """KL of each sliding window ``samples[i : i + window]``, as in AdapTrack's Figure 4.

    Plotting the KL of successive windows shows whether a sampler that adapts over time
    (ASAp, AdapTrack) converges towards the target distribution.

    Exactly one of ``target`` and ``logprob`` must be given:

    * ``target``: each window is scored with :func:`kl_to_distribution`.
    * ``logprob``: each window is scored with :func:`sample_kl`. The support defaults to the
      distinct values of the *whole* ``samples`` sequence (not of each window), so that all
      windows share one normalizer and are comparable with each other.

    Args:
        samples: The samples in the order they were drawn.
        window: Window length, ``1 <= window <= len(samples)``.
        target: Target distribution (non-negative weights, normalized internally).
        logprob: The LM's sequence log-likelihoods, as a Mapping or a callable.
        support: Renormalization set for ``logprob``; only valid together with ``logprob``.
        step: Distance between the starts of consecutive windows, ``>= 1``.

    Returns:
        One KL value per window start ``0, step, 2 * step, ...`` such that the window fits,
        i.e. ``(len(samples) - window) // step + 1`` values.

    Raises:
        ValueError: If not exactly one of ``target`` / ``logprob`` is given, ``support`` is
            given with ``target``, or ``window`` / ``step`` is out of range (plus the errors
            of the underlying KL function).

    Example:
        >>> sliding_kl(["a", "a", "b", "b"], 2, target={"a": 0.5, "b": 0.5})
        [0.6931471805599453, 0.0, 0.6931471805599453]
        >>> sliding_kl(["a", "a", "b", "b"], 2, target={"a": 0.5, "b": 0.5}, step=2)
        [0.6931471805599453, 0.6931471805599453]
    """
    if (target is None) == (logprob is None):
        raise ValueError("sliding_kl needs exactly one of target= or logprob=")
    if target is not None and support is not None:
        raise ValueError("support= only applies with logprob=, not with target=")
    window = as_int("window", window)
    step = as_int("step", step)
    samples = list(samples)
    if not 1 <= window <= len(samples):
        raise ValueError(
            f"window must satisfy 1 <= window <= len(samples)={len(samples)}, got {window}"
        )
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")

    # Normalize / renormalize once: the per-window work is then only counting.
    if target is not None:
        q = _normalize(target, "target")
        log_q = {outcome: math.log(w) if w > 0 else -math.inf for outcome, w in q.items()}
    else:
        assert logprob is not None
        support_items = list(dict.fromkeys(samples)) if support is None else list(support)
        log_q = _renormalized_logprobs(logprob, support_items)
        outside = [s for s in dict.fromkeys(samples) if s not in log_q]
        if outside:
            raise ValueError(
                f"support must contain every sample; {len(outside)} sample(s) are missing, "
                f"e.g. {outside[0]!r}"
            )
    return [
        _kl_counts(Counter(samples[start : start + window]), log_q)
        for start in range(0, len(samples) - window + 1, step)
    ]
