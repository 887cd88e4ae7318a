"""What every method shares: the tree it samples from, the counters, and what a walk is
(docs/design.md §4, walks); ``sampling/engine.py`` serves the walks."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import ClassVar

import numpy as np

from ..errors import NoValidSequenceError
from .expansion import Expansion
from .tree import Node, PrefixTree

#: A walk yields this to wait until every walk of its request in flight waits for it too
#: (the end of a round, :meth:`Method.release`).
BARRIER = object()

#: One sample in progress: yields the prefix whose expansion it needs next (a node, or a
#: tuple of nodes that one model call serves together, which may hold a :class:`Prefetch`;
#: or :data:`BARRIER`), returns the final node. Written as a generator so that several walks
#: can share one model call (the engine, ``sampling/engine.py``).
Walk = Generator[object, None, Node]


class Prefetch(tuple[Node, ...]):
    """Prefixes, inside the tuple a walk yields, that the model call serves only to fill the
    cache: nothing waits for them, and the model need not keep state for them
    (``LanguageModel.transient``)."""


class Method:
    """A sampler over one prefix tree. ``walk(seen, rng)`` draws one sample.

    ``greedy`` is ``temperature == 0``. A walk adds to ``seen`` the prefixes whose next-token
    distribution it used, cached or not: the AdapTrack paper's "calls to LM per sample"
    (Table 5). ``backtracks`` and ``restarts`` add up over all samples. ``independent`` says
    whether samples share no state but the tree, so that their walks can run in lockstep.
    ``parallel`` is the default for a method whose samples share Q: whether several of its
    walks run at once over that one Q (the AdapTrack paper's §7.2.1 parallel update).
    ``eager_chains``: whether a walk at a forced chain's head always goes on into the chain,
    so that the whole chain is best fed at once (else only where a walk enters it).
    ``forces_chains``: what ``FastForward(force=None)`` means for the method: forced tokens
    are the only valid ones (the target conditioned on canonical tokenization), or chains
    are only prefilled (the target unchanged; docs/design.md §2, fast-forward).

    A method declares itself to the registry (``sampling/methods.py``): its ``name``
    (``generate``'s ``method=``), whether it ``searches`` (samples the target conditioned
    on ending within ``max_new_tokens``, with the search budget and the CD fallback),
    whether it is ``forward_only`` (its walks never go back: a server streams a sample
    token by token), whether it is ``constrained`` (False: the model as it is, the
    constraint's terminators and stop strings only end the text) and its own ``options``:
    the :class:`~adaptrack.SamplingOptions` fields only it reads, passed to its
    constructor as keywords.
    """

    name: ClassVar[str] = ""
    searches: ClassVar[bool] = False
    forward_only: ClassVar[bool] = False
    constrained: ClassVar[bool] = True
    options: ClassVar[tuple[str, ...]] = ()

    independent = True
    parallel = False
    #: How many of its walks the engine runs at once (set by ``Engine.submit``).
    width = 1
    #: Whether the engine runs its walks one at a time whatever ``width`` says (which
    #: then bounds what one walk does at once: ``exact``'s ``ahead`` schedule).
    serial = False
    #: Whether ``width`` is rows the walk spends in one pass without changing a sample
    #: (``exact``'s attempts followed ahead): its request's width then comes from the
    #: ``width`` option (:attr:`asked_width`), else from the model's cost model
    #: (``lm/cost.py``; ``PreparedCall.submit``).
    spends_width = False
    asked_width: int | None = None
    #: How many samples its request asks for (set by ``Engine.submit``).
    samples = 1
    #: Whether only the search itself ends its request: no call budget and no early
    #: hand-over (set by ``Engine.submit``; ``max_nodes`` and ``max_seconds`` still stop it).
    unbounded = False
    #: Walks from the root one sample may take (CD as a fallback tries past dead ends).
    tries = 1
    eager_chains = True
    forces_chains = False

    def __init__(self, tree: PrefixTree, greedy: bool) -> None:
        """A method sampling from ``tree``; ``greedy``: temperature 0 (docs/design.md §2)."""
        self.tree, self.greedy = tree, greedy
        self.backtracks = 0
        self.restarts = 0
        #: Prefixes evaluated ahead of the walks only to fill the cache, used later or not
        #: (AdapTrack's siblings at a crawled parent; ``stats["fetched_ahead"]``).
        self.fetched = 0

    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        raise NotImplementedError

    def runs_in_parallel(self, parallel: bool | None) -> bool:
        """Whether several walks run at once: always for independent samples, else
        ``parallel`` (None: the method's default)."""
        if self.independent:
            return True
        if parallel is None:  # greedy samples are the same answer: one search suffices
            return self.parallel and not self.greedy
        return parallel

    def release(self) -> None:
        """Every walk in flight waits at :data:`BARRIER`: the end of a round."""

    @staticmethod
    def used(seen: set[int], node: Node) -> None:
        """Count ``node``'s distribution as one this sample used. A node whose token was
        fast-forwarded got its distribution with the chain's one call: not counted again."""
        if not node.in_chain:
            seen.add(id(node))

    def expand(self, node: Node) -> Generator[Node, None, Expansion]:
        """The node's expansion; the walk pauses while the driver asks the model, and
        asks again should the cache have dropped it meanwhile (a walk never calls the
        model itself: the engine batches every walk's waiting prefixes)."""
        while node.expansion is None:
            yield node
        return node.expansion

    def expand_along(self, node: Node, along: Sequence[Node]
                     ) -> Generator[object, None, Expansion]:
        """:meth:`expand`, the first model call serving ``along`` too, only to fill the
        cache: nothing waits for them, and a later visit finds them expanded unless the
        cache dropped them meanwhile."""
        if node.expansion is None and along:
            yield (node, Prefetch(along))
        return (yield from self.expand(node))

    def empty_language(self) -> NoValidSequenceError:
        t = self.tree
        cut = f" and top_p={t.top_p}" if t.top_p < 1 else ""
        return NoValidSequenceError(
            f"the language is empty (not merely improbable): the constraint admits no "
            f"complete sequence within max_new_tokens="
            f"{t.max_new_tokens}{cut}: check the constraint, or allow more tokens"
        )
