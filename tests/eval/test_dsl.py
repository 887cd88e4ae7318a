"""The DSL benchmarks of RQ4 (eval/dsl.py, `adaptrack eval dsl`, the DSL report): a small
exact model on a made-up data directory, the record checks, and one problem of each real
dataset end to end on the default model (skipped without ../shared)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from paths import SHARED

pytest.importorskip("llguidance", reason="the DSL grammars run on llguidance")

import adaptrack as at
from adaptrack.cli import main
from adaptrack.eval import dsl, dslreport, report, runner

DSL_DIR = SHARED / "data" / "dsl"
BITS = ('root ::= s\ns ::= "00000" | "1" b b b b\nb ::= Zero | "1"\nZero ::= "0"')


def _data(tmp_path: Path) -> Path:
    """A data directory whose four files hold one binary-like problem each."""
    for name in dsl.DATASETS:
        row = {"id": f"{name}_1", "dataset": name, "prompt": "", "grammar": BITS,
               "start_symbol": "root"}
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    return tmp_path


def _uniform_bits() -> at.TableLM:
    return at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)


def test_study_on_an_exact_model(tmp_path: Path) -> None:
    """Uniform bits: P(· | c) is uniform over the 17 strings. CD gives 00000 about 1/2;
    AdapTrack and exact are within sampling noise (16 / (2n) ≈ 0.03 nats) of the target.
    The paper's KL(Q ‖ P_LM) differs from the exact KL by -log Z for every method."""
    task = dsl.DslTask(n=300, data=str(_data(tmp_path)), datasets=("cp", "binary"),
                       methods=("cd", "adaptrack", "exact"), max_new_tokens=8)
    task._lm = _uniform_bits()
    # The paper's searches: the eos target, no budget of model calls, no CD fallback.
    options = task.options("binary_1", "exact")
    assert (options.end, options.search_budget, options.fallback) == ("eos", None, None)
    assert [j["key"] for j in task.jobs()] == [
        "cp_1/cd", "cp_1/adaptrack", "cp_1/exact",
        "binary_1/target", "binary_1/cd", "binary_1/adaptrack", "binary_1/exact"]
    path = tmp_path / "r.jsonl"
    runner.run(task, path)
    s = dslreport.dsl_scores(runner.read_results(path)[1])
    assert s["common"] == ["cp_1", "binary_1"] and s["datasets"] == ["cp", "binary"]
    cells = s["cells"]["binary_1"]
    assert cells["cd"]["exact_kl"] > 0.4
    for m in ("adaptrack", "exact"):
        assert cells[m]["exact_kl"] < 0.15, m
    log_z = math.log(17) - 6 * math.log(3)  # 17 strings of five bits and EOS, each (1/3)^6
    for m, c in cells.items():
        assert c["kl"] - c["exact_kl"] == pytest.approx(-log_z, abs=1e-9), m
    # Table 4: per dataset means; the average is over problems.
    for m in ("cd", "adaptrack", "exact"):
        both = [s["cells"][p][m]["kl"] for p in ("cp_1", "binary_1")]
        assert s["table"][m]["average"] == pytest.approx(sum(both) / 2)
        assert len(s["curves"]["cp"][m]) == (300 - 75) // 1 + 1
    # Against exact's samples: every string has the same log-probability, so the excess is
    # the difference of the exact KLs, with no spread.
    for m in ("cd", "adaptrack"):
        delta, half = cells[m]["excess"]
        assert delta == pytest.approx(cells[m]["exact_kl"] - cells["exact"]["exact_kl"])
        assert half == pytest.approx(0.0, abs=1e-9)
    assert cells["cd"]["excess"][0] > 0.3 and abs(cells["adaptrack"]["excess"][0]) < 0.15
    assert "excess" not in cells["exact"]
    text = report.report(path, plots=tmp_path / "plots")
    assert "| Constrained decoding | " in text and "Exact KL to the enumerated target" in text
    assert "## Excess KL over exact" in text and "| Exact |" in text
    cheap = report.report(path, methods=["cd"])
    assert "| Constrained decoding | " in cheap and "| Exact |" not in cheap
    assert "Exact KL to the enumerated target" in cheap  # the target is kept
    with pytest.raises(at.AdaptrackError, match="no records of asap; it holds adaptrack, cd"):
        report.report(path, methods=["cd", "asap"])
    assert (tmp_path / "plots" / "dsl-binary-kl.png").stat().st_size > 1000
    # Resuming with more datasets runs only the new jobs.
    more = dsl.DslTask(n=300, data=task.data, datasets=("slia", "cp", "binary"),
                       methods=task.methods, max_new_tokens=8)
    more._lm = task._lm
    added = []
    runner.run(more, path, on_record=added.append)
    assert sorted(r["key"] for r in added) == ["slia_1/adaptrack", "slia_1/cd", "slia_1/exact"]


