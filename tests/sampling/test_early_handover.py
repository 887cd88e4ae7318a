"""The early hand-over (docs/design.md §6): a search that has spent EARLY_RATIO x CD's
estimated cost hands the samples it has not drawn to CD, so that a request whose search
cannot finish costs about (EARLY_RATIO + 1) x CD, not its whole budget and CD on top."""

from __future__ import annotations

import re
import warnings

import pytest

import adaptrack as at
from adaptrack.sampling.nodes import Node
from adaptrack.sampling.policy import EARLY_FLOOR, EARLY_RATIO, BudgetPolicy
from adaptrack.sampling.tree import PrefixTree
from adaptrack.testing import hashed_weights

LETTERS = [chr(ord("a") + i).encode() for i in range(16)]
SEARCHES = [("adaptrack", {}), ("adaptrack", {"share_q": True}), ("exact", {})]


def crawl_lm() -> at.TableLM:
    """EOS is rare after a letter: under end="eos" the searches crawl (hundreds of calls)
    where CD takes one walk a sample."""
    weights = hashed_weights(len(LETTERS))
    return at.TableLM([*LETTERS, b"<eos>"],
                      lambda prefix: [*weights(prefix), 0.05 if prefix else 0.0],
                      eos=len(LETTERS))


def run(method: str, budget: float | None, letters: int = 10,
        **kwargs: object) -> at.GenerationResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.SearchFallbackWarning)
        return at.generate(crawl_lm(), [], at.constraints.regex(f"[a-p]{{{letters}}}[a-d]?"),
                           method=method, n=5, seed=0, max_new_tokens=letters + 2, end="eos",
                           search_budget=budget, **kwargs)


@pytest.mark.parametrize(("method", "kwargs"), SEARCHES)
def test_a_search_that_cannot_finish_hands_over_early(method, kwargs):
    """25 letters: CD's estimate (26 calls a sample) times EARLY_RATIO passes the floor."""
    # A budget 50 times CD's worst case: only the early rule stops the search.
    res = run(method, 50.0, letters=25, **kwargs)
    assert sum(s.fallback for s in res.samples) >= 3
    assert all(re.fullmatch("[a-p]{25}[a-d]?", s.text) for s in res.samples)
    # Without the early rule the search spends its budget (3 200 calls) or crawls on.
    late = run(method, 10.0, letters=25, early_handover=None, **kwargs)
    assert res.stats["lm_calls"] * 2 < late.stats["lm_calls"]
    # The share counts the prefixes walks used, EARLY_RATIO x CD's 26 calls a sample (more
    # than the floor); the siblings AdapTrack fetches ahead and exact's width come on top.
    assert EARLY_RATIO * 26 > EARLY_FLOOR


@pytest.mark.parametrize(("method", "kwargs"), SEARCHES)
def test_without_a_budget_the_search_is_not_cut_short(method, kwargs):
    res = run(method, None, letters=2, **kwargs)
    assert res.stats["lm_calls"] > 10 * run("cd", None, letters=2).stats["lm_calls"]
    assert not any(s.fallback for s in res.samples)


def test_the_fallback_says_it_was_the_early_hand_over():
    with pytest.warns(at.SearchFallbackWarning, match="CD's estimated cost"):
        at.generate(crawl_lm(), [], at.constraints.regex("[a-p]{20}[a-d]?"), n=2, seed=0,
                    max_new_tokens=22, end="eos", search_budget=50.0)


@pytest.mark.parametrize(("method", "kwargs"), SEARCHES)
def test_a_search_that_draws_its_samples_keeps_them(method, kwargs):
    """Every sample of a request its search finishes within the early share is its own."""
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 2], eos=2)
    res = at.generate(lm, [], at.constraints.choice(["ab", "ba", "aab"]), method=method, n=8,
                      seed=1, max_new_tokens=4, **kwargs)
    assert not any(s.fallback for s in res.samples)


def test_cd_cost_is_estimated_from_the_bound_and_the_samples():
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    tree = PrefixTree([], at.constraints.choice(["aaaa", "ab"]).bind(lm.vocab))
    policy = BudgetPolicy(fallback_tries=4, early=2.0)
    policy.bind(tree)
    assert policy.cd_calls() == 3  # "ab" and its EOS
    assert policy.early_calls() == EARLY_FLOOR  # 2 x 3 is less than the floor
    node = tree.root
    for _ in range(4):  # "aaaa": five calls on its path, the root's included
        node = Node(node, 0, node.state, False, 0.0)
    policy.sample_done(tree, True, node)  # a finished sample, here CD's, says more
    assert policy.cd_calls() == 5
    assert BudgetPolicy(fallback_tries=None, early=2.0).early_calls() is None


@pytest.mark.parametrize(("method", "kwargs"), SEARCHES)
def test_a_sample_handed_over_early_is_walked_by_cd_from_the_root(method, kwargs):
    """The early hand-over's walks are CD's own: from the root, on each sample's random
    stream, so a sample it hands over is the one the seed gives with method="cd" (a walk
    that wandered far from where CD goes is not finished from there)."""
    cd = run("cd", None, letters=20)
    res = run(method, 50.0, letters=20, **kwargs)
    fell = [i for i, s in enumerate(res.samples) if s.fallback]
    assert fell
    assert all(res.samples[i].tokens == cd.samples[i].tokens for i in fell)


