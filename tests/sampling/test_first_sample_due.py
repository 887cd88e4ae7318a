"""The first sample's due (docs/design.md §6): a search whose n > 1 samples share one Q
(``exact``, ``asap``, AdapTrack with ``share_q``) hands every sample to the CD fallback
once it has made (n + 1) / 2 samples' shares of model calls without a sample, and gets the
request's whole budget once its first sample came."""

from __future__ import annotations

import math

import pytest
from test_crawl import Counting  # tests/sampling, on the path as the test's directory

import adaptrack as at
from adaptrack.options import FALLBACK_TRIES

SHARE = 100  # model calls a sample: search_budget x max(max_new_tokens, 64)


def run(seed: int, n: int = 4, **kwargs):
    lm = Counting()
    c = at.constraints.regex("[a-p]{2}[a-d]?")
    # Without the early hand-over: the budget's own rule is what these tests check.
    return at.generate(lm, [], c, method="exact", n=n, seed=seed, max_new_tokens=4,
                       end="eos", early_handover=None, **kwargs)


def test_a_search_with_no_sample_by_its_due_hands_every_sample_to_the_fallback():
    """Seed 3's first exact sample takes 480 calls without a budget: past the due of
    ceil(100 x 5 / 2) = 250, so the search stops there, not at the request's 400."""
    free = run(3, search_budget=None)
    assert not any(s.fallback for s in free.samples)
    due = math.ceil(SHARE * (4 + 1) / 2)
    with pytest.warns(at.SearchFallbackWarning,
                      match=rf"4 of 4 .*max_calls={due} \(no sample yet: the first is due"):
        res = run(3, search_budget=SHARE / 64)
    assert all(s.fallback and s.valid for s in res.samples)
    # The search's calls stop at the due (one pass may cross it), then four CD walks of at
    # most 4 tokens each, FALLBACK_TRIES walks each at worst.
    assert res.stats["lm_calls"] <= due + 4 + 2 * 4 * FALLBACK_TRIES * 4 < SHARE * 4


def test_once_the_first_sample_came_the_request_has_its_whole_budget():
    """Seed 5's first samples take 153 and 165 calls, the third 699: the first comes
    before the due (250), so the search goes on to the request's 400 calls, its samples
    before that the ones it draws without a budget."""
    free = run(5, search_budget=None)
    with pytest.warns(at.SearchFallbackWarning,
                      match=r"2 of 4 .*max_calls=400 \(search_budget x n x max_new_tokens"):
        res = run(5, search_budget=SHARE / 64)
    assert [s.fallback for s in res.samples] == [False, False, True, True]
    assert [s.tokens for s in res.samples[:2]] == [s.tokens for s in free.samples[:2]]
    assert res.stats["lm_calls"] >= 4 * SHARE


def test_without_the_fallback_the_search_keeps_the_request_budget():
    """The due hands samples to the fallback; a caller who asked for the error instead
    (``fallback=None``) gets it at the request's budget, as before."""
    with pytest.raises(at.CallLimitError, match=r"max_calls=400 \(search_budget x n x"):
        run(3, search_budget=SHARE / 64, fallback=None)


def test_one_sample_keeps_the_request_budget():
    """At n = 1 the due would be the request's budget itself: nothing changes."""
    with pytest.warns(at.SearchFallbackWarning, match=r"max_calls=100 \(search_budget x n x"):
        res = run(3, n=1, search_budget=SHARE / 64)
    assert res.samples[0].fallback
