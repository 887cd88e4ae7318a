"""A :class:`~adaptrack.eval.jobs.Pool` on Ray: one actor per worker, on one machine or a
cluster.

Each actor receives the task once, loads its model once (``task.setup(threads)``, as a
local worker process does) and then runs groups of jobs with the runner's own grouping and
timing, so a job's record is the one :class:`~adaptrack.eval.pools.Processes` gives it (the
jobs' seeds come from their keys, not from where they run). Records stream back as groups
finish (``ray.wait``); the driver alone writes the results file, so resuming an interrupted
run works as with local workers. Ray is an optional extra: ``pip install 'adaptrack[ray]'``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ..errors import WorkerError
from .jobs import Job, Record, Task, available_cpus, grouped, timed_group

RAY_EXTRA = "pip install 'adaptrack[ray]' (or: pip install 'ray>=2.9')"

_AHEAD = 2
"""Groups queued on each actor, so it starts the next while the last one's records travel."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise WorkerError(f"--pool ray needs Ray ({err}): {RAY_EXTRA}") from None
    return ray


class _Worker:
    """The actor: one task, set up once, running groups of jobs."""

    def __init__(self, task: Task, threads: int) -> None:
        self.task, self.threads = task, threads

    def setup(self) -> str | None:
        """The setup error as ``"Type: message"`` (reported with the actor's first job, as a
        local worker reports it), or None."""
        try:
            self.task.setup(self.threads)
        except Exception as err:
            return f"{type(err).__name__}: {err}"
        return None

    def run(self, jobs: list[Job]) -> list[Record]:
        return timed_group(self.task, jobs)


class _RemoteTraceback(Exception):
    """Where a job failed in its actor (Ray's text of the remote traceback)."""


def _cause(err: BaseException) -> BaseException:
    """The exception a job raised in an actor, with the remote traceback as its cause, so
    the command line reports the library's own one-line error."""
    cause = getattr(err, "cause", None)
    if not isinstance(cause, BaseException):
        return err
    cause.__cause__ = _RemoteTraceback(str(err))
    return cause


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0].rstrip(".") if lines else type(err).__name__


class RayPool:
    """Spread jobs over ``workers`` Ray actors, each loading the model once.

    ``address``: the Ray cluster to join (``"auto"`` for the one this machine belongs to,
    ``"HOST:6379"``, or ``"ray://HOST:10001"`` for Ray Client); None starts a local Ray with
    this machine's cores. A process already connected to Ray (``ray.init``) keeps that
    connection. Each actor reserves an equal share of the cluster's CPUs (at most one
    node's) and runs with that many threads (at least 1), and, unless the task's device is
    ``"cpu"``, an equal share of its GPUs; Ray spreads the actors over the nodes, and an
    actor Ray cannot place gets no jobs. Jobs are handed out in order, in
    groups (:func:`~adaptrack.eval.jobs.group_size`), to the actors that have set up.
    When a job fails or the run is interrupted, the records already finished are yielded
    first and the actors are killed without waiting for the jobs they hold.

    >>> RayPool(0)
    Traceback (most recent call last):
    ...
    ValueError: workers must be at least 1, got 0
    """

    def __init__(self, workers: int, address: str | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers, self.address = workers, address
        # a missing Ray or a wrong address is reported before any model or file work; a
        # local Ray starts with the first jobs (a finished run needs none)
        if address is None:
            _ray()
        else:
            self._connect()

    def _connect(self) -> Any:
        ray = _ray()
        if ray.is_initialized():
            return ray
        options: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                       logging_level="warning")
        address = self.address
        if address is None:  # "local": a new Ray, not a cluster `ray start` left running here
            address, options["num_cpus"] = "local", available_cpus()
        try:
            # left running for later runs in this process; Ray stops it at exit
            ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as err:
            if self.address is None:
                raise WorkerError(f"cannot start a local Ray: {_first_line(err)}") from None
            raise WorkerError(f"cannot join the Ray cluster at {self.address!r}: "
                              f"{_first_line(err)}; start it with `ray start --head` or fix "
                              "--ray-address") from None
        return ray

    def _share(self, ray: Any, resource: str) -> float:
        """How much of ``resource`` ("CPU", "GPU") each actor reserves: an equal share of
        the cluster's, at most one node's, whole above 1 (Ray takes fractions below 1 only)."""
        nodes = [n.get("Resources", {}).get(resource, 0.0) for n in ray.nodes() if n.get("Alive")]
        share = min(sum(nodes) / self.workers, max(nodes, default=0.0))
        return float(int(share)) if share >= 1 else math.floor(share * 10_000) / 10_000

    def imap(self, task: Task, jobs: list[Job]) -> Iterator[Record]:
        if not jobs:
            return
        ray = self._connect()
        cpus = self._share(ray, "CPU")
        # Ray hides the GPUs from an actor that reserves none (CUDA_VISIBLE_DEVICES="")
        gpus = 0.0 if getattr(task, "device", "auto") == "cpu" else self._share(ray, "GPU")
        actor_class = ray.remote(_Worker).options(num_cpus=cpus, num_gpus=gpus,
                                                  scheduling_strategy="SPREAD")
        actors = [actor_class.remote(task, max(1, int(cpus))) for _ in range(self.workers)]
        # each waited-on reference -> (its actor, whether it is the actor's setup)
        pending: dict[Any, tuple[Any, bool]] = {a.setup.remote(): (a, True) for a in actors}
        groups = grouped(task, jobs)
        given = running = 0
        failed: BaseException | None = None
        try:
            while given < len(groups) or running:
                done, rest = ray.wait(list(pending), num_returns=1)
                if rest:  # the others done too: their records are kept before a failure
                    done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
                for ref in done:
                    actor, is_setup = pending.pop(ref)
                    running -= not is_setup
                    try:
                        value = ray.get(ref)
                    except ray.exceptions.RayActorError as err:
                        failed = failed or WorkerError(
                            f"a Ray worker died ({_first_line(err)}); run with --pool local "
                            "--workers 1 to see why")
                        continue
                    except ray.exceptions.RayTaskError as err:
                        failed = failed or _cause(err)
                        continue
                    if is_setup and value is not None:
                        failed = failed or WorkerError(f"a Ray worker could not set up: {value}")
                        continue
                    if not is_setup:
                        yield from value
                    for _ in range(_AHEAD if is_setup else 1):
                        if given < len(groups) and failed is None:
                            pending[actor.run.remote(groups[given])] = (actor, False)
                            given, running = given + 1, running + 1
                if failed is not None:
                    raise failed
        finally:  # also the actors still waiting for a node: no job is left for them
            for actor in actors:
                ray.kill(actor)
