"""The prefix tree's parts (docs/design.md §4): the node store, the expander, the forced
chains and the budgets, each on its own, and the tree's names over them."""

from __future__ import annotations

import time

import numpy as np
import pytest

import adaptrack as at
from adaptrack.errors import CallLimitError, SearchTimeoutError, TreeLimitError
from adaptrack.sampling.budgets import Budgets
from adaptrack.sampling.chains import Chains
from adaptrack.sampling.engine import expand
from adaptrack.sampling.expander import Expander
from adaptrack.sampling.expansion import Expansion
from adaptrack.sampling.fastforward import FastForward
from adaptrack.sampling.nodes import Node, NodeStore
from adaptrack.sampling.tree import PrefixTree
from adaptrack.sampling.treeoptions import TreeOptions
from adaptrack.tokenization.tokenizer import Tokenizer

A, B, C, EOS = 0, 1, 2, 3
VOCAB = [b"a", b"b", b"c", b"<eos>"]


def table_lm() -> at.TableLM:
    return at.TableLM(VOCAB, lambda prefix: [4, 2, 1, 1], eos=EOS)


def chains_of(lm: at.TableLM, m: at.constraints.Matcher, ff: FastForward | None,
              max_new_tokens: int) -> Chains:
    return Chains((), m, ff, max_new_tokens=max_new_tokens, tokenizer=Tokenizer.for_model(lm))


def root_of(matcher: at.constraints.Matcher) -> Node:
    start = matcher.start()
    return Node(None, None, start, matcher.is_complete(start), 0.0)


def step(matcher: at.constraints.Matcher, node: Node, token: int) -> Node:
    state = matcher.advance(node.state, token)
    assert state is not None
    return Node(node, token, state, matcher.is_complete(state), 0.0)


def flat(size: int = 4) -> np.ndarray:
    return np.log(np.full(size, 1.0 / size))


# --- budgets ------------------------------------------------------------------------------

def test_budgets_raise_at_their_limits_and_name_them():
    b = Budgets(max_nodes=3, max_opened_bytes=100, max_seconds=None)
    b.check_nodes(2)
    with pytest.raises(TreeLimitError, match="max_nodes=3"):
        b.check_nodes(3)
    b.check_opened(100, nodes=1)
    with pytest.raises(TreeLimitError, match="max_opened_bytes=100"):
        b.check_opened(101, nodes=1)
    b.check_spent(nodes=1, calls=1)  # no limit
    b.max_seconds, b.started = 5.0, time.monotonic() - 60  # started a minute ago
    with pytest.raises(SearchTimeoutError, match=r"max_seconds=5 .*7 prefixes, 2 model calls"):
        b.check_spent(nodes=7, calls=2)


def test_the_call_budget_stops_before_the_call_past_it():
    b = Budgets(max_nodes=100, max_opened_bytes=100, max_seconds=None, max_calls=3)
    b.check_spent(nodes=9, calls=2)
    with pytest.raises(CallLimitError, match=r"made 3 model calls, its budget max_calls=3 "
                       r"\(search_budget x n x max_new_tokens; 9 prefixes\); raise "
                       r"search_budget"):
        b.check_spent(nodes=9, calls=3)
    b.check_time(nodes=9, calls=3)  # a walk going on through known prefixes is not stopped
    b.max_calls = None  # the fallback lifts it
    b.check_spent(nodes=9, calls=10**6)


def test_the_trees_budget_names_set_its_budgets():
    lm = table_lm()
    tree = PrefixTree([], at.constraints.choice(["ab"]).bind(lm.vocab), TreeOptions(max_nodes=10))
    tree.max_nodes, tree.max_opened_bytes, tree.max_seconds = 1, 7, 3.0
    tree.started = 12.5
    b = tree.budgets
    assert (b.max_nodes, b.max_opened_bytes, b.max_seconds, b.started) == (1, 7, 3.0, 12.5)
    with pytest.raises(SearchTimeoutError):  # 3 s from a long-gone start
        expand(lm, tree, tree.root)
    tree.max_seconds = None
    expand(lm, tree, tree.root)
    with pytest.raises(TreeLimitError, match="max_nodes=1"):
        tree.child(tree.root, A)


# --- the node store -----------------------------------------------------------------------

def test_the_store_drops_the_least_recent_unprotected_expansions_and_keeps_pinned_ones():
    root = Node(None, None, 0, False, 0.0)
    kids = [Node(root, t, 0, False, 0.0) for t in range(3)]
    store = NodeStore(root, max_cache_bytes=2 * 16)  # two expansions of 2 float64s
    for kid in kids:
        store.add(root, int(kid.token or 0), kid)
        store.keep(kid, Expansion(np.array([0.5, 0.5]), np.array([0, 1])))
    assert store.count == 4 and set(root.children) == {0, 1, 2}
    assert store.cache_bytes == 48  # over the bound until trimmed
    store.trim([kids[0]])  # the oldest is protected: the next one goes
    assert [k.expansion is None for k in kids] == [False, True, False]
    assert (store.cache_bytes, store.evictions) == (32, 1)
    assert store.pin(kids[0]) and not store.pin(kids[0])  # counted once
    assert (store.opened_bytes, store.cache_bytes) == (16, 16)
    store.keep(kids[1], Expansion(np.array([0.5, 0.5]), np.array([0, 1])))
    store.keep(root, Expansion(np.array([0.5, 0.5]), np.array([0, 1])))
    store.trim([])  # 48 droppable bytes: the oldest droppable one goes, never the pinned
    assert kids[0].expansion is not None and kids[2].expansion is None
    assert kids[1].expansion is not None and root.expansion is not None


# --- the expander -------------------------------------------------------------------------

