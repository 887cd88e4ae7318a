"""What every method shares: the tree it samples from, the counters, and the driver that
serves many walks with batched model calls (docs/design.md §4, walks)."""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np

from ..errors import NoValidSequenceError
from .tree import Expansion, Node, PrefixTree

#: One sample in progress: yields the prefixes whose distribution it needs next, returns
#: the final node. Written as a generator so that several walks can share one model call.
Walk = Generator[Node, None, Node]


class Method:
    """A sampler over one prefix tree. ``walk(seen, rng)`` draws one sample.

    ``greedy`` is ``temperature == 0``. A walk adds to ``seen`` the prefixes whose next-token
    distribution it used, cached or not: the AdapTrack paper's "calls to LM per sample"
    (Table 5). ``backtracks`` and ``restarts`` add up over all samples. ``independent`` says
    whether samples share no state but the tree, so that their walks can run in lockstep.
    """

    independent = True

    def __init__(self, tree: PrefixTree, greedy: bool) -> None:
        """A method sampling from ``tree``; ``greedy``: temperature 0 (docs/design.md §2)."""
        self.tree, self.greedy = tree, greedy
        self.backtracks = 0
        self.restarts = 0

    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        raise NotImplementedError

    @staticmethod
    def used(seen: set[int], node: Node) -> None:
        """Count ``node``'s distribution as one this sample used. A node whose token was
        fast-forwarded got its distribution with the chain's one call: not counted again."""
        if not node.in_chain:
            seen.add(id(node))

    def expand(self, node: Node) -> Generator[Node, None, Expansion]:
        """The node's expansion; the walk pauses while the driver asks the model."""
        if node.expansion is None:
            yield node
        return self.tree.expand(node)  # already there, unless evicted meanwhile

    def empty_language(self) -> NoValidSequenceError:
        t = self.tree
        cut = f" and top_p={t.top_p}" if t.top_p < 1 else ""
        return NoValidSequenceError(
            f"the constraint admits no complete sequence within max_new_tokens="
            f"{t.max_new_tokens}{cut}: check the constraint, or allow more tokens"
        )


def run_walks(
    method: Method,
    n: int,
    batch: int,
    seed: int | None,
    on_done: Callable[[int, Node, int], None],
) -> None:
    """Draw ``n`` samples; ``on_done(i, node, requests)`` receives each as it finishes.

    Independent samples run ``batch`` walks at a time in lockstep: the prefixes they wait
    for go to the model in one call. Methods whose samples share Q run one walk at a time,
    in order, since each sample must see the Q its predecessors left. Sample i draws from
    its own random stream (spawned from ``seed``), so neither the batch size nor which
    prefixes happen to be cached changes what it draws.
    """
    streams = np.random.SeedSequence(seed).spawn(n)
    width = batch if method.independent else 1
    waiting: dict[int, tuple[Walk, set[int], Node]] = {}
    started = 0

    def step(i: int, walk: Walk, seen: set[int]) -> None:
        try:
            waiting[i] = (walk, seen, next(walk))
        except StopIteration as stop:
            on_done(i, stop.value, len(seen))

    while started < n or waiting:
        while started < n and len(waiting) < width:
            seen: set[int] = set()
            step(started, method.walk(seen, np.random.default_rng(streams[started])), seen)
            started += 1
        if not waiting:
            continue
        method.tree.check_time()  # between model calls: every search stays within its budget
        method.tree.expand_many([node for _, _, node in waiting.values()])
        for i, (walk, seen, _) in sorted(waiting.items()):
            del waiting[i]
            step(i, walk, seen)
