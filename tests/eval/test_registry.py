"""The registry of evaluation tasks (docs/design.md §4, ``eval/``): each task's declaration
makes its flags, builds the task, checks its results files and reports them; a task of
one's own, registered here and nowhere else, gets all of that."""

from __future__ import annotations

import argparse
import inspect
import json
from dataclasses import dataclass
from typing import Any

import pytest
from paths import RESULTS

from adaptrack.cli import build_parser, common, main
from adaptrack.errors import AdaptrackError, ResultsMismatchError
from adaptrack.eval import registry, runner
from adaptrack.eval.checks import INT, STR, fields
from adaptrack.eval.report import report
from adaptrack.eval.taskspec import Option, Sampling, TaskSpec
from adaptrack.flags import PARSED
from adaptrack.options import option_flags


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _eval_commands() -> dict[str, argparse.ArgumentParser]:
    return _subparsers(_subparsers(build_parser())["eval"])


def test_the_command_line_parses_every_type_an_option_may_name():
    assert set(common.PARSERS) == set(PARSED)
    assert {flag.reads for _, flag, _ in option_flags()} <= {*PARSED, "choice", "switch",
                                                            "negated"}


def test_the_command_line_offers_every_registered_task_in_order():
    assert list(_eval_commands()) == list(registry.names())
    assert registry.names() == ("tfv1", "tfv1real", "binary", "dsl", "humaneval", "mbpp")


@pytest.mark.parametrize("name", registry.names())
def test_each_task_gets_the_flags_its_options_declare(name):
    spec = registry.TASKS[name]
    command = _eval_commands()[name]
    flags = {s: a for a in command._actions for s in a.option_strings}
    required = []
    for option in (*spec.options, *spec.model_options):
        for flag in option.flags:
            assert flags[flag].dest == option.dest, flag
        action = flags[option.flags[0]]
        assert action.help == option.help
        if isinstance(option, Option):
            assert action.required == option.required
            if option.required:
                required += [option.flags[0], "x"]
    # What every task has besides: the results file and where its jobs run.
    for flag in ("-o", "--out", "--workers", "--pool", "--ray-address", "--no-report"):
        assert flag in flags
    args = vars(build_parser().parse_args(["eval", name, "-o", "r.jsonl", *required]))
    # The parsed values are the task's keywords: its constructor takes every one of them.
    keywords = dict(o.value(args) for o in (*spec.options, *spec.model_options))
    inspect.signature(spec.task).bind(**keywords)
    for option in (*spec.options, *spec.model_options):
        if isinstance(option, Option) and option.flag:
            assert args[option.dest] is False
        elif not isinstance(option.default, str) and not getattr(option, "required", False):
            assert args[option.dest] == option.default, option.flags


@pytest.mark.parametrize("name", registry.names())
def test_a_tasks_sampling_flags_are_generates(name):
    """A task flag that is a sampling option reads its value as ``generate``'s flag does,
    with the same spelling and the same help up to the task's default and note."""
    generate = {a.dest: a for a in _subparsers(build_parser())["generate"]._actions}
    ours = {a.dest: a for a in _eval_commands()[name]._actions}
    sampling = [o for o in (*registry.TASKS[name].options, *registry.TASKS[name].model_options)
                if isinstance(o, Sampling)]
    assert {o.name for o in sampling} >= {"n"}
    for option in sampling:
        theirs, mine = generate[option.name], ours[option.name]
        assert mine.option_strings == theirs.option_strings
        assert (mine.type, mine.metavar, mine.choices) == (theirs.type, theirs.metavar,
                                                           theirs.choices)
        assert mine.help == option.flag.describe(option.default, option.note)


def test_a_sampling_flag_names_a_field_and_a_default_its_help_can_show():
    with pytest.raises(ValueError, match="'top_k' is not a sampling option"):
        Sampling("top_k")
    with pytest.raises(ValueError, match="the help of --share-q cannot show the default"):
        Sampling("share_q", True)
    assert Sampling("max_seconds", None).help.startswith(
        "time budget of the search in seconds, 'inf' for none (default: inf)")




@pytest.mark.parametrize("name, file", [("tfv1", "tfv1"), ("binary", "binary"),
                                        ("dsl", "dsl-binary"), ("mbpp", "mbpp")])
