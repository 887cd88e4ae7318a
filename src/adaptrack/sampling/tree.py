"""The prefix tree shared by every method (docs/design.md §4).

:class:`PrefixTree` keeps, per prefix, what the model and the constraint say about the
next token: its :class:`Expansion`. Each prefix is evaluated by the model once per
``generate`` call, whatever the method and however many samples (``lm_calls``). The tree is
the composition of its parts, one module each: the nodes and the store of their expansions
(``nodes.py``), how an expansion is made from the model's row (``expander.py``), the forced
chains (``chains.py``) and the search's budgets (``budgets.py``, docs/design.md §6):
prefixes (``max_nodes``), bytes (``max_cache_bytes`` for expansions it may drop and
recompute, ``max_opened_bytes`` for those the algorithms hold) and time (``max_seconds``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..constraints.base import Matcher
from ..errors import InternalError
from ..tokenization.tokenizer import Tokenizer
from .budgets import Budgets
from .chains import Chains
from .expander import Expander
from .expansion import Expansion
from .nodes import Node, NodeStore
from .treeoptions import TreeOptions

__all__ = ["Node", "PrefixTree"]


class PrefixTree:
    """Prefixes of one prompt under one constraint, with the model's outputs cached, as
    ``options`` say (:class:`~adaptrack.sampling.treeoptions.TreeOptions`; default: its
    defaults). The tree holds no model: the engine asks the model and stores its rows here
    (docs/design.md §4). What the tree needs of the model is passed as data: ``dtype``, the
    model's ``probs_dtype``, and ``tokenizer``, its tokenizer (:meth:`Tokenizer.for_model`)
    for the forced chains of ``options.fast_forward`` when that names none.

    The cache of expansions is bounded by ``max_cache_bytes``: past it, the least recently
    expanded prefixes that no Q table has opened lose their expansion, and a later visit
    asks the model again. Results do not depend on the bound (the same seed gives the same
    samples); only the number of model calls does. Opened prefixes are the algorithms' own
    state (formula 2 of the AdapTrack paper needs their valid probabilities): they are
    bounded by ``max_nodes`` and ``max_opened_bytes`` (``TreeLimitError`` past either).
    ``max_seconds`` (None: no limit) bounds the time from the tree's creation, checked
    before every model call and every new prefix (``SearchTimeoutError``).

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> tree = PrefixTree([], at.constraints.choice(["ab", "b"]).bind(lm.vocab))
    >>> from adaptrack.sampling.engine import expand   # the engine calls the model
    >>> expand(lm, tree, tree.root).ids.tolist(), tree.lm_calls
    ([0, 1], 1)
    >>> tree.child(tree.root, 0).tokens
    (0,)
    """

    def __init__(self, prompt: Sequence[int], matcher: Matcher,
                 options: TreeOptions | None = None, *, dtype: type = np.float64,
                 tokenizer: Tokenizer | None = None) -> None:
        self.options = o = TreeOptions() if options is None else options
        self.prompt, self.matcher = tuple(prompt), matcher
        # What the methods, a reused tree's call and the server read of the options.
        self.max_new_tokens, self.top_p, self.leave = o.max_new_tokens, o.top_p, o.leave
        self.allow_truncated, self.restrict_length = o.allow_truncated, o.restricted
        self.lm_calls = 0
        self.budgets = Budgets(max_nodes=o.max_nodes, max_opened_bytes=o.max_opened_bytes,
                               max_seconds=o.max_seconds, max_calls=o.max_calls)
        start = matcher.start()
        self.root = Node(None, None, start, matcher.is_complete(start), 0.0)
        self.nodes = NodeStore(self.root, o.max_cache_bytes)
        # Forced tokens are the only valid ones (target conditioned on canonical
        # tokenization), or chains are only prefilled (target unchanged); docs/design.md §2.
        self.chains = Chains(self.prompt, matcher, o.fast_forward,
                             max_new_tokens=o.max_new_tokens, tokenizer=tokenizer)
        self.expander = Expander(matcher, o, force=self.chains.force, dtype=dtype)

    # The counts and limits of the parts, under the tree's names (the engine, a reused
    # tree's call and the statistics read them; the budgets are also set).
    @property
    def num_nodes(self) -> int:
        """Prefixes in the tree, the root included."""
        return self.nodes.count

    @property
    def opened_bytes(self) -> int:
        """Bytes of the expansions Q tables opened (bounded by ``max_opened_bytes``)."""
        return self.nodes.opened_bytes

    @property
    def cache_bytes(self) -> int:
        """Bytes of the expansions no Q table has opened (the droppable cache)."""
        return self.nodes.cache_bytes

    @property
    def evictions(self) -> int:
        """Expansions dropped from the cache so far."""
        return self.nodes.evictions

    @property
    def ff_sequences(self) -> int:
        """Forced chains fed (one model call each)."""
        return self.chains.sequences

    @property
    def forced_tokens(self) -> int:
        """Tokens in the forced chains fed."""
        return self.chains.tokens

    @property
    def ff_unencodable(self) -> int:
        """Prefixes whose forced bytes the tokenizer cannot encode (no chain there)."""
        return self.chains.unencodable

    @property
    def max_nodes(self) -> int:
        return self.budgets.max_nodes

    @max_nodes.setter
    def max_nodes(self, value: int) -> None:
        self.budgets.max_nodes = value

    @property
    def max_opened_bytes(self) -> int:
        return self.budgets.max_opened_bytes

    @max_opened_bytes.setter
    def max_opened_bytes(self, value: int) -> None:
        self.budgets.max_opened_bytes = value

    @property
    def max_seconds(self) -> float | None:
        return self.budgets.max_seconds

    @max_seconds.setter
    def max_seconds(self, value: float | None) -> None:
        self.budgets.max_seconds = value

    @property
    def max_calls(self) -> int | None:
        return self.budgets.max_calls

    @max_calls.setter
    def max_calls(self, value: int | None) -> None:
        self.budgets.max_calls = value

    @property
    def started(self) -> float:
        """When ``max_seconds`` started counting (``time.monotonic``)."""
        return self.budgets.started

    @started.setter
    def started(self, value: float) -> None:
        self.budgets.started = value

    def check_spent(self) -> None:
        """Before a model call: raise ``CallLimitError`` once ``max_calls`` were made,
        ``SearchTimeoutError`` once ``max_seconds`` have passed."""
        self.budgets.check_spent(self.nodes.count, self.lm_calls)

    def plan(self, nodes: list[Node], *, eager: bool = True,
             eager_for: Sequence[Node] = ()) -> tuple[list[Node], list[Node]]:
        """What the model must say for ``nodes`` to have expansions: ``(plain, heads)``, the
        prefixes that need one distribution each and the chain heads whose forced tokens
        are fed in one call each (docs/design.md §2, fast-forward). Prefixes at the length
        limit get their empty expansion here, with no model call.

        ``eager=False`` feeds a chain only once a walk has stepped into it: its head gets
        one distribution (when forced, the forced token is then its only valid one), and
        the first node inside the chain feeds the rest. A walk that leaves the head (AdapTrack's
        backtracking, a rejected ``exact`` attempt) then prefills nothing it does not use.
        The prefixes of ``eager_for`` feed theirs at once whatever ``eager`` says.
        """
        todo = list({id(n): n for n in nodes if n.expansion is None}.values())
        for node in todo:
            if self.expander.dead(node):  # nothing valid may follow: no model call
                node.expansion = Expansion(np.zeros(0), np.empty(0, dtype=np.int64))
        return self.chains.split([n for n in todo if n.expansion is None], eager=eager,
                                 always={id(n) for n in eager_for})

    def store(self, nodes: list[Node], logprobs: np.ndarray) -> None:
        """Keep the expansions of ``nodes`` (``plan``'s plain list) from the model's rows."""
        self.lm_calls += len(nodes)
        for node, row in zip(nodes, logprobs, strict=True):
            self._keep(node, row)

    def store_chains(self, heads: list[Node], found: list[np.ndarray]) -> None:
        """Keep what one fed chain per head (``plan``'s heads) gave: every position's
        expansion, so Q sees each forced token's probability exactly; the node after a
        chain gets its expansion from the same call."""
        self.lm_calls += len(heads)
        self.chains.store(heads, found, self._keep, self.child)

    def finish(self, nodes: list[Node]) -> None:
        """After a model call for ``nodes``: bring the droppable cache back within its bound,
        keeping the expansions just made for them."""
        self.nodes.trim(nodes)

    @staticmethod
    def calls_to(node: Node) -> int:
        """The model calls a walk makes to expand ``node`` from the root: one a prefix on the
        path, none for those a fed chain's one call gave (``in_chain``)."""
        return PrefixTree.calls_within(node, node.depth + 1)

    @staticmethod
    def calls_within(node: Node, tokens: int) -> int:
        """The model calls a walk makes to write the first ``tokens`` tokens of ``node``'s
        path: one a prefix of fewer tokens (:meth:`calls_to`), and one for each token
        beyond ``node`` (a path shorter than ``tokens``)."""
        calls = max(0, tokens - 1 - node.depth)
        at: Node | None = node
        while at is not None:
            calls += at.depth < tokens and not at.in_chain
            at = at.parent
        return calls

    def _keep(self, node: Node, logprobs: np.ndarray) -> Expansion:
        expansion = self.expander.expansion(node, logprobs)
        self.nodes.keep(node, expansion)
        return expansion

    def pin(self, node: Node) -> None:
        """Keep ``node``'s expansion for good (a Q table opened it); ``TreeLimitError`` once
        the opened expansions hold more than ``max_opened_bytes``."""
        if self.nodes.pin(node):
            # Children made before a cache eviction read an earlier copy of this expansion;
            # from now on every reader (Q above all) sees the pinned one.
            p = node.expansion.p  # type: ignore[union-attr]
            for child in node.children.values():
                child.token_logp = math.log(p[child.slot])
            self.budgets.check_opened(self.nodes.opened_bytes, self.nodes.count)

    def child(self, node: Node, token: int, expansion: Expansion | None = None) -> Node:
        """The prefix ``node + [token]``; ``token`` must be valid (or unconstrained) by
        ``node``'s expansion, which the caller holds (``expansion``) or the node still
        does."""
        found = node.children.get(token)
        if found is not None:
            return found
        self.budgets.check_nodes(self.nodes.count)
        self.budgets.check_time(self.nodes.count, self.lm_calls)
        state = self.matcher.advance(node.state, token)
        exp = node.expansion if expansion is None else expansion
        if exp is None:
            raise InternalError(f"a child of {node.tokens} before its expansion: a walk waits "
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
        child.token_logp = math.log(exp.p[child.slot])
        child.logprob = node.logprob + child.token_logp
        self.nodes.add(node, token, child)
        return child
