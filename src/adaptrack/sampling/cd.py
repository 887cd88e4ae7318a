"""Greedy constrained decoding (the AdapTrack paper §3.2): mask invalid tokens, renormalize,
never look back (docs/design.md §3).

P_con(s_i | s_<i) ∝ P(s_i | s_<i) · 1[s_i ∈ C(s_<i)]. It never fails on a constraint with no
dead ends; when it walks into one (a prefix that cannot finish within max_new_tokens) it
returns that prefix as an incomplete sample, as docs/design.md §2 specifies.

As the searches' fallback (docs/design.md §6) it goes past dead ends, ``tries`` walks at
most for one sample: at a dead end the walk backs up one token, masks the dead end there
(and wherever a later walk meets it) and goes on, until it has taken max_new_tokens + 1
steps since its first dead end; then the next walk starts again (a walk takes at most
:data:`WALK_STEPS` x (max_new_tokens + 1) steps). The first complete text is the sample
(the last dead end if none is), so that a fallback near the length limit still answers
with a text that finishes, mostly a few tokens from where it met the dead end. A sample
whose search walk was in flight begins where that walk had reached (``start``), its walks
start there again (fewer than ``tries`` once every way on from it met a dead end), then
from the root, as the others do. With ``tries=1`` (the paper's CD) the first dead end is
the sample.

The fallback also follows forced chains as a forcing tree would (``canonical``): the
searches' tree only prefills them (every tokenization of forced bytes stays valid, docs/design.md
§2), and a CD walk there wanders into other tokenizations, each a model call and a different
text. Following the canonical token instead, a sample the fallback draws from the root on
its own random stream is the sample ``cd`` draws with that seed, at ``cd``'s cost, until
``cd`` would stop at a dead end.
"""

from __future__ import annotations

import numpy as np

from .base import Method, Walk
from .draw import argmax, draw
from .expansion import Expansion
from .tree import Node, PrefixTree

#: A walk's steps past dead ends, in units of max_new_tokens + 1: its way down, its steps
#: after backing up, and the way down from the last dead end it backed up from.
WALK_STEPS = 3


class ConstrainedDecoding(Method):
    """Greedy CD: each token from P(· | prefix) restricted to the valid tokens.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    >>> tree = PrefixTree([], at.constraints.choice(["b", "ab"]).bind(lm.vocab))
    >>> ConstrainedDecoding(tree, greedy=True).independent   # samples share only the tree
    True
    """

    name = "cd"
    forward_only = True

    forces_chains = True  # CD conditions on its own path anyway: take the fewest calls

    def __init__(self, tree: PrefixTree, greedy: bool, *, tries: int = 1,
                 canonical: bool = False) -> None:
        """CD over ``tree``; ``greedy``: take the argmax (temperature 0); ``tries``: walks a
        sample may take past dead ends (1: the paper's CD); ``canonical``: where a forced
        chain goes on, its canonical token alone, as on a tree that forces chains (the
        fallback's walks; module docstring)."""
        super().__init__(tree, greedy)
        self.tries, self.canonical = tries, canonical

    def walk(self, seen: set[int], rng: np.random.Generator, *,
             start: Node | None = None) -> Walk:
        """One sample, from the root or from ``start`` (a prefix, not complete)."""
        root, tree = self.tree.root, self.tree
        dead: dict[int, set[int]] = {}  # id(prefix) -> tokens after it that met a dead end
        begin = root if start is None else start
        end, failed = root, 0  # the last dead end; walks from begin that met one
        while failed < self.tries:
            node, left = begin, None  # steps this walk may take once it met a dead end
            while not node.complete:
                exp = yield from self.expand(node)
                self.used(seen, node)
                if len(exp.ids) == 0 and node is root:
                    raise self.empty_language()
                # P_con(s_i | s_<i) ∝ P(s_i | s_<i) over the valid tokens ids
                ids, p = self._choices(node, exp) if self.canonical else (exp.ids, exp.p)
                met = dead.get(id(node))
                p = p if met is None else np.where(np.isin(ids, list(met)), 0.0, p)
                if len(ids) and p.any():
                    i = argmax(p) if self.greedy else draw(p, rng)
                    node = tree.child(node, int(ids[i]))
                    left = None if left is None else left - 1
                    continue
                # A dead end: incomplete, marked as such if the last try. Past one (the
                # fallback) the walk backs up a token, with the dead end masked, and goes
                # on: near the length limit a dead end is mostly a few tokens from a text
                # that finishes, where a walk from ``begin`` would cost a CD sample.
                if node is root:
                    return end  # every way on from the root met a dead end
                assert node.parent is not None and node.token is not None
                dead.setdefault(id(node.parent), set()).add(node.token)
                end = node
                self.restarts += 1
                if left is None:
                    left = tree.max_new_tokens + 1
                if self.tries == 1 or node is begin or left <= 0:
                    break
                node = node.parent
            else:
                return node
            failed += 1
            if begin is not root and (node is begin or failed == self.tries):
                begin, failed = root, 0  # the prefix reached is spent: the root's tries
        return end

    def _choices(self, node: Node, exp: Expansion) -> tuple[np.ndarray, np.ndarray]:
        """The tokens a ``canonical`` walk chooses from after ``node`` and their weights: a
        forced chain's next token alone where the chain goes on and the token is valid
        (where top-p dropped it, the valid tokens kept), else every valid token."""
        chain = self.tree.chains.pending(node)
        if chain:
            i = exp.index(chain[0])  # one binary search: where the token is, if valid
            if i < len(exp.ids) and int(exp.ids[i]) == chain[0]:
                return exp.ids[i:i + 1], exp.p[i:i + 1]
        return exp.ids, exp.p
