"""Where an evaluation's jobs run: :class:`InProcess` (one at a time, here) and
:class:`Processes` (local worker processes); :func:`pool` also builds a Ray pool
(:mod:`~adaptrack.eval.raypool`). Every pool runs groups of jobs with the grouping and
timing of :mod:`~adaptrack.eval.jobs`, so a job's record is the same wherever it ran
(docs/design.md §4, ``eval/``).

A distributed pool (a cluster queue, Ray, …) is another class with the same ``imap``
method; :func:`~adaptrack.eval.runner.run` does not change.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool as BrokenExecutor
from typing import Any

from ..errors import WorkerError
from .jobs import Job, Pool, Record, Task, available_cpus, grouped, timed_records

__all__ = ["POOLS", "InProcess", "Processes", "pool"]


class InProcess:
    """Run jobs one after another in this process."""

    def imap(self, task: Task, jobs: list[Job]) -> Iterator[Record]:
        if jobs:
            task.setup()
        for group in grouped(task, jobs):
            yield from timed_records(task, group)


_WORKER_TASK: Task | None = None
_WORKER_ERROR: str | None = None
_WORKER_RECORDS: Any = None  # a SimpleQueue to the parent


def _die_with_parent(parent: int) -> None:
    """Have the kernel stop this worker when the process that started it dies (Linux).

    A parent stopped by SIGTERM or SIGKILL runs no cleanup, and an orphaned worker would go on
    computing jobs (holding gigabytes and a core) whose records nobody collects."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no prctl here: the worker outlives its parent
            return
    if os.getppid() != parent:  # the parent died before the request took hold
        os._exit(1)


def _init_worker(task: Task, threads: int, parent: int = 0, records: Any = None) -> None:
    global _WORKER_TASK, _WORKER_ERROR, _WORKER_RECORDS
    _WORKER_RECORDS = records
    if parent:
        _die_with_parent(parent)
    try:
        task.setup(threads)
    except Exception as err:  # reported with the first job, as the library's error
        _WORKER_ERROR = f"{type(err).__name__}: {err}"
    _WORKER_TASK = task


def _run_in_worker(jobs: list[Job]) -> None:
    """Run a group; each record goes to the parent as its job finishes. ``put`` writes it
    into the pipe before returning, so when the group's future is done every record of
    the group is readable."""
    if _WORKER_ERROR is not None:
        raise WorkerError(f"a worker process could not set up: {_WORKER_ERROR}")
    assert _WORKER_TASK is not None and _WORKER_RECORDS is not None
    for record in timed_records(_WORKER_TASK, jobs):
        _WORKER_RECORDS.put(record)


class Processes:
    """Spread jobs over ``workers`` local processes, each loading the model once and
    using ``cpus // workers`` threads. Each record comes back as its job finishes (through
    a pipe). Jobs are handed out in order (in groups, for a task
    with ``run_many``: :func:`group_size`), a few ahead, so
    neighbouring jobs (the same problem's methods) stay close in time. When a job fails or
    the run is interrupted, the records already finished are yielded first and the workers
    are stopped without waiting for the jobs they hold."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers

    def imap(self, task: Task, jobs: list[Job]) -> Iterator[Record]:
        if not jobs:
            return
        threads = max(1, available_cpus() // self.workers)
        # spawn, not fork: a forked copy of a process that holds model threads can hang.
        context = multiprocessing.get_context("spawn")
        records = context.SimpleQueue()
        executor = ProcessPoolExecutor(self.workers, mp_context=context,
                                       initializer=_init_worker,
                                       initargs=(task, threads, os.getpid(), records))
        pending: set[Future[None]] = set()
        queue = iter(grouped(task, jobs))
        clean = False
        try:
            for job in queue:
                pending.add(executor.submit(_run_in_worker, job))
                if len(pending) >= 2 * self.workers:
                    break
            while pending:
                done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                while not records.empty():  # records of jobs finished so far
                    yield records.get()
                failed: BaseException | None = None
                for future in done:
                    try:
                        future.result()
                    except BrokenExecutor as err:
                        failed = failed or WorkerError(
                            f"a worker process died ({err}); run with --workers 1 to see why")
                        continue
                    except BaseException as err:
                        failed = failed or err
                        continue
                    nxt = next(queue, None)
                    if nxt is not None and failed is None:
                        pending.add(executor.submit(_run_in_worker, nxt))
                if failed is not None:
                    raise failed
            clean = True
        finally:
            if clean:
                executor.shutdown(wait=True)
            else:  # do not wait for jobs whose records would be thrown away
                for proc in list(getattr(executor, "_processes", {}).values()):
                    proc.terminate()
                executor.shutdown(wait=False, cancel_futures=True)
            records.close()


POOLS = ("local", "ray")


def pool(workers: int = 1, kind: str = "local", address: str | None = None) -> Pool:
    """``kind="local"``: :class:`InProcess` for one worker, else :class:`Processes`;
    ``kind="ray"``: ``workers`` Ray actors (:class:`~adaptrack.eval.raypool.RayPool`) on the
    cluster at ``address``, or on a local Ray when it is None.

    >>> type(pool(2)).__name__
    'Processes'
    >>> pool(2, kind="dask")
    Traceback (most recent call last):
    ...
    ValueError: pool kind must be one of local, ray, got 'dask'
    """
    if kind not in POOLS:
        raise ValueError(f"pool kind must be one of {', '.join(POOLS)}, got {kind!r}")
    if kind == "ray":
        from .raypool import RayPool

        return RayPool(workers, address)
    if address is not None:
        raise ValueError(f"address is for kind='ray', got {address!r} with kind='local'")
    return InProcess() if workers == 1 else Processes(workers)
