"""Sweepable options of the TFv1-style tasks (the paper's Figures 5 and 7): one value or a
list of temperatures and of AdapTrack's ``max_backtrack``, checked, parsed from the command
line and written in keys and reports.

>>> sweep_values([0.5, 1.0], "temperature", temperature_ok)
(0.5, 1.0)
>>> backtrack_label(None), backtrack_label(4)
('unlimited', '4')
"""

from __future__ import annotations

import argparse
import math
from typing import Any

__all__ = ["SWEEP_WORDS", "backtrack_label", "parse_backtracks", "parse_temperatures",
           "sweep_values"]


def sweep_values(value: Any, name: str, check: Any) -> tuple[Any, ...]:
    """The values of a sweepable option (one value, or a sequence of them), each checked by
    ``check(value) -> bool``; ValueError naming the option for a bad or repeated value."""
    values = tuple(value) if isinstance(value, list | tuple) else (value,)
    if not values:
        raise ValueError(f"{name} needs at least one value")
    for v in values:
        if not check(v):
            raise ValueError(f"{name} got {v!r}; {SWEEP_WORDS[name]}")
    if len(set(values)) < len(values):
        raise ValueError(f"{name} lists a value twice: {list(values)!r}")
    return values


SWEEP_WORDS = {
    "temperature": "the samples need temperature > 0 and finite (EM@1 is greedy already)",
    "max_backtrack": "each value is an int >= 0, or None for no limit",
}


def temperature_ok(t: Any) -> bool:
    return (isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
            and t > 0)


def backtrack_ok(b: Any) -> bool:
    return b is None or (isinstance(b, int) and not isinstance(b, bool) and b >= 0)


def _parse_list(text: str, item: Any, check: Any, words: str) -> list[Any]:
    try:
        values = [item(v.strip()) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(check(v) for v in values):
        raise argparse.ArgumentTypeError(f"must be {words}, got {text!r}")
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"must not list a value twice, got {text!r}")
    return values


def parse_temperatures(text: str) -> list[float]:
    """``--temperature``'s values: comma-separated finite numbers > 0 (an argparse type).

    >>> parse_temperatures("0.1,0.5,1")
    [0.1, 0.5, 1.0]
    """
    return _parse_list(text, float, temperature_ok, "comma-separated finite numbers > 0")


def parse_backtracks(text: str) -> list[int | None]:
    """``--max-backtrack``'s values: comma-separated integers >= 0 or ``unlimited``.

    >>> parse_backtracks("1,2,4,8,unlimited")
    [1, 2, 4, 8, None]
    """
    return _parse_list(text, lambda v: None if v == "unlimited" else int(v), backtrack_ok,
                       "comma-separated integers >= 0 or 'unlimited'")


def backtrack_label(b: int | None) -> str:
    """How keys and reports write a max_backtrack value (``None`` is ``unlimited``)."""
    return "unlimited" if b is None else str(b)

