"""The sandbox that runs generated programs (adaptrack.eval.sandbox)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from adaptrack.eval.sandbox import isolation_prefix, run_program

MIB = 2**20


def run(source: str, timeout: float = 5.0, memory: int = 512 * MIB):
    return run_program(source, timeout=timeout, memory_bytes=memory)


def test_pass_and_failing_assert():
    assert run("assert sum([1, 2]) == 3").status == "pass"
    out = run("def f():\n    return 1\nassert f() == 2, 'f is wrong'")
    assert (out.status, out.detail) == ("fail", "AssertionError: f is wrong")


def test_other_exceptions_and_exit_codes_are_errors():
    out = run("raise KeyError('k')")
    assert (out.status, out.detail) == ("error", "KeyError: 'k'")
    assert run("import sys; sys.exit(3)").status == "error"
    assert run("def f(:\n  pass").detail.startswith("SyntaxError")


def test_infinite_loop_times_out():
    out = run("while True:\n    pass", timeout=1.0)
    assert out.status == "timeout"
    assert out.seconds < 10


def test_memory_hog_fails_inside_the_limit():
    out = run("x = bytearray(4 * 2**30)", memory=256 * MIB)
    assert (out.status, out.detail) == ("error", "MemoryError")


def _watch(path: Path) -> bool:
    """Whether something still appends to ``path`` half a second after the run."""
    before = path.stat().st_size if path.exists() else 0
    time.sleep(0.5)
    return (path.stat().st_size if path.exists() else 0) != before


@pytest.mark.parametrize("escape", [False, True])
def test_child_left_running_is_killed_with_the_program(tmp_path, escape):
    # The child outlives its parent, in its process group or out of it (setsid): the group
    # kill ends the first, the PID namespace the second.
    if escape and not isolation_prefix():
        pytest.skip("no PID namespace here: a child that calls setsid() escapes the group kill")
    beat = tmp_path / "beat"
    source = f"""
import os, time
if os.fork() == 0:
    if {escape}:
        os.setsid()
    while True:
        with open({str(beat)!r}, "a") as f:
            f.write("x")
        time.sleep(0.05)
time.sleep(0.3)
"""
    assert run(source).status == "pass"
    assert beat.exists()
    assert not _watch(beat), "a child of the program still runs after run_program returned"


def test_fork_bomb_is_bounded(tmp_path):
    """Forking without end: NPROC stops it where the kernel enforces the limit, and the
    timeout plus the group (and PID namespace) kill end it and every child either way."""
    beat = tmp_path / "beat"
    source = f"""
import os, time
made = 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        print("fork refused after", made)
        break
    if pid == 0:
        while True:
            with open({str(beat)!r}, "a") as f:
                f.write("x")
            time.sleep(0.2)
    made += 1
time.sleep(60)
"""
    out = run(source, timeout=1.5)
    assert out.status == "timeout"
    assert not _watch(beat), "forked children survived the program"


def test_writes_land_in_a_private_directory_that_is_removed():
    out = run("import os\nopen('out.txt', 'w').write('hi')\nprint(os.getcwd())")
    assert out.status == "pass"
    cwd = out.output.strip()
    assert cwd != os.getcwd() and "adaptrack-sandbox-" in cwd
    assert not Path(cwd).exists()


def test_environment_is_minimal_and_stdin_closed():
    out = run("import os, sys\nassert 'HOME' in os.environ and len(os.environ) < 10\n"
              "assert sys.stdin.read() == ''")
    assert out.status == "pass", out.output


def test_network_is_blocked_where_supported():
    if not isolation_prefix():
        pytest.skip("this machine does not allow unshare's network namespace to this user")
    out = run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert out.isolated
    assert out.status == "error" and "unreachable" in out.detail


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="timeout"):
        run_program("pass", timeout=0, memory_bytes=MIB)
    with pytest.raises(ValueError, match="memory_bytes"):
        run_program("pass", timeout=1, memory_bytes=-1)
