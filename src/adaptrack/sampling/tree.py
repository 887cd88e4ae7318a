"""The prefix tree shared by every method, and the Q table of the AdapTrack paper.

:class:`PrefixTree` caches, per prefix, what the model and the constraint say about the
next token (:class:`Expansion`); each prefix is evaluated by the model once per
``generate`` call, whatever the method and however many samples (``lm_calls``).

:class:`QTable` holds Q[x], the estimate of P(c | x) (paper formula 2), for the prefixes one
run has opened, and keeps it consistent as prefixes open (§7.2.1). Methods that share Q
across samples keep one table; AdapTrack with fresh state makes one per sample.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..constraints.base import Matcher, State
from ..errors import TreeLimitError
from ..lm.base import LanguageModel
from ..tokenization.fastforward import Tokenizer, forced_tokens


class Node:
    """One prefix: the tokens after the prompt, the constraint state after them."""

    __slots__ = ("children", "complete", "depth", "expansion", "forced", "logprob", "opened",
                 "parent", "pending", "slot", "state", "token", "tokens")

    def __init__(
        self, parent: Node | None, token: int | None, state: State, complete: bool,
        logprob: float,
    ) -> None:
        self.parent, self.token, self.state, self.complete = parent, token, state, complete
        self.tokens: tuple[int, ...] = () if parent is None else (*parent.tokens, token)
        self.depth = len(self.tokens)
        self.logprob = logprob  # log P(tokens | prompt) under the sampling model
        self.children: dict[int, Node] = {}
        self.expansion: Expansion | None = None
        self.slot = -1  # position of ``token`` in the parent's ``expansion.ids``
        self.opened = False  # some Q table holds this node's facts: never evicted
        # Fast-forward: the forced tokens still to come from here (pending[0] is then the
        # only valid next token); None until computed. ``forced``: this node's token was
        # forced, so its facts came with the chain's one model call.
        self.pending: tuple[int, ...] | None = None
        self.forced = False


class Expansion:
    """The next-token facts of one prefix, computed once from the model's distribution.

    ``ids``: the valid next tokens with positive probability, sorted (constraint, the
    validity-aware top-p cutoff and the length limit all applied); ``p``: their
    probabilities under the model at the sampling temperature (normalized over the whole
    vocabulary, so ``p.sum()`` is the valid mass). The full distribution is not kept: every
    method needs only the valid tokens, and it is most of the memory.
    """

    __slots__ = ("ids", "p")

    def __init__(self, probs: np.ndarray, ids: np.ndarray) -> None:
        if len(ids) == len(probs) and probs.all():
            self.ids, self.p = ids, probs  # no constraint: skip two vocabulary-wide copies
        else:
            self.ids = ids[probs[ids] > 0]
            self.p = probs[self.ids]

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.p.nbytes

    def index(self, token: int) -> int:
        """Position of a valid ``token`` in ``ids``."""
        return int(np.searchsorted(self.ids, token))

    def is_valid(self, token: int) -> bool:
        i = int(np.searchsorted(self.ids, token))
        return i < len(self.ids) and int(self.ids[i]) == token


def nucleus(probs: np.ndarray, valid: np.ndarray, top_p: float) -> np.ndarray:
    """Validity-aware top-p (paper §6.3, design.md §2).

    Scan tokens from the most probable down; once known-valid mass / (known-valid mass +
    unchecked mass) exceeds ``top_p``, the rest counts as invalid. Without a constraint
    (every token valid) the ratio is the cumulative mass: ordinary nucleus sampling.
    """
    order = np.argsort(-probs, kind="stable")
    is_valid = np.zeros(len(probs), dtype=bool)
    is_valid[valid] = True
    is_valid = is_valid[order]
    ranked = probs[order]
    known_valid = np.cumsum(np.where(is_valid, ranked, 0.0))
    unchecked = np.clip(1.0 - np.cumsum(ranked), 0.0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = known_valid / (known_valid + unchecked)
    over = np.flatnonzero(ratio > top_p)
    stop = over[0] + 1 if len(over) else len(order)
    return np.sort(order[:stop][is_valid[:stop]])


def checked_nucleus(
    probs: np.ndarray, candidates: np.ndarray, check: Callable[[int], bool], top_p: float
) -> np.ndarray:
    """:func:`nucleus` for a lazy matcher: validity is asked token by token, most probable
    first, and asking stops at the cutoff (paper §6.3), so with ``top_p < 1`` most of the
    vocabulary is never checked. Tokens outside ``candidates`` are invalid without asking."""
    order = np.argsort(-probs, kind="stable")
    order = order[probs[order] > 0]
    ranked = probs[order]
    unchecked = np.clip(1.0 - np.cumsum(ranked), 0.0, None)
    is_candidate = np.zeros(len(probs), dtype=bool)
    is_candidate[candidates] = True
    valid: list[int] = []
    known_valid = 0.0
    for i, tok in enumerate(order.tolist()):
        if is_candidate[tok] and check(tok):
            valid.append(tok)
            known_valid += ranked[i]
        if known_valid > 0 and known_valid / (known_valid + unchecked[i]) > top_p:
            break
    return np.asarray(sorted(valid), dtype=np.int64)


@dataclass(frozen=True)
class FastForward:
    """Fast-forward options (seed 002). Forced bytes become the canonical tokens of
    ``tokenizer`` (default: the model's), holding back final tokens while an allowed longer
    token starting within the last ``max_tokens`` of them could span their end
    (``conservative``: any longer token, allowed or not; ``max_tokens=0``: never hold
    back). The tokenizer sees its ``context_tokens`` last tokens before the forced bytes.

    >>> FastForward(max_tokens=2).conservative
    False
    """

    max_tokens: int = 4
    conservative: bool = False
    tokenizer: Tokenizer | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"FastForward needs max_tokens >= 0, got {self.max_tokens}")


class PrefixTree:
    """Prefixes of one prompt under one constraint, with the model's outputs cached.

    The cache of expansions is bounded by ``max_cache_bytes``: past it, the least recently
    expanded prefixes that no Q table has opened lose their expansion, and a later visit
    asks the model again. Results do not depend on the bound (the same seed gives the same
    samples); only the number of model calls does. Opened prefixes are the algorithms' own
    state (formula 2 needs their valid probabilities) and are bounded by ``max_nodes``.

    ``temperature`` 0 keeps the model's own distribution (T = 1) in the tree: greedy
    methods take argmaxes of it. ``restrict_length`` makes ``max_new_tokens`` part of the
    constraint (at the last position only finishing tokens are valid); unconstrained
    decoding turns it off and simply stops there.
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
        restrict_length: bool = True,
        fast_forward: FastForward | None = None,
    ) -> None:
        self.lm, self.prompt, self.matcher = lm, tuple(prompt), matcher
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.max_nodes = max_new_tokens, max_nodes
        self.restrict_length = restrict_length
        start = matcher.start()
        self.root = Node(None, None, start, matcher.is_complete(start), 0.0)
        self.num_nodes = 1
        self.lm_calls = 0
        self.max_cache_bytes = max_cache_bytes
        self.cache_bytes = 0
        self.evictions = 0
        self._lru: OrderedDict[int, Node] = OrderedDict()  # expanded, not opened
        self.fast_forward = fast_forward
        if fast_forward is not None:
            self._tokenizer = fast_forward.tokenizer or Tokenizer.for_model(lm)
        self.ff_sequences = 0  # forced chains fed (one model call each)
        self.forced_tokens = 0  # tokens in them

    def expand(self, node: Node) -> Expansion:
        """The node's next-token facts, calling the model if this prefix is new."""
        if node.expansion is None:
            self.expand_many([node])
        return node.expansion  # type: ignore[return-value]

    def expand_many(self, nodes: list[Node]) -> None:
        """Expand several prefixes with one batched model call."""
        todo = [n for n in nodes if n.expansion is None]
        if not todo:
            return
        todo = list({id(n): n for n in todo}.values())
        for node in todo:
            if node.depth >= self.max_new_tokens:  # nothing may follow: no model call
                node.expansion = Expansion(np.zeros(0), np.empty(0, dtype=np.int64))
        todo = [n for n in todo if n.depth < self.max_new_tokens]
        chains = [n for n in todo if self._forced(n)]
        plain = [n for n in todo if not n.pending]
        if plain:
            logprobs = self.lm.next_logprobs([self.prompt + n.tokens for n in plain])
            self.lm_calls += len(plain)
            for node, row in zip(plain, logprobs, strict=True):
                self._store(node, self._facts(node, row))
        if chains:
            self._feed_forced(chains)
        self._evict(keep=todo)

    def _store(self, node: Node, expansion: Expansion) -> None:
        node.expansion = expansion
        self.cache_bytes += expansion.nbytes
        self._lru[id(node)] = node

    def _forced(self, node: Node) -> tuple[int, ...]:
        """The forced tokens from ``node`` on (computed once per node, seed 002)."""
        if node.pending is None:
            ff, tokens = self.fast_forward, ()
            if ff is not None and not node.complete and node.depth < self.max_new_tokens:
                keep = self._tokenizer.context_tokens
                recent = (self.prompt + node.tokens)[-keep:] if keep else ()
                try:
                    found, _ = forced_tokens(self._tokenizer, self.matcher, node.state, recent,
                                             max_tokens=ff.max_tokens,
                                             conservative=ff.conservative)
                except ValueError:  # the tokenizer cannot encode them: feed token by token
                    found = []
                tokens = tuple(found[: self.max_new_tokens - node.depth])
            node.pending = tokens
        return node.pending

    def _feed_forced(self, heads: list[Node]) -> None:
        """Fast-forward: each head's chain of forced tokens in one model call (a short
        prefill; the chains of all waiting walks share one batch) that gives every
        position's distribution, so Q sees each forced token's probability exactly; the
        node after a chain gets its facts from the same call."""
        chains = [head.pending or () for head in heads]
        found = self.lm.logprobs_along_many(
            [(self.prompt + head.tokens, chain) for head, chain in zip(heads, chains,
                                                                         strict=True)])
        self.lm_calls += len(heads)
        self.ff_sequences += len(heads)
        self.forced_tokens += sum(len(c) for c in chains)
        for node, chain, rows in zip(heads, chains, found, strict=True):
            self._follow(node, chain, rows)

    def _follow(self, node: Node, chain: tuple[int, ...], rows: np.ndarray) -> None:
        for i, tok in enumerate(chain):
            if node.expansion is None:
                self._store(node, self._facts(node, rows[i]))
            if not node.expansion.is_valid(tok):  # type: ignore[union-attr]
                return  # p = 0, or not finishing at the length limit: a dead end here
            node = self.child(node, tok)
        if node.expansion is None and node.depth < self.max_new_tokens:
            self._forced(node)
            self._store(node, self._facts(node, rows[len(chain)]))

    def pin(self, node: Node) -> None:
        """Keep ``node``'s expansion for good (a Q table opened it)."""
        if not node.opened:
            node.opened = True
            if self._lru.pop(id(node), None) is not None:
                self.cache_bytes -= node.expansion.nbytes  # type: ignore[union-attr]

    def _evict(self, keep: list[Node]) -> None:
        if self.cache_bytes <= self.max_cache_bytes:
            return
        protected = {id(n) for n in keep}
        for key in list(self._lru):
            if self.cache_bytes <= self.max_cache_bytes:
                break
            if key in protected:
                continue
            node = self._lru.pop(key)
            self.cache_bytes -= node.expansion.nbytes  # type: ignore[union-attr]
            node.expansion = None
            self.evictions += 1

    def _facts(self, node: Node, logprobs: np.ndarray) -> Expansion:
        t = self.temperature if self.temperature > 0 else 1.0
        # One new array, worked in place: at 50k tokens each extra temporary costs ~0.1 ms.
        probs = logprobs - logprobs.max()
        if t != 1.0:
            probs /= t
        np.exp(probs, out=probs)
        probs /= probs.sum()
        last = self.restrict_length and node.depth == self.max_new_tokens - 1
        matcher, state = self.matcher, node.state
        if node.pending:  # fast-forward: the forced token is the only valid one (no top-p)
            tok = node.pending[0]
            after = matcher.advance(state, tok)
            ok = after is not None and (not last or matcher.is_complete(after))
            return Expansion(probs, np.asarray([tok] if ok else [], dtype=np.int64))
        if node.depth >= self.max_new_tokens:
            valid = np.empty(0, dtype=np.int64)
        elif last:
            valid = matcher.finishing(state)
        else:
            valid = matcher.allowed(state)
        if matcher.lazy and len(valid):
            def check(tok: int) -> bool:
                after = matcher.advance(state, tok)
                return after is not None and (not last or matcher.is_complete(after))

            with matcher.checking():
                valid = checked_nucleus(probs, valid, check, self.top_p)
        elif self.top_p < 1.0 and len(valid):
            valid = nucleus(probs, valid, self.top_p)
        return Expansion(probs, valid)

    def child(self, node: Node, token: int) -> Node:
        """The prefix ``node + [token]``; ``token`` must be valid (or unconstrained)."""
        found = node.children.get(token)
        if found is not None:
            return found
        if self.num_nodes >= self.max_nodes:
            raise TreeLimitError(
                f"the prefix tree reached max_nodes={self.max_nodes}; raise max_nodes or "
                "lower max_new_tokens"
            )
        state = self.matcher.advance(node.state, token)
        exp = self.expand(node)
        if state is None or not exp.is_valid(token):
            raise ValueError(f"token {token} is not valid after {node.tokens}")
        child = Node(node, token, state, self.matcher.is_complete(state), 0.0)
        if node.pending:  # the rest of the chain; at its end, look for new forced bytes
            child.pending, child.forced = node.pending[1:] or None, True
        child.slot = exp.index(token)
        child.logprob = node.logprob + math.log(exp.p[child.slot])
        node.children[token] = child
        self.num_nodes += 1
        return child


