"""The prefix tree, the Q table and the methods (design.md §3-4)."""

from .tree import Expansion, Node, PrefixTree, QTable

__all__ = ["Expansion", "Node", "PrefixTree", "QTable"]
