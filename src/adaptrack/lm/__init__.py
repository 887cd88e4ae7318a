"""Model backends behind one interface (docs/design.md §4, bottom layer)."""

from .base import LanguageModel, Prefix
from .load import load_model
from .table import TableLM

__all__ = ["LanguageModel", "Prefix", "TableLM", "load_model"]
