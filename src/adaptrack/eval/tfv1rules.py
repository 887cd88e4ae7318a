"""TFv1Real's rules per file (the module docstring of :mod:`~adaptrack.eval.tfv1real`):
where a file splits into a prompt and an oracle (:func:`split`), the problem it gives
(:class:`RealProblem`) and the exact and near duplicates dropped (:func:`deduplicate`).

>>> split("import tensorflow as tf\\nx = tf.compat.v1.placeholder(tf.float32)\\n")
('import tensorflow as tf\\nx = tf', '.compat.v1.placeholder')
"""

from __future__ import annotations

import io
import re
import tokenize
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["NEAR_DUPLICATE", "REASONS", "RealProblem", "deduplicate", "near_duplicate",
           "split"]

#: Jaccard similarity of code-line sets from which two prompts with one oracle are duplicates.
NEAR_DUPLICATE = 0.8

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