def test_the_validity_rule_at_the_last_two_positions():
    lm = table_lm()
    m = at.constraints.choice(["ab", "abc", "b"]).bind(lm.vocab)
    root = root_of(m)
    a = step(m, root, A)
    ab = step(m, a, B)
    # One token before the last: only tokens after which one can finish ("b", not "a"),
    # as ``closing`` says (choice's own lists every allowed token: a superset is allowed).
    m.closing = lambda state: np.array([B])
    two = Expander(m, TreeOptions(max_new_tokens=2))
    assert m.allowed(root.state).tolist() == [A, B] and two.valid(root).tolist() == [B]
    assert two.dead(a) and not two.dead(root)  # "a" cannot finish at the last position
    three = Expander(m, TreeOptions(max_new_tokens=3))
    assert m.allowed(ab.state).tolist() == [C, EOS] and three.valid(ab).tolist() == [EOS]
    assert two.valid(ab).tolist() == [] and two.dead(ab)  # at the length limit
    loose = Expander(m, TreeOptions(max_new_tokens=2, restrict_length=False))
    assert loose.valid(root).tolist() == [A, B] and not loose.dead(a)


def test_an_expansion_from_a_row():
    lm = table_lm()
    m = at.constraints.choice(["a", "b"]).bind(lm.vocab)
    root = root_of(m)
    row = np.log(np.array([0.4, 0.2, 0.2, 0.2]))
    def expansion(force: bool = False, **options) -> Expansion:
        return Expander(m, TreeOptions(end="eos", **options), force=force).expansion(root, row)

    e = expansion()
    assert e.ids.tolist() == [A, B] and np.allclose(e.p, [0.4, 0.2])
    hot = expansion(temperature=0.5)  # p ∝ p^2
    assert np.allclose(hot.p, np.array([0.16, 0.04]) / 0.28)
    cold = expansion(temperature=0.0)  # T = 1 kept
    assert np.allclose(cold.p, e.p)
    top = expansion(top_p=0.3)  # .4 / (.4 + .6 unchecked)
    assert top.ids.tolist() == [A]
    root.pending = (B,)
    forced = expansion(force=True)
    assert forced.ids.tolist() == [B] and np.allclose(forced.p, [0.2])


def test_leave_moves_the_mass_of_leaving_tokens_onto_eos():
    lm = table_lm()
    m = at.constraints.choice(["a", "ab"]).bind(lm.vocab)
    a = step(m, root_of(m), A)  # accepted; "b" continues, "a" and "c" leave
    row = np.log(np.array([0.1, 0.3, 0.2, 0.4]))
    left = Expander(m).expansion(a, row)
    assert left.ids.tolist() == [B, EOS] and np.allclose(left.p, [0.3, 0.7])
    stay = Expander(m, TreeOptions(end="eos")).expansion(a, row)
    assert stay.ids.tolist() == [B, EOS] and np.allclose(stay.p, [0.3, 0.4])


# --- the chains ---------------------------------------------------------------------------

def test_pending_tokens_are_computed_once_and_fit_the_length_limit():
    lm = table_lm()
    m = at.constraints.choice(["abc"]).bind(lm.vocab)
    root = root_of(m)
    assert chains_of(lm, m, FastForward(), 2).pending(root) == (A, B)
    assert root.pending == (A, B)
    assert chains_of(lm, m, FastForward(), 8).pending(root) == (A, B)  # kept
    assert chains_of(lm, m, None, 8).pending(root_of(m)) == ()
    prefill = chains_of(lm, m, FastForward(force=False), 8)
    assert not prefill.force and chains_of(lm, m, FastForward(), 8).force
    with pytest.raises(ValueError, match="fast-forward needs the model's tokenizer"):
        Chains((), m, FastForward(), max_new_tokens=8)  # a tree holds no model to ask
    mine = Chains((), m, FastForward(tokenizer=Tokenizer.longest_match(lm.vocab)),
                  max_new_tokens=8)
    assert mine.pending(root_of(m)) == (A, B, C)  # FastForward's own tokenizer is enough


def test_split_feeds_a_lazy_chain_only_from_inside_it():
    lm = table_lm()
    m = at.constraints.choice(["abc", "b"]).bind(lm.vocab)
    chains = chains_of(lm, m, FastForward(), 8)
    root = root_of(m)
    assert chains.split([root]) == ([root], [])  # nothing forced at the root
    a = step(m, root, A)
    assert chains.pending(a) == (B, C)
    assert chains.split([a], eager=False) == ([a], [])  # a head of its own
    a.in_chain, root.pending = True, (A, B, C)  # stepped in from a chain's head
    assert chains.split([a], eager=False) == ([], [a])


def test_a_fed_chain_expands_every_prefix_along_it():
    lm = table_lm()
    m = at.constraints.choice(["abc"]).bind(lm.vocab)
    tree = PrefixTree([], m, TreeOptions(fast_forward=FastForward(), max_new_tokens=8, end="eos"),
                      tokenizer=Tokenizer.for_model(lm))
    plain, heads = tree.plan([tree.root])
    assert (plain, heads) == ([], [tree.root]) and tree.root.pending == (A, B, C)
    rows = [np.tile(flat(), (4, 1))]
    tree.store_chains(heads, rows)
    abc = tree.root.children[A].children[B].children[C]
    assert [n.expansion.ids.tolist() for n in (tree.root, abc.parent, abc)] == [[A], [C], [EOS]]
    assert (tree.lm_calls, tree.ff_sequences, tree.forced_tokens, tree.num_nodes) == (1, 1, 3, 4)
    assert tree.cache_bytes == sum(n.expansion.nbytes for n in
                                   (tree.root, abc.parent.parent, abc.parent, abc))
