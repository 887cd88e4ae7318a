"""The evaluation harness: TFv1 problems and filters, the resumable runner, the binary
study and the reports (issue 6)."""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from paths import RESULTS

import adaptrack as at
from adaptrack.cli import main
from adaptrack.eval import apireport, binary, report, runner, tables, tfv1
from adaptrack.eval.tfapi import tensorflow_api_names

SEED_A_CD_V1 = 471090191401584496

# -- TFv1 problems -----------------------------------------------------------------------


def test_shipped_problem_list_is_the_filters_applied_to_the_shipped_api():
    apis = tfv1.filter_v1_only(tensorflow_api_names())
    assert tuple(apis) == tfv1.v1_only_apis()
    assert len(apis) == 416  # the paper's website list gave 419


def test_each_filter_rule():
    names = [
        "compat.v1.placeholder",  # kept
        "compat.v1.reduce_sum", "reduce_sum",  # rule 2: v2 has reduce_sum
        "compat.v1.compat.v1.get_variable",  # rule 1: a nested copy of the namespace
        "compat.v1.Session", "compat.v1.layers.Dense",  # rule 3: a part not lowercase
        "compat.v1.app", "compat.v1.app.run",  # rule 4: app is a prefix of app.run
        "compat.v1.assign", "compat.v1.assign_add",  # a string prefix is not a dotted one
        "compat.v2.foo", "compat.v1.foo",  # compat.v2 is not a v2 counterpart
        "compat.as_bytes", "compat.v1.compat.as_bytes",  # tf.compat.as_bytes is v2
    ]
    assert tfv1.filter_v1_only(names) == [
        "compat.v1.app.run", "compat.v1.assign", "compat.v1.assign_add", "compat.v1.foo",
        "compat.v1.placeholder"]


def test_problems_oracles_and_settings():
    probs = tfv1.problems()
    assert len({p.api for p in probs}) == 416
    assert [p.api for p in tfv1.problems(limit=5)] == [p.api for p in probs[:5]]
    assert [p.api for p in probs] != sorted(p.api for p in probs)  # shuffled, fixed
    v1 = set(tfv1.setting_names("v1"))
    v2 = set(tfv1.setting_names("v2"))
    nested = ("compat.v1.compat.v1", "compat.v1.compat.v2")
    assert len(v2) == 11965 and v1 == {n[10:] for n in v2 if n.startswith("compat.v1.")
                                       and not n.startswith(nested)}
    assert len(v1) == 3656
    for p in probs:
        assert p.oracle["v1"][1:] in v1 and p.oracle["v2"][1:] in v2
        assert p.oracle["v1"][1:] not in v2  # v1-only: TF 2 has it only under compat.v1
        last = p.api.rsplit(".", 1)[-1]
        assert f"def {last}(*args, **kwargs):" in p.prompt and p.prompt.endswith("return tf")
    with pytest.raises(ValueError, match="does not start with"):
        tfv1.problem("reduce_sum")
    with pytest.raises(ValueError, match="unknown TFv1 setting"):
        tfv1.setting_names("v3")


def test_setting_constraints_accept_the_oracles():
    lm = at.TableLM([bytes([b]) for b in range(32, 127)] + [b"<eos>"], lambda p: [1] * 96,
                    eos=95)
    p = tfv1.problems(limit=1)[0]
    for setting in tfv1.SETTINGS:
        m = tfv1.setting_constraint(setting).bind(lm.vocab)
        assert m.accepts(lm.encode(p.oracle[setting] + "("))
    assert not tfv1.setting_constraint("v2").bind(lm.vocab).accepts(
        lm.encode(p.oracle["v1"] + "("))
    v1 = set(tfv1.setting_names("v1"))
    assert not any(p.oracle["v2"][1:] in v1 for p in tfv1.problems())


@pytest.mark.parametrize("text, api", [
    (".losses.log_loss(labels", ".losses.log_loss"), (".a.b\n", ".a.b"), ("", ""),
    (" tf.x(", ""), (".nn.relu", ".nn.relu"), (".é(", ".é"),
])
def test_api_text(text, api):
    assert tfv1.api_text(text) == api