class QTable:
    """Q[x] ≈ P(c | x) for the prefixes a run has opened (paper formula 2).

    A prefix is *new* until opened: then Q[x] = c(x), which is 1 for every node in the tree
    (invalid prefixes never become nodes). Opening x replaces 1 by the valid mass below it,
    Q[x] = Σ_u P(u|x) Q[x::u], and every ancestor s of x changes by P(x'|s) times the same
    amount (§7.2.1: Q[s] ← Q[s] − P(x'|s)(1 − q)). Per opened node the table keeps the
    weights w[u] = P(u|x) Q[x::u] over the valid tokens, so P_Q(u|x) = w[u] / Q[x]
    (formula 3), and a count of children with Q > 0 so that dead branches reach exactly 0.
    """

    def __init__(self, tree: PrefixTree) -> None:
        self.tree = tree
        self._w: dict[int, np.ndarray] = {}
        self._q: dict[int, float] = {}
        self._alive: dict[int, int] = {}
        self._facts: dict[int, Expansion] = {}

    def is_open(self, node: Node) -> bool:
        return id(node) in self._q

    def q(self, node: Node) -> float:
        """Q[node]; 1 for a prefix this run has not opened (complete ones included)."""
        return self._q.get(id(node), 1.0)

    def weights(self, node: Node) -> np.ndarray:
        """w[u] = P(u|node) Q[node::u] over ``expansion.ids`` (node must be open)."""
        return self._w[id(node)]

    def token(self, node: Node, i: int) -> int:
        """The token at position ``i`` of ``weights(node)``."""
        return int(self._facts[id(node)].ids[i])

    def prob(self, child: Node) -> float:
        """P_Q(child.token | child.parent), formula 3."""
        key = id(child.parent)
        q = self._q[key]
        return self._w[key][child.slot] / q if q > 0 else 0.0

    def open(self, node: Node) -> None:
        """Mark ``node`` old: Q[node] becomes its valid mass and ancestors follow (formula 2)."""
        if self.is_open(node):
            return
        exp = self.tree.expand(node)
        self.tree.pin(node)
        key = id(node)
        self._facts[key] = exp
        self._w[key] = exp.p.copy()
        self._alive[key] = len(exp.p)
        self._q[key] = float(exp.p.sum()) if len(exp.p) else 0.0
        self._propagate(node, 1.0)

    def _propagate(self, node: Node, old_q: float) -> None:
        # §7.2.1: walk up once; each parent's weight for the path token becomes
        # P(token|parent) · Q[child], and its Q moves by the same difference.
        new_q = self._q[id(node)]
        while node.parent is not None and new_q != old_q:
            parent = node.parent
            key = id(parent)
            w = self._w[key]
            i = node.slot
            before = w[i]
            w[i] = self._facts[key].p[i] * new_q if new_q > 0 else 0.0
            old_q = self._q[key]
            if new_q == 0 and before > 0:
                self._alive[key] -= 1
            # An exact 0 once every child is dead, so emptiness is detected, never approximated.
            if self._alive[key] == 0:
                self._q[key] = 0.0
            else:
                q = old_q + (w[i] - before)
                # The running sum can drift below the true tiny mass; re-add when that matters.
                self._q[key] = q if q > 1e-9 else float(w.sum())
            node, new_q = parent, self._q[key]
