"""The budgets of one search (docs/design.md §6): prefixes, the bytes of the expansions the
algorithms hold, model calls and time; each with the error that names it and says how to
fix it."""

from __future__ import annotations

import time

from ..errors import CallLimitError, SearchTimeoutError, TreeLimitError

#: What a search's ``max_calls`` is by default, as its error says.
CALLS_RULE = "search_budget x n x max_new_tokens"
#: What it is while a shared Q's first sample is due (docs/design.md §6).
FIRST_SAMPLE_RULE = ("no sample yet: the first is due within search_budget x max_new_tokens x "
                     "(n + 1) / 2")


class Budgets:
    """The limits of one prefix tree: ``max_nodes`` prefixes, ``max_opened_bytes`` of opened
    expansions (``TreeLimitError`` past either), ``max_calls`` model calls
    (``CallLimitError``) and ``max_seconds`` from ``started`` (``SearchTimeoutError``); None:
    no limit. Each check takes the tree's counts, for the message.

    Mutable: a tree reused by a later call gets that call's budgets on top of what it holds
    (``PreparedCall.use_tree``), and the budget policy (``sampling/policy.py``) sets the
    call budget and lifts them for a fallback.

    >>> b = Budgets(max_nodes=2, max_opened_bytes=1 << 20, max_seconds=None)
    >>> b.check_nodes(1); b.check_spent(nodes=1, calls=0)
    >>> try:
    ...     b.check_nodes(2)
    ... except TreeLimitError as err:
    ...     print(str(err)[:38])
    the prefix tree reached max_nodes=2; r
    """

    __slots__ = ("calls_rule", "max_calls", "max_nodes", "max_opened_bytes", "max_seconds",
                 "started")

    def __init__(self, *, max_nodes: int, max_opened_bytes: int,
                 max_seconds: float | None, max_calls: int | None = None) -> None:
        self.max_nodes, self.max_opened_bytes = max_nodes, max_opened_bytes
        self.max_seconds, self.max_calls = max_seconds, max_calls
        #: What ``max_calls`` is, for the error (the first sample's due sets another).
        self.calls_rule = CALLS_RULE
        self.started = time.monotonic()

    def check_spent(self, nodes: int, calls: int) -> None:
        """Before a model call: raise ``CallLimitError`` once ``max_calls`` calls were made,
        ``SearchTimeoutError`` once ``max_seconds`` have passed since ``started``."""
        if self.max_calls is not None and calls >= self.max_calls:
            raise CallLimitError(
                f"the search made {calls} model calls, its budget max_calls={self.max_calls} "
                f"({self.calls_rule}; {nodes} prefixes); raise search_budget (None for no "
                "limit)")
        self.check_time(nodes, calls)

    def check_time(self, nodes: int, calls: int) -> None:
        """Raise ``SearchTimeoutError`` once ``max_seconds`` have passed since ``started``
        (where a walk works without a model call: a spent call budget stops it only at
        its next call)."""
        if self.max_seconds is None:
            return
        spent = time.monotonic() - self.started
        if spent > self.max_seconds:
            raise SearchTimeoutError(
                f"the search ran past max_seconds={self.max_seconds:g} ({spent:.1f} s, "
                f"{nodes} prefixes, {calls} model calls); raise max_seconds "
                "(None for no limit), or lower n or max_new_tokens"
            )

    def check_nodes(self, nodes: int) -> None:
        """Raise ``TreeLimitError`` if a tree of ``nodes`` prefixes may not grow by one."""
        if nodes >= self.max_nodes:
            raise TreeLimitError(
                f"the prefix tree reached max_nodes={self.max_nodes}; raise max_nodes or "
                "lower max_new_tokens"
            )

    def check_opened(self, opened_bytes: int, nodes: int) -> None:
        """Raise ``TreeLimitError`` once the opened expansions hold more than
        ``max_opened_bytes``."""
        if opened_bytes > self.max_opened_bytes:
            raise TreeLimitError(
                f"the prefixes the search opened hold {opened_bytes / 2**20:.0f} MiB, past "
                f"max_opened_bytes={self.max_opened_bytes} ({nodes} prefixes); raise "
                "max_opened_bytes, lower max_new_tokens or n, or use a constraint or top_p < 1"
            )
