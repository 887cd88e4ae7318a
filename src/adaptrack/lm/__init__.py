"""Model backends behind one interface (design.md §4, bottom layer)."""

from .base import LanguageModel, Prefix
from .table import TableLM

__all__ = ["LanguageModel", "Prefix", "TableLM"]