def test_a_committed_results_file_reports_through_its_declaration(name, file):
    path = RESULTS / f"{file}.jsonl.gz"
    header, records = runner.read_results(path)
    spec = registry.TASKS[name]
    assert header["task"] == name
    assert report(path) == spec.report(header, records, None)
    assert spec.scores is not None and spec.scores(records)["methods"]


def test_registering_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="'tfv1' is registered already"):
        registry.register(registry.TASKS["tfv1"])


# -- a task of one's own, declared in this file only ----------------------------------------


@dataclass
class CountTask:
    """Counts up to ``size``: one job per number, each record the number (times ``step``)."""

    size: int = 3
    word: str = "n"
    step: int = 1

    def config(self) -> dict[str, Any]:
        return {"task": "count", "size": self.size, "word": self.word, "step": self.step}

    def jobs(self) -> list[dict[str, Any]]:
        return [{"key": f"{self.word}{i}", "i": i} for i in range(self.size)]

    def setup(self, threads: int | None = None) -> None:
        pass

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        return {"key": job["key"], "value": job["i"] * self.step}


def _count_record(r: dict[str, Any]) -> str | None:
    return fields(r, {"value": INT})


def _count_report(header: dict[str, Any], records: list[dict[str, Any]], plots: Any) -> str:
    total = sum(r["value"] for r in records)
    return f"# Count: {len(records)} records, total {total}, plots {plots}"


COUNT = TaskSpec(
    "count", help="count up to a number", description="A task of this test's own.",
    options=(Option(("--size",), type="count", default=3, metavar="N",
                    help="how many jobs (default: 3)"),
             Option(("--word",), default="n", help="each job's key starts with it"),
             Option(("--double",), flag=True, keyword="step", convert=lambda v: 2 if v else 1,
                    help="count in twos")),
    task=CountTask, header={"size": INT, "word": STR}, record=_count_record,
    report=_count_report, plots=False)


@pytest.fixture
def count_task():
    registry.register(COUNT)
    yield COUNT
    registry.unregister("count")


def test_a_registered_task_gets_flags_runs_and_reports(count_task, tmp_path, capsys):
    out = tmp_path / "count.jsonl"
    assert main(["eval", "count", "--help"]) == 0
    shown = capsys.readouterr().out
    for text in ("--size N", "how many jobs (default: 3)", "--word WORD", "--double",
                 "-o FILE, --out FILE", "--workers N"):
        assert text in shown
    assert main(["eval", "count", "--size", "0", "-o", str(out)]) == 2
    assert "--size: must be at least 1, got 0" in capsys.readouterr().err
    assert main(["eval", "count", "--size", "4", "--double", "-o", str(out)]) == 0
    assert "# Count: 4 records, total 12, plots None" in capsys.readouterr().out
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0] == {"header": {"task": "count", "size": 4, "word": "n", "step": 2}}
    assert [r["value"] for r in lines[1:]] == [0, 2, 4, 6]
    # Resuming runs nothing new; the report reads the file through the registry.
    assert main(["eval", "count", "--size", "4", "--double", "-o", str(out)]) == 0
    assert "resuming: 4 of 4 jobs" in capsys.readouterr().err
    assert report(out) == "# Count: 4 records, total 12, plots None"
    assert main(["report", str(out), "--plots", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "count results have no plots; --plots is ignored" in captured.err
    # Its record check guards its files: a record without a value is refused, by line.
    with out.open("a") as f:
        f.write(json.dumps({"key": "n9", "value": "nine"}) + "\n")
    with pytest.raises(ResultsMismatchError, match=r"line 6 is not a count record: 'value' "
                                                   r"is not an integer"):
        runner.read_results(out)


def test_an_unregistered_task_is_not_reported(count_task, tmp_path):
    out = tmp_path / "count.jsonl"
    runner.run(CountTask(size=1), out)
    registry.unregister("count")
    try:
        with pytest.raises(AdaptrackError, match=r"unknown task 'count' in the header \(tfv1, "
                                            r"tfv1real, binary, dsl, humaneval, mbpp\)"):
            report(out)
    finally:
        registry.register(COUNT)
