"""Run an evaluation's jobs into a resumable JSONL file, in this process or over workers.

An evaluation is a :class:`Task`: a picklable description (model, sampling options) that
lists its jobs (one problem × method × setting each), loads what it needs once per worker
(:meth:`Task.setup`) and turns one job into one JSON record (:meth:`Task.run`; a task
may also run a group of jobs together, ``run_many``, to share batched model calls). A
:class:`Pool` runs jobs and yields records as they finish (:mod:`~adaptrack.eval.pools`:
in this process, local worker processes, Ray actors); :func:`run` does not depend on which.

The results file starts with one header line, ``{"header": {...task.config()}}``; each
later line is one job's record, written and flushed as soon as the job finishes: a group of
jobs served by one engine hands over each record when its job's calls are done
(``run_each``; the API tasks), so ``kill -9`` loses only the jobs in flight. The code tasks
score a problem's completions after its group's generation, and a Ray actor returns a whole
group. :func:`run` on an existing file checks that the header matches (else
:class:`ResultsMismatchError`, which says which option differs), skips the jobs already
recorded and appends the rest, so an interrupted run resumes without losing or redoing
work. A line cut short by an interrupt is dropped. One run at a time writes a file (an
exclusive lock); every record is stamped with ``started_at`` and ``finished_at`` (epoch
seconds) for wall-time reports.

Resuming and reporting read a file the same way (:func:`parse_results`): a path that is not
a regular file is refused unread (a device or a FIFO may never end), no line may exceed
:data:`LINE_LIMIT`, and every line is checked against its task's declaration (the header
fields and record check of :mod:`~adaptrack.eval.registry`), so a bad file fails with
one :class:`ResultsMismatchError` that names the line (docs/design.md §6), and a run never
appends to a file its report could not read.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, BinaryIO

from ..errors import AdaptrackError, JSONDepthError, ResultsMismatchError
from ..errors import WorkerError as WorkerError
from ..limits import loads
from .checks import INT as INT
from .checks import NUMBER as NUMBER
from .checks import POSITIVE as POSITIVE
from .checks import STR as STR
from .checks import Check as Check
from .checks import fields
from .jobs import Job as Job
from .jobs import Pool as Pool
from .jobs import Record as Record
from .jobs import Task as Task
from .jobs import available_cpus as available_cpus
from .jobs import group_size as group_size
from .jobs import grouped as _groups  # noqa: F401  (the name tests and older code use)
from .modeltask import ModelTask as ModelTask
from .modeltask import check_methods as check_methods
from .modeltask import check_study as check_study
from .modeltask import seed_for as seed_for
from .pools import POOLS as POOLS
from .pools import InProcess as InProcess
from .pools import Processes as Processes
from .pools import pool as pool
from .registry import HEADERS as HEADERS
from .registry import RECORDS as RECORDS

LINE_LIMIT = 64 * 2**20
"""The longest line a results file may hold, in bytes. Reading stops there, so a huge or
endless input fails fast instead of filling memory; a binary record of 2,000 samples takes
about 128 KB and a TFv1 record about 2 KB."""

_KINDS = {stat.S_IFDIR: "directory", stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket",
          stat.S_IFCHR: "character device", stat.S_IFBLK: "block device"}


def _refuse_unless_regular(mode: int, path: str | os.PathLike[str]) -> None:
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "special file")
        raise ResultsMismatchError(
            f"{path} is a {kind}, not a regular file; pass a results file name")


def check_regular(path: str | os.PathLike[str]) -> None:
    """:class:`ResultsMismatchError` if ``path`` exists and is not a regular file (a
    device, a FIFO, a socket, a directory), whose reading may never end; a missing path is
    fine (a run creates it).

    >>> check_regular("/dev/null")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    adaptrack.errors.ResultsMismatchError: /dev/null is a character device, not a regular ...
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    _refuse_unless_regular(mode, path)


def _open_regular(path: Path, flags: int) -> BinaryIO:
    """``path`` opened without blocking (a FIFO would block at open) and checked again once
    open, in case it was replaced after :func:`check_regular`."""
    check_regular(path)
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        _refuse_unless_regular(os.fstat(fd).st_mode, path)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "a+b" if flags & os.O_RDWR else "rb")


