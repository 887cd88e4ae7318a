"""How a prefix's :class:`~adaptrack.sampling.expansion.Expansion` is made from the model's
row (docs/design.md §2): the temperature, the end policy, the validity rule within the
length limit, a forced chain's token and the validity-aware top-p cut."""

from __future__ import annotations

import numpy as np

from ..cache import LRU
from ..constraints.base import Matcher, State
from .expansion import Expansion
from .nodes import Node
from .topp import checked_nucleus, nucleus
from .treeoptions import TreeOptions


class Expander:
    """The expansions of one tree's prefixes: which tokens the constraint lets follow a
    prefix within ``max_new_tokens`` (:meth:`valid`, :meth:`dead`) and their probabilities
    under the model's row (:meth:`expansion`), as the tree's ``options`` say
    (:class:`~adaptrack.sampling.treeoptions.TreeOptions`: ``temperature`` 0 keeps the
    model's own distribution, T = 1; where the length is restricted, at the last position
    only finishing tokens are valid, at the one before only closing ones; ``end``, the end
    policy, docs/design.md §2). ``force``: a node's pending forced token is its only valid
    one. ``dtype``: the model's ``probs_dtype``.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> m = at.constraints.choice(["ab", "b"]).bind(lm.vocab)
    >>> ex = Expander(m, TreeOptions(max_new_tokens=2))
    >>> root = Node(None, None, m.start(), False, 0.0)
    >>> ex.valid(root).tolist(), ex.dead(root)
    ([0, 1], False)
    >>> e = ex.expansion(root, np.log(np.array([0.5, 0.25, 0.25])))
    >>> e.ids.tolist(), e.p.tolist()
    ([0, 1], [0.5, 0.25])
    """

    def __init__(self, matcher: Matcher, options: TreeOptions | None = None, *,
                 force: bool = False, dtype: type = np.float64) -> None:
        o = TreeOptions() if options is None else options
        self.matcher, self.temperature, self.top_p = matcher, o.temperature, o.top_p
        self.max_new_tokens, self.restrict_length = o.max_new_tokens, o.restricted
        self.leave, self.force, self.dtype = o.leave, force, dtype
        # Masks the matcher returned lately: one seen again is shared by several prefixes.
        self._recent_masks: LRU[int, np.ndarray] = LRU(8)

    def dead(self, node: Node) -> bool:
        """Whether the constraint alone says no valid token follows ``node`` (its expansion
        is then empty whatever the model says): at the length limit, at its last position
        when no token finishes there, at the one before when none closes, or where nothing
        is allowed."""
        if node.depth >= self.max_new_tokens:
            return True
        if not self.restrict_length or node.complete:
            return False
        if node.depth == self.max_new_tokens - 1:  # finishing candidates: lazy matchers too
            return not len(self.matcher.finishing(node.state))
        return not self.matcher.lazy and not len(self.valid(node))

    def valid(self, node: Node) -> np.ndarray:
        """The tokens the constraint allows after ``node`` within the length limit: at the
        last position those that finish, before it those after which the text may still
        be complete in the tokens left (``Matcher.within``: at the one before the last
        ``Matcher.closing``; docs/design.md §2); lazy matchers: every allowed one before
        the last position."""
        matcher, left = self.matcher, self.max_new_tokens - node.depth
        if left <= 0:
            return np.empty(0, dtype=np.int64)
        if self.restrict_length and left == 1:
            return matcher.finishing(node.state)
        if self.restrict_length and not matcher.lazy:
            return matcher.within(node.state, left)
        return matcher.allowed(node.state)

    def expansion(self, node: Node, logprobs: np.ndarray) -> Expansion:
        """``node``'s expansion from the model's log-probabilities of its next token."""
        t = self.temperature if self.temperature > 0 else 1.0
        # One new array, worked in place: at 50k tokens each extra temporary costs ~0.1 ms.
        probs = logprobs - logprobs.max()
        if t != 1.0:
            probs /= t
        np.exp(probs, out=probs)
        probs /= probs.sum()
        last = self.restrict_length and node.depth == self.max_new_tokens - 1
        matcher, state = self.matcher, node.state
        if self.leave:
            _leave(probs, matcher, state)
        if node.pending and self.force:  # the forced token alone is valid (no top-p)
            tok = node.pending[0]
            after = matcher.advance(state, tok)
            # Before the last position ``within`` validates more than ``advance`` does.
            closes = (matcher.lazy or not self.restrict_length or last
                      or tok in self.valid(node))
            ok = after is not None and (not last or matcher.is_complete(after)) and closes
            return Expansion(probs, np.asarray([tok] if ok else [], dtype=np.int64),
                             dtype=self.dtype)
        valid = self.valid(node)
        if matcher.lazy and len(valid):
            def check(tok: int) -> bool:
                after = matcher.advance(state, tok)
                return after is not None and (not last or matcher.is_complete(after))

            with matcher.checking():
                valid = checked_nucleus(probs, valid, check, self.top_p)
        elif self.top_p < 1.0 and len(valid):
            valid = nucleus(probs, valid, self.top_p)
        else:
            return Expansion(probs, valid, shared_ids=self._seen_before(valid), dtype=self.dtype)
        return Expansion(probs, valid, dtype=self.dtype)

    def _seen_before(self, mask: np.ndarray) -> bool:
        """Whether the matcher returned this very array lately (then it is shared: its bytes
        count once, for the prefix that saw it first)."""
        key = id(mask)
        seen = self._recent_masks.get(key) is mask
        self._recent_masks.put(key, mask)
        return seen


def _leave(probs: np.ndarray, matcher: Matcher, state: State) -> None:
    """The ``leave`` end policy (docs/design.md §2): where the text is accepted, every token
    with which the model leaves it ends the text there, so their mass moves onto EOS (in
    place), and EOS then stands for "the text ends here" with P(leave | s)."""
    gone = matcher.leaving(state)
    if len(gone):
        eos = matcher.vocab.eos_ids
        end = int(eos[np.isin(eos, matcher.finishing(state))][0])
        probs[end] += probs[gone].sum()
        probs[gone] = 0.0
