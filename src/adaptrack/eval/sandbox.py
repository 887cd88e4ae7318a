"""Run an untrusted generated program in a fresh, isolated, limited process (the code
tasks' tests).

Generated code never runs in the harness process. :func:`run_program` writes the program
into a private temporary directory and runs it there with ``python -I``:

- isolated by bubblewrap (:mod:`adaptrack.eval.isolation`): as an unprivileged user
  (``nobody`` when the harness is root), on a read-only file system but its own
  directory, with a private ``/tmp``, no network (Unix sockets of the machine included),
  no view of or signal to other processes, and every process it starts (a ``setsid``
  double fork included) killed with it. Where bubblewrap is missing or the kernel refuses
  its namespaces, :func:`run_program` raises
  :class:`~adaptrack.errors.SandboxUnavailableError` unless ``allow_unsandboxed=True``
  (the command line's ``--unsafe-run-code``): then the program runs as the harness's user,
  with its files and network, bounded only by the limits below;
- a wall-clock ``timeout`` (the process group is killed when it runs out) and a CPU-time
  limit (``RLIMIT_CPU``) a second above it; an address-space limit (``RLIMIT_AS`` =
  ``memory_bytes``), so a memory hog fails with ``MemoryError``; ``RLIMIT_NPROC`` (its
  user may run :data:`EXTRA_PROCESSES` more processes than when it started: a fork bomb
  is refused); ``RLIMIT_FSIZE`` (no file over 16 MiB) and no core dumps;
- a minimal environment (``PATH``, ``HOME`` and ``TMPDIR`` pointing at its directory);
  stdout and stderr into files the program cannot reach (read back, truncated).

The verdict comes from the program running to its end, not from its exit status: a
runner reads a random secret of this run from stdin (then /dev/null), runs the program
and prints the secret after its last line. ``pass`` needs exit status 0 *and* the secret:
a program that leaves early (``sys.exit(0)``, ``os._exit(0)``, ``raise SystemExit``,
before or inside the tests) is an ``error``. It defends against a program that exits
early, not against one written to dig the secret out of the runner's memory.

>>> run_program("assert 1 + 1 == 2", timeout=10, memory_bytes=2**30,
...             allow_unsandboxed=True).status
'pass'
>>> run_program("import sys; sys.exit(0)", timeout=10, memory_bytes=2**30,
...             allow_unsandboxed=True).detail
'left before its end (exit status 0)'
"""

from __future__ import annotations

import math
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import SandboxUnavailableError
from .isolation import (
    INSTALL_HINT,
    child_pid,
    isolation_prefix,
    sandbox_uid,
    unavailable_reason,
    wait_gone,
)

STATUSES = ("pass", "fail", "timeout", "error")
#: The largest file a program may write (RLIMIT_FSIZE), its output included.
FILE_LIMIT = 16 * 2**20
#: Processes a program may start on top of those its user already runs (RLIMIT_NPROC).
EXTRA_PROCESSES = 64
#: Characters of the program's output kept in :attr:`Outcome.output`.
OUTPUT_CHARS = 2000
#: Runs ``program.py`` as ``__main__``, then prints the secret it read first from stdin.
#: Exceptions propagate (a traceback, exit status 1); ``SystemExit`` skips the print.
RUNNER = """\
import os, runpy, sys
def _run():
    secret = b""
    while chunk := os.read(0, 256):
        secret += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.argv = ["program.py"]
    runpy.run_path("program.py", run_name="__main__")
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, b"\\n" + secret.strip() + b"\\n")
_run()
"""


@dataclass(frozen=True)
class Outcome:
    """How a program ended: ``status`` is ``pass`` (ran to its end and exited 0), ``fail``
    (an ``AssertionError``: a test failed), ``timeout`` (killed at the time limit) or
    ``error`` (any other exception, an early exit, a crash, a signal, a resource limit);
    ``detail`` says which, in a line (the exception's last line, ``killed by SIGKILL``,
    …); ``output`` the tail of stdout and stderr; ``isolated`` whether it ran in the
    sandbox (:mod:`adaptrack.eval.isolation`) rather than unsandboxed."""

    status: str
    detail: str
    seconds: float
    isolated: bool
    output: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def require_isolation(allow_unsandboxed: bool = False) -> bool:
    """Whether programs will run isolated; :class:`~adaptrack.errors.SandboxUnavailableError`
    when they cannot and ``allow_unsandboxed`` is false.

    >>> isinstance(require_isolation(allow_unsandboxed=True), bool)
    True
    """
    reason = unavailable_reason()
    if reason is None:
        return True
    if allow_unsandboxed:
        return False
    raise SandboxUnavailableError(
        f"generated code cannot run isolated here: {reason}; {INSTALL_HINT}, or pass "
        "--unsafe-run-code (allow_unsandboxed=True) to run it as your own user, with your "
        "files and network")