def chained_lm() -> at.TableLM:
    """A letter, then "xy" forced: one token canonically, or "x" and "y". EOS is rare after
    a letter, so under end="eos" the searches crawl and hand over early."""
    vocab = [*LETTERS, b"x", b"y", b"xy", b"<eos>"]
    weights = hashed_weights(len(vocab) - 1, b"chains")
    return at.TableLM(vocab, lambda prefix: [*weights(prefix), 0.05 if prefix else 0.0],
                      eos=len(vocab) - 1)


@pytest.mark.parametrize(("method", "kwargs"), SEARCHES)
def test_a_sample_handed_over_early_is_cds_own(method, kwargs):
    """The fallback walks the search's tree, where a forced chain is only prefilled and
    "x" "y" stays valid beside "xy"; it follows the canonical token as cd's own tree forces
    it, so each sample it draws from the root is the one cd draws with that seed, at the
    model calls cd makes for it."""
    pattern = at.constraints.regex("([a-p]xy){8}")
    kw = dict(n=5, seed=0, max_new_tokens=30, end="eos")
    cd = at.generate(chained_lm(), [], pattern, method="cd", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.SearchFallbackWarning)
        res = at.generate(chained_lm(), [], pattern, method=method, search_budget=50.0,
                          **kw, **kwargs)
    fell = [i for i, s in enumerate(res.samples) if s.fallback]
    assert len(fell) >= 3
    assert [res.samples[i].tokens for i in fell] == [cd.samples[i].tokens for i in fell]
    assert all(len(s.tokens) == 17 for s in cd.samples)  # 8 letters, 8 "xy", EOS
    calls = sum(s.lm_requests for s in cd.samples)
    assert sum(res.samples[i].lm_requests for i in fell) <= calls


def test_cd_cost_counts_no_call_for_a_forced_token():
    """The bound counts tokens; the walks' paths say which of the first ones fast-forward
    fed, which CD pays no call for."""
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    tree = PrefixTree([], at.constraints.choice(["aaaab"]).bind(lm.vocab))
    policy = BudgetPolicy(fallback_tries=4, early=2.0)
    policy.bind(tree)
    assert policy.cd_calls() == 6  # "aaaab" and its EOS, a call each
    path = [tree.root]
    for forced in (False, True, True, False):
        path.append(Node(path[-1], 0, path[-1].state, False, 0.0))
        path[-1].in_chain = forced
    assert [PrefixTree.calls_within(path[-1], t) for t in (1, 3, 4, 6)] == [1, 2, 2, 4]
    assert not policy.reads_paths(EARLY_FLOOR - 1) and policy.reads_paths(EARLY_FLOOR)
    # 4 calls for 6 tokens; 2 calls for 3, a call for each of the 3 it has not reached
    policy.walked([path[-1], path[2]])
    assert policy.cd_calls() == 4.5


@pytest.mark.parametrize(("method", "kwargs"), SEARCHES)
def test_forced_tokens_do_not_delay_the_hand_over(method, kwargs):
    """Thirty letters, each followed by a forced "xy": 61 tokens, but 31 calls a CD sample.
    Counted in tokens, CD's estimate doubled, and the searches handed over after 7.1 to
    8.0 x CD's model calls; counted in calls they hand over within EARLY_RATIO + 1 times,
    the siblings AdapTrack fetches ahead and exact's width on top."""
    pattern = at.constraints.regex("([a-p]xy){30}")
    kw = dict(n=5, seed=0, max_new_tokens=70, end="eos")
    cd = at.generate(chained_lm(), [], pattern, method="cd", **kw).stats["lm_calls"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.SearchFallbackWarning)
        res = at.generate(chained_lm(), [], pattern, method=method, search_budget=50.0,
                          **kw, **kwargs)
    assert res.stats["fallback_samples"] == 5
    assert res.stats["lm_calls"] <= 2 * (EARLY_RATIO + 1) * cd


@pytest.mark.parametrize("method", ["adaptrack", "exact"])
def test_a_lazy_constraint_keeps_its_search(method):
    """A predicate tells CD no dead end ahead: handed over early, 15 of adaptrack's 20
    samples here went to CD and 12 came back incomplete. With no early hand-over over a
    lazy constraint, the search draws every sample, complete."""
    lm = at.TableLM([b"1", b"2", b"+", b"<eos>"], lambda prefix: [1, 1, 1, 1], eos=3)
    sums = at.constraints.predicate(lambda t: "++" not in t and not t.startswith("+"),
                                    lambda t: t[-1:].isdigit() and eval(t) == 4)
    res = at.generate(lm, [], sums, method=method, n=20, seed=2, max_new_tokens=8)
    assert res.stats["fallback_samples"] == 0
    assert all(s.complete for s in res.samples)
