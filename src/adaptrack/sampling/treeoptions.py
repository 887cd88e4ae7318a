"""What a prefix tree is built with (docs/design.md §4): :class:`TreeOptions`, declared once.

:class:`~adaptrack.options.SamplingOptions` reads the defaults of the options it shares with
the tree from here and builds a tree's options from a call's
(:meth:`~adaptrack.options.SamplingOptions.tree_options`); a tree built directly (a test, a
doctest) takes these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from .fastforward import FastForward

__all__ = ["END_POLICIES", "TreeOptions"]

#: Where a text the constraint accepts ends (docs/design.md §2): ``leave``, where the model's
#: next token cannot continue it (EOS or any token the constraint rejects there); ``eos``,
#: only where the model emits EOS (the AdapTrack paper's target).
END_POLICIES = ("leave", "eos")


@dataclass(frozen=True, kw_only=True)
class TreeOptions:
    """The options of one :class:`~adaptrack.sampling.tree.PrefixTree`.

    The model's distribution: ``temperature`` (0 keeps the model's own distribution, T = 1,
    in the tree: greedy methods take argmaxes of it) and ``top_p``. The length:
    ``max_new_tokens``; ``restrict_length`` makes it part of the constraint (at the last
    position only finishing tokens are valid; unconstrained decoding turns it off and
    simply stops there); ``allow_truncated`` makes a valid prefix of ``max_new_tokens``
    tokens an end instead (``complete`` and ``truncated``: the target becomes the model's
    text cut at the limit, conditioned on every prefix being valid, docs/design.md §2).
    ``end`` is where an accepted text ends (:data:`END_POLICIES`): with ``leave`` the
    expansion of an accepted prefix gives EOS the mass of every token that cannot continue
    the text, so the target is P(s) · P(leave | s). ``fast_forward``: the forced chains
    (None: none).

    The budgets (docs/design.md §6): prefixes (``max_nodes``), bytes (``max_cache_bytes``
    for expansions the tree may drop and recompute, ``max_opened_bytes`` for those the
    algorithms hold), time from the tree's creation (``max_seconds``) and model calls
    (``max_calls``); None is no limit.

    >>> TreeOptions(max_new_tokens=8, end="eos").leave
    False
    >>> TreeOptions(end="stop")
    Traceback (most recent call last):
    ValueError: end must be one of 'leave', 'eos', got 'stop'
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    max_nodes: int = 100_000
    max_cache_bytes: int = 1 << 30
    max_opened_bytes: int = 1 << 30
    max_seconds: float | None = None
    max_calls: int | None = None
    restrict_length: bool = True
    allow_truncated: bool = False
    fast_forward: FastForward | None = None
    end: str = "leave"

    def __post_init__(self) -> None:
        if self.end not in END_POLICIES:
            raise ValueError(f"end must be one of {', '.join(map(repr, END_POLICIES))}, "
                             f"got {self.end!r}")

    @property
    def leave(self) -> bool:
        """Whether an accepted text ends where the model's next token cannot continue it."""
        return self.end == "leave"

    @property
    def restricted(self) -> bool:
        """Whether ``max_new_tokens`` is part of the constraint: ``restrict_length``, unless
        ``allow_truncated`` makes a cut text an end."""
        return self.restrict_length and not self.allow_truncated
