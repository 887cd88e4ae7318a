"""``exact_distribution``: the target P(s | c) by enumerating every valid complete sequence."""

from __future__ import annotations

import math

from .tree import Node, PrefixTree


def enumerate_tree(tree: PrefixTree) -> dict[tuple[int, ...], float]:
    """Every valid complete sequence below the root with its normalized probability.

    Expands each valid prefix once (depth-first); raises ``TreeLimitError`` past the tree's
    ``max_nodes`` and returns an empty dict for an empty language.
    """
    found: dict[tuple[int, ...], float] = {}
    stack: list[Node] = [tree.root]
    while stack:
        node = stack.pop()
        if node.complete:
            found[node.tokens] = node.logprob
            continue
        exp = tree.expand(node)
        stack.extend(tree.child(node, int(t)) for t in exp.ids)
    if not found:
        return {}
    top = max(found.values())
    total = math.fsum(math.exp(lp - top) for lp in found.values())
    return {s: math.exp(lp - top) / total for s, lp in found.items()}
