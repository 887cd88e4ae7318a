"""The Q table (``adaptrack.sampling.qtable``): formula 2 of the AdapTrack paper after any
order of openings, its root's value once every prefix is open, and Q in log space
(docs/design.md §3)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from adaptrack.sampling.qtable import QTable
from adaptrack.sampling.tree import PrefixTree
from adaptrack.testing import PROBLEMS


def test_q_table_satisfies_formula_2_after_random_openings():
    lm, constraint, max_new = PROBLEMS["api_names"]()
    tree = PrefixTree(lm, [], constraint.bind(lm.vocab), max_new_tokens=max_new)
    Q = QTable(tree)
    rng = random.Random(0)
    for _ in range(200):  # random root-to-leaf walks, opening as we go
        node = tree.root
        while not node.complete:
            tree.expand(node)  # the test is the driver: it asks the model
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
    tree = PrefixTree(lm, [], constraint.bind(lm.vocab), max_new_tokens=max_new)
    Q = QTable(tree)
    stack, total = [tree.root], 0.0
    while stack:
        node = stack.pop()
        if node.complete:
            total += np.exp(node.logprob)
            continue
        tree.expand(node)  # the test is the driver: it asks the model
        Q.open(node)
        stack.extend(tree.child(node, int(t)) for t in node.expansion.ids)
    assert Q.q(tree.root) == pytest.approx(total, rel=1e-9)
