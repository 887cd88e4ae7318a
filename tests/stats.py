"""Goodness-of-fit helpers shared by the statistical tests."""

from __future__ import annotations

from scipy.stats import chi2

import adaptrack as at


def counts(result: at.GenerationResult) -> dict[tuple[int, ...], int]:
    """How often each complete sample occurred (CD's dead ends are left out)."""
    out: dict[tuple[int, ...], int] = {}
    for s in result.samples:
        if s.complete:
            out[s.tokens] = out.get(s.tokens, 0) + 1
    return out


def chi_square_p(observed: dict, target: dict) -> float:
    """Goodness of fit; outcomes expected fewer than 5 times are pooled into one bin."""
    assert set(observed) <= set(target), "a sample outside the target's support"
    n = sum(observed.values())
    big = [s for s in target if target[s] * n >= 5]
    small = [s for s in target if target[s] * n < 5]
    obs = [observed.get(s, 0) for s in big]
    exp = [target[s] * n for s in big]
    if small:
        obs.append(sum(observed.get(s, 0) for s in small))
        exp.append(sum(target[s] for s in small) * n)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    return float(chi2.sf(stat, len(obs) - 1))