# -- the runner ----------------------------------------------------------------------------


class Squares:
    """A task without a model: job i's record holds i²; ``fail_at`` raises on one job."""

    def __init__(self, count: int, fail_at: int | None = None, option: int = 0,
                 error: type[BaseException] = KeyboardInterrupt, setup_error: bool = False
                 ) -> None:
        self.count, self.fail_at, self.option, self.ran = count, fail_at, option, []
        self.error, self.setup_error = error, setup_error

    def config(self):
        return {"task": "squares", "option": self.option}

    def jobs(self):
        return [{"key": f"j{i}", "i": i} for i in range(self.count)]

    def setup(self, threads=None):
        if self.setup_error:
            raise at.ModelLoadError("no such model file: /nope.gguf")

    def run(self, job):
        if job["i"] == self.fail_at:
            raise self.error(f"job {job['i']} failed")
        self.ran.append(job["i"])
        # a seeded draw: records must not depend on which worker ran the job
        draw = random.Random(runner.seed_for(0, job["key"])).random()
        return {"key": job["key"], "square": job["i"] ** 2, "draw": draw}


def test_runner_resumes_without_losing_or_redoing_work(tmp_path):
    path = tmp_path / "r.jsonl"
    first = Squares(10, fail_at=6)
    with pytest.raises(KeyboardInterrupt):
        runner.run(first, path)
    assert first.ran == [0, 1, 2, 3, 4, 5]
    with open(path, "a") as f:  # an interrupted write leaves half a line
        f.write('{"key": "j6", "squ')
    second = Squares(10)
    seen = []
    records = runner.run(second, path, on_start=lambda done, todo: seen.append((done, todo)))
    assert seen == [(6, 4)] and second.ran == [6, 7, 8, 9]
    assert sorted(r["square"] for r in records) == [i * i for i in range(10)]
    header, again = runner.read_results(path)
    assert header == {"task": "squares", "option": 0} and again == records
    assert all(r["finished_at"] >= r["started_at"] for r in records)
    assert runner.run(Squares(10), path) == records  # nothing left to do
    seen.clear()
    runner.run(Squares(4), path, on_start=lambda done, todo: seen.append((done, todo)))
    assert seen == [(4, 0)]  # counts only this task's jobs


class Streamed(Squares):
    """Jobs run in groups of 4 (``run_each``): before finishing a job, it waits (a bounded
    time) for the group's previous job to be in the results file, and says whether it was."""

    group = 4

    def __init__(self, count: int, path: Path) -> None:
        super().__init__(count)
        self.path = path

    def run_each(self, jobs):
        previous = None
        for job in jobs:
            seen = previous is None
            for _ in range(400):
                if seen or f'"key": "{previous}"' in self.path.read_text():
                    seen = True
                    break
                time.sleep(0.05)
            previous = job["key"]
            yield {**self.run(job), "previous_in_file": seen}

    def run_many(self, jobs):
        return list(self.run_each(jobs))


@pytest.mark.parametrize("workers", [1, 2])
def test_records_reach_the_file_as_each_job_of_a_group_finishes(tmp_path, workers):
    path = tmp_path / "r.jsonl"
    records = runner.run(Streamed(8, path), path, workers=workers)
    assert len(records) == 8
    assert all(r["previous_in_file"] for r in records)


def test_a_record_line_written_twice_counts_once(tmp_path):
    path = tmp_path / "r.jsonl"
    runner.run(Squares(3), path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[2], lines[1]]) + "\n")  # j1 and j0 again
    _, records = runner.read_results(path)
    assert [r["key"] for r in records] == ["j0", "j1", "j2"]
    again = Squares(4)
    assert [r["key"] for r in runner.run(again, path)] == ["j0", "j1", "j2", "j3"]
    assert again.ran == [3]


def test_report_plots_into_a_file_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "b.jsonl"
    path.write_bytes(gzip.decompress((RESULTS / "binary.jsonl.gz").read_bytes()))
    for plots in ("/etc/passwd", "/etc/passwd/x"):
        assert main(["report", str(path), "--plots", plots]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"adaptrack: error: --plots {plots}") and err.count("\n") == 1


