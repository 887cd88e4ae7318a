"""TFv1Real (the AdapTrack paper's §6.1, Table 2): real code cut at its first v1-only call.

The problems come from Python files of pinned PyPI packages (``data/tfv1real-packages.txt``,
or a list of one's own), downloaded with ``pip download --no-deps`` into the cache directory
at evaluation time; nothing from them is committed. The paper's rules, per file:

1. Python files only (``*.py`` in the wheel or sdist);
2. split at the first ``tf.compat.v1`` *in code*: the tokens ``tf`` ``.`` ``compat`` ``.``
   ``v1`` written together, outside comments and strings (:mod:`tokenize`; an f-string
   counts as a string, also on Pythons that tokenize its fields);
3. drop the file if the text before the split holds ``tf.compat.v1`` anywhere (in a
   comment, a docstring, a string);
4. keep it only if the text at the split is a call ``tf.compat.v1.<dotted name>(``: the
   prompt is everything before it up to and including ``tf``, the oracle the rest of the
   name (``.compat.v1.placeholder``), which the model completes as in TFv1's v2 setting;
5. drop prompts longer than :data:`MAX_PROMPT_TOKENS` tokens of the model's tokenizer (the
   paper's 4 096 minus 512 for the completion);
6. drop duplicates, keeping the first in package-list order, then path order: **exact**
   ones (the same oracle and the same prompt once blank lines are removed and runs of
   whitespace collapsed) and **near** ones (the same oracle and a Jaccard similarity of
   at least :data:`NEAR_DUPLICATE` between the sets of the two prompts' code lines:
   non-blank, not only a comment, whitespace collapsed). Comment lines are left out
   because most of these packages open every file with the same 13-line license header,
   which makes any two short files look alike. On the default list, pairs with one oracle
   fall into two groups: 0.81 to 1.0 (a file vendored into another package, a ``v1/``
   copy, tests generated from one template) and 0.71 or less (files that share imports);
   nothing lies between.

Each problem keeps its provenance: package, version, path inside the distribution and the
package's license (from its metadata: ``License-Expression``, else a one-line ``License``
field, else the license classifiers).

**Downloads and the cache.** :func:`cached_dist` tries, in turn, a wheel for any Python, a
Linux wheel built for CPython 3.10 down to 3.6 (the Python files are those of every
platform), then the sdist, for which pip runs the package's ``setup.py`` to read its
metadata (tensorflow-plot and texar of the default list have only an sdist). Files go to
``cache_dir() / "dists"``; a build is kept as JSON in ``cache_dir() / "tfv1real"``, keyed
by the package list, the tokenizer and :data:`RULES_VERSION`.

**The default list** (36 packages, the default model's tokenizer; all download): 5 254
Python files, of which 4 592 hold no ``tf.compat.v1`` in code, 20 hold it earlier in a
comment or string and 100 not at a call; 542 split, 42 prompts too long, 2 exact and 7
near duplicates: **491 problems** with 123 distinct oracles, 63 of them among TFv1's 416
APIs; prompts of 902 tokens at the median, 1 189 on average, 3 541 at most. 19 problems
(9 oracles) call names that TensorFlow 2.16.1's API modules do not list (the Keras-backed
``compat.v1.layers.*`` and ``compat.v1.keras.*``, a class method, ``estimator``), which no
constrained method can write in the v2 setting; they stay, as the rules keep them.

>>> split("import tensorflow as tf\\nx = tf.compat.v1.placeholder(tf.float32)\\n")
('import tensorflow as tf\\nx = tf', '.compat.v1.placeholder')
>>> split("# tf.compat.v1 is gone in 3.0\\nx = tf.compat.v1.placeholder()\\n")
'earlier'
>>> split("s = tf.compat.v1.Session\\n")
'not_call'
"""

from __future__ import annotations

import email.parser
import hashlib
import io
import json
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import tokenize
import zipfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import AdaptrackError
from ..lm.default import cache_dir
from .jobs import Job
from .tfv1 import ApiProblem, ApiTask

#: The longest prompt kept, in tokens of the model's tokenizer (the paper: 4 096 - 512).
MAX_PROMPT_TOKENS = 3584
#: Jaccard similarity of code-line sets from which two prompts with one oracle are duplicates.
NEAR_DUPLICATE = 0.8
#: Changes whenever the rules change what a build gives, so a cached build is not reused.
RULES_VERSION = 1