class ResultsFile:
    """A JSONL results file: a header line, then one record per finished job.

    While open it holds an exclusive lock on the file, so two runs cannot append to it at
    once. ``close()`` releases it. An existing file is appended to only if every line passes
    :func:`parse_results` and its header equals ``header``.
    """

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.header = header
        self.records: list[Record] = []
        if self.path.suffix == ".gz":
            raise ResultsMismatchError(
                f"{self.path}: runs append to plain JSONL; gunzip it first or pass a .jsonl "
                "name (report reads .gz files)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # held open: the lock lives as long as it
        self._file = _open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise ResultsMismatchError(
                f"another run is writing {self.path}; wait for it or pass another file"
            ) from None
        try:
            size = os.fstat(self._file.fileno()).st_size
            if size:
                self._load(size)
            else:
                self._write_line({"header": header})
        except BaseException:
            self.close()
            raise

    def _load(self, size: int) -> None:
        self._file.seek(0)
        old, self.records, complete = parse_results(self._file, self.path,
                                                    "; pass a new file name")
        old = {**{k: v for k, v in ADDED_LATER.items() if k in self.header}, **old}
        keys = sorted(set(old) | set(self.header))
        differ = [k for k in keys if old.get(k) != self.header.get(k)]
        if differ:
            shown = ", ".join(f"{k}: file {old.get(k)!r}, now {self.header.get(k)!r}"
                              for k in differ)
            raise ResultsMismatchError(
                f"{self.path} was written with other options ({shown}); resume with the "
                "same options or pass a new file name"
            )
        if complete < size:  # a line cut short by an interrupt: drop it
            self._file.truncate(complete)

    @property
    def done(self) -> set[str]:
        return {r["key"] for r in self.records}

    def append(self, record: Record) -> None:
        self._write_line(record)
        self.records.append(record)

    def _write_line(self, obj: dict[str, Any]) -> None:
        line = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")
        if len(line) > LINE_LIMIT:  # refused unwritten, so the file stays readable
            raise ResultsMismatchError(
                f"the record of job {obj.get('key')!r} takes {len(line) / 2**20:.0f} MiB, "
                f"over the {LINE_LIMIT // 2**20} MiB line limit of results files; run it "
                "with fewer samples (-n)")
        self._file.seek(0, os.SEEK_END)
        self._file.write(line)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()


#: Header options added after results files were written, with the value those files ran
#: with: such a file resumes under that value.
ADDED_LATER: dict[str, Any] = {"allow_truncated": False}


def _json_kind(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def parse_results(file: IO[bytes] | gzip.GzipFile, path: str | os.PathLike[str], hint: str = ""
                  ) -> tuple[dict[str, Any], list[Record], int]:
    """The header, the records and the byte length of the whole lines of a results file
    open for reading, each line checked: the header is an object with a ``task`` name and
    options of the right types (:data:`HEADERS`), each record an object holding what its
    task's records hold (:data:`RECORDS`). A job's later lines (a record written twice,
    files joined) are left out: the first one counts. Blank lines are skipped; a last line
    without a newline (cut short by an interrupt) is left out of all three. Anything else raises
    :class:`ResultsMismatchError` naming the line and what is wrong with it.

    >>> import io
    >>> text = b'{"header": {"task": "mine"}}\\n{"key": "a", "x": 1}\\n{"key": "b", "x'
    >>> parse_results(io.BytesIO(text), "r.jsonl")
    ({'task': 'mine'}, [{'key': 'a', 'x': 1}], 50)
    >>> parse_results(io.BytesIO(text.replace(b'{"key": "a", "x": 1}', b'[1]')), "r.jsonl")
    Traceback (most recent call last):
    ...
    adaptrack.errors.ResultsMismatchError: r.jsonl line 2 is not a JSON object but an array; ...
    """
    fix = "; fix or delete that line"
    header: dict[str, Any] | None = None
    records: list[Record] = []
    keys: set[str] = set()
    size = number = 0
    while True:
        raw = file.readline(LINE_LIMIT + 1)
        if not raw:
            break
        number += 1
        if not raw.endswith(b"\n"):
            if len(raw) > LINE_LIMIT:
                raise ResultsMismatchError(
                    f"{path} line {number} is longer than {LINE_LIMIT // 2**20} MiB; "
                    f"results files hold no such lines{hint}")
            break  # the last line, cut short: its job is redone on resume
        size += len(raw)
        if not raw.strip():
            continue
        try:
            obj = loads(raw, f"{path} line {number}")
        except JSONDepthError as err:
            raise ResultsMismatchError(f"{err}{fix}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            if header is None:
                break
            why = err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8"
            raise ResultsMismatchError(f"{path} line {number} is not JSON ({why}){fix}"
                                       ) from None
        if header is None:
            if not (isinstance(obj, dict) and isinstance(obj.get("header"), dict)
                    and isinstance(obj["header"].get("task"), str)):
                break
            header = obj["header"]
            wrong = fields(header, {}, HEADERS.get(header["task"], {}))
            if wrong:
                raise ResultsMismatchError(f"{path}: header option {wrong}{hint}")
            continue
        record = _record(obj, header["task"], f"{path} line {number}", fix)
        if record["key"] not in keys:  # a line written twice (files joined): counted once
            keys.add(record["key"])
            records.append(record)
    if header is None:
        raise ResultsMismatchError(
            f"{path} is not an adaptrack results file (no header line){hint}")
    return header, records, size


def _record(obj: Any, task: str, where: str, fix: str) -> Record:
    """``obj`` if it is a record of ``task``, else the error that says why not."""
    if not isinstance(obj, dict):
        raise ResultsMismatchError(f"{where} is not a JSON object but {_json_kind(obj)}{fix}")
    if "header" in obj:
        raise ResultsMismatchError(
            f"{where} is a second header (two results files joined?){fix}")
    if not isinstance(obj.get("key"), str):
        raise ResultsMismatchError(f"{where} has no 'key' string, which every record has{fix}")
    check = RECORDS.get(task)
    wrong = check(obj) if check else None
    if wrong:
        other = [t for t, c in RECORDS.items() if t != task and c(obj) is None]
        also = f"; it is a {other[0]} record" if other else ""
        raise ResultsMismatchError(f"{where} is not a {task} record: {wrong}{also}{fix}")
    return obj


def read_results(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[Record]]:
    """The header and records of a results file, plain or gzipped (``.gz``), checked as
    :func:`parse_results` says; a line cut short at the end is ignored."""
    try:
        with _open_regular(Path(path), os.O_RDONLY) as raw:
            if str(path).endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                    header, records, _ = parse_results(unzipped, path)
            else:
                header, records, _ = parse_results(raw, path)
    except (OSError, EOFError, zlib.error) as err:  # EOFError: a gzip file cut short
        raise AdaptrackError(f"cannot read results file {str(path)!r}: "
                             f"{getattr(err, 'strerror', None) or err}") from None
    return header, records


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
