"""The nodes of a prefix tree and the store of their expansions (docs/design.md §4): the
expansions no Q table has opened are a cache, bounded in bytes and dropped least recently
used first (a later visit asks the model again); opened ones are kept for good, counted."""

from __future__ import annotations

from ..cache import LRU
from ..constraints.base import State
from .expansion import Expansion


class Node:
    """One prefix: the tokens after the prompt, the constraint state after them."""

    __slots__ = ("children", "complete", "depth", "expansion", "in_chain", "logprob", "opened",
                 "parent", "pending", "slot", "state", "token", "token_logp", "tokens",
                 "truncated")

    def __init__(
        self, parent: Node | None, token: int | None, state: State, complete: bool,
        logprob: float,
    ) -> None:
        self.parent, self.token, self.state, self.complete = parent, token, state, complete
        self.tokens: tuple[int, ...] = (
            () if parent is None or token is None else (*parent.tokens, token))
        self.depth = len(self.tokens)
        self.logprob = logprob  # log P(tokens | prompt) under the sampling model
        # log P(token | parent) as the parent's expansion stores it: the Q table reads it at
        # every level of every update, so it is taken once (0.0 for the root).
        self.token_logp = 0.0
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


class NodeStore:
    """The nodes of one tree (``root``, ``count``) and the expansions they hold: droppable
    ones by recency up to ``max_cache_bytes`` (``cache_bytes``, ``evictions``), pinned ones
    for good (``opened_bytes``).

    >>> import numpy as np
    >>> root = Node(None, None, 0, False, 0.0)
    >>> store = NodeStore(root, max_cache_bytes=0)
    >>> store.keep(root, Expansion(np.array([0.5, 0.5]), np.array([0, 1])))
    >>> store.cache_bytes, store.trim([root]), root.expansion is None  # just made: kept
    (16, None, False)
    >>> store.trim([]); root.expansion is None, store.evictions
    (True, 1)
    """

    __slots__ = ("_cache", "count", "opened_bytes", "root")

    def __init__(self, root: Node, max_cache_bytes: int) -> None:
        self.root, self.count, self.opened_bytes = root, 1, 0
        # Expanded, not opened: id(node) → node, by recency, up to max_cache_bytes.
        self._cache: LRU[int, Node] = LRU(max_cache_bytes, _expansion_bytes,
                                          on_evict=_drop_expansion)

    @property
    def cache_bytes(self) -> int:
        """Bytes of the expansions no Q table has opened (the droppable cache)."""
        return self._cache.used

    @property
    def evictions(self) -> int:
        """Expansions the cache dropped so far."""
        return self._cache.evictions

    def add(self, parent: Node, token: int, child: Node) -> None:
        """Hang ``child`` under ``parent`` by its ``token`` and count it."""
        parent.children[token] = child
        self.count += 1

    def keep(self, node: Node, expansion: Expansion) -> None:
        """Give ``node`` its expansion, droppable until pinned; the cache is brought back
        within its bound only by :meth:`trim`, so that a batch keeps what it just made."""
        node.expansion = expansion
        self._cache.put(id(node), node, trim=False)

    def trim(self, protected: list[Node]) -> None:
        """Drop least recently made expansions past ``max_cache_bytes``, except those of
        ``protected``."""
        self._cache.trim(protected={id(n) for n in protected})

    def pin(self, node: Node) -> bool:
        """Keep ``node``'s expansion for good, counted in ``opened_bytes``; whether it was
        not pinned before."""
        if node.opened:
            return False
        node.opened = True
        self._cache.pop(id(node))
        self.opened_bytes += node.expansion.nbytes  # type: ignore[union-attr]
        return True


def _expansion_bytes(node: Node) -> int:
    return node.expansion.nbytes  # type: ignore[union-attr]


def _drop_expansion(key: int, node: Node) -> None:
    node.expansion = None
