"""Robustness sweeps (the paper's Figures 5 and 7): lists of temperatures and AdapTrack
max_backtrack values for the TFv1 tasks, their jobs, records, headers and reports."""

from __future__ import annotations

import json

import pytest
from test_eval import _intent_model

from adaptrack.cli import main
from adaptrack.errors import ResultsMismatchError
from adaptrack.eval import apireport, report, runner, tfv1

TEMPS = [0.5, 1.0]
BACKS = [0, None]


def _task(**options):
    task = tfv1.TFv1Task(limit=1, n=4, max_new_tokens=48, **options)
    p = tfv1.problems(limit=1)[0]
    task._lm = _intent_model(p.prompt, p.oracle["v1"])
    return task


def _plain(record):
    """A record without what depends on the run rather than the samples."""
    return {k: v for k, v in record.items()
            if k not in ("key", "seconds", "started_at", "finished_at")}


def test_sweep_jobs_keys_and_header():
    task = _task(temperature=TEMPS, max_backtrack=BACKS)
    jobs = task.jobs()
    # per temperature: unconstrained once, cd and exact per setting, adaptrack per B too
    assert len(jobs) == task.jobs_per_problem() == 2 * (1 + 2 + 2 * 2 + 2)
    assert len({j["key"] for j in jobs}) == len(jobs)
    api = tfv1.problems(limit=1)[0].api
    assert f"{api}|adaptrack|v2|T=0.5|B=0" in {j["key"] for j in jobs}
    assert f"{api}|cd|v1|T=1.0" in {j["key"] for j in jobs}
    assert {j["max_backtrack"] for j in jobs if j["method"] != "adaptrack"} == {None}
    assert [j["temperature"] for j in jobs] == [0.5] * 9 + [1.0] * 9  # temperature-major
    config = task.config()
    assert config["temperature"] == TEMPS and config["max_backtrack"] == BACKS


def test_without_sweeps_keys_and_header_are_unchanged():
    """One value of each gives the keys and header a run without sweeps always had, so
    older results files resume."""
    plain, listed = _task(), _task(temperature=[1.0], max_backtrack=[None])
    assert plain.config() == listed.config()
    assert "max_backtrack" not in plain.config() and plain.config()["temperature"] == 1.0
    assert [j["key"] for j in plain.jobs()] == [j["key"] for j in listed.jobs()]
    assert all(j["key"].count("|") == 2 for j in plain.jobs())
    assert _task(max_backtrack=4).config()["max_backtrack"] == 4


def test_bad_sweeps_are_refused():
    with pytest.raises(ValueError, match="temperature got 0"):
        tfv1.TFv1Task(temperature=[0.5, 0])
    with pytest.raises(ValueError, match="lists a value twice"):
        tfv1.TFv1Task(temperature=[0.5, 0.5])
    with pytest.raises(ValueError, match="max_backtrack got -1"):
        tfv1.TFv1Task(max_backtrack=[1, -1])
    with pytest.raises(ValueError, match="applies to the adaptrack method only"):
        tfv1.TFv1Task(methods=("cd",), max_backtrack=[1, 2])


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "sweep.jsonl"
    task = _task(temperature=TEMPS, max_backtrack=BACKS, group=5)  # groups mix temperatures
    return path, task, runner.run(task, path)


def test_sweep_records_and_resume(sweep_run):
    path, task, records = sweep_run
    assert len(records) == 18 and all("error" not in r for r in records)
    for r in records:
        assert r["temperature"] in TEMPS
        assert r["max_backtrack"] in (BACKS if r["method"] == "adaptrack" else [None])
    # The limit reaches AdapTrack: it never backtracks at 0, and does without a limit.
    backtracks = {b: sum(r["backtracks"] for r in records
                         if r["method"] == "adaptrack" and r["max_backtrack"] == b)
                  for b in BACKS}
    assert backtracks[0] == 0 < backtracks[None]
    header, _ = runner.read_results(path)
    assert header["temperature"] == TEMPS and header["max_backtrack"] == BACKS
    assert runner.run(task, path) == records  # resumed: nothing redone
    # A file written with other sweep values is refused, naming the option.
    with pytest.raises(ResultsMismatchError, match="temperature: file"):
        runner.run(_task(temperature=[0.5], max_backtrack=BACKS), path)


def test_a_sweep_point_gives_the_records_of_a_run_at_that_point(sweep_run):
    """Every sweep value uses the job's seed, so the sweep's records at temperature 1.0 and
    no backtrack limit are those of a plain run (and a group mixing temperatures gives
    each job what it gets alone)."""
    _, _, records = sweep_run
    plain = {r["key"]: _plain(r) for r in _task().run_many(_task().jobs())}
    at_point = {r["key"].replace("|T=1.0", "").replace("|B=unlimited", ""): _plain(r)
                for r in records if r["temperature"] == 1.0 and r["max_backtrack"] is None}
    assert at_point == plain


