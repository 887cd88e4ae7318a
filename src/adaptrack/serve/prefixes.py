"""What the engine loop reads off a walk's prefix while it runs: its text so far, how much
of it may be streamed (stop strings end and cut the text in the constraint:
:func:`adaptrack.constraints.with_stop`), the log-probabilities along it, and the top
alternatives at each of its positions.

>>> held_back("say st", ("stop",))
2
"""

from __future__ import annotations

import codecs

import numpy as np

from ..lm.base import LanguageModel
from ..sampling.engine import peek
from ..sampling.tree import Node, PrefixTree

#: One position's top alternatives: ``(token id, log-probability)``, likeliest first.
Top = list[tuple[int, float]]


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


def node_at(tree: PrefixTree, tokens: tuple[int, ...]) -> Node:
    """The node of a sampled path."""
    node = tree.root
    for t in tokens:
        node = node.children[t]
    return node


def path_logprobs(tree: PrefixTree, tokens: tuple[int, ...]) -> list[float]:
    return logprobs_to(node_at(tree, tokens))



def top_alternatives(lm: LanguageModel, tree: PrefixTree, node: Node, k: int,
                     upto: int | None = None, start: int = 0) -> list[Top]:
    """At each position ``start .. upto`` (default: all) of the path to ``node``, the ``k``
    likeliest tokens of the expansion there: the tokens valid at that position (every
    token without a constraint, within top_p) with their log-probabilities under the model
    ``lm`` at the sampling temperature. An expansion the tree's cache dropped is made
    again, all of them in one batched model call.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 0], eos=2)
    >>> tree = PrefixTree([], at.constraints.choice(["ab", "b"]).bind(lm.vocab))
    >>> from adaptrack.sampling.engine import expand
    >>> node = tree.child(tree.root, 1, expand(lm, tree, tree.root))
    >>> [[(t, round(lp, 3)) for t, lp in top] for top in top_alternatives(lm, tree, node, 2)]
    [[(0, -0.288), (1, -1.386)]]
    """
    path: list[Node] = []
    while node.parent is not None:
        path.append(node.parent)
        node = node.parent
    path = path[::-1][start:upto]
    out = []
    for exp in peek(lm, tree, path):
        order = np.argsort(-exp.p, kind="stable")[:k]
        out.append([(int(exp.ids[i]), float(np.log(exp.p[i]))) for i in order])
    return out
