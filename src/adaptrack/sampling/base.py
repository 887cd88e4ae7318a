"""What every method shares: the tree it samples from, the generator, the counters."""

from __future__ import annotations

import numpy as np

from ..errors import NoValidSequenceError
from .tree import Node, PrefixTree


class Method:
    """A sampler over one prefix tree. ``sample()`` returns the final node of one sample.

    ``greedy`` is ``temperature == 0``. ``requests`` counts the prefixes whose next-token
    distribution the current sample used, cached or not: the paper's "calls to LM per
    sample" (Table 5). ``backtracks`` and ``restarts`` add up over all samples.
    """

    def __init__(self, tree: PrefixTree, rng: np.random.Generator, greedy: bool) -> None:
        self.tree, self.rng, self.greedy = tree, rng, greedy
        self.backtracks = 0
        self.restarts = 0
        self._seen: set[int] = set()

    @property
    def requests(self) -> int:
        return len(self._seen)

    def begin_sample(self) -> None:
        self._seen = set()

    def use(self, node: Node) -> None:
        """Record that this sample needs ``node``'s next-token distribution."""
        self._seen.add(id(node))

    def sample(self) -> Node:
        raise NotImplementedError

    def empty_language(self) -> NoValidSequenceError:
        t = self.tree
        cut = f" and top_p={t.top_p}" if t.top_p < 1 else ""
        return NoValidSequenceError(
            f"the constraint admits no complete sequence within max_new_tokens="
            f"{t.max_new_tokens}{cut}: check the constraint, or allow more tokens"
        )
