"""Run an evaluation's jobs into a resumable JSONL file, in this process or over workers.

An evaluation is a :class:`Task`: a picklable description (model, sampling options) that
lists its jobs (one problem × method × setting each), loads what it needs once per worker
(:meth:`Task.setup`) and turns one job into one JSON record (:meth:`Task.run`). A
:class:`Pool` runs jobs and yields records as they finish: :class:`InProcess` (one at a
time, here) and :class:`Processes` (local worker processes). A distributed pool (a cluster
queue, Ray, …) is another class with the same ``imap`` method; :func:`run` does not change.

The results file starts with one header line, ``{"header": {...task.config()}}``; each later
line is one job's record, written and flushed as soon as the job finishes. :func:`run` on an
existing file checks that the header matches (else :class:`ResultsMismatchError`, which
says which option differs), skips the jobs already recorded and appends the rest, so an
interrupted run resumes without losing or redoing work. A line cut short by an interrupt is
dropped. One run at a time writes a file (an exclusive lock); every record is stamped with
``started_at`` and ``finished_at`` (epoch seconds) for wall-time reports.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool as BrokenExecutor
from pathlib import Path
from typing import Any, Protocol

from ..errors import AdaptrackError, ResultsMismatchError, WorkerError

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


class Pool(Protocol):
    """Runs jobs of a task and yields their records in the order they finish."""

    def imap(self, task: Task, jobs: list[Job]) -> Iterator[Record]: ...


def _timed(task: Task, job: Job) -> Record:
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


class InProcess:
    """Run jobs one after another in this process."""

    def imap(self, task: Task, jobs: list[Job]) -> Iterator[Record]:
        if jobs:
            task.setup()
        for job in jobs:
            yield _timed(task, job)


_WORKER_TASK: Task | None = None
_WORKER_ERROR: str | None = None


def _init_worker(task: Task, threads: int) -> None:
    global _WORKER_TASK, _WORKER_ERROR
    try:
        task.setup(threads)
    except Exception as err:  # reported with the first job, as the library's error
        _WORKER_ERROR = f"{type(err).__name__}: {err}"
    _WORKER_TASK = task


def _run_in_worker(job: Job) -> Record:
    if _WORKER_ERROR is not None:
        raise WorkerError(f"a worker process could not set up: {_WORKER_ERROR}")
    assert _WORKER_TASK is not None
    return _timed(_WORKER_TASK, job)


class Processes:
    """Spread jobs over ``workers`` local processes, each loading the model once and
    using ``cpus // workers`` threads. Jobs are handed out in order, a few ahead, so
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
        executor = ProcessPoolExecutor(self.workers, mp_context=context,
                                       initializer=_init_worker, initargs=(task, threads))
        pending: set[Future[Record]] = set()
        queue = iter(jobs)
        clean = False
        try:
            for job in queue:
                pending.add(executor.submit(_run_in_worker, job))
                if len(pending) >= 2 * self.workers:
                    break
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                failed: BaseException | None = None
                for future in done:
                    try:
                        record = future.result()
                    except BrokenExecutor as err:
                        failed = failed or WorkerError(
                            f"a worker process died ({err}); run with --workers 1 to see why")
                        continue
                    except BaseException as err:
                        failed = failed or err
                        continue
                    yield record
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


def pool(workers: int = 1) -> Pool:
    """:class:`InProcess` for one worker, else :class:`Processes`."""
    return InProcess() if workers == 1 else Processes(workers)


