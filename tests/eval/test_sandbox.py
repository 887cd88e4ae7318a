"""The sandbox that runs generated programs (adaptrack.eval.sandbox): its verdict, its
limits, and the attacks of issue 47, each blocked where bubblewrap isolates."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaptrack.errors import SandboxUnavailableError
from adaptrack.eval import isolation, sandbox
from adaptrack.eval.isolation import unavailable_reason
from adaptrack.eval.sandbox import EXTRA_PROCESSES, run_program

MIB = 2**20
REASON = unavailable_reason()
isolated = pytest.mark.skipif(REASON is not None, reason=f"no isolation here: {REASON}")


def run(source: str, timeout: float = 5.0, memory: int = 512 * MIB):
    """Isolated where this machine allows it (the tests of the verdict and limits hold
    either way)."""
    return run_program(source, timeout=timeout, memory_bytes=memory, allow_unsandboxed=True)


def test_pass_and_failing_assert():
    assert run("assert sum([1, 2]) == 3").status == "pass"
    out = run("def f():\n    return 1\nassert f() == 2, 'f is wrong'")
    assert (out.status, out.detail) == ("fail", "AssertionError: f is wrong")


def test_other_exceptions_and_exit_codes_are_errors():
    out = run("raise KeyError('k')")
    assert (out.status, out.detail) == ("error", "KeyError: 'k'")
    assert run("import sys; sys.exit(3)").status == "error"
    assert run("def f(:\n  pass").detail.startswith("SyntaxError")


@pytest.mark.parametrize("leave", ["import sys; sys.exit(0)", "import os; os._exit(0)",
                                   "raise SystemExit", "exit()"])
def test_leaving_early_with_status_0_is_not_a_pass(leave):
    # The check after the exit fails: the exit status alone would say "pass".
    out = run(f"def f():\n    {leave}\nf()\nassert 1 == 2\n")
    assert (out.status, out.detail) == ("error", "left before its end (exit status 0)")


def test_the_secret_is_not_in_the_output_and_output_is_kept():
    out = run("print('hello')")
    assert (out.status, out.output) == ("pass", "hello\n")


def test_a_lone_surrogate_is_an_outcome_not_an_exception():
    out = run("x = '\ud800'")
    assert out.status == "error" and "surrogate" in out.detail


def test_infinite_loop_times_out():
    out = run("while True:\n    pass", timeout=1.0)
    assert out.status == "timeout"


def test_memory_hog_fails_inside_the_limit():
    out = run("x = bytearray(4 * 2**30)", memory=256 * MIB)
    assert (out.status, out.detail) == ("error", "MemoryError")


def test_writes_land_in_a_private_directory_that_is_removed():
    out = run("import os\nopen('out.txt', 'w').write('hi')\nprint(os.getcwd())")
    assert out.status == "pass", out.output
    cwd = out.output.strip()
    assert cwd != os.getcwd() and "adaptrack-sandbox-" in cwd
    assert not Path(cwd).exists()


def test_environment_is_minimal_and_stdin_closed():
    out = run("import os, sys\nassert 'HOME' in os.environ and len(os.environ) < 10\n"
              "assert sys.stdin.read() == ''")
    assert out.status == "pass", out.output


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="timeout"):
        run_program("pass", timeout=0, memory_bytes=MIB, allow_unsandboxed=True)
    with pytest.raises(ValueError, match="memory_bytes"):
        run_program("pass", timeout=1, memory_bytes=-1, allow_unsandboxed=True)


def test_without_isolation_code_runs_only_when_asked(monkeypatch):
    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "bwrap is not installed")
    with pytest.raises(SandboxUnavailableError, match=r"apt-get install bubblewrap.*"
                                                      r"--unsafe-run-code"):
        run_program("pass", timeout=5, memory_bytes=512 * MIB)
    out = run_program("pass", timeout=5, memory_bytes=512 * MIB, allow_unsandboxed=True)
    assert (out.status, out.isolated) == ("pass", False)


def test_a_missing_bwrap_is_named(monkeypatch):
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    isolation._tools.cache_clear()
    isolation.unavailable_reason.cache_clear()
    try:
        assert "bubblewrap (bwrap) is not installed" in str(isolation.unavailable_reason())
        assert isolation.isolation_prefix("/tmp") == ()
    finally:
        isolation._tools.cache_clear()
        isolation.unavailable_reason.cache_clear()


# -- the attacks (issue 47), where bubblewrap isolates -------------------------------------


def _running(token: str) -> list[int]:
    """Processes whose command line holds ``token``."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and token in Path(entry.path, "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _sleeper(token: str) -> str:
    """Source that replaces the process with ``sleep`` marked by ``token``."""
    return f"os.execv('/bin/sleep', ['sleep', '600', '0.{token}'])"


