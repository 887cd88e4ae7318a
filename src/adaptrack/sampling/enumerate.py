"""``exact_distribution``: the target P(s | c) of docs/design.md §2 by enumerating every valid
complete sequence."""

from __future__ import annotations

import math

from ..lm.base import LanguageModel
from .engine import expand
from .tree import Node, PrefixTree


def enumerate_tree(lm: LanguageModel, tree: PrefixTree) -> dict[tuple[int, ...], float]:
    """Every valid complete sequence below the root with its normalized probability under
    ``lm``.

    Expands each valid prefix once (depth-first); raises the tree's budget errors
    (``TreeLimitError`` past ``max_nodes``, ``SearchTimeoutError`` past ``max_seconds``) and
    returns an empty dict for an empty language.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> tree = PrefixTree([], at.constraints.choice(["a", "b"]).bind(lm.vocab))
    >>> {s: round(p, 3) for s, p in enumerate_tree(lm, tree).items()}
    {(1, 2): 0.333, (0, 2): 0.667}
    """
    found: dict[tuple[int, ...], float] = {}
    stack: list[Node] = [tree.root]
    while stack:
        node = stack.pop()
        if node.complete:
            found[node.tokens] = node.logprob
            continue
        exp = expand(lm, tree, node)
        stack.extend(tree.child(node, int(t)) for t in exp.ids)
    if not found:
        return {}
    top = max(found.values())
    total = math.fsum(math.exp(lp - top) for lp in found.values())
    return {s: math.exp(lp - top) / total for s, lp in found.items()}
