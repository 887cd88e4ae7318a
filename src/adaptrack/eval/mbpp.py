"""MBPP (Austin et al. 2021, *Program Synthesis with Large Language Models*): write a short
Python program from a one-sentence description and three assert tests.

The data is a file in the original release's format, passed by path (nothing is shipped
or downloaded): the full set ``mbpp.jsonl`` (one JSON object a line; ``text``, ``code``,
``task_id``, ``test_setup_code``, ``test_list``) or the sanitized subset
``sanitized-mbpp.json`` (one JSON array; ``prompt`` and ``test_imports`` instead of ``text``
and ``test_setup_code``). The test split is task_ids 11–510 (500 problems in the full set,
257 in the sanitized one).

The prompt is the MBPP paper's: the description, then the tests,

    You are an expert Python programmer, and here is your task: {text} Your code should
    pass these tests:

    {tests, one a line}
    [BEGIN]

three-shot by default, with the problems of task_ids 2, 3 and 4 (of the same file) and their
reference code between ``[BEGIN]`` and ``[DONE]`` in front (the paper keeps task_ids 1–10 for
prompting; 2, 3 and 4 are the shots most re-implementations use), or zero-shot
(``shots=0``). The completion is a whole program (``prefix`` is empty), ended by
``[DONE]`` or top-level test code (:data:`STOP`). It passes when the program, then
the task's setup code and its asserts, exits cleanly in the sandbox.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import AdaptrackError
from ..limits import loads
from .checks import INT
from .codespec import CODE_HEADER, CODE_OPTIONS, code_record, code_report, code_scores
from .codetask import CodeProblem, CodeTask, file_digest
from .taskspec import Option, TaskSpec, model_options

#: The test split (task_ids, inclusive) and the few-shot problems.
TEST_IDS = range(11, 511)
SHOT_IDS = (2, 3, 4)
STOP = ("[DONE]", "\nassert", "\nprint", "\nif __name__")
#: Where to look when no file is given: the shared data of this project's checkout.
DOCUMENTED_PLACE = "../shared/data/mbpp/mbpp.jsonl"

TEMPLATE = ("You are an expert Python programmer, and here is your task: {text} "
            "Your code should pass these tests:\n\n{tests}\n")


class MbppDataError(AdaptrackError):
    """An MBPP file that cannot be read or is not in the release's format."""


def _rows(data: bytes, path: str) -> list[dict[str, Any]]:
    """The records of an MBPP file, full (JSONL) or sanitized (a JSON array), normalized to
    ``task_id``, ``text``, ``code``, ``setup``, ``tests``."""
    try:
        text = data.decode("utf-8")
        stripped = text.lstrip()
        raw = (loads(text, path) if stripped.startswith("[")
               else [loads(line, path) for line in text.splitlines() if line.strip()])
        rows = [{"task_id": int(r["task_id"]),
                 "text": r["text"] if "text" in r else r["prompt"],
                 "code": r["code"].replace("\r\n", "\n"),
                 "setup": (r.get("test_setup_code") or "\n".join(r.get("test_imports", []))),
                 "tests": list(r["test_list"])} for r in raw]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise MbppDataError(
            f"{path} is not an MBPP file (mbpp.jsonl or sanitized-mbpp.json of the release): "
            f"{type(err).__name__}: {err}") from None
    return rows


def task_prompt(row: dict[str, Any]) -> str:
    """The paper's prompt for one problem (no shots), up to ``[BEGIN]``'s line."""
    return TEMPLATE.format(text=row["text"].strip(), tests="\n".join(row["tests"]))


