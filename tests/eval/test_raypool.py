"""The Ray pool: the same records as local workers, resuming, failures, and the options
that choose it (issue 14). The runs use a local Ray started once for the module (about
10 s) and tasks without a real model."""

from __future__ import annotations

import os
import random
import sys

import pytest

import adaptrack as at
from adaptrack.cli import main
from adaptrack.errors import WorkerError
from adaptrack.eval import raypool, runner, tfv1


# Defined here, not imported from test_eval: Ray workers unpickle this module's tasks
# without tests/ on their path.
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


class TableTFv1(tfv1.TFv1Task):
    """TFv1 on a small exact model that each worker builds in ``setup`` (a pickled task
    carries no model)."""

    def setup(self, threads=None):
        if self._lm is None:
            p = tfv1.problems(limit=1)[0]
            self._lm = _intent_model(p.prompt, p.oracle["v1"])


def _tfv1() -> TableTFv1:
    return TableTFv1(limit=1, n=4, max_new_tokens=48, group=2)  # 7 jobs in 4 groups


class Squares:
    """A task without a model: job i's record holds i² and the threads its worker got;
    ``fail_at`` raises on one job, ``die_at`` kills the worker's process."""

    def __init__(self, count, fail_at=None, die_at=None, setup_error=False):
        self.count, self.fail_at, self.die_at = count, fail_at, die_at
        self.setup_error, self.threads = setup_error, None

    def config(self):
        return {"task": "squares"}

    def jobs(self):
        return [{"key": f"j{i}", "i": i} for i in range(self.count)]

    def setup(self, threads=None):
        if self.setup_error:
            raise at.ModelLoadError("no such model file: /nope.gguf")
        self.threads = threads

    def run(self, job):
        if job["i"] == self.fail_at:
            raise RuntimeError(f"job {job['i']} failed")
        if job["i"] == self.die_at:
            os._exit(3)
        draw = random.Random(runner.seed_for(0, job["key"])).random()
        return {"key": job["key"], "square": job["i"] ** 2, "draw": draw,
                "threads": self.threads}


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'adaptrack[ray]'")
    # Ray's workers cannot import this test module: its tasks travel by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="warning")
    yield ray
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _strip_times(records):
    return sorted(({k: v for k, v in r.items() if k not in ("started_at", "finished_at",
                                                            "seconds")} for r in records),
                  key=lambda r: r["key"])


@pytest.fixture(scope="module")
def local_tfv1(tmp_path_factory):
    return runner.run(_tfv1(), tmp_path_factory.mktemp("local") / "r.jsonl")


def test_ray_actors_give_the_records_of_the_local_pool(ray, local_tfv1, tmp_path):
    records = runner.run(_tfv1(), tmp_path / "r.jsonl", workers=raypool.RayPool(2))
    assert len(records) == 7
    assert _strip_times(records) == _strip_times(local_tfv1)
    assert runner.read_results(tmp_path / "r.jsonl")[1] == records


def test_an_interrupted_ray_run_resumes_from_its_file(ray, local_tfv1, tmp_path):
    path = tmp_path / "r.jsonl"

    def interrupt(record):
        if len(runner.read_results(path)[1]) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run(_tfv1(), path, workers=raypool.RayPool(2), on_record=interrupt)
    assert len(runner.read_results(path)[1]) == 3
    seen = []
    records = runner.run(_tfv1(), path, workers=raypool.RayPool(2),
                         on_start=lambda done, todo: seen.append((done, todo)))
    assert seen == [(3, 4)]
    assert _strip_times(records) == _strip_times(local_tfv1)  # every job once


def test_a_failing_job_keeps_the_finished_records(ray, tmp_path):
    path = tmp_path / "r.jsonl"
    with pytest.raises(RuntimeError, match=r"^job 5 failed$"):
        runner.run(Squares(8, fail_at=5), path, workers=raypool.RayPool(2))
    kept = runner.read_results(path)[1]
    assert "j5" not in {r["key"] for r in kept}
    assert {r["threads"] for r in kept} == {1}  # 2 CPUs over 2 actors
    again = runner.run(Squares(8), path, workers=raypool.RayPool(1))
    assert sorted(r["key"] for r in again) == [f"j{i}" for i in range(8)]


def test_a_ray_worker_that_dies_or_cannot_set_up_says_so(ray, tmp_path):
    with pytest.raises(WorkerError, match=r"a Ray worker died .*--pool local --workers 1"):
        runner.run(Squares(6, die_at=2), tmp_path / "a.jsonl", workers=raypool.RayPool(2))
    with pytest.raises(WorkerError, match="could not set up: ModelLoadError: no such model"):
        runner.run(Squares(3, setup_error=True), tmp_path / "b.jsonl",
                   workers=raypool.RayPool(2))


class _Nodes:
    """What ``_share`` reads of Ray: the alive nodes' resources."""

    def __init__(self, *cpus, gpus=()):
        self.cpus, self.gpus = cpus, gpus or (0.0,) * len(cpus)

    def nodes(self):
        return [{"Alive": True, "Resources": {"CPU": c, "GPU": g}}
                for c, g in zip(self.cpus, self.gpus, strict=True)] + [
            {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}]


@pytest.mark.parametrize("cpus, gpus, workers, share", [
    ((2.0,), (), 2, (1.0, 0.0)), ((2.0,), (), 4, (0.5, 0.0)), ((2.0,), (), 3, (0.6666, 0.0)),
    ((16.0,), (1.0,), 3, (5.0, 0.3333)), ((8.0, 8.0), (2.0, 2.0), 1, (8.0, 2.0)),
    ((8.0, 2.0), (1.0, 0.0), 2, (5.0, 0.5))])
def test_each_actor_reserves_an_equal_share_of_the_cluster(cpus, gpus, workers, share):
    pool = raypool.RayPool.__new__(raypool.RayPool)
    pool.workers = workers
    nodes = _Nodes(*cpus, gpus=gpus)
    assert (pool._share(nodes, "CPU"), pool._share(nodes, "GPU")) == share


def test_without_ray_the_pool_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(WorkerError, match=r"needs Ray .*: pip install 'adaptrack\[ray\]'"):
        runner.pool(2, kind="ray")
    out = tmp_path / "r.jsonl"
    assert main(["eval", "binary", "-o", str(out), "--pool", "ray"]) == 2
    assert "adaptrack[ray]" in capsys.readouterr().err and not out.exists()


def test_eval_passes_the_pool_options(monkeypatch, tmp_path, capsys):
    pools = []
    monkeypatch.setattr(runner, "run", lambda task, path, workers, **kw: pools.append(workers))
    monkeypatch.setattr(raypool.RayPool, "_connect", lambda self: None)  # joins no cluster
    base = ["eval", "binary", "-o", str(tmp_path / "r.jsonl"), "--no-report"]
    assert main([*base, "--pool", "ray", "--workers", "3", "--ray-address", "auto"]) == 0
    assert main([*base, "--workers", "2"]) == 0
    ray_pool, local = pools
    assert (type(ray_pool), ray_pool.workers, ray_pool.address) == (raypool.RayPool, 3, "auto")
    assert (type(local), local.workers) == (runner.Processes, 2)
    assert main([*base, "--ray-address", "auto"]) == 2
    assert "--ray-address needs --pool ray" in capsys.readouterr().err
    with pytest.raises(ValueError, match="address is for kind='ray'"):
        runner.pool(2, address="auto")