def _user_processes(uid: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) of the real user ``uid``."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


def _limits(timeout: float, memory_bytes: int, processes: int) -> None:
    """Runs in the child between fork and exec: its resource limits."""
    cpu = math.ceil(timeout) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def _tail(f: IO[bytes]) -> str:
    f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * OUTPUT_CHARS))
    return f.read().decode("utf-8", "replace")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _verdict(returncode: int, stderr: str, ended: bool) -> tuple[str, str]:
    if returncode == 0:
        return ("pass", "ran to its end") if ended else (
            "error", "left before its end (exit status 0)")
    if returncode < 0:
        return "error", f"killed by {_signal_name(-returncode)}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else f"exit status {returncode}"
    if last.startswith("AssertionError"):
        return "fail", last[:200]
    if returncode > 128 and not lines:
        # bwrap reports a program killed by a signal as 128 + its number.
        return "error", f"killed by {_signal_name(returncode - 128)}"
    return "error", last[:200]


def _check_limits(timeout: float, memory_bytes: int) -> None:
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout takes a finite number of seconds > 0, got {timeout!r}")
    if not (isinstance(memory_bytes, int) and memory_bytes > 0):
        raise ValueError(f"memory_bytes takes a positive integer, got {memory_bytes!r}")


def _wait(proc: subprocess.Popen[bytes], secret: bytes, timeout: float) -> bool:
    """Hand the program its secret and wait; whether it ran out of time. The whole group
    is killed either way (children it left running)."""
    try:
        assert proc.stdin is not None
        try:
            proc.stdin.write(secret)
            proc.stdin.close()
        except OSError:  # BrokenPipeError: it died before reading
            pass
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        return True
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _wait_namespace(info_r: int) -> None:
    """After bwrap is killed: wait until every process of the program is gone."""
    os.set_blocking(info_r, False)
    try:
        info = os.read(info_r, 4096)
    except BlockingIOError:  # bwrap died before writing: no namespace to wait for
        info = b""
    finally:
        os.close(info_r)
    pid = child_pid(info)
    if pid is not None:
        wait_gone(pid)


def run_program(source: str, *, timeout: float, memory_bytes: int,
                allow_unsandboxed: bool = False) -> Outcome:
    """Run ``source`` as a Python program in a fresh sandboxed process (module docstring)
    and say how it ended.

    ``timeout``: wall-clock seconds (> 0); ``memory_bytes``: its address-space limit;
    ``allow_unsandboxed``: run it without isolation where none is available instead of
    raising :class:`~adaptrack.errors.SandboxUnavailableError`.

    >>> run_program("while True: pass", timeout=0.5, memory_bytes=2**30,
    ...             allow_unsandboxed=True).status
    'timeout'
    """
    _check_limits(timeout, memory_bytes)
    isolated = require_isolation(allow_unsandboxed)
    try:
        data = source.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: no Python source has one
        return Outcome("error", f"UnicodeEncodeError: {e.reason} at character {e.start} "
                       "of the program", 0.0, isolated)
    uid = sandbox_uid() if isolated else os.getuid()
    processes = EXTRA_PROCESSES + _user_processes(uid)
    secret = secrets.token_hex(16).encode()
    with (tempfile.TemporaryDirectory(prefix="adaptrack-sandbox-",
                                      ignore_cleanup_errors=True) as tmp,
          tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err):
        (Path(tmp) / "program.py").write_bytes(data)
        if isolated and uid != os.getuid():
            os.chown(tmp, uid, -1)
        info_r, info_w = os.pipe() if isolated else (-1, -1)
        prefix = isolation_prefix(tmp, info_w) if isolated else ()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp,
               "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-I", "-c", RUNNER], cwd=tmp, env=env,
                stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True,
                close_fds=True, pass_fds=(info_w,) if isolated else (),
                preexec_fn=lambda: _limits(timeout, memory_bytes, processes))
        finally:
            if isolated:
                os.close(info_w)
        timed_out = _wait(proc, secret + b"\n", timeout)
        if isolated:
            _wait_namespace(info_r)
        seconds = time.monotonic() - started
        stdout, stderr = _tail(out), _tail(err)
    ended = ("\n" + secret.decode() + "\n") in stdout
    stdout = stdout.replace("\n" + secret.decode() + "\n", "")
    if timed_out:
        status, detail = "timeout", f"no exit within {timeout:g} s"
    else:
        status, detail = _verdict(proc.returncode, stderr, ended)
        if status == "error" and detail == "killed by SIGXCPU":
            status = "timeout"
    output = (stdout + ("\n" if stdout and stderr else "") + stderr)[-OUTPUT_CHARS:]
    return Outcome(status, detail, seconds, isolated, output)


__all__ = ["EXTRA_PROCESSES", "STATUSES", "Outcome", "require_isolation", "run_program"]