def test_runner_refuses_a_file_from_other_options(tmp_path):
    path = tmp_path / "r.jsonl"
    runner.run(Squares(2), path)
    with pytest.raises(runner.ResultsMismatchError, match="option: file 0, now 1"):
        runner.run(Squares(2, option=1), path)
    for content in (b'{"key": 1}\n', b"notes without a final newline", b"\x1f\x8b\x08gz"):
        other = tmp_path / "other.txt"
        other.write_bytes(content)
        with pytest.raises(runner.ResultsMismatchError, match="not an adaptrack results"):
            runner.run(Squares(2), other)
        assert other.read_bytes() == content  # a foreign file is left as it was
    gz = tmp_path / "r.jsonl.gz"
    with pytest.raises(runner.ResultsMismatchError, match="gunzip it first"):
        runner.run(Squares(2), gz)
    assert not gz.exists()


def test_one_run_at_a_time_per_file(tmp_path):
    path = tmp_path / "r.jsonl"
    holder = runner.ResultsFile(path, {"task": "squares", "option": 0})
    try:
        with pytest.raises(runner.ResultsMismatchError, match="another run is writing"):
            runner.run(Squares(2), path)
    finally:
        holder.close()
    assert len(runner.run(Squares(2), path)) == 2


def _strip_times(records):
    return sorted(({k: v for k, v in r.items() if not k.endswith("_at")} for r in records),
                  key=lambda r: r["key"])


def test_worker_processes_give_the_same_records(tmp_path):
    one = runner.run(Squares(12), tmp_path / "one.jsonl")
    two = runner.run(Squares(12), tmp_path / "two.jsonl", workers=2)
    assert _strip_times(two) == _strip_times(one)
    with pytest.raises(ValueError, match="at least 1"):
        runner.Processes(0)


def test_a_failing_job_in_a_worker_keeps_finished_records(tmp_path):
    path = tmp_path / "r.jsonl"
    with pytest.raises(RuntimeError, match="job 5 failed"):
        runner.run(Squares(8, fail_at=5, error=RuntimeError), path, workers=2)
    kept = runner.read_results(path)[1]
    assert "j5" not in {r["key"] for r in kept}
    again = runner.run(Squares(8), path, workers=2)  # resumes: every job once
    assert sorted(r["key"] for r in again) == [f"j{i}" for i in range(8)]