@isolated
def test_it_runs_as_an_unprivileged_user_and_cannot_read_secrets():
    out = run("import os\nprint(os.getuid())\nprint(open('/etc/shadow').read())")
    assert out.isolated
    assert int(out.output.split()[0]) != 0
    assert out.status == "error" and "/etc/shadow" in out.detail, out.detail
    if os.path.isdir("/root") and os.access("/root", os.R_OK):
        listed = run("import os\nprint(os.listdir('/root'))")
        assert listed.status == "pass" and ".bashrc" not in listed.output


@isolated
def test_it_cannot_write_outside_its_directory(tmp_path):
    tmp_path.chmod(0o777)
    token = secrets.token_hex(6)
    targets = [str(tmp_path / "escape"), f"/dev/shm/adaptrack-{token}",
               f"/var/tmp/adaptrack-{token}", str(Path(__file__).parent / f"x-{token}"),
               f"/adaptrack-{token}"]
    out = run(f"""
for path in {targets!r}:
    try:
        open(path, "w").write("x")
    except OSError as e:
        print(path, type(e).__name__)
""")
    assert out.status == "pass", out.output
    for path in targets:
        assert not os.path.exists(path), f"the program wrote {path}"
    assert "Read-only file system" in run(f"open({targets[-1]!r}, 'w')").detail


@isolated
def test_it_cannot_reach_unix_sockets_of_the_machine(tmp_path):
    tmp_path.chmod(0o777)
    path = str(tmp_path / "s")
    abstract = "\0adaptrack-" + secrets.token_hex(6)
    servers = []
    for address in (path, abstract):
        server = socket.socket(socket.AF_UNIX)
        server.bind(address)
        server.listen()
        server.setblocking(False)
        servers.append(server)
    os.chmod(path, 0o777)
    out = run(f"""
import socket
for address in {[path, abstract]!r}:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(address)
        print("connected", repr(address))
    except OSError as e:
        print("refused", type(e).__name__)
""")
    assert out.status == "pass" and "connected" not in out.output, out.output
    for server in servers:
        with pytest.raises(BlockingIOError):
            server.accept()
        server.close()


@isolated
def test_it_has_no_network():
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    port = server.getsockname()[1]
    out = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
    assert out.status == "error" and ("refused" in out.detail or "unreachable" in out.detail)
    with pytest.raises(BlockingIOError):
        server.accept()
    server.close()
    out = run("import socket\nsocket.create_connection(('192.0.2.1', 9), timeout=2)")
    assert out.status == "error" and "unreachable" in out.detail, out.detail


@isolated
def test_a_fork_bomb_is_refused_and_leaves_nothing():
    token = str(secrets.randbelow(10**12))
    already = sandbox._user_processes(isolation.sandbox_uid())
    out = run(f"""
import os
made = 0
for _ in range(1024):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        {_sleeper(token)}
    made += 1
print(made)
""", timeout=20)
    assert out.status == "pass", out.output
    made = int(out.output.split()[-1])
    assert 0 < made < 1024
    assert made <= EXTRA_PROCESSES + already
    assert _running(token) == [], "forked processes outlived the run"


@isolated
def test_it_cannot_kill_the_harness_or_other_processes():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for target in ("os.getppid()", str(victim.pid), str(os.getpid()), "1", "-1"):
            out = run(f"import os\ntry:\n    os.kill({target}, 9)\nexcept OSError:\n    pass\n")
            assert out.status in ("pass", "error"), out
        assert victim.poll() is None, "the program killed a process outside the sandbox"
    finally:
        victim.kill()
        victim.wait()


@isolated
@pytest.mark.parametrize("leave", ["pass", "while True: pass"])
def test_a_setsid_double_fork_does_not_outlive_the_run(leave):
    token = str(secrets.randbelow(10**12))
    out = run(f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        {_sleeper(token)}
    os._exit(0)
while not any({token!r} in open(f"/proc/{{p}}/cmdline").read()
              for p in os.listdir("/proc") if p.isdigit()):
    time.sleep(0.05)
print("the grandchild runs", flush=True)
{leave}
""", timeout=3)
    assert out.status == ("pass" if leave == "pass" else "timeout"), out.output
    assert "the grandchild runs" in out.output
    assert _running(token) == [], "a grandchild outlived the run"


def test_unsandboxed_the_process_group_is_killed(monkeypatch):
    # Without isolation only the group kill holds: a child in the group dies with the run.
    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "bwrap is not installed")
    token = str(secrets.randbelow(10**12))
    out = run(f"""
import os, time
if os.fork() == 0:
    {_sleeper(token)}
while not any({token!r} in open(f"/proc/{{p}}/cmdline").read()
              for p in os.listdir("/proc") if p.isdigit()):
    time.sleep(0.05)
""", timeout=5)
    assert (out.status, out.isolated) == ("pass", False), out.output
    for _ in range(100):  # SIGKILL is delivered at once; reaping by init may take a moment
        if not _running(token):
            break
        time.sleep(0.05)
    assert _running(token) == [], "a child in the program's process group outlived the run"
