"""The draws a walk makes: :func:`draw` by inverse CDF and :class:`Race` by exponential race,
whose winners can be read before the draw is made (AdapTrack's crawled parents)."""

from __future__ import annotations

import numpy as np
import pytest
from stats import chi_square_p

from adaptrack.sampling.draw import Race, draw

WEIGHTS = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 0.5])


@pytest.mark.parametrize("exclude", [None, 3])
def test_a_race_draws_in_proportion_to_the_weights(exclude: int | None) -> None:
    race, n = Race(seed=11), 5_000
    w = WEIGHTS.copy()
    if exclude is not None:
        w[exclude] = 0.0
    target = {i: float(x / w.sum()) for i, x in enumerate(w) if x > 0}
    seen: dict[int, int] = {}
    for _ in range(n):
        i = race.draw(WEIGHTS, exclude)
        seen[i] = seen.get(i, 0) + 1
    assert race.drawn == n
    # A fixed seed: a sampler that drew another distribution would fail at n = 5 000 with
    # a p-value far below this (an odds shift of 10 % on one weight: ~1e-6).
    assert chi_square_p(seen, target) > 1e-3


def test_a_race_winner_stays_when_other_weights_fall() -> None:
    """What AdapTrack reads ahead: the index draw v takes does not move when the weights of
    other indices fall (to 0 or not), where an inverse CDF's draw does."""
    race, rng = Race(seed=3), np.random.default_rng(0)
    moved_cdf = 0
    for v in range(300):
        i = race.winner(WEIGHTS, v)
        lower = WEIGHTS * rng.uniform(0.0, 1.0, len(WEIGHTS))
        lower[i] = WEIGHTS[i]
        assert race.winner(lower, v) == i
        moved_cdf += draw(WEIGHTS, np.random.default_rng(v)) != draw(
            lower, np.random.default_rng(v))
    assert moved_cdf > 0  # the property is the race's, not every draw's


def test_draws_of_one_race_are_fixed_by_seed_and_number() -> None:
    a, b = Race(seed=5), Race(seed=5)
    ahead = [a.winner(WEIGHTS, v) for v in range(20)]
    assert [b.draw(WEIGHTS) for _ in range(20)] == ahead
    assert [Race(seed=6).winner(WEIGHTS, v) for v in range(20)] != ahead
    with pytest.raises(ValueError, match="positive weight"):
        a.draw(np.zeros(3))
