"""What the runner and every pool share: a task's jobs and records, the :class:`Task` and
:class:`Pool` protocols, and how jobs are grouped and timed (docs/design.md §4, ``eval/``).

A pool (local, :mod:`~adaptrack.eval.raypool`) runs groups of jobs with :func:`grouped`
and :func:`timed_records` (:func:`timed_group`), so a job's record is the same wherever it
ran.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

Job = dict[str, Any]
Record = dict[str, Any]


class Task(Protocol):
    """An evaluation: jobs, a once-per-worker setup, and one job → one JSON record."""

    def config(self) -> dict[str, Any]:
        """The options that decide the results (written to, and checked against, the header)."""
        ...

    def jobs(self) -> list[Job]:
        """Every job, each a JSON object with a unique ``"key"``."""
        ...

    def setup(self, threads: int | None = None) -> None:
        """Load the model (once per worker; ``threads``: CPU threads it may use)."""
        ...

    def run(self, job: Job) -> Record:
        """Do one job; the record must be JSON and hold the job's ``"key"``."""
        ...


def group_size(task: Task) -> int:
    """How many jobs a worker runs together: a task with ``run_many(jobs)`` (records in job
    order) serves a group of ``task.group`` jobs at once (one engine, shared batched model
    calls); any other task one job at a time with ``run``."""
    if not callable(getattr(task, "run_many", None)):
        return 1
    return max(1, int(getattr(task, "group", 1)))


def timed_group(task: Task, jobs: list[Job]) -> list[Record]:
    """The records of :func:`timed_records`, all at the group's end."""
    return list(timed_records(task, jobs))


def timed_records(task: Task, jobs: list[Job]) -> Iterator[Record]:
    """Run a group of jobs, yielding each record as its job finishes, stamped with the
    group's start (its jobs ran at the same time) and its own end. A task with
    ``run_each(jobs)`` (records as they finish, in any order) hands them over one by one;
    one with only ``run_many`` at the group's end."""
    if group_size(task) == 1:
        for job in jobs:
            yield timed(task, job)
        return
    started = time.time()
    each = getattr(task, "run_each", None)
    if callable(each):
        for record in each(jobs):
            yield {**record, "started_at": started, "finished_at": time.time()}
        return
    records = task.run_many(jobs)  # type: ignore[attr-defined]
    finished = time.time()
    for record in records:
        yield {**record, "started_at": started, "finished_at": finished}


def grouped(task: Task, jobs: list[Job]) -> list[list[Job]]:
    """Consecutive jobs, at most :func:`group_size` a group; a task whose ``group_key(job)``
    names what belongs together (a problem) never mixes two keys in a group."""
    size = group_size(task)
    key = getattr(task, "group_key", None)
    out: list[list[Job]] = []
    for job in jobs:
        last = out[-1] if out else None
        if (last is None or len(last) >= size
                or (key is not None and key(last[0]) != key(job))):
            out.append([job])
        else:
            last.append(job)
    return out


class Pool(Protocol):
    """Runs jobs of a task and yields their records in the order they finish."""

    def imap(self, task: Task, jobs: list[Job]) -> Iterator[Record]: ...


def timed(task: Task, job: Job) -> Record:
    """Run one job and stamp its record with when it started and finished (epoch seconds),
    so a report can measure wall time across workers and resumed sessions."""
    started = time.time()
    record = task.run(job)
    return {**record, "started_at": started, "finished_at": time.time()}


def available_cpus() -> int:
    """CPUs this process may run on (its affinity, which containers restrict)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
