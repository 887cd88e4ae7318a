"""The evaluation tasks: one :class:`~adaptrack.eval.taskspec.TaskSpec` per task, in the
order ``adaptrack eval`` lists them. Adding a task is one module that declares its spec and
one line here (or :func:`register`, for a task of one's own).

The command line makes each task's flags from its spec, the runner checks a results file's
header and records with it, and ``adaptrack report`` calls its report section.

>>> names()
('tfv1', 'tfv1real', 'binary', 'dsl', 'humaneval', 'mbpp')
>>> spec("tfv1").name
'tfv1'
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from . import binary, dsl, humaneval, mbpp, tfv1, tfv1real
from .checks import Check
from .jobs import Record
from .taskspec import TaskSpec

__all__ = ["HEADERS", "RECORDS", "TASKS", "names", "register", "spec", "unregister"]

TASKS: dict[str, TaskSpec] = {s.name: s for s in (
    tfv1.SPEC,
    tfv1real.SPEC,
    binary.SPEC,
    dsl.SPEC,
    humaneval.SPEC,
    mbpp.SPEC,
)}
"""Every task by name, in the order the command line lists them."""


def names() -> tuple[str, ...]:
    """The tasks' names, in order."""
    return tuple(TASKS)


def spec(name: str) -> TaskSpec | None:
    """The declaration of task ``name``, or None for a task not registered."""
    return TASKS.get(name)


def register(task: TaskSpec) -> TaskSpec:
    """Add a task (last in order): its flags, results files and report work from then on.
    ValueError when a task of that name is registered already.

    >>> register(spec("dsl"))
    Traceback (most recent call last):
    ...
    ValueError: a task named 'dsl' is registered already
    """
    if task.name in TASKS:
        raise ValueError(f"a task named {task.name!r} is registered already")
    TASKS[task.name] = task
    return task


def unregister(name: str) -> None:
    """Remove a task added with :func:`register` (KeyError when there is none)."""
    del TASKS[name]


V = TypeVar("V")


class _ByTask(Mapping[str, V]):
    """A live view of one part of every registered task's declaration."""

    def __init__(self, part: Callable[[TaskSpec], V | None]) -> None:
        self._part = part

    def __getitem__(self, name: str) -> V:
        found = self._part(TASKS[name])
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        return (n for n, s in TASKS.items() if self._part(s) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self))


RECORDS: Mapping[str, Callable[[Record], str | None]] = _ByTask(lambda s: s.record)
"""Each task's record check: what is wrong with a record (an object with a string ``key``),
or None. A task without one needs only the ``key``."""

HEADERS: Mapping[str, Mapping[str, Check]] = _ByTask(lambda s: s.header)
"""The options of each task's header, by type (each may be absent: a run compares the whole
header with its options anyway)."""