def build_prompt(row: dict[str, Any], shots: list[dict[str, Any]]) -> str:
    """``row``'s prompt after the ``shots`` (each with its code between [BEGIN] and [DONE]).

    >>> shot = {"text": "Add.", "tests": ["assert add(1, 2) == 3"],
    ...         "code": "def add(a, b):\\n    return a + b"}
    >>> print(build_prompt({"text": "Negate.", "tests": ["assert neg(1) == -1"]}, [shot]))
    You are an expert Python programmer, and here is your task: Add. Your code should pass these tests:
    <BLANKLINE>
    assert add(1, 2) == 3
    [BEGIN]
    def add(a, b):
        return a + b
    [DONE]
    You are an expert Python programmer, and here is your task: Negate. Your code should pass these tests:
    <BLANKLINE>
    assert neg(1) == -1
    [BEGIN]
    <BLANKLINE>
    """  # noqa: E501
    parts = [task_prompt(s) + "[BEGIN]\n" + s["code"].strip() + "\n[DONE]\n" for s in shots]
    return "".join(parts) + task_prompt(row) + "[BEGIN]\n"


@cache
def read(path: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    """The digest and the normalized records of an MBPP file."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise MbppDataError(f"cannot read MBPP file {path!r}: {err.strerror or err}; pass "
                            "mbpp.jsonl or sanitized-mbpp.json with --data") from None
    return file_digest(data), tuple(_rows(data, path))


def problems(path: str, shots: int = 3) -> list[CodeProblem]:
    """The test-split problems of an MBPP file, by task_id, with ``shots`` (0 or 3) shots."""
    if shots not in (0, 3):
        raise ValueError(f"shots takes 0 or 3, got {shots!r}")
    _, rows = read(str(path))
    by_id = {r["task_id"]: r for r in rows}
    missing = [i for i in SHOT_IDS[:shots] if i not in by_id]
    if missing:
        raise MbppDataError(f"{path} lacks the few-shot task_id {missing[0]}; pass the full "
                            "mbpp.jsonl or use zero-shot (--shots 0)")
    examples = [by_id[i] for i in SHOT_IDS[:shots]]
    return [CodeProblem(f"MBPP/{r['task_id']}", build_prompt(r, examples), "", STOP,
                        r["setup"] + "\n" + "\n".join(r["tests"]))
            for r in sorted(rows, key=lambda r: r["task_id"]) if r["task_id"] in TEST_IDS]


@dataclass
class MbppTask(CodeTask):
    """MBPP's test split per problem and method (:class:`~adaptrack.eval.codetask.CodeTask`);
    ``data`` is the file, ``shots`` 3 or 0; ``limit`` takes the first problems by
    task_id."""

    data: str = DOCUMENTED_PLACE
    shots: int = 3
    name = "mbpp"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shots not in (0, 3):
            raise ValueError(f"shots takes 0 or 3, got {self.shots!r}")

    def problems(self) -> list[CodeProblem]:
        return problems(self.data, self.shots)

    def data_config(self) -> dict[str, Any]:
        digest, _ = read(str(self.data))
        return {"data": f"{Path(self.data).name} sha256:{digest}", "shots": self.shots}


SPEC = TaskSpec(
    "mbpp", help="MBPP: write short Python programs from a description and three tests",
    description="Per MBPP test problem (task_ids 11-510) and method: one greedy and n "
                "sampled programs (the MBPP paper's prompt, three-shot from task_ids 2-4 or "
                "zero-shot), each run against the task's asserts in a sandboxed process; "
                "pass@1, pass@k, parse and name-check shares (Table 3).",
    options=(Option(("--data",), metavar="FILE", required=True,
                    help="the MBPP release's mbpp.jsonl (full) or sanitized-mbpp.json"),
             Option(("--shots",), type=int, choices=(0, 3), default=3,
                    help="few-shot examples in the prompt: 3 (task_ids 2, 3, 4; default) or 0"),
             *CODE_OPTIONS),
    model_options=model_options(), task=MbppTask, header={**CODE_HEADER, "shots": INT},
    record=code_record("MBPP/"), scores=code_scores, report=code_report, plots=False)
"""The declaration of the MBPP task: its flags, header, records and report (Table 3)."""

__all__ = ["SPEC", "MbppTask", "build_prompt", "problems", "read"]
