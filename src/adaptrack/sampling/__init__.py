"""The prefix tree, the Q table, the top-p cut, fast-forward, the methods and the engine
that serves their walks (docs/design.md §3-4)."""

from .engine import Engine, Request
from .expansion import Expansion
from .fastforward import FastForward, forced_tokens
from .qtable import QTable
from .tree import Node, PrefixTree
from .treeoptions import TreeOptions

__all__ = ["Engine", "Expansion", "FastForward", "Node", "PrefixTree", "QTable", "Request",
           "TreeOptions", "forced_tokens"]