#: Why a file gives no problem (:func:`split`'s answers besides a problem).
REASONS = {
    "none": "no tf.compat.v1 in code",
    "earlier": "tf.compat.v1 in a comment or string before the first one in code",
    "not_call": "the first tf.compat.v1 in code is not a call of a name under it",
    "unreadable": "not text in its encoding, or does not tokenize before its first "
                  "tf.compat.v1",
}

_CALL = re.compile(r"tf\.compat\.v1((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\(")
_V1 = ("tf", ".", "compat", ".", "v1")
# Token types between which "tf.compat.v1" is not code: f-strings' fields (Python 3.12+).
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


class TFv1RealDataError(AdaptrackError):
    """A package of TFv1Real's list could not be downloaded or read."""


def _first_in_code(source: str) -> int | None:
    """Offset of the first ``tf.compat.v1`` written as code, or None; raises
    :class:`tokenize.TokenError` or :class:`SyntaxError` when the file stops tokenizing
    before one."""
    starts = [0]
    for line in source.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    window: list[tokenize.TokenInfo] = []
    fstrings = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == _FSTRING_START:
            fstrings += 1
        elif tok.type == _FSTRING_END:
            fstrings -= 1
        if fstrings or tok.type not in (tokenize.NAME, tokenize.OP):
            window = []
            continue
        if window and window[-1].end != tok.start:  # not written together
            window = []
        window = [*window[-4:], tok]
        if len(window) == 5 and tuple(t.string for t in window) == _V1:
            row, col = window[0].start
            return starts[row - 1] + col
    return None


def split(source: str) -> tuple[str, str] | str:
    """The (prompt, oracle) of one Python file by the rules of the module docstring, or the
    key in :data:`REASONS` of why it gives none. Line ends are normalized to ``\\n``.

    >>> split("'''Uses tf.compat.v1.Session.'''\\nimport tensorflow as tf\\n")
    'none'
    >>> split('x = f"{tf.compat.v1.x()}"\\ny = tf.compat.v1.layers.dense(x)\\n')
    'earlier'
    """
    source = source.replace("\r\n", "\n").replace("\r", "\n")
    if "tf.compat.v1" not in source:
        return "none"
    try:
        at = _first_in_code(source)
    except (tokenize.TokenError, SyntaxError):
        return "unreadable"
    if at is None:
        return "none"
    before = source[:at]
    if "tf.compat.v1" in before:
        return "earlier"
    call = _CALL.match(source, at)
    if call is None:
        return "not_call"
    return before + "tf", ".compat.v1" + call.group(1)


# -- packages -----------------------------------------------------------------------------

_REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)")


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
            if not _REQUIREMENT.fullmatch(word):
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
    match = _REQUIREMENT.fullmatch(requirement)
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


