"""The isolation the sandbox runs generated programs in: bubblewrap (``bwrap``).

:func:`isolation_prefix` is the command that runs a program in a directory ``WORKDIR``
with

- the whole file system read-only (``--ro-bind / /``) except ``WORKDIR``, with a private,
  empty ``/tmp``, ``/var/tmp``, ``/run``, ``/dev`` and ``/dev/shm`` (so no Unix socket of
  the machine in those is reachable) and the home directories hidden (``/root``,
  ``/home`` and ``$HOME``; the interpreter's own directories are bound back read-only
  where they lie inside them);
- new network, PID, IPC, UTS and cgroup namespaces: no network (a down loopback, and no
  abstract Unix sockets of the machine), no signal to any process outside, and when
  bwrap dies every process of the program dies with it (``--die-with-parent`` on the
  namespace's first process), a ``setsid`` double fork included;
- an unprivileged user: started by root, bwrap drops to ``nobody`` (uid 65534) with
  ``setpriv`` after mounting (a user namespace would map its users back to root, who may
  read ``/etc/shadow``), with no capabilities and ``no_new_privs``; started by another
  user, it runs as that user, in a user namespace, with no capabilities.

:func:`sandbox_uid` is the user the program runs as, whose processes ``RLIMIT_NPROC``
counts. :func:`unavailable_reason` says why no isolation is available here (no ``bwrap``,
no ``setpriv``, or the kernel refuses the namespaces), probing once per process.

>>> prefix = isolation_prefix("/tmp/x")
>>> prefix == () or prefix[0].endswith("bwrap")
True
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

#: What to install where :func:`unavailable_reason` finds no isolation.
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: "
                "dnf install bubblewrap)")
_PRIVATE = ("/tmp", "/var/tmp", "/run")
_HIDDEN = ("/root", "/home")


def sandbox_uid() -> int:
    """The uid a sandboxed program runs as: ``nobody`` when the harness is root, else the
    harness's own user.

    >>> sandbox_uid() == (_nobody()[0] if os.geteuid() == 0 else os.getuid())
    True
    """
    return _nobody()[0] if os.geteuid() == 0 else os.getuid()


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return 65534, 65534
    return entry.pw_uid, entry.pw_gid


def _inside(path: str, parents: list[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)


def _interpreter_dirs(hidden: list[str]) -> list[str]:
    """The interpreter's directories that the hidden ones would hide: bound back."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    dirs.add(os.path.dirname(os.path.realpath(sys.executable)))
    kept = sorted(d for d in dirs if os.path.isdir(d) and _inside(d, hidden))
    return [d for d in kept if not _inside(d, [k for k in kept if k != d])]


def _mounts(workdir: str) -> list[str]:
    hidden = list(_HIDDEN)
    home = os.path.realpath(os.path.expanduser("~"))
    if home != "/" and not _inside(home, [*_PRIVATE, *hidden]):
        hidden.append(home)
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for path in [*_PRIVATE, *hidden]:
        if os.path.isdir(path):
            args += ["--tmpfs", path]
    for path in _interpreter_dirs([*_PRIVATE, *hidden]):
        args += ["--ro-bind", path, path]
    return [*args, "--bind", workdir, workdir, "--chdir", workdir]


def _command(bwrap: str, setpriv: str | None, workdir: str,
             info_fd: int | None = None) -> tuple[str, ...]:
    info = [] if info_fd is None else ["--info-fd", str(info_fd)]
    namespaces = [*info, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                  "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if setpriv is None:  # not root: a user namespace, no capabilities in it
        user = ["--unshare-user", "--cap-drop", "ALL", "--"]
    else:
        uid, gid = _nobody()
        # bwrap keeps only these two capabilities for setpriv, which gives them up (and
        # every other) when it changes the uid; no_new_privs bars setuid binaries.
        user = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", setpriv,
                f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--"]
    return (bwrap, *_mounts(workdir), *namespaces, *user)


@cache
def _tools() -> tuple[str, str | None] | str:
    """(bwrap, setpriv or None when not root), or why they are missing."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() != 0:
        return bwrap, None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "setpriv (util-linux), which drops root to nobody, is not installed"
    return bwrap, setpriv


@cache
def unavailable_reason() -> str | None:
    """Why generated code cannot run isolated here, or ``None`` when it can (checked once
    per process by running a program under :func:`isolation_prefix`).

    >>> unavailable_reason() is None or isinstance(unavailable_reason(), str)
    True
    """
    tools = _tools()
    if isinstance(tools, str):
        return tools
    with tempfile.TemporaryDirectory(prefix="adaptrack-probe-") as tmp:
        if os.geteuid() == 0:
            os.chown(tmp, *_nobody())
        probe = "import os; print(os.getuid())"
        try:
            done = subprocess.run([*_command(*tools, tmp), sys.executable, "-I", "-c", probe],
                                  capture_output=True, text=True, timeout=30,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bubblewrap failed to start: {e}"
    if done.returncode != 0 or done.stdout.strip() != str(sandbox_uid()):
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"bubblewrap cannot create its namespaces here ({last})"
    return None


def isolation_prefix(workdir: str, info_fd: int | None = None) -> tuple[str, ...]:
    """The command that runs a program isolated in ``workdir`` (module docstring), or
    ``()`` where :func:`unavailable_reason` finds none. Started by root, ``workdir`` must
    belong to :func:`sandbox_uid` for the program to write in it. ``info_fd``: a file
    descriptor bwrap writes ``{"child-pid": N}`` to, N the PID namespace's first process,
    whose end is the end of every process of the program (:func:`wait_gone`)."""
    tools = _tools()
    if isinstance(tools, str) or unavailable_reason() is not None:
        return ()
    return _command(*tools, workdir, info_fd)


def child_pid(info: bytes) -> int | None:
    """The namespace's first process from what bwrap wrote to its ``--info-fd``.

    >>> child_pid(b'{\\n    "child-pid": 42\\n}\\n'), child_pid(b"")
    (42, None)
    """
    try:
        first = json.JSONDecoder().raw_decode(info.decode("utf-8", "replace").lstrip())[0]
    except ValueError:
        return None
    pid = first.get("child-pid") if isinstance(first, dict) else None
    return pid if isinstance(pid, int) and pid > 0 else None


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    """Wait until process ``pid`` has exited (gone or a zombie); whether it did within
    ``seconds``. The kernel ends a PID namespace's first process only after every other
    process of the namespace is gone, so this waits for all of them."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
            return True
        time.sleep(0.01)
    return False


__all__ = ["INSTALL_HINT", "child_pid", "isolation_prefix", "sandbox_uid", "unavailable_reason",
           "wait_gone"]
