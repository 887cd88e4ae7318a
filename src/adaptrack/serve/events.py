"""What the engine thread tells the HTTP side about a request, as small frozen dataclasses:
a :class:`Delta` (a piece of a choice streamed token by token), a :class:`Final` (a choice
is final), then a :class:`Done` or a :class:`Failed`. Plain data: no HTTP shapes, so that
``engine_loop`` knows nothing of the protocol.

>>> c = Choice(0, "ab", "stop", (1, 2))
>>> Done([c], prompt_tokens=3, stats={}).completion_tokens
2
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Choice:
    """One finished choice: its index, text (cut at a stop string), why it ended
    (``"stop"`` or ``"length"``), the tokens sampled and, when asked, their
    log-probabilities and the top alternatives at each position (``(token, logprob)``
    pairs, likeliest first)."""

    index: int
    text: str
    finish_reason: str
    tokens: tuple[int, ...]
    token_logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass(frozen=True)
class Delta:
    """A new piece of choice ``index``: its ``text``, the whole ``tokens`` that make it and,
    when asked, their log-probabilities and top alternatives."""

    index: int
    text: str
    tokens: tuple[int, ...]
    logprobs: list[float] | None = None
    top: list[list[tuple[int, float]]] | None = None


@dataclass(frozen=True)
class Final:
    """A choice is final (for a streamed walk, after its last :class:`Delta`)."""

    choice: Choice


@dataclass(frozen=True)
class Done:
    """The request succeeded: its choices by index, its prompt tokens and the ``adaptrack``
    stats (model calls, backtracks, fallback, times)."""

    choices: list[Choice]
    prompt_tokens: int
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.choices)


@dataclass(frozen=True)
class Failed:
    """The request failed with ``error`` (the library's exception, or the reason it was
    cancelled); the HTTP side maps it to a status (:func:`~.errors.error_for`)."""

    error: BaseException


Event = Delta | Final | Done | Failed