def _text(data: bytes) -> str | None:
    """A source file's text (PEP 263 encoding, UTF-8 by default), or None if it is not text."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding).removeprefix("\ufeff")
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return None


# -- problems ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealProblem:
    """One TFv1Real problem: ``prompt`` (real code ending in ``tf``) and ``oracle``
    (``{"v2": ".compat.v1.…"}``), with its provenance and the prompt's length in tokens;
    ``duplicates`` names the files dropped as its duplicates."""

    package: str
    version: str
    path: str
    license: str
    prompt: str
    oracle: dict[str, str]
    prompt_tokens: int = 0
    duplicates: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """``package==version/path``: unique in a build."""
        return f"{self.package}=={self.version}/{self.path}"

    @property
    def api(self) -> str:
        """The TF 2 name the oracle calls (``compat.v1.placeholder``)."""
        return self.oracle["v2"][1:]


def _lines(prompt: str) -> list[str]:
    return [" ".join(line.split()) for line in prompt.split("\n") if line.strip()]


def _code_lines(prompt: str) -> set[str]:
    return {line for line in _lines(prompt) if not line.startswith("#")}


def near_duplicate(a: str, b: str, threshold: float = NEAR_DUPLICATE) -> bool:
    """Whether two prompts are near duplicates: the Jaccard similarity of their sets of
    code lines (non-blank, not only a comment, whitespace collapsed) is at least
    ``threshold``.

    >>> head = "# Copyright 2019\\n# Licensed under the Apache License\\nimport tf\\n"
    >>> near_duplicate(head + "x = 1\\ny = 2\\nz = tf",
    ...                "# (c) 2020\\nimport tf\\nx  = 1\\ny = 2\\nz = tf")
    True
    >>> near_duplicate(head + "x = 1\\ny = 2\\nz = tf", head + "x = 1\\nw = 2\\nz = tf")
    False
    """
    return _jaccard(_code_lines(a), _code_lines(b)) >= threshold


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def deduplicate(problems: Sequence[RealProblem], threshold: float = NEAR_DUPLICATE
                ) -> tuple[list[RealProblem], int, int]:
    """``problems`` without exact and near duplicates (module docstring), keeping the first
    of each; each kept problem's ``duplicates`` names the dropped ones. Returns the kept
    problems, the number of exact and of near duplicates dropped.

    >>> f, g = {"v2": ".compat.v1.f"}, {"v2": ".compat.v1.g"}
    >>> p = [RealProblem("a", "1", "x.py", "MIT", "import tf\\nx = tf", f),
    ...      RealProblem("b", "2", "y.py", "MIT", "import tf\\n\\nx  =  tf", f),
    ...      RealProblem("c", "3", "z.py", "MIT", "import tf\\nx = tf", g)]
    >>> kept, exact, near = deduplicate(p)
    >>> [k.id for k in kept], kept[0].duplicates, exact, near
    (['a==1/x.py', 'c==3/z.py'], ('b==2/y.py',), 1, 0)
    """
    kept: list[RealProblem] = []
    dropped: dict[int, list[str]] = defaultdict(list)
    seen: dict[tuple[str, str], int] = {}
    by_oracle: dict[str, list[tuple[set[str], int]]] = defaultdict(list)
    exact = near = 0
    for p in problems:
        key = (p.oracle["v2"], "\n".join(_lines(p.prompt)))
        if key in seen:
            dropped[seen[key]].append(p.id)
            exact += 1
            continue
        found = _code_lines(p.prompt)
        twin = next((i for other, i in by_oracle[p.oracle["v2"]]
                     if _jaccard(found, other) >= threshold), None)
        if twin is not None:
            dropped[twin].append(p.id)
            near += 1
            continue
        seen[key] = len(kept)
        by_oracle[p.oracle["v2"]].append((found, len(kept)))
        kept.append(p)
    out = [RealProblem(**{**asdict(p), "duplicates": tuple(dropped[i])}) if dropped[i] else p
           for i, p in enumerate(kept)]
    return out, exact, near


@dataclass
class PackageStats:
    """What one package gave: its Python files, what :func:`split` said of them, how many
    prompts were too long, and the problems left after deduplication."""

    requirement: str
    file: str = ""
    license: str = ""
    python_files: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    split: int = 0
    too_long: int = 0
    kept: int = 0


@dataclass
class ProblemSet:
    """A TFv1Real build: the problems (sorted by id), the package list and tokenizer it was
    built for, per-package statistics, and the duplicates dropped."""

    problems: list[RealProblem]
    packages: tuple[str, ...]
    tokenizer: str
    stats: list[PackageStats]
    exact_duplicates: int = 0
    near_duplicates: int = 0

    def summary(self) -> dict[str, Any]:
        """Files, usable problems, distinct oracles, and how many of those oracles are
        among TFv1's v1-only APIs (:func:`adaptrack.eval.tfv1.v1_only_apis`)."""
        from .tfv1 import v1_only_apis

        oracles = {p.api for p in self.problems}
        reasons: Counter[str] = Counter()
        for s in self.stats:
            reasons.update(s.reasons)
        return {"packages": len(self.packages),
                "python_files": sum(s.python_files for s in self.stats),
                "reasons": dict(reasons), "split": sum(s.split for s in self.stats),
                "too_long": sum(s.too_long for s in self.stats),
                "exact_duplicates": self.exact_duplicates,
                "near_duplicates": self.near_duplicates, "problems": len(self.problems),
                "oracles": len(oracles), "tfv1_oracles": len(oracles & set(v1_only_apis())),
                "licenses": dict(Counter(p.license for p in self.problems).most_common())}


