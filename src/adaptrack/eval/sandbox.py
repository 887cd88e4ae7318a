"""Run an untrusted generated program in a fresh, limited process (the code tasks' tests).

Generated code never runs in the harness process. :func:`run_program` writes the program
into a private temporary directory and runs ``python -I`` on it there, in a new session
(its own process group) with:

- a wall-clock ``timeout`` (the group is killed when it runs out) and a CPU-time limit
  (``RLIMIT_CPU``) a second above it;
- an address-space limit (``RLIMIT_AS`` = ``memory_bytes``), so a memory hog fails with
  ``MemoryError`` instead of pushing the machine into swap;
- ``RLIMIT_NPROC`` (a fork bomb stops forking where the kernel enforces it; a Firecracker
  VM with Linux 6.18 let 400 forks through a limit of 64, so the timeout and the kill below
  are what bound one there), ``RLIMIT_FSIZE`` (no file over 16 MiB) and no core dumps;
- a minimal environment (``PATH``, ``HOME`` and ``TMPDIR`` pointing at the private
  directory), stdin closed, stdout and stderr into files there (read back, truncated);
- where the machine allows it (``unshare`` from util-linux and user namespaces), a new
  network namespace with no interface but a down loopback (no network) and a new PID
  namespace whose processes all die with the program (a child that escapes the process
  group with ``setsid`` dies too). Without it the program runs with the machine's network;
  :attr:`Outcome.isolated` says which. Inside the namespace the program is PID 1, so a
  signal it sends itself without a handler (``os.kill(os.getpid(), SIGTERM)``) is ignored.

At the end the whole process group is killed and the directory deleted.

What this does **not** protect: the program runs as the harness's user and can read and
write every file that user can (the working directory is private, the file system is not),
it can use the CPU and memory up to the limits above, and it can talk to other processes
of the user (signals, local sockets outside the network namespace). Run evaluations of
untrusted models in a container or as an unprivileged user with nothing to lose.

>>> run_program("assert 1 + 1 == 2", timeout=10, memory_bytes=2**30).status
'pass'
>>> run_program("assert 1 + 1 == 3", timeout=10, memory_bytes=2**30).status
'fail'
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

STATUSES = ("pass", "fail", "timeout", "error")
#: The largest file a program may write (RLIMIT_FSIZE), its own output files included.
FILE_LIMIT = 16 * 2**20
#: Processes a program may start on top of those its user already runs (RLIMIT_NPROC).
EXTRA_PROCESSES = 64
#: Characters of the program's output kept in :attr:`Outcome.output`.
OUTPUT_CHARS = 2000


@dataclass(frozen=True)
class Outcome:
    """How a program ended: ``status`` is ``pass`` (exit status 0), ``fail`` (an
    ``AssertionError``: a test failed), ``timeout`` (killed at the time limit) or ``error``
    (any other exception, a crash, a signal, a resource limit); ``detail`` says which, in a
    line (the exception's last line, ``killed by SIGKILL``, …); ``output`` the tail of
    stdout and stderr; ``isolated`` whether the program ran without network (network and
    PID namespaces)."""

    status: str
    detail: str
    seconds: float
    isolated: bool
    output: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _user_processes() -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) of this real user."""
    uid, count = os.getuid(), 0
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


@cache
def isolation_prefix() -> tuple[str, ...]:
    """The command that puts a program into new network and PID namespaces, if this
    machine allows it to this user (checked once per process by running it), else ``()``.

    >>> isinstance(isolation_prefix(), tuple)
    True
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    # -r: a user namespace, so no privilege is needed; --kill-child: when unshare dies the
    # program (PID 1 of the new namespace) dies, and every process of the namespace with it.
    prefix = (unshare, "--user", "--map-root-user", "--net", "--pid", "--fork",
              "--kill-child")
    probe = "import socket; socket.create_connection(('192.0.2.1', 9), timeout=1)"
    try:
        done = subprocess.run([*prefix, sys.executable, "-I", "-c", probe],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    # Without network the connection fails at once ("Network is unreachable").
    if done.returncode != 0 and "unreachable" in done.stderr:
        return prefix
    return ()


def _limits(timeout: float, memory_bytes: int, processes: int) -> None:
    """Runs in the child between fork and exec: its resource limits."""
    cpu = math.ceil(timeout) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * OUTPUT_CHARS))
            return f.read().decode("utf-8", "replace")[-OUTPUT_CHARS:]
    except OSError:
        return ""


def _verdict(returncode: int, stderr: str) -> tuple[str, str]:
    if returncode == 0:
        return "pass", "exited 0"
    if returncode < 0:
        return "error", f"killed by {signal.Signals(-returncode).name}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else f"exit status {returncode}"
    if last.startswith("AssertionError"):
        return "fail", last[:200]
    if returncode > 128 and not lines:
        return "error", f"exit status {returncode}"
    return "error", last[:200]


def run_program(source: str, *, timeout: float, memory_bytes: int) -> Outcome:
    """Run ``source`` as a Python program in a fresh sandboxed process (module docstring)
    and say how it ended.

    ``timeout``: wall-clock seconds (> 0); ``memory_bytes``: its address-space limit.

    >>> run_program("while True: pass", timeout=0.5, memory_bytes=2**30).status
    'timeout'
    """
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout takes a finite number of seconds > 0, got {timeout!r}")
    if not (isinstance(memory_bytes, int) and memory_bytes > 0):
        raise ValueError(f"memory_bytes takes a positive integer, got {memory_bytes!r}")
    prefix = isolation_prefix()
    # A new user namespace counts its processes from zero; elsewhere the user's count
    # includes everything it already runs.
    processes = EXTRA_PROCESSES + (0 if prefix else _user_processes())
    with tempfile.TemporaryDirectory(prefix="adaptrack-sandbox-") as tmp:
        home = Path(tmp)
        (home / "program.py").write_text(source, encoding="utf-8")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp,
               "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        started = time.monotonic()
        timed_out = False
        with open(home / ".stdout", "wb") as out, open(home / ".stderr", "wb") as err:
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-I", "program.py"], cwd=tmp, env=env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                close_fds=True,
                preexec_fn=lambda: _limits(timeout, memory_bytes, processes))
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # The whole group, also after a normal exit: children it left running.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        seconds = time.monotonic() - started
        stdout, stderr = _tail(home / ".stdout"), _tail(home / ".stderr")
    if timed_out:
        status, detail = "timeout", f"no exit within {timeout:g} s"
    else:
        status, detail = _verdict(proc.returncode, stderr)
        if status == "error" and detail == "killed by SIGXCPU":
            status = "timeout"
    output = (stdout + ("\n" if stdout and stderr else "") + stderr)[-OUTPUT_CHARS:]
    return Outcome(status, detail, seconds, bool(prefix), output)


__all__ = ["STATUSES", "Outcome", "isolation_prefix", "run_program"]
