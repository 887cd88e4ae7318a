"""Greedy constrained decoding (the AdapTrack paper §3.2): mask invalid tokens, renormalize,
never look back (docs/design.md §3).

P_con(s_i | s_<i) ∝ P(s_i | s_<i) · 1[s_i ∈ C(s_<i)]. It never fails on a constraint with no
dead ends; when it walks into one (a prefix that cannot finish within max_new_tokens) it
returns that prefix as an incomplete sample, as docs/design.md §2 specifies.

As the searches' fallback (docs/design.md §6) it may take ``tries`` walks for one sample:
a walk that meets a dead end starts again with that prefix masked wherever it meets it,
and the first complete walk is the sample (the last dead end if none is), so that a
fallback near the length limit still answers with a text that finishes. A sample whose
search walk was in flight begins where that walk had reached (``start``), and past a dead
end starts there again, ``tries`` walks at most (fewer once every way on from it met one),
then from the root, as the others do.
"""

from __future__ import annotations

import numpy as np

from .base import Method, Walk
from .draw import argmax, draw
from .tree import Node, PrefixTree


class ConstrainedDecoding(Method):
    """Greedy CD: each token from P(· | prefix) restricted to the valid tokens.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    >>> tree = PrefixTree(lm, [], at.constraints.choice(["b", "ab"]).bind(lm.vocab))
    >>> ConstrainedDecoding(tree, greedy=True).independent   # samples share only the tree
    True
    """

    forces_chains = True  # CD conditions on its own path anyway: take the fewest calls

    def __init__(self, tree: PrefixTree, greedy: bool, *, tries: int = 1) -> None:
        """CD over ``tree``; ``greedy``: take the argmax (temperature 0); ``tries``: walks a
        sample may take past dead ends (1: the paper's CD)."""
        super().__init__(tree, greedy)
        self.tries = tries

    def walk(self, seen: set[int], rng: np.random.Generator, *,
             start: Node | None = None) -> Walk:
        """One sample, from the root or from ``start`` (a prefix, not complete)."""
        root = self.tree.root
        dead: dict[int, set[int]] = {}  # id(prefix) -> tokens after it that met a dead end
        begin = root if start is None else start
        end, failed = root, 0  # the last dead end; walks from begin that met one
        while failed < self.tries:
            node = begin
            while not node.complete:
                exp = yield from self.expand(node)
                self.used(seen, node)
                if len(exp.ids) == 0 and node is root:
                    raise self.empty_language()
                # P_con(s_i | s_<i) ∝ P(s_i | s_<i) over the valid tokens exp.ids
                met = dead.get(id(node))
                p = exp.p if met is None else np.where(np.isin(exp.ids, list(met)), 0.0, exp.p)
                if len(exp.ids) == 0 or (met is not None and not p.any()):
                    break  # a dead end: incomplete, marked as such if the last try
                i = argmax(p) if self.greedy else draw(p, rng)
                node = self.tree.child(node, int(exp.ids[i]))
            else:
                return node
            if node is root:
                break  # every way on from the root met a dead end
            assert node.parent is not None and node.token is not None
            dead.setdefault(id(node.parent), set()).add(node.token)
            end, failed = node, failed + 1
            self.restarts += 1
            if begin is not root and (node is begin or failed == self.tries):
                begin, failed = root, 0  # the prefix reached is spent: the root's tries
        return end

