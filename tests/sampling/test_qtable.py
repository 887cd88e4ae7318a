"""The Q table (``adaptrack.sampling.qtable``): formula 2 of the AdapTrack paper after any
order of openings, P_Q of formula 3, dead branches, and Q in log space (docs/design.md §3).
The tests drive the tree as the engine does: they call ``expand`` themselves."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import adaptrack as at
from adaptrack.sampling.draw import draw
from adaptrack.sampling.engine import expand
from adaptrack.sampling.qtable import QTable
from adaptrack.sampling.tree import PrefixTree
from adaptrack.sampling.treeoptions import TreeOptions
from adaptrack.testing import PROBLEMS, hashed_weights


def test_q_table_satisfies_formula_2_after_random_openings():
    lm, constraint, max_new = PROBLEMS["api_names"]()
    tree = PrefixTree([], constraint.bind(lm.vocab), TreeOptions(max_new_tokens=max_new))
    Q = QTable(tree)
    rng = random.Random(0)
    for _ in range(200):  # random root-to-leaf walks, opening as we go
        node = tree.root
        while not node.complete:
            expand(lm, tree, node)  # the test is the driver: it asks the model
            Q.open(node)
            if Q.q(node) == 0:
                break
            ids = node.expansion.ids.tolist()
            node = tree.child(node, rng.choice(ids))

    def recomputed(node) -> float:
        if node.complete or not Q.is_open(node):
            return 1.0
        exp = node.expansion
        return sum(exp.p[i] * (recomputed(node.children[t]) if t in node.children else 1.0)
                   for i, t in enumerate(exp.ids.tolist()))

    opened = 0
    stack = [tree.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if Q.is_open(node):
            opened += 1
            assert Q.q(node) == pytest.approx(recomputed(node), abs=1e-12)
    assert opened > 10


def test_fully_opened_q_root_is_the_total_valid_probability():
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    tree = PrefixTree([], constraint.bind(lm.vocab), TreeOptions(max_new_tokens=max_new))
    Q = QTable(tree)
    stack, total = [tree.root], 0.0
    while stack:
        node = stack.pop()
        if node.complete:
            total += np.exp(node.logprob)
            continue
        expand(lm, tree, node)  # the test is the driver: it asks the model
        Q.open(node)
        stack.extend(tree.child(node, int(t)) for t in node.expansion.ids)
    assert Q.q(tree.root) == pytest.approx(total, rel=1e-9)


# Tokens a, b, EOS at odds 2 : 1 : 1.
SMALL_LM = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)


def small() -> tuple[PrefixTree, QTable]:
    """The strings "a" and "b", ending at EOS only, under ``SMALL_LM``."""
    c = at.constraints.choice(["a", "b"]).bind(SMALL_LM.vocab)
    tree = PrefixTree([], c, TreeOptions(end="eos"))
    return tree, QTable(tree)


def test_a_new_prefix_has_q_one_and_opening_twice_changes_nothing() -> None:
    tree, Q = small()
    root = tree.root
    assert (Q.q(root), Q.log_q(root), Q.dead(root), Q.is_open(root)) == (1.0, 0.0, False, False)
    expand(SMALL_LM, tree, root)  # the test is the driver: it asks the model
    Q.open(root)
    assert Q.q(root) == pytest.approx(0.75) and root.opened  # opened prefixes are pinned
    Q.open(root)
    assert Q.q(root) == pytest.approx(0.75)


def test_p_q_is_formula_3_and_sums_to_one_over_the_children() -> None:
    tree, Q = small()
    expand(SMALL_LM, tree, tree.root)
    Q.open(tree.root)
    a, b = (tree.child(tree.root, t) for t in (0, 1))
    expand(SMALL_LM, tree, a)
    Q.open(a)  # Q[a] = P(EOS | a) = 1/4; b stays new (Q = 1)
    assert Q.q(tree.root) == pytest.approx(0.5 * 0.25 + 0.25)
    assert Q.prob(a) == pytest.approx(0.5 * 0.25 / 0.375)
    assert Q.prob(a) + Q.prob(b) == pytest.approx(1.0)
    w = Q.weights(tree.root)
    assert [Q.token(tree.root, i) for i in range(len(w))] == [0, 1]
    assert (w / w.sum()).tolist() == pytest.approx([Q.prob(a), Q.prob(b)])


def test_a_branch_with_no_valid_end_is_dead_and_its_mass_leaves_its_parent() -> None:
    # After "a" the model never writes b, so "ab" cannot be written: the branch is empty.
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 0, 1] if prefix else [2, 1, 1],
                    eos=2)
    tree = PrefixTree([], at.constraints.choice(["ab", "b"]).bind(lm.vocab),
                      TreeOptions(end="eos"))
    Q = QTable(tree)
    expand(lm, tree, tree.root)
    Q.open(tree.root)
    a = tree.child(tree.root, 0)
    expand(lm, tree, a)
    Q.open(a)
    assert Q.dead(a) and Q.q(a) == 0.0 and Q.prob(a) == 0.0
    assert Q.q(tree.root) == pytest.approx(0.25) and not Q.dead(tree.root)  # "b" alone


def test_q_stays_finite_in_log_space_and_exact_at_single_child_nodes() -> None:
    lm, k = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 97, 1], eos=2), 500
    tree = PrefixTree([], at.constraints.choice(["a" * k]).bind(lm.vocab),
                      TreeOptions(max_new_tokens=k + 1, end="eos"))
    Q, node = QTable(tree), tree.root
    while not node.complete:
        expand(lm, tree, node)  # the test is the driver: it asks the model
        Q.open(node)
        node = tree.child(node, int(node.expansion.ids[0]))
    expected = k * math.log(0.02) + math.log(0.01)
    assert Q.log_q(tree.root) == pytest.approx(expected, rel=1e-12)
    assert Q.q(tree.root) == 0.0 and not Q.dead(tree.root)  # underflows as a float, alive
    # One valid child: P_Q is 1 up to rounding at every depth (no spurious backtracking).
    node = tree.root.children[0]
    while not node.complete:
        assert Q.prob(node) == pytest.approx(1.0, abs=1e-10)  # AdapTrack's ROUNDING: 1e-9
        node = next(iter(node.children.values()))


def test_an_update_lists_the_links_it_moved_and_kept_draw_sums_are_bit_for_bit() -> None:
    """What AdapTrack's walk reads instead of P_Q at every depth (``moved``) and the weights
    and sums Q keeps for the last drawn nodes, against P_Q and np.cumsum computed afresh,
    on a crawl that opens a node's children one by one (many die at the length limit)."""
    letters = [bytes([c]) for c in b"abcdefghijkl"]
    lm = at.TableLM([*letters, b"<eos>"], hashed_weights(13, b"crawl"), eos=12)
    # After "abc", "def" or "ghi" every letter is valid, but only "abcd", "defg" and "ghij"
    # end within 5 tokens: a walk there opens children that die at once, one by one.
    words = [p + c + "kk" for p in ("abc", "def", "ghi") for c in "abcdefghijkl"]
    words += ["ab", "jkl", "abcd", "defg", "ghij"]
    tree = PrefixTree([], at.constraints.choice(words).bind(lm.vocab),
                      TreeOptions(max_new_tokens=5, end="eos"))
    Q, fresh, rng = QTable(tree, moves=True), QTable(tree), np.random.default_rng(0)
    path, moved_links, partial_sums = [tree.root], 0, 0
    for _ in range(300):
        s = path[-1]
        if s.complete:
            path = [tree.root]
            continue
        before = [Q.prob(n) for n in path[1:]]
        expand(lm, tree, s)
        Q.open(s)
        fresh.open(s)
        links = {id(n): (p, lr) for n, p, lr in Q.moved}
        depths = [n.depth for n, _, _ in Q.moved]
        assert depths == sorted(depths, reverse=True)  # longest prefix first
        assert all(n is path[n.depth] for n, _, _ in Q.moved)
        for n, p in zip(path[1:], before, strict=True):
            now = Q.prob(n)
            if id(n) not in links:
                assert now == p  # not listed: P_Q kept bit for bit
                continue
            moved_links += 1
            assert links[id(n)][0] == p
            if now > 0 and not Q.dead(n.parent):
                assert links[id(n)][1] == pytest.approx(math.log(now / p), abs=1e-12)
        while path and Q.dead(path[-1]):
            path.pop()  # its parent draws again, without it
        if not path:
            break
        x = path[-1]
        w = Q.weights(x)
        partial_sums += Q._cache[id(x)].stale < len(w)  # a child died since its last draw
        cdf = Q.cumulative(x)
        fresh._cache.clear()  # the weights computed afresh, from the table's dict
        assert cdf is not None and w.tobytes() == fresh.weights(x).tobytes()
        assert cdf.tobytes() == np.cumsum(w, dtype=np.float64).tobytes()
        path.append(tree.child(x, Q.token(x, draw(w, rng, cdf=cdf))))
    assert moved_links > 100 and partial_sums > 20  # the cases above did happen
