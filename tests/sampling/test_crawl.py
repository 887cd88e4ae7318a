"""AdapTrack's siblings fetched ahead where its walk crawls a parent (``crawl_ahead``,
docs/design.md §3): one model call serves them, they only fill the cache, so samples and
counters are those of a walk without them, under any cache bound and within max_nodes."""

from __future__ import annotations

import math

import pytest

import adaptrack as at
from adaptrack.options import FALLBACK_TRIES
from adaptrack.sampling.adaptrack import AHEAD_SHARE, AdapTrack
from adaptrack.sampling.engine import Engine
from adaptrack.sampling.tree import PrefixTree
from adaptrack.sampling.treeoptions import TreeOptions
from adaptrack.testing import hashed_weights

LETTERS = [chr(ord("a") + i) for i in range(16)]


class Counting(at.TableLM):
    """A TableLM that records the rows of each model call."""

    def __init__(self) -> None:
        weights = hashed_weights(len(LETTERS))
        # EOS is rare after a letter, so a prefix that must end soon has little valid mass:
        # the walk opens a parent's children one by one (a crawl).
        super().__init__([*LETTERS, b"<eos>"],
                         lambda prefix: [*weights(prefix), 0.05 if prefix else 0.0],
                         eos=len(LETTERS))
        self.batches: list[int] = []

    def _next_logprobs(self, prefixes):
        self.batches.append(len(prefixes))
        return super()._next_logprobs(prefixes)


def crawl(**kwargs):
    lm = Counting()
    c = at.constraints.regex("[a-p]{2}[a-d]?")
    # No call budget: a crawl of a few hundred prefixes a sample is what is tested.
    res = at.generate(lm, [], c, method="adaptrack", n=6, seed=kwargs.pop("seed", 0),
                      max_new_tokens=4, end="eos", search_budget=None, **kwargs)
    return lm, res


def outcome(res):
    """What a seed must reproduce: the samples, what each used, and the search's counters."""
    return ([(s.tokens, s.lm_requests, s.complete) for s in res.samples],
            res.stats["backtracks"], res.stats["restarts"])


@pytest.mark.parametrize("share_q", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_siblings_fetched_ahead_change_no_sample_and_share_passes(monkeypatch, share_q,
                                                                      seed):
    monkeypatch.setattr(AdapTrack, "crawl_ahead", 1)
    off_lm, off = crawl(share_q=share_q, seed=seed)
    monkeypatch.setattr(AdapTrack, "crawl_ahead", 8)
    on_lm, on = crawl(share_q=share_q, seed=seed)
    assert outcome(on) == outcome(off)
    assert max(off_lm.batches) == 1 or not share_q  # lockstep samples batch on their own
    # The crawl happened and one call served several siblings, in fewer calls.
    assert max(on_lm.batches) >= 4
    assert len(on_lm.batches) < len(off_lm.batches)
    assert on.stats["lm_calls"] > off.stats["lm_calls"]  # prefixes evaluated, used or not
    assert off.stats["fetched_ahead"] == 0 < on.stats["fetched_ahead"]
    assert on.stats["lm_calls"] <= off.stats["lm_calls"] + on.stats["fetched_ahead"]


def test_the_cache_bound_holds_with_siblings_fetched_ahead(monkeypatch):
    """Siblings fetched ahead are droppable: a tiny cache drops them (and the walk asks
    again where it needs one), the bytes stay within the bound between calls, and the
    samples are the same."""
    monkeypatch.setattr(AdapTrack, "crawl_ahead", 1)
    _, free = crawl()
    monkeypatch.setattr(AdapTrack, "crawl_ahead", 8)
    lm = Counting()
    c = at.constraints.regex("[a-p]{2}[a-d]?").bind(lm.vocab)
    bound = 600  # a few expansions of 17 float64 numbers
    tree = PrefixTree([], c, TreeOptions(max_new_tokens=4, end="eos", max_cache_bytes=bound))
    method, got = AdapTrack(tree, greedy=False), {}
    engine = Engine(lm)
    engine.submit(method, 6, 0, lambda i, node, used: got.__setitem__(i, (node.tokens, used)),
                  width=6)
    most = 0
    while engine.step():
        most = max(most, tree.cache_bytes)
    assert tree.evictions > 0 and method.fetched > 0
    row = 17 * 8 + 8 * 17  # p and ids of one expansion at most
    assert most <= bound + max(lm.batches) * row  # past it only the last call's rows
    assert [got[i] for i in range(6)] == [(s.tokens, s.lm_requests) for s in free.samples]


def test_siblings_fetched_ahead_take_at_most_a_share_of_max_nodes(monkeypatch):
    """A request that stays within max_nodes without fetching ahead stays within it with
    fetching ahead when its own prefixes fill at most 1 - AHEAD_SHARE of it."""
    monkeypatch.setattr(AdapTrack, "crawl_ahead", 1)
    _, off = crawl()
    nodes = off.stats["tree_nodes"]
    monkeypatch.setattr(AdapTrack, "crawl_ahead", 8)
    _, wide = crawl()
    assert wide.stats["tree_nodes"] > nodes  # unbounded, it fetches more than it uses
    limit = math.ceil(nodes / (1 - AHEAD_SHARE)) + 1
    _, tight = crawl(max_nodes=limit, fallback=None)
    assert outcome(tight) == outcome(off)
    assert tight.stats["tree_nodes"] <= limit


@pytest.mark.parametrize("seed", [0, 1])
def test_independent_walks_fall_back_one_by_one_at_their_share(seed):
    """AdapTrack with a Q per sample: each walk may cause search_budget x max(max_new_tokens,
    64) model calls (those for its siblings fetched ahead included); one past its share
    goes on by CD alone, the others search on, so a sample within its share is the one the
    seed gives without a budget."""
    share = 30
    _, free = crawl(seed=seed)
    lm = Counting()
    c = at.constraints.regex("[a-p]{2}[a-d]?")
    with pytest.warns(at.SearchFallbackWarning, match=r"of 6 .* its share .*30 a sample"):
        res = at.generate(lm, [], c, method="adaptrack", n=6, seed=seed, max_new_tokens=4,
                          end="eos", search_budget=share / 64, early_handover=None)
    fell = [s.fallback for s in res.samples]
    assert any(fell) and all(s.valid for s in res.samples)
    assert res.stats["fallback_samples"] == sum(fell)
    for alone, got in zip(free.samples, res.samples, strict=True):
        if not got.fallback:
            assert got.tokens == alone.tokens
    # Each walk's share, one pass of siblings fetched ahead past it, and the CD walks
    # (FALLBACK_TRIES from where the walk was, as many from the root; 4 tokens each).
    bound = 6 * (share + AdapTrack.crawl_ahead) + sum(fell) * 2 * FALLBACK_TRIES * 4
    assert res.stats["lm_calls"] <= bound < free.stats["lm_calls"]