def test_prompt_ids_drop_a_leading_bos() -> None:
    class WithBos:
        vocab = at.Vocabulary([b"a", b"", b"<e>"], eos_ids=[2])

        def encode(self, text: str) -> list[int]:
            return [1] + [0] * len(text)

    assert dsl.prompt_ids(WithBos(), "aa") == [0, 0]


def test_bad_options_and_records(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown dataset 'sql'"):
        dsl.DslTask(datasets=("sql",))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        dsl.DslTask(temperature=0)
    task = dsl.DslTask(data=str(_data(tmp_path)), problem_ids=("nope",))
    with pytest.raises(ValueError, match="no problem 'nope'"):
        task.jobs()
    with pytest.raises(dsl.DslDataError, match="cannot read DSL data file"):
        dsl.DslTask(data=str(tmp_path / "missing")).jobs()
    good = {"key": "p/cd", "problem": "p", "dataset": "cp", "method": "cd", "samples": [[1]],
            "logprobs": [-1.0], "complete": [True], "lm_requests": [1], "lm_calls": 1,
            "seconds": 0.1}
    head = json.dumps({"header": {"task": "dsl", "n": 1}})
    for bad, why in [({**good, "logprobs": []}, "1 samples but 0 logprobs"),
                     ({**good, "complete": "yes"}, "'complete' is not"),
                     ({**good, "problem": 3}, "'problem' is not")]:
        path = tmp_path / "bad.jsonl"
        path.write_text(head + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(runner.ResultsMismatchError, match=why):
            report.report(path)


# The shortest prompt of each dataset (tokens of the default model: 1346, 1776, 403, 24).
SHORTEST = "lastname,find_inv_ne_bvudiv1_4bit,CP_re_ptb_605,binary_len_5_0"


def test_one_problem_of_each_dataset_on_the_default_model(tmp_path: Path, capsys) -> None:
    """End to end: `adaptrack eval dsl` then `adaptrack report --plots` on the shortest
    problem of each dataset, with CD (the SyGuS prompts cost most of the time: their
    prefill) and the exact target of binary."""
    if not DSL_DIR.exists():
        pytest.skip(f"the shared DSL data ({DSL_DIR}) is not in this checkout")
    out = tmp_path / "dsl.jsonl"
    started = time.perf_counter()
    assert main(["eval", "dsl", "--data", str(DSL_DIR), "-o", str(out), "-n", "2",
                 "--methods", "cd", "--problems", SHORTEST, "--max-new-tokens", "64",
                 "--no-report"]) == 0
    seconds = time.perf_counter() - started
    _, records = runner.read_results(out)
    assert sorted(r["key"] for r in records) == sorted(
        [f"{p}/cd" for p in SHORTEST.split(",")] + ["binary_len_5_0/target"])
    for r in records:
        assert "error" not in r, r
        if r["method"] == "cd":
            assert len(r["samples"]) == 2 and all(r["valid"]) == all(r["complete"])
    capsys.readouterr()
    assert main(["report", str(out), "--plots", str(tmp_path / "plots")]) == 0
    text = capsys.readouterr().out
    assert "## KL(Q ‖ P_LM) (Table 4)" in text, text
    print(f"eval dsl on 4 problems: {seconds:.1f} s")
