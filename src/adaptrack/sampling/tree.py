"""The prefix tree shared by every method (docs/design.md §4).

:class:`PrefixTree` keeps, per prefix, what the model and the constraint say about the
next token: its :class:`Expansion`. Each prefix is evaluated by the model once per
``generate`` call, whatever the method and however many samples (``lm_calls``). The tree
also holds the search's budgets (docs/design.md §6): prefixes (``max_nodes``), bytes
(``max_cache_bytes`` for expansions it may drop and recompute, ``max_opened_bytes`` for
those the algorithms hold) and time (``max_seconds``).
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..cache import LRU
from ..constraints.base import Matcher, State
from ..errors import SearchTimeoutError, TokenizerError, TreeLimitError
from ..lm.base import LanguageModel
from ..tokenization.tokenizer import Tokenizer
from .expansion import Expansion
from .fastforward import FastForward, forced_tokens
from .topp import checked_nucleus, nucleus

#: Where a text the constraint accepts ends (docs/design.md §2): ``leave``, where the model's
#: next token cannot continue it (EOS or any token the constraint rejects there); ``eos``,
#: only where the model emits EOS (the AdapTrack paper's target).
END_POLICIES = ("leave", "eos")


class Node:
    """One prefix: the tokens after the prompt, the constraint state after them."""

    __slots__ = ("children", "complete", "depth", "expansion", "in_chain", "logprob", "opened",
                 "parent", "pending", "slot", "state", "token", "tokens", "truncated")

    def __init__(
        self, parent: Node | None, token: int | None, state: State, complete: bool,
        logprob: float,
    ) -> None:
        self.parent, self.token, self.state, self.complete = parent, token, state, complete
        self.tokens: tuple[int, ...] = (
            () if parent is None or token is None else (*parent.tokens, token))
        self.depth = len(self.tokens)
        self.logprob = logprob  # log P(tokens | prompt) under the sampling model
        self.children: dict[int, Node] = {}
        self.expansion: Expansion | None = None
        self.slot = -1  # position of ``token`` in the parent's ``expansion.ids``
        self.opened = False  # pinned: a Q table holds (or will open) it: never evicted
        # Fast-forward: the forced tokens still to feed from here (when forced, pending[0]
        # is then the only valid next token); None until computed. ``in_chain``: this
        # node's token came in a fed chain, so its expansion came with the chain's one call.
        self.pending: tuple[int, ...] | None = None
        self.in_chain = False
        # Ends a sample because it reached max_new_tokens (``allow_truncated``): then
        # ``complete`` too, so that every method stops here and counts it as c(s) = 1.
        self.truncated = False


class PrefixTree:
    """Prefixes of one prompt under one constraint, with the model's outputs cached.

    The cache of expansions is bounded by ``max_cache_bytes``: past it, the least recently
    expanded prefixes that no Q table has opened lose their expansion, and a later visit
    asks the model again. Results do not depend on the bound (the same seed gives the same
    samples); only the number of model calls does. Opened prefixes are the algorithms' own
    state (formula 2 of the AdapTrack paper needs their valid probabilities): they are
    bounded by ``max_nodes`` and ``max_opened_bytes`` (``TreeLimitError`` past either).
    ``max_seconds`` (None: no limit) bounds the time from the tree's creation, checked
    before every model call and every new prefix (``SearchTimeoutError``).

    ``temperature`` 0 keeps the model's own distribution (T = 1) in the tree: greedy
    methods take argmaxes of it. ``restrict_length`` makes ``max_new_tokens`` part of the
    constraint (at the last position only finishing tokens are valid); unconstrained
    decoding turns it off and simply stops there. ``allow_truncated`` makes a valid prefix
    of ``max_new_tokens`` tokens an end (``complete`` and ``truncated``): the target becomes
    the model's text cut at the limit, conditioned on every prefix being valid
    (docs/design.md §2). ``end`` is where an accepted text ends (:data:`END_POLICIES`):
    with ``leave`` the expansion of an accepted prefix gives EOS the mass of every token
    that cannot continue the text, so the target is P(s) · P(leave | s).

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> tree = PrefixTree(lm, [], at.constraints.choice(["ab", "b"]).bind(lm.vocab))
    >>> tree.expand(tree.root).ids.tolist(), tree.lm_calls
    ([0, 1], 1)
    >>> tree.child(tree.root, 0).tokens
    (0,)
    """

    def __init__(
        self,
        lm: LanguageModel,
        prompt: list[int],
        matcher: Matcher,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 64,
        max_nodes: int = 100_000,
        max_cache_bytes: int = 1 << 30,
        max_opened_bytes: int = 1 << 30,
        max_seconds: float | None = None,
        restrict_length: bool = True,
        allow_truncated: bool = False,
        fast_forward: FastForward | None = None,
        end: str = "leave",
    ) -> None:
        if end not in END_POLICIES:
            raise ValueError(f"end must be one of {', '.join(map(repr, END_POLICIES))}, "
                             f"got {end!r}")
        self.lm, self.prompt, self.matcher = lm, tuple(prompt), matcher
        self.leave = end == "leave"
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.max_nodes = max_new_tokens, max_nodes
        self.allow_truncated = allow_truncated
        self.restrict_length = restrict_length and not allow_truncated
        start = matcher.start()
        self.root = Node(None, None, start, matcher.is_complete(start), 0.0)
        self.num_nodes = 1
        self.lm_calls = 0
        self.max_cache_bytes, self.max_opened_bytes = max_cache_bytes, max_opened_bytes
        self.opened_bytes = 0
        # Expanded, not opened: id(node) → node, by recency, up to max_cache_bytes.
        self._cache: LRU[int, Node] = LRU(max_cache_bytes, _expansion_bytes,
                                          on_evict=_drop_expansion)
        # Masks the matcher returned lately: one seen again is shared by several prefixes.
        self._recent_masks: LRU[int, np.ndarray] = LRU(8)
        self.max_seconds = max_seconds
        self.started = time.monotonic()
        self.fast_forward = fast_forward
        # Forced tokens are the only valid ones (target conditioned on canonical
        # tokenization), or chains are only prefilled (target unchanged); docs/design.md §2.
        self.force_chains = fast_forward is not None and fast_forward.force is not False
        if fast_forward is not None:
            self._tokenizer = fast_forward.tokenizer or Tokenizer.for_model(lm)
        self.ff_sequences = 0  # forced chains fed (one model call each)
        self.forced_tokens = 0  # tokens in them
        self.ff_unencodable = 0  # prefixes whose forced bytes the tokenizer cannot encode

    @property
    def cache_bytes(self) -> int:
        """Bytes of the expansions no Q table has opened (the droppable cache)."""
        return self._cache.used

    @property
    def evictions(self) -> int:
        return self._cache.evictions

    def check_time(self) -> None:
        """Raise ``SearchTimeoutError`` once ``max_seconds`` have passed."""
        if self.max_seconds is None:
            return
        spent = time.monotonic() - self.started
        if spent > self.max_seconds:
            raise SearchTimeoutError(
                f"the search ran past max_seconds={self.max_seconds:g} ({spent:.1f} s, "
                f"{self.num_nodes} prefixes, {self.lm_calls} model calls); raise max_seconds "
                "(None for no limit), or lower n or max_new_tokens"
            )

    def expand(self, node: Node) -> Expansion:
        """The node's expansion, calling the model if this prefix is new: for drivers (the
        engine, the enumeration), never for a walk (walks wait: ``Method.expand``)."""
        if node.expansion is None:
            self.expand_many([node])
        return node.expansion  # type: ignore[return-value]

    def expand_many(self, nodes: list[Node]) -> None:
        """Expand several prefixes with one batched model call (chains: one more)."""
        if all(n.expansion is not None for n in nodes):
            return
        self.check_time()
        plain, heads = self.plan(nodes)
        if plain:
            self.store(plain, self.lm.next_logprobs([self.prompt + n.tokens for n in plain]))
        if heads:
            self.store_chains(heads, self.lm.logprobs_along_many(
                [(self.prompt + h.tokens, h.pending or ()) for h in heads]))
        self.finish(nodes)

    def plan(self, nodes: list[Node], *, eager: bool = True) -> tuple[list[Node], list[Node]]:
        """What the model must say for ``nodes`` to have expansions: ``(plain, heads)``, the
        prefixes that need one distribution each and the chain heads whose forced tokens
        are fed in one call each (docs/design.md §2, fast-forward). Prefixes at the length
        limit get their empty expansion here, with no model call.

        ``eager=False`` feeds a chain only once a walk has stepped into it: its head gets
        one distribution (when forced, the forced token is then its only valid one), and
        the first node inside the chain feeds the rest. A walk that leaves the head (AdapTrack's
        backtracking, a rejected ``exact`` attempt) then prefills nothing it does not use.
        """
        todo = list({id(n): n for n in nodes if n.expansion is None}.values())
        for node in todo:
            if self._dead(node):  # nothing valid may follow: no model call
                node.expansion = Expansion(np.zeros(0), np.empty(0, dtype=np.int64))
        todo = [n for n in todo if n.expansion is None]
        plain: list[Node] = []
        heads: list[Node] = []
        for node in todo:
            if self._pending(node) and (eager or _inside_chain(node)):
                heads.append(node)
            else:
                plain.append(node)
        return plain, heads

    def _dead(self, node: Node) -> bool:
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
        return not self.matcher.lazy and not len(self._valid(node))

    def _valid(self, node: Node) -> np.ndarray:
        """The tokens the constraint allows after ``node`` within the length limit: at the
        last position those that finish, at the one before those after which one can finish
        (``Matcher.closing``, docs/design.md §2), else every allowed one."""
        matcher, left = self.matcher, self.max_new_tokens - node.depth
        if left <= 0:
            return np.empty(0, dtype=np.int64)
        if self.restrict_length and left == 1:
            return matcher.finishing(node.state)
        if self.restrict_length and left == 2 and not matcher.lazy:
            return matcher.closing(node.state)
        return matcher.allowed(node.state)

    def store(self, nodes: list[Node], logprobs: np.ndarray) -> None:
        """Keep the expansions of ``nodes`` (``plan``'s plain list) from the model's rows."""
        self.lm_calls += len(nodes)
        for node, row in zip(nodes, logprobs, strict=True):
            self._store(node, self._expansion(node, row))

    def store_chains(self, heads: list[Node], found: list[np.ndarray]) -> None:
        """Keep what one fed chain per head (``plan``'s heads) gave: every position's
        expansion, so Q sees each forced token's probability exactly; the node after a
        chain gets its expansion from the same call."""
        self.lm_calls += len(heads)
        self.ff_sequences += len(heads)
        for node, rows in zip(heads, found, strict=True):
            chain = node.pending or ()
            self.forced_tokens += len(chain)
            self._follow(node, chain, rows)

    def finish(self, nodes: list[Node]) -> None:
        """After a model call for ``nodes``: bring the droppable cache back within its bound,
        keeping the expansions just made for them."""
        self._cache.trim(protected={id(n) for n in nodes})

    def _store(self, node: Node, expansion: Expansion) -> None:
        node.expansion = expansion
        self._cache.put(id(node), node, trim=False)

    def _pending(self, node: Node) -> tuple[int, ...]:
        """The forced tokens to feed from ``node`` on (computed once per node; docs/design.md
        §2, fast-forward target), at most as many as the length limit leaves."""
        if node.pending is None:
            ff = self.fast_forward
            tokens: tuple[int, ...] = ()
            if ff is not None and not node.complete and node.depth < self.max_new_tokens:
                room = self.max_new_tokens - node.depth
                keep = self._tokenizer.context_tokens
                recent = (self.prompt + node.tokens)[-keep:] if keep else ()
                # Bytes enough for ``room`` tokens after the recipe holds back up to
                # ``max_tokens`` of them and an incomplete character: the constraint need
                # not walk a forced string further than the sequence can reach.
                limit = (room + ff.max_tokens) * self._tokenizer.max_token_len + 3
                try:
                    found, _ = forced_tokens(self._tokenizer, self.matcher, node.state, recent,
                                             max_tokens=ff.max_tokens,
                                             conservative=ff.conservative, limit=limit)
                except TokenizerError:
                    # The forced bytes have no canonical tokenization (docs/design.md §2
                    # defines chains by it): this prefix gets no chain, counted. Errors of
                    # the constraint itself are not caught: they are the caller's.
                    self.ff_unencodable += 1
                    found = []
                tokens = tuple(found[:room])
            node.pending = tokens
        return node.pending

    def _follow(self, node: Node, chain: tuple[int, ...], rows: np.ndarray) -> None:
        for i, tok in enumerate(chain):
            if node.expansion is None:
                self._store(node, self._expansion(node, rows[i]))
            if not node.expansion.is_valid(tok):  # type: ignore[union-attr]
                return  # p = 0, or not finishing at the length limit: a dead end here
            node = self.child(node, tok)
        if node.expansion is None and node.depth < self.max_new_tokens:
            self._pending(node)
            self._store(node, self._expansion(node, rows[len(chain)]))

    def pin(self, node: Node) -> None:
        """Keep ``node``'s expansion for good (a Q table opened it); ``TreeLimitError`` once
        the opened expansions hold more than ``max_opened_bytes``."""
        if node.opened:
            return
        node.opened = True
        self._cache.pop(id(node))
        self.opened_bytes += node.expansion.nbytes  # type: ignore[union-attr]
        if self.opened_bytes > self.max_opened_bytes:
            raise TreeLimitError(
                f"the prefixes the search opened hold {self.opened_bytes / 2**20:.0f} MiB, past "
                f"max_opened_bytes={self.max_opened_bytes} ({self.num_nodes} prefixes); raise "
                "max_opened_bytes, lower max_new_tokens or n, or use a constraint or top_p < 1"
            )

    def _expansion(self, node: Node, logprobs: np.ndarray) -> Expansion:
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
        if node.pending and self.force_chains:  # the forced token alone is valid (no top-p)
            tok = node.pending[0]
            after = matcher.advance(state, tok)
            # Only the position before the last validates more than ``advance`` does.
            closes = (matcher.lazy or not self.restrict_length
                      or node.depth != self.max_new_tokens - 2 or tok in self._valid(node))
            ok = after is not None and (not last or matcher.is_complete(after)) and closes
            return Expansion(probs, np.asarray([tok] if ok else [], dtype=np.int64),
                             dtype=self.lm.probs_dtype)
        valid = self._valid(node)
        if matcher.lazy and len(valid):
            def check(tok: int) -> bool:
                after = matcher.advance(state, tok)
                return after is not None and (not last or matcher.is_complete(after))

            with matcher.checking():
                valid = checked_nucleus(probs, valid, check, self.top_p)
        elif self.top_p < 1.0 and len(valid):
            valid = nucleus(probs, valid, self.top_p)
        else:
            return Expansion(probs, valid, shared_ids=self._seen_before(valid),
                             dtype=self.lm.probs_dtype)
        return Expansion(probs, valid, dtype=self.lm.probs_dtype)

    def _seen_before(self, mask: np.ndarray) -> bool:
        """Whether the matcher returned this very array lately (then it is shared: its bytes
        count once, for the prefix that saw it first)."""
        key = id(mask)
        seen = self._recent_masks.get(key) is mask
        self._recent_masks.put(key, mask)
        return seen

    def child(self, node: Node, token: int, expansion: Expansion | None = None) -> Node:
        """The prefix ``node + [token]``; ``token`` must be valid (or unconstrained) by
        ``node``'s expansion, which the caller holds (``expansion``) or the node still
        does."""
        found = node.children.get(token)
        if found is not None:
            return found
        if self.num_nodes >= self.max_nodes:
            raise TreeLimitError(
                f"the prefix tree reached max_nodes={self.max_nodes}; raise max_nodes or "
                "lower max_new_tokens"
            )
        self.check_time()
        state = self.matcher.advance(node.state, token)
        exp = node.expansion if expansion is None else expansion
        if exp is None:
            raise RuntimeError(f"a child of {node.tokens} before its expansion: a walk waits "
                               "for it first (Method.expand)")
        if state is None or not exp.is_valid(token):
            raise ValueError(f"token {token} is not valid after {node.tokens}")
        complete = self.matcher.is_complete(state)
        truncated = (self.allow_truncated and not complete
                     and node.depth + 1 >= self.max_new_tokens)
        child = Node(node, token, state, complete or truncated, 0.0)
        child.truncated = truncated
        if node.pending and token == node.pending[0]:  # the rest of the chain; at its end,
            child.pending, child.in_chain = node.pending[1:] or None, True  # new forced bytes
        child.slot = exp.index(token)
        child.logprob = node.logprob + math.log(exp.p[child.slot])
        node.children[token] = child
        self.num_nodes += 1
        return child


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


def _expansion_bytes(node: Node) -> int:
    return node.expansion.nbytes  # type: ignore[union-attr]


def _drop_expansion(key: int, node: Node) -> None:
    node.expansion = None


def _inside_chain(node: Node) -> bool:
    """Whether a walk stepped from a chain's head into its forced tokens to reach ``node``
    (rather than ``node`` starting a chain of its own)."""
    parent = node.parent
    return node.in_chain and parent is not None and len(parent.pending or ()) > 1