def extract(requirement: str, path: str | Path, encode: Callable[[str], Sequence[int]],
            max_tokens: int = MAX_PROMPT_TOKENS) -> tuple[list[RealProblem], PackageStats]:
    """The problems of one downloaded distribution (before deduplication) and its stats."""
    name, version = requirement.split("==")
    files, metadata = read_dist(path)
    stats = PackageStats(requirement, Path(path).name, license_of(metadata), len(files))
    reasons: Counter[str] = Counter()
    out = []
    for inner, data in files.items():
        text = _text(data)
        got = split(text) if text is not None else "unreadable"
        if isinstance(got, str):
            reasons[got] += 1
            continue
        stats.split += 1
        prompt, oracle = got
        tokens = len(encode(prompt))
        if tokens > max_tokens:
            stats.too_long += 1
            continue
        out.append(RealProblem(name, version, inner, stats.license, prompt, {"v2": oracle},
                               tokens))
    stats.reasons = dict(sorted(reasons.items()))
    return out, stats


def build(packages: Iterable[str], encode: Callable[[str], Sequence[int]], tokenizer: str,
          *, max_tokens: int = MAX_PROMPT_TOKENS, download: bool = True,
          use_cache: bool = True) -> ProblemSet:
    """The TFv1Real problems of ``packages`` for a tokenizer (``encode``, named by the
    string ``tokenizer``, which keys the cache): downloads each package (:func:`cached_dist`),
    applies the rules of the module docstring, and keeps the result as JSON in
    ``cache_dir() / "tfv1real"``, keyed by the package list, the tokenizer and the rules."""
    packages = tuple(packages)
    key = hashlib.sha256(json.dumps([RULES_VERSION, packages, tokenizer, max_tokens,
                                     NEAR_DUPLICATE]).encode()).hexdigest()[:16]
    where = cache_dir() / "tfv1real" / f"problems-{key}.json"
    if use_cache and where.is_file():
        try:
            return _load(where)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged cache file is rebuilt
    found: list[RealProblem] = []
    stats = []
    for requirement in packages:
        problems, s = extract(requirement, cached_dist(requirement, download), encode,
                              max_tokens)
        found += problems
        stats.append(s)
    order = {r.split("==")[0]: i for i, r in enumerate(packages)}
    found.sort(key=lambda p: (order[p.package], p.path))
    kept, exact, near = deduplicate(found)
    for s in stats:
        s.kept = sum(p.package == s.requirement.split("==")[0] for p in kept)
    built = ProblemSet(sorted(kept, key=lambda p: p.id), packages, tokenizer, stats, exact,
                       near)
    _save(built, where)
    return built


def model_tokenizer(model: str | None = None) -> tuple[str, Callable[[str], list[int]]]:
    """The tokenizer of a model as :func:`adaptrack.load_model` takes it (``None``: the
    default model), loaded without the weights: a name for it (the model and a hash of
    the tokenizer's definition, so a changed tokenizer gives a new build) and its
    ``encode``, which counts tokens as the transformers backend's ``encode`` does."""
    from ..errors import ModelLoadError
    from ..lm.default import default_gguf
    from ..lm.load import _converted_gguf

    try:
        import transformers
    except ImportError:
        raise ModelLoadError("TFv1Real counts prompt tokens with the model's tokenizer, "
                             "which needs transformers: pip install 'adaptrack[hf]'") from None
    path = default_gguf() if model is None else Path(model).expanduser()
    source = str(_converted_gguf(path)) if str(path).endswith(".gguf") else str(model)
    try:
        tok = transformers.AutoTokenizer.from_pretrained(source)
    except Exception as err:  # transformers raises many kinds; the message is what matters
        raise ModelLoadError(f"could not load the tokenizer of {model or 'the default model'}"
                             f" ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
                             ) from None
    backend = getattr(tok, "backend_tokenizer", None)
    definition = (backend.to_str() if backend is not None
                  else json.dumps(sorted(tok.get_vocab().items())))
    digest = hashlib.sha256(definition.encode()).hexdigest()[:12]
    return f"{model or 'default'}:{digest}", lambda text: list(tok.encode(text))