class ResultsFile:
    """A JSONL results file: a header line, then one record per finished job.

    While open it holds an exclusive lock on the file, so two runs cannot append to it at
    once. ``close()`` releases it.
    """

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.header = header
        self.records: list[Record] = []
        if self.path.suffix == ".gz":
            raise ResultsMismatchError(
                f"{self.path}: runs append to plain JSONL; gunzip it first or pass a .jsonl "
                "name (report reads .gz files)")
        if self.path.is_dir():
            raise ResultsMismatchError(f"{self.path} is a directory; pass a file name")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a+b")  # held open: the lock lives as long as it
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise ResultsMismatchError(
                f"another run is writing {self.path}; wait for it or pass another file"
            ) from None
        try:
            self._file.seek(0)
            data = self._file.read()
            if data:
                self._load(data)
            else:
                self._write_line({"header": header})
        except BaseException:
            self.close()
            raise

    def _load(self, data: bytes) -> None:
        complete = data[: data.rfind(b"\n") + 1]
        try:
            text = complete.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        old, self.records = _parse(text, self.path, "; pass a new file name")
        keys = sorted(set(old) | set(self.header))
        differ = [k for k in keys if old.get(k) != self.header.get(k)]
        if differ:
            shown = ", ".join(f"{k}: file {old.get(k)!r}, now {self.header.get(k)!r}"
                              for k in differ)
            raise ResultsMismatchError(
                f"{self.path} was written with other options ({shown}); resume with the "
                "same options or pass a new file name"
            )
        if len(complete) < len(data):  # a line cut short by an interrupt: drop it
            self._file.truncate(len(complete))

    @property
    def done(self) -> set[str]:
        return {r["key"] for r in self.records}

    def append(self, record: Record) -> None:
        self._write_line(record)
        self.records.append(record)

    def _write_line(self, obj: dict[str, Any]) -> None:
        self._file.seek(0, os.SEEK_END)
        self._file.write((json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8"))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()


def _parse(text: str, path: Path | str, hint: str = "") -> tuple[dict[str, Any], list[Record]]:
    """Header and records of whole JSONL lines (blank lines skipped)."""
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1)
             if line.strip()]
    try:
        first = json.loads(lines[0][1]) if lines else None
    except json.JSONDecodeError:
        first = None
    if not isinstance(first, dict) or "header" not in first:
        raise ResultsMismatchError(
            f"{path} is not an adaptrack results file (no header line){hint}")
    records = []
    for number, line in lines[1:]:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ResultsMismatchError(
                f"{path} line {number} is not JSON ({err.msg}); fix or delete that line"
            ) from None
    return first["header"], records


def read_results(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[Record]]:
    """The header and records of a results file, plain or gzipped (``.gz``); a line cut
    short at the end is ignored."""
    try:
        raw = Path(path).read_bytes()
        data = (gzip.decompress(raw) if str(path).endswith(".gz") else raw).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as err:  # EOFError: a gzip file cut short
        raise AdaptrackError(f"cannot read results file {str(path)!r}: "
                             f"{getattr(err, 'strerror', None) or err}") from None
    return _parse(data[: data.rfind("\n") + 1], path)


def run(
    task: Task,
    path: str | os.PathLike[str],
    workers: Pool | int = 1,
    on_start: Callable[[int, int], None] | None = None,
    on_record: Callable[[Record], None] | None = None,
) -> list[Record]:
    """Run ``task``'s jobs not yet in ``path``, appending each record as it finishes.

    ``workers``: a :class:`Pool` or a number of local processes. ``on_start(done, todo)``
    is called once before any job runs and ``on_record`` after each (progress hooks).
    Returns every record in the file, old and new.
    """
    every = task.jobs()
    keys = [j["key"] for j in every]
    if len(set(keys)) != len(keys):
        raise ValueError("task jobs must have unique keys")
    results = ResultsFile(path, task.config())
    try:
        done = results.done
        jobs = [j for j in every if j["key"] not in done]
        if on_start is not None:
            on_start(len(every) - len(jobs), len(jobs))
        runner = pool(workers) if isinstance(workers, int) else workers
        for record in runner.imap(task, jobs):
            results.append(record)
            if on_record is not None:
                on_record(record)
        return results.records
    finally:
        results.close()


def seed_for(seed: int, *parts: Any) -> int:
    """A stable per-job seed from the run's seed and the job's identity (any order of
    execution gives every job the same random stream)."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


class ModelTask:
    """What tasks that sample from a model share: the model spec and its lazy loading.

    Subclasses are dataclasses with ``model``, ``backend`` and ``device`` fields; the loaded
    model stays out of pickles, so a task travels to workers as its options only.
    """

    model: str | None
    backend: str
    device: str
    _lm: Any = None

    def setup(self, threads: int | None = None) -> None:
        if self._lm is None:
            from ..lm.load import load_model

            self._lm = load_model(self.model, backend=self.backend, device=self.device,
                                  threads=threads)

    @property
    def lm(self) -> Any:
        self.setup()
        return self._lm

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lm"] = None
        return state

    def model_config(self) -> dict[str, Any]:
        return {"model": self.model or "default", "backend": self.backend, "device": self.device}


def check_methods(methods: tuple[str, ...]) -> None:
    """ValueError naming the first unknown method (before any model is loaded)."""
    from ..generate import METHODS

    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}"
                         if bad else "give at least one method")
