"""What the engine loop reads off a walk's prefix while it runs: its text so far, how much
of it may be streamed (stop strings end and cut the text in the constraint:
:func:`adaptrack.constraints.with_stop`), and the log-probabilities along it.

>>> held_back("say st", ("stop",))
2
"""

from __future__ import annotations

import codecs

from ..sampling.tree import Node, PrefixTree


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many final characters of ``text`` could start a stop string: not streamed yet."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


def text_so_far(data: bytes) -> str:
    """The text of a prefix's bytes, an incomplete final character held back."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)


def logprobs_to(node: Node) -> list[float]:
    """Per-token log-probabilities of the path from the root to ``node``."""
    out: list[float] = []
    while node.parent is not None:
        out.append(node.logprob - node.parent.logprob)
        node = node.parent
    return out[::-1]


def path_logprobs(tree: PrefixTree, tokens: tuple[int, ...]) -> list[float]:
    node = tree.root
    for t in tokens:
        node = node.children[t]
    return logprobs_to(node)

