"""The shape of a results file's lines, declared: a :data:`Check` per field, and
:func:`fields` to say what is wrong with an object (docs/design.md §6: one error that names
the line). Each task declares its header's and its records' fields with these
(:class:`~adaptrack.eval.taskspec.TaskSpec`); the runner applies them when it reads a file.

>>> fields({"n": 0}, {"n": POSITIVE})
"'n' is not a positive integer"
>>> fields({"n": 3, "seed": "x"}, {"n": POSITIVE}, {"seed": INT})
"'seed' is not an integer"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["BOOL", "INT", "NUMBER", "POSITIVE", "STAMPS", "STR", "TARGET", "TOKEN_SAMPLES",
           "Check", "fields", "is_int", "is_num", "list_of", "optional_number", "samples_match",
           "strings"]

#: Whether a value is acceptable, and the words an error message uses for what it must be.
Check = tuple[Callable[[Any], bool], str]


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def list_of(item: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A non-empty list whose every item passes ``item``."""
    return lambda x: isinstance(x, list) and len(x) > 0 and all(item(i) for i in x)


STR: Check = (lambda x: isinstance(x, str), "a string")
INT: Check = (is_int, "an integer")
POSITIVE: Check = (lambda x: is_int(x) and x > 0, "a positive integer")
NUMBER: Check = (is_num, "a number")
BOOL: Check = (lambda x: isinstance(x, bool), "true or false")


def optional_number() -> Check:
    """A number or null (a budget that may be absent)."""
    return (lambda x: x is None or is_num(x), "a number or null")


def strings() -> Check:
    """A non-empty list of strings."""
    return (list_of(lambda x: isinstance(x, str)), "a non-empty list of strings")


#: When a job started and finished (epoch seconds), on every record the runner writes.
STAMPS: dict[str, Check] = {"started_at": NUMBER, "finished_at": NUMBER}


def _target_row(x: Any) -> bool:
    return (isinstance(x, list) and len(x) == 3 and list_of(is_int)(x[0])
            and is_num(x[1]) and isinstance(x[2], str))


#: An enumerated target: rows of [tokens, probability, text] (the binary and DSL studies).
TARGET: Check = (list_of(_target_row), "a non-empty list of [tokens, probability, text]")

#: What a record of sampled token sequences holds (the binary and DSL studies).
TOKEN_SAMPLES: dict[str, Check] = {
    "samples": (list_of(list_of(is_int)), "a non-empty list of token lists"),
    "logprobs": (lambda x: isinstance(x, list) and all(is_num(i) for i in x),
                 "a list of numbers"),
    "lm_requests": (list_of(is_int), "a non-empty list of integers"),
    "lm_calls": INT, "seconds": NUMBER}


def fields(obj: Mapping[str, Any], required: Mapping[str, Check],
           optional: Mapping[str, Check] | None = None) -> str | None:
    """What is wrong with ``obj``'s fields, or None: each ``required`` one present and
    passing its check, each ``optional`` one passing it where present."""
    for name, (ok, words) in required.items():
        if name not in obj:
            return f"no {name!r} field"
        if not ok(obj[name]):
            return f"{name!r} is not {words}"
    for name, (ok, words) in (optional or {}).items():
        if name in obj and not ok(obj[name]):
            return f"{name!r} is not {words}"
    return None


def samples_match(r: Mapping[str, Any], other: str) -> str | None:
    """Whether a record's ``samples`` and its ``other`` list have one entry each."""
    if len(r[other]) != len(r["samples"]):
        return f"{len(r['samples'])} samples but {len(r[other])} {other}"
    return None
