"""What a walk waits for (docs/design.md §4): a walk yields one prefix, or a tuple of the
prefixes one model call serves, with a :class:`~adaptrack.sampling.base.Prefetch` of those it
fetches ahead last. The engine reads these to plan its calls and charge its budgets.

>>> import adaptrack as at
>>> from adaptrack.sampling.tree import PrefixTree
>>> lm = at.TableLM([b"a", b"<eos>"], lambda prefix: [1, 1], eos=1)
>>> root = PrefixTree([], at.constraints.choice(["a"]).bind(lm.vocab)).root
>>> waited(root) == [root], direct((root, Prefetch([root]))) == [root], prefetched(root)
(True, True, [])
"""

from __future__ import annotations

from .base import Prefetch
from .nodes import Node

__all__ = ["direct", "prefetched", "waited"]


def waited(waits: object) -> list[Node]:
    """The prefixes a walk waits for: one node, or a tuple of nodes one call serves (those
    of a :class:`Prefetch` in it too, after the others: a walk yields it last)."""
    return direct(waits) + prefetched(waits)


def direct(waits: object) -> list[Node]:
    """The prefixes a walk waits for, those of a :class:`Prefetch` left out."""
    if isinstance(waits, Node):
        return [waits]
    return [n for n in waits if isinstance(n, Node)] if isinstance(waits, tuple) else []


def prefetched(waits: object) -> list[Node]:
    """The prefixes of the :class:`Prefetch` in what a walk yields."""
    if not isinstance(waits, tuple):
        return []
    return [n for item in waits if isinstance(item, Prefetch) for n in item]