def test_a_worker_that_cannot_set_up_says_why(tmp_path):
    with pytest.raises(runner.WorkerError, match="ModelLoadError: no such model file"):
        runner.run(Squares(3, setup_error=True), tmp_path / "r.jsonl", workers=2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_stop_when_the_parent_is_killed(tmp_path):
    """A parent killed outright runs no cleanup; its workers must not go on computing."""
    (tmp_path / "slowtask.py").write_text(textwrap.dedent(f"""
        import os, time
        class Slow:
            def config(self):
                return {{"task": "slow"}}
            def jobs(self):
                return [{{"key": f"j{{i}}"}} for i in range(4)]
            def setup(self, threads=None):
                open(os.path.join({str(tmp_path)!r}, f"worker-{{os.getpid()}}"), "w").close()
            def run(self, job):
                time.sleep(120)
                return {{"key": job["key"]}}
        """))
    code = ("from adaptrack.eval import runner; import slowtask\n"
            f"runner.run(slowtask.Slow(), {str(tmp_path / 'r.jsonl')!r}, workers=2)\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path})
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("worker-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(f.name.split("-")[1]) for f in tmp_path.glob("worker-*")]
        assert len(pids) == 2
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in pids)
    finally:
        parent.kill()
        for f in tmp_path.glob("worker-*"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(f.name.split("-")[1]), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has stopped
    except OSError:
        return False


def test_seed_for_is_stable_and_distinct():
    # a literal: a change of hashing would silently change every evaluation's samples
    assert runner.seed_for(0, "a", "cd", "v1") == SEED_A_CD_V1
    assert len({runner.seed_for(0, "a", m, s) for m in "xyz" for s in "uv"}) == 6


def test_wall_seconds_counts_overlaps_once():
    rows = [{"started_at": 0, "finished_at": 10}, {"started_at": 5, "finished_at": 12},
            {"started_at": 100, "finished_at": 101}, {"key": "old record"}]
    assert tables.wall_seconds(rows) == 13



def _guarded(code: str, cwd: Path, seconds: int = 60) -> str:
    """Run ``code`` in a fresh Python held to 1 GiB of memory and ``seconds`` of wall time,
    so a regression that reads without limit fails fast instead of eating the machine."""
    prelude = ("import resource\n"
               "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n")
    proc = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True,
                          text=True, timeout=seconds, cwd=cwd,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_results_path_that_is_not_a_regular_file_is_refused_unread(tmp_path):
    """`adaptrack eval binary -n 10 -o /dev/full` read the device without end (24 GB, then
    killed for memory) and `report` on a FIFO blocked for ever: both commands refuse such a
    path, naming it and what it is, before reading or writing it. A small gzip file that
    expands to 2 GiB is read only up to the line limit."""
    device = next((d for d in ("/dev/full", "/dev/zero") if os.path.exists(d)), None)
    code = f"""
import contextlib, gzip, io, json, os, socket
from adaptrack.cli import main
from adaptrack.eval import runner
os.mkfifo("fifo")
os.mkdir("dir")
sock = socket.socket(socket.AF_UNIX)
sock.bind("sock")
# 2 GiB of zeros after the header, in 2 MB of gzip (members of 64 MiB each, concatenated)
with open("bomb.jsonl.gz", "wb") as f:
    f.write(gzip.compress(b'{{"header": {{"task": "binary"}}}}\\n'))
    f.write(gzip.compress(bytes(64 << 20)) * 32)
err = io.StringIO()
with contextlib.redirect_stderr(err):
    out = {{"bomb.jsonl.gz": [main(["report", "bomb.jsonl.gz"]), err.getvalue()]}}
for path in {[device] if device else []} + ["fifo", "sock", "dir"]:
    got = out[path] = []
    for argv in (["eval", "binary", "-n", "10", "-o", path], ["report", path]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            got.append([main(argv), err.getvalue()])
    try:
        runner.read_results(path)
    except runner.ResultsMismatchError as exc:
        got.append([0, str(exc)])
print(json.dumps(out))
"""
    out = json.loads(_guarded(code, tmp_path))
    status, err = out.pop("bomb.jsonl.gz")
    assert status == 2 and "bomb.jsonl.gz line 2 is longer than 64 MiB" in err
    kinds = {"fifo": "FIFO", "sock": "socket", "dir": "directory", device: "character device"}
    assert len(out) == (4 if device else 3)
    for path, got in out.items():
        assert len(got) == 3, got
        for status, err in got:
            assert status in (0, 2) and f"{path} is a {kinds[path]}, not a regular file" in err
            assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.jsonl.gz", "dir", "fifo", "sock"]
    assert not any((tmp_path / "dir").iterdir())


def test_a_results_line_is_read_with_a_bound(tmp_path, monkeypatch):
    """A line longer than runner.LINE_LIMIT is an error, not a read of the whole line (the
    limit lowered to 1 MiB here to keep the test fast; the guarded test above uses 64 MiB)."""
    monkeypatch.setattr(runner, "LINE_LIMIT", 2**20)
    header = json.dumps({"header": {"task": "squares", "option": 0}}).encode() + b"\n"
    huge = b"0" * (2**20 + 10)
    plain = tmp_path / "r.jsonl"
    plain.write_bytes(header + huge + b"\n")
    with pytest.raises(runner.ResultsMismatchError, match="line 2 is longer than 1 MiB"):
        runner.run(Squares(2), plain)
    assert plain.stat().st_size == len(header) + len(huge) + 1  # left as it was
    with pytest.raises(runner.ResultsMismatchError, match="line 2 is longer than 1 MiB"):
        runner.read_results(plain)
    packed = tmp_path / "r.jsonl.gz"
    packed.write_bytes(gzip.compress(header + huge))  # no newline: torn, still too long
    with pytest.raises(runner.ResultsMismatchError, match="line 2 is longer than 1 MiB"):
        runner.read_results(packed)


def test_a_record_too_long_to_read_back_is_not_written(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "LINE_LIMIT", 2**20)

    class Big(Squares):
        def run(self, job):
            return {"key": job["key"], "blob": "x" * (2**20 if job["i"] else 1)}

    path = tmp_path / "r.jsonl"
    with pytest.raises(runner.ResultsMismatchError, match="over the 1 MiB line limit"):
        runner.run(Big(2), path)
    assert [r["key"] for r in runner.read_results(path)[1]] == ["j0"]
    with pytest.raises(ValueError, match="n must be at least 1 and at most 250,000"):
        binary.BinaryTask(n=10**6)


def _results(path: Path, header: dict, *lines) -> Path:
    rows = [json.dumps({"header": header})] + [x if isinstance(x, str) else json.dumps(x)
                                               for x in lines]
    path.write_text("\n".join(rows) + "\n")
    return path


TFV1_HEADER = {"task": "tfv1", "model": "default", "backend": "auto", "device": "auto",
               "n": 4, "temperature": 1.0, "max_new_tokens": 48, "seed": 0,
               "tf_version": "2.16.1"}
BINARY_RECORD = {"key": "cd", "method": "cd", "samples": [[1, 2]], "logprobs": [-1.0],
                 "lm_requests": [3], "lm_calls": 3, "seconds": 0.5}


@pytest.mark.parametrize("line, why", [
    (BINARY_RECORD, "line 3 is not a tfv1 record: no 'problem' field; it is a binary record"),
    ("[1, 2]", "line 3 is not a JSON object but an array"),
    ('"text"', "line 3 is not a JSON object but a string"),
    ({"problem": "p"}, "line 3 has no 'key'"),
    ({**BINARY_RECORD, "key": "x", "problem": "p", "method": "cd", "setting": "v1",
      "oracle": {"v1": ".a"}, "greedy": ".a", "samples": ".a"},
     "line 3 is not a tfv1 record: 'samples' is not a non-empty list of strings"),
    ({"header": TFV1_HEADER}, "line 3 is a second header"),
    ("{not json", "line 3 is not JSON"),
])
def test_report_refuses_a_bad_record_in_one_line(tmp_path, capsys, line, why):
    """A record of another task, or not an object, raised KeyError or TypeError from deep in
    the report; the parser now names the line and what is wrong."""
    path = _results(tmp_path / "r.jsonl", TFV1_HEADER, _row("x", "cd"), line)
    with pytest.raises(runner.ResultsMismatchError, match=why):
        report.report(path)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaptrack: error: ") and why in err and err.count("\n") == 1


@pytest.mark.parametrize("header, why", [
    ([], "not an adaptrack results file"),
    ({"model": "m"}, "not an adaptrack results file"),
    ({**TFV1_HEADER, "n": "many"}, "header option 'n' is not a positive integer"),
])
def test_report_refuses_a_bad_header_in_one_line(tmp_path, header, why):
    path = _results(tmp_path / "r.jsonl", header, _row("x", "cd"))
    with pytest.raises(runner.ResultsMismatchError, match=why):
        report.report(path)


def test_binary_record_checks(tmp_path):
    header = {"task": "binary", "n": 1}
    for bad, why in [({**BINARY_RECORD, "logprobs": []}, "1 samples but 0 logprobs"),
                     ({**BINARY_RECORD, "lm_requests": []}, "'lm_requests' is not a non-empty"),
                     ({"key": "target", "target": [[[1], "p", "0"]]}, "'target' is not")]:
        path = _results(tmp_path / "b.jsonl", header, bad)
        with pytest.raises(runner.ResultsMismatchError, match=why):
            report.report(path)


def test_eval_refuses_to_append_to_a_mixed_file(tmp_path):
    """`eval tfv1` appended its records after another task's, making a file no report could
    read; it now refuses the file, before loading a model, and leaves it as it was."""
    task = tfv1.TFv1Task(limit=1, n=4, max_new_tokens=48)
    task._lm = "no model: nothing may run"
    path = _results(tmp_path / "r.jsonl", task.config(), BINARY_RECORD)
    before = path.read_bytes()
    with pytest.raises(runner.ResultsMismatchError, match="line 2 is not a tfv1 record"):
        runner.run(task, path)
    with open(path, "a") as f:  # still refused with a torn last line after it
        f.write('{"key": "j6", "squ')
    with pytest.raises(runner.ResultsMismatchError, match="line 2 is not a tfv1 record"):
        runner.run(task, path)
    assert path.read_bytes() == before + b'{"key": "j6", "squ'


def test_shipped_results_files_pass_the_checks():
    if not (RESULTS / "binary.jsonl.gz").exists():
        pytest.skip("docs/results is not in this checkout")
    header, records = runner.read_results(RESULTS / "binary.jsonl.gz")
    assert header["task"] == "binary" and len(records) == 5
    assert "P(00000 | c)" in report.report(RESULTS / "binary.jsonl.gz")
    header, records = runner.read_results(RESULTS / "tfv1.jsonl.gz")
    assert header["task"] == "tfv1" and len(records) == 2912

# -- TFv1 end to end on a small exact model -------------------------------------------------


def _intent_model(prompt: str, intent: str) -> at.TableLM:
    """Newline, bytes 32..126 and EOS; after the prompt the model wants ``intent``, "("."""
    vocab = [b"\n"] + [bytes([b]) for b in range(32, 127)] + [b"<eos>"]
    lm = at.TableLM(vocab, lambda p: [1] * 97, eos=96)
    start = len(lm.encode(prompt))

    def next_probs(prefix):
        text = b"".join(vocab[t] for t in prefix[start:]).decode()
        w = [1.0] * 97
        want = intent[len(text)] if intent.startswith(text) and len(text) < len(intent) else "("
        w[vocab.index(want.encode())] = 300.0
        return w

    lm.next_probs = next_probs
    return lm


@pytest.fixture(scope="module")
def tfv1_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("tfv1") / "tfv1.jsonl"
    task = tfv1.TFv1Task(limit=1, n=4, max_new_tokens=48)
    p = tfv1.problems(limit=1)[0]
    task._lm = _intent_model(p.prompt, p.oracle["v1"])
    return path, task, runner.run(task, path), p


def test_tfv1_task_records(tfv1_run):
    path, task, records, p = tfv1_run
    assert len(records) == 7  # unconstrained once, 3 methods × 2 settings
    by = {(r["method"], r["setting"]): r for r in records}
    assert by[("unconstrained", None)]["oracle"] == p.oracle
    for method in ("cd", "adaptrack", "exact"):
        r = by[(method, "v1")]
        assert r["greedy"] == p.oracle["v1"]  # the intent is valid in v1
        assert len(r["samples"]) == len(r["lm_requests"]) == 4
        v2 = by[(method, "v2")]
        names = set(tfv1.setting_names("v2"))
        assert all(s[1:] in names for s in v2["samples"] + [v2["greedy"]])
    assert runner.run(task, path) == records  # resumed: nothing redone


def test_tfv1_report(tfv1_run, tmp_path):
    path, _, _, _ = tfv1_run
    s = apireport.tfv1_scores(runner.read_results(path)[1])
    assert s["problems"] == 1 and s["n"] == 4
    assert s["cells"][("cd", "v1")]["em"][1] == 1.0
    assert set(s["cells"][("cd", "v1")]["em"]) == {1, 3}  # EM@k only for k <= n
    text = report.report(path, plots=tmp_path)
    assert "| Constrained decoding | 100.00% |" in text
    assert "v2 avg (min, max)" in text
    pytest.importorskip("matplotlib")
    assert (tmp_path / "tfv1-em.png").stat().st_size > 1000


def _row(p, m, greedy=".a", samples=(".a", ".b", ".b", ".b"), calls=(1, 3, 5, 3), **extra):
    return {"key": f"{p}|{m}|v1", "problem": p, "method": m, "setting": "v1",
            "oracle": {"v1": ".a"}, "greedy": greedy, "samples": list(samples),
            "lm_requests": list(calls), "lm_calls": 3, "seconds": 1.0, **extra}


def test_report_arithmetic_table1_and_table5():
    rows = [_row("x", "cd"), _row("y", "cd", greedy=".b", calls=(5, 9, 10, 12)),
            _row("x", "exact"), _row("y", "exact", samples=[".b"] * 4)]
    s = apireport.tfv1_scores(rows)
    cd, exact = s["cells"][("cd", "v1")], s["cells"][("exact", "v1")]
    assert cd["em"][1] == 0.5 and exact["em"][1] == 1.0
    assert set(cd["em"]) == {1, 3}  # EM@k only for k <= n = 4
    assert cd["em"][3] == 0.75  # n = 4, c = 1, k = 3: 1 - C(3,3)/C(4,3), both problems
    assert exact["em"][3] == 0.375  # 0.75 on x, 0 on y
    # Table 5: the mean over problems of each one's average, minimum and maximum
    assert cd["calls"] == ((3 + 9) / 2, (1 + 5) / 2, (5 + 12) / 2)


def test_report_scores_errors_as_misses():
    rows = [_row("x", "cd"), _row("y", "cd"), _row("x", "exact"),
            {**_row("y", "exact"), "error": "TreeLimitError: too big"}]
    s = apireport.tfv1_scores(rows)
    assert s["problems"] == 2 and s["errors"] == {("exact", "v1"): 1}
    assert s["cells"][("exact", "v1")]["em"][1] == 0.5
    assert s["cells"][("exact", "v1")]["calls"][0] == 3  # from the finished job only
    assert "scored as misses: exact v1: 1" in report.tfv1_report({}, rows)


def test_report_counts_only_problems_every_method_has(tmp_path):
    rows = [_row(p, m) for p, m in [("x", "cd"), ("x", "exact"), ("y", "cd")]]
    s = apireport.tfv1_scores(rows)
    assert s["problems"] == 1 and s["dropped"] == 1
    # a gzipped results file reads the same
    gz = tmp_path / "r.jsonl.gz"
    lines = [json.dumps({"header": TFV1_HEADER})] + [json.dumps(r) for r in rows]
    gz.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    assert "# TFv1: 1 problems, n = 4" in report.report(gz)


# -- binary --------------------------------------------------------------------------------


def test_binary_study_on_a_uniform_model(tmp_path):
    """Uniform bits: the target is uniform over the 17 valid strings. CD gives 00000 about
    1/2 (KL ≈ 0.75); exact and AdapTrack are within sampling noise (≈ 16/(2n) = 0.02)."""
    task = binary.BinaryTask(n=400, prompt="")
    task._lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    path = tmp_path / "b.jsonl"
    runner.run(task, path)
    s = binary.binary_scores(runner.read_results(path)[1])
    assert len(s["target"]) == 17
    assert all(abs(p - 1 / 17) < 1e-12 for p in s["target"].values())
    m = s["methods"]
    assert 0.4 < m["cd"]["p00000"] < 0.6 and m["cd"]["kl"] > 0.5
    for method in ("exact", "adaptrack", "asap"):
        assert m[method]["kl"] < 0.1, method
        assert m[method]["outside"] == 0
    # the paper's sample KL differs from the exact one by one constant for every method
    offsets = [r["sample_kl"] - r["kl"] for r in m.values()]
    assert max(offsets) - min(offsets) < 1e-9
    assert len(m["cd"]["sliding"]) == (400 - 100) // 2 + 1
    text = report.report(path, plots=tmp_path)
    assert "| Constrained decoding |" in text and "P(00000 | c) = 0.0588" in text
    pytest.importorskip("matplotlib")
    assert (tmp_path / "binary-kl.png").stat().st_size > 1000


def test_iid_kl_matches_the_asymptotic_formula():
    target = {i: 1 / 17 for i in range(17)}
    # E[KL] ≈ (K − 1)/(2n) for n large; 2000 simulations, so the mean is within ~3 %
    assert abs(tables.iid_kls(target, 2000, reps=2000).mean() - 16 / 4000) < 0.0004
    assert math.isclose(tables.iid_kls(target, 10**9, reps=3).max(), 0, abs_tol=1e-7)


def test_tfv1_task_rejects_bad_options():
    with pytest.raises(ValueError, match="temperature > 0"):
        tfv1.TFv1Task(temperature=0)
    with pytest.raises(ValueError, match="unknown setting 'v3'"):
        tfv1.TFv1Task(settings=("v3",))


def test_binary_task_rejects_bad_options():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        binary.BinaryTask(temperature=0)
    with pytest.raises(ValueError, match="unknown method 'beam'"):
        binary.BinaryTask(methods=("beam",))


def test_the_weights_dtype_reaches_the_model_and_the_header(monkeypatch):
    import adaptrack.lm.load as load

    loaded = []
    monkeypatch.setattr(load, "load_model", lambda *a, **kw: loaded.append(kw["dtype"]))
    # auto is left out of the header: files made before the option existed still resume.
    assert "dtype" not in tfv1.TFv1Task().config()
    task = tfv1.TFv1Task(dtype="bfloat16")
    assert task.config()["dtype"] == "bfloat16"
    task.setup()
    # The binary study's KL needs float32 on every device, CUDA included.
    study = binary.BinaryTask(device="cuda")
    study.setup()
    assert "dtype" not in study.config()
    binary.BinaryTask(backend="llamacpp").setup()
    assert loaded == ["bfloat16", "float32", "auto"]
    # The command line's --dtype is the task's.
    tasks = []
    monkeypatch.setattr(runner, "run", lambda task, *a, **kw: tasks.append(task))
    for name in ("tfv1", "tfv1real", "humaneval"):
        assert main(["eval", name, "-o", "x.jsonl", "--dtype", "float16", "--no-report"]) == 0
    assert [t.config()["dtype"] for t in tasks] == ["float16"] * 3


# -- command line --------------------------------------------------------------------------


def test_cli_rejects_bad_eval_options(capsys, tmp_path):
    out = str(tmp_path / "r.jsonl")
    assert main(["eval", "tfv1", "--methods", "cd,beam", "-o", out]) == 2
    assert "'beam' is not one of unconstrained, cd, asap, adaptrack, exact" in \
        capsys.readouterr().err
    assert main(["eval", "tfv1", "--settings", "v3", "-o", out]) == 2
    assert main(["eval", "binary", "--temperature", "0", "-o", out]) == 2
    assert "temperature must be > 0" in capsys.readouterr().err
    assert main(["eval", "binary", "--dtype", "float16", "-o", out]) == 2
    assert "unrecognized arguments: --dtype" in capsys.readouterr().err
    assert main(["eval", "tfv1", "--dtype", "float64", "-o", out]) == 2
    assert "invalid choice: 'float64'" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read results file" in capsys.readouterr().err
    Path(out).write_text('{"header": {"task": "nope"}}\n')
    assert main(["report", out]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err


def test_cli_report_prints_tables(tfv1_run, capsys):
    path, _, _, _ = tfv1_run
    assert main(["report", str(path)]) == 0
    assert "## Exact match (Table 1)" in capsys.readouterr().out


def test_tfv1_jobs_run_together_give_the_records_they_give_alone(tfv1_run):
    """A worker runs a group of jobs on one engine (``run_many``); each job's record is the
    one it gets alone, but for the time it took."""
    _path, task, _records, _p = tfv1_run
    jobs = task.jobs()
    assert runner.group_size(task) == task.group > 1
    together = task.run_many(jobs)
    alone = [task.run(job) for job in jobs]
    drop = lambda r: {k: v for k, v in r.items() if k != "seconds"}  # noqa: E731
    assert [drop(r) for r in together] == [drop(r) for r in alone]
    assert all(r["seconds"] > 0 for r in together)