def _save(built: ProblemSet, where: Path) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    data = {"rules": RULES_VERSION, **asdict(built)}
    tmp = where.with_name(where.name + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    tmp.replace(where)


def _load(where: Path) -> ProblemSet:
    data = json.loads(where.read_text(encoding="utf-8"))
    problems = [RealProblem(**{**p, "duplicates": tuple(p["duplicates"])})
                for p in data["problems"]]
    return ProblemSet(problems, tuple(data["packages"]), data["tokenizer"],
                      [PackageStats(**s) for s in data["stats"]], data["exact_duplicates"],
                      data["near_duplicates"])


# -- the evaluation --------------------------------------------------------------------------


@dataclass
class TFv1RealTask(ApiTask):
    """TFv1Real (the paper's Table 2): per problem and method, one greedy completion and
    ``n`` sampled ones of the text after the ``tf`` of the problem's first v1-only call, in
    the v2 setting (every TF 2.16 name, API-name semantics), exact match against the
    oracle. Shares :class:`~adaptrack.eval.tfv1.ApiTask`'s jobs, records and sweeps; the
    header adds the package list and the tokenizer that built the problems. ``limit``
    takes the first problems of a fixed shuffled order (seed 0): a sample across packages.

    **Long prompts.** A prompt has up to 3 584 tokens, and each job's greedy and sampled
    ``generate`` calls are separate prefix trees. Jobs run in groups of one problem (all
    its methods and sweep values; ``group`` is that count unless set), and before a group
    is served its prompt goes to the model once (:meth:`prepare`): the backends keep the
    KV of what they evaluated and start each tree's root from it, so the prompt is
    evaluated once per problem instead of once per call (its time counts in the run's
    wall time, not in a job's ``seconds``).
    """

    packages: tuple[str, ...] = ()
    group: int = 0
    name = "tfv1real"
    _built: ProblemSet | None = field(default=None, init=False, repr=False, compare=False)
    _by_id: dict[str, RealProblem] | None = field(default=None, init=False, repr=False,
                                                   compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.packages = tuple(self.packages) or read_packages()
        for requirement in self.packages:
            if not isinstance(requirement, str) or not _REQUIREMENT.fullmatch(requirement):
                raise ValueError(f"packages: each is name==version, got {requirement!r}")
        self.group = self.group or self.jobs_per_problem()

    def problem_set(self) -> ProblemSet:
        """The build for this task's packages and model (from the cache after the first)."""
        if self._built is None:
            name, encode = model_tokenizer(self.model)
            self._built = build(self.packages, encode, name)
        return self._built

    def problem_list(self) -> list[ApiProblem]:
        out: list[ApiProblem] = list(self.problem_set().problems)
        random.Random(0).shuffle(out)
        return out[:self.limit]

    def lookup(self, problem_id: str) -> ApiProblem:
        if self._by_id is None:
            self._by_id = {p.id: p for p in self.problem_set().problems}
        return self._by_id[problem_id]

    def jobs(self) -> list[Job]:
        """Problem-major, so that a group (:attr:`group`) is one problem's jobs."""
        return [j for p in self.problem_list() for t in self.temperatures
                for j in self._jobs_of(p, t)]

    def config(self) -> dict[str, object]:
        return {**super().config(), "packages": list(self.packages),
                "max_prompt_tokens": MAX_PROMPT_TOKENS,
                "tokenizer": self.problem_set().tokenizer}

    def prepare(self, prompts: list[str]) -> None:
        """Evaluate each prompt once, so that every call of the group starts from its KV."""
        for prompt in prompts:
            try:
                self.lm.next_logprobs([tuple(self.lm.encode(prompt))])
            except AdaptrackError:  # a prompt too long: each of its calls records the error
                pass


if __name__ == "__main__":  # python -m adaptrack.eval.tfv1real [PACKAGES_FILE]: build, summarize
    tokenizer, encode_text = model_tokenizer()
    built = build(read_packages(sys.argv[1] if len(sys.argv) > 1 else None), encode_text,
                  tokenizer)
    for s in built.stats:
        print(f"{s.requirement:45} {s.python_files:5} files {s.split:4} split "
              f"{s.too_long:3} too long {s.kept:4} kept  {s.license}")
    print(json.dumps(built.summary(), indent=1))