def test_report_draws_both_sweeps(sweep_run, tmp_path):
    path, _, _ = sweep_run
    text = report.report(path, plots=tmp_path)
    assert "The tables below are at temperature 1.0 and AdapTrack max_backtrack unlimited" \
        in text
    assert "## EM@k against temperature (Figure 5)" in text
    assert "## EM@k against max_backtrack (Figure 7)" in text
    assert "| Method | EM@k | T=0.5 | T=1.0 |" in text
    assert "| Method | EM@k | B=0 | B=unlimited |" in text
    # AdapTrack's cost per limit: B=0 keeps every choice whose mass merely shrank.
    calls = [line for line in text.splitlines() if line.startswith("| v1 | calls/sample |")]
    backtracks = [line for line in text.splitlines() if line.startswith("| v1 | backtracks |")]
    assert len(calls) == len(backtracks) == 1
    b0, unlimited = (float(x) for x in backtracks[0].strip(" |").split(" | ")[2:])
    assert b0 <= unlimited
    # The main tables count each problem once (the base point), not once per sweep value.
    assert text.startswith("# TFv1: 1 problems, n = 4")
    pytest.importorskip("matplotlib")
    for name in ("tfv1-em.png", "tfv1-temperature.png", "tfv1-max-backtrack.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_sweep_scores_use_the_samples_for_em1():
    def row(method, t, samples, b=None):
        return {"key": f"x|{method}|v1|{t}|{b}", "problem": "x", "method": method,
                "setting": "v1", "oracle": {"v1": ".a"}, "greedy": ".a", "samples": samples,
                "lm_requests": [1] * 4, "lm_calls": 1, "seconds": 1.0, "temperature": t,
                "max_backtrack": b}
    rows = [row("cd", 0.5, [".a"] * 4), row("cd", 1.0, [".a", ".b", ".b", ".b"])]
    header = {"task": "tfv1", "temperature": [0.5, 1.0]}
    temps, backs, base_t, base_b = apireport.sweep_points(header, rows)
    assert (temps, backs, base_t, base_b) == ([0.5, 1.0], [None], 1.0, None)
    text = report.tfv1_report(header, rows)
    assert "| Constrained decoding (v1) | 1 | 100.00% | 25.00% |" in text


def test_a_partial_sweep_reports_what_it_has(sweep_run):
    """Jobs run temperature-major, so an interrupted sweep has the low temperatures only:
    the main tables then use the highest one there is."""
    path, _, records = sweep_run
    header, _ = runner.read_results(path)
    first = [r for r in records if r["temperature"] == 0.5]
    text = report.tfv1_report(header, first)
    assert "at temperature 0.5 and AdapTrack max_backtrack unlimited" in text
    assert "EM@k against temperature" not in text  # one temperature: no sweep to draw
    only_limited = [r for r in first if r["method"] != "adaptrack" or r["max_backtrack"] == 0]
    assert "# TFv1: 1 problems" in report.tfv1_report(header, only_limited)


def test_results_headers_with_sweeps_are_checked(tmp_path):
    path = tmp_path / "r.jsonl"
    header = {"task": "tfv1", "temperature": [0.5, "hot"]}
    path.write_text(json.dumps({"header": header}) + "\n")
    with pytest.raises(ResultsMismatchError, match="'temperature' is not a number or a"):
        runner.read_results(path)
    header = {"task": "tfv1", "temperature": 1.0, "max_backtrack": [1, None]}
    record = {"key": "a", "problem": "a", "method": "adaptrack", "setting": "v1",
              "oracle": {"v1": ".a"}, "temperature": 1.0, "max_backtrack": -2, "error": "x"}
    path.write_text(json.dumps({"header": header}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ResultsMismatchError, match="'max_backtrack' is not an integer >= 0"):
        runner.read_results(path)


def test_cli_sweep_options(capsys, tmp_path):
    out = str(tmp_path / "r.jsonl")
    assert main(["eval", "tfv1", "-o", out, "--temperature", "0.5,0"]) == 2
    assert "--temperature: must be comma-separated finite numbers > 0" in \
        capsys.readouterr().err
    assert main(["eval", "tfv1real", "-o", out, "--max-backtrack", "1,two"]) == 2
    assert "--max-backtrack: must be comma-separated integers >= 0 or 'unlimited'" in \
        capsys.readouterr().err
    assert main(["eval", "tfv1", "-o", out, "--methods", "cd", "--max-backtrack", "1,2"]) == 2
    assert "max_backtrack applies to the adaptrack method only" in capsys.readouterr().err
    assert tfv1.parse_backtracks("1,2,4,8,unlimited") == [1, 2, 4, 8, None]
