"""The prefix tree, the Q table, the top-p cut, fast-forward and the methods
(docs/design.md §3-4)."""

from .fastforward import FastForward, forced_tokens
from .qtable import QTable
from .tree import Expansion, Node, PrefixTree

__all__ = ["Expansion", "FastForward", "Node", "PrefixTree", "QTable", "forced_tokens"]
