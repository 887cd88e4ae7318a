"""``adaptrack serve --replicas N``: N replicas of the server on Ray Serve, one model each,
behind one endpoint (:mod:`.front`) that routes by prompt prefix (:mod:`.routing`).

A :class:`Replica` is a Ray Serve deployment holding a whole :class:`~.serving.Server`
(its model, engine thread, tree cache and metrics): it answers a request the way the
single-process server's route does and names itself in the answer (the ``adaptrack``
object's ``replica`` and the ``X-Adaptrack-Replica`` header). :func:`launch` starts Ray
(or joins the cluster ``RAY_ADDRESS`` names) and deploys the N replicas as one Serve
application, so that they load their models at once; Serve's own HTTP proxy stays off
(the front listens on the user's host and port). :meth:`Replicas.close` deletes them after
the front has drained: Serve waits for the requests a replica still holds, then calls its
``__del__``, which finishes its engine.

Needs Ray Serve (the ``replicas`` extra); this module imports Ray only in :func:`launch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ReplicaError
from ..lm.base import LanguageModel
from .errors import APIError
from .serving import Answer, Server

#: The response header naming the replica that answered (also in a body's ``adaptrack``).
REPLICA_HEADER = "X-Adaptrack-Replica"
#: The start of the name of the Serve application the replicas form (a process's own
#: suffix follows: two servers on one Ray cluster do not replace each other's).
APP_NAME = "adaptrack"
#: Ids of requests whose client left before they reached the replica, kept at most.
LEFT_KEPT = 4096
#: The one-line fix printed when Ray Serve is missing.
INSTALL = "pip install 'adaptrack[replicas]'"


@dataclass(frozen=True)
class Head:
    """The first item a replica yields for a request: its status, headers and JSON body,
    or ``stream`` when server-sent events (strings) follow."""

    status: int
    body: dict[str, Any] | None
    headers: dict[str, str]
    stream: bool = False


class Replica:
    """One replica: a :class:`Server` over the model ``load()`` returns, named ``name``
    (``replica-0``, ...); ``options`` are the server's. The methods are what the front
    calls through Ray Serve's handles.

    >>> import adaptrack as at
    >>> toy = lambda: at.TableLM([b"a", b"b", b"<eos>"], lambda p: [1, 1, 1], eos=2)
    >>> r = Replica("replica-0", toy, {"model_name": "toy"})
    >>> r.health()[0], "adaptrack_requests_total" in r.metrics_text()
    (200, True)
    >>> r.close()
    """

    def __init__(self, name: str, load: Callable[[], LanguageModel],
                 options: dict[str, Any]) -> None:
        self.name = name
        self.server = Server(load(), **options)
        self.server.start()
        self._gone: dict[str, asyncio.Event] = {}  # by request id, while it is answered
        self._left: dict[str, None] = {}  # ids whose client left before they arrived

    async def leave(self, rid: str) -> None:
        """The client of request ``rid`` has left: cancel its walks (the front says so
        itself, whether or not Serve's cancellation reaches :meth:`generate`)."""
        if rid in self._gone:
            self._gone[rid].set()
            return
        self._left[rid] = None
        while len(self._left) > LEFT_KEPT:
            del self._left[next(iter(self._left))]

    async def generate(self, kind: str, body: bytes, endpoint: str, authorization: str,
                       waited: float, rid: str) -> AsyncIterator[Head | str]:
        """Answer a request of ``kind`` whose ``body`` the front read ``waited`` seconds
        after it arrived: a :class:`Head`, then the stream's events, if any. Cancelled,
        or told its client left (:meth:`leave`), the request's walks are cancelled."""
        gone = self._gone[rid] = asyncio.Event()
        if rid in self._left:  # its client left while it travelled here
            del self._left[rid]
            gone.set()
        try:
            async for item in self._answer(kind, body, endpoint, authorization, waited, gone):
                yield item
        finally:
            self._gone.pop(rid, None)

    async def _answer(self, kind: str, body: bytes, endpoint: str, authorization: str,
                      waited: float, gone: asyncio.Event) -> AsyncIterator[Head | str]:
        started, arrived = time.perf_counter(), time.monotonic() - waited

        async def disconnected() -> None:
            await gone.wait()

        try:
            self.server.authorize(authorization)
        except APIError as err:
            answer = self.server.error(err, endpoint, started)
        else:
            task = asyncio.ensure_future(self.server.generate(kind, body, endpoint, started,
                                                              arrived, disconnected))
            try:
                answer = await asyncio.shield(task)
            except asyncio.CancelledError:
                gone.set()  # the server cancels the request's walks and counts a 499
                while not task.done():  # however often Serve cancels, until it has
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(task)
                raise
        yield self._head(answer)
        if answer.stream is not None:
            async for piece in answer.stream:
                yield self._named(piece)

    def models(self, authorization: str) -> tuple[int, dict[str, Any]]:
        """``/v1/models``: its status and body."""
        try:
            self.server.authorize(authorization)
        except APIError as err:
            return err.status, err.body()
        return 200, self.server.models()

    def health(self) -> tuple[int, dict[str, Any]]:
        """``/health`` of this replica: its status and body."""
        answer = self.server.health()
        return answer.status, answer.body or {}

    def check_health(self) -> None:
        """Serve's periodic check: a replica whose engine thread died (a bug) is
        restarted."""
        if not self.server.stopping and not self.server.engine.alive:
            raise RuntimeError(f"{self.name}: the engine thread is not running")

    def metrics_text(self) -> str:
        """This replica's Prometheus text."""
        return self.server.metrics_text()

    def close(self) -> None:
        """Refuse new requests, finish those in flight, stop the engine thread (again:
        nothing)."""
        server = getattr(self, "server", None)  # None: the model did not load
        if server is not None:
            server.close()

    def __del__(self) -> None:  # Serve calls it once the replica has drained
        self.close()

    def _head(self, answer: Answer) -> Head:
        body = answer.body
        if body is not None and isinstance(body.get("adaptrack"), dict):
            body["adaptrack"]["replica"] = self.name
        return Head(answer.status, body, {**answer.headers, REPLICA_HEADER: self.name},
                    answer.stream is not None)

    def _named(self, piece: str) -> str:
        """A server-sent event, with the replica named in its ``adaptrack`` object (the
        final chunk's, with ``include_usage``)."""
        if not piece.startswith("data: {") or '"adaptrack"' not in piece:
            return piece
        data = json.loads(piece[len("data: "):])
        if isinstance(data.get("adaptrack"), dict):
            data["adaptrack"]["replica"] = self.name
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Group:
    """The Serve application's root: it binds the replicas so that Serve deploys them
    together (each loads its model at the same time); requests go to the replicas."""

    def __init__(self, *replicas: Any) -> None:
        self.count = len(replicas)

    def size(self) -> int:
        return self.count


@dataclass
class Replicas:
    """The running replicas: their ``names``, Serve ``handles`` by name and Serve
    application ``app``; :meth:`close` deletes them (and stops the Ray this process
    started)."""

    names: list[str]
    handles: dict[str, Any]
    app: str = APP_NAME
    started_ray: bool = False
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        from ray import serve

        serve.delete(self.app)
        if self.started_ray:
            import ray

            ray.shutdown()


def ray_serve() -> tuple[Any, Any]:
    """``(ray, ray.serve)``, or :class:`ReplicaError` saying which extra to install.

    >>> ray_serve()[1].__name__
    'ray.serve'
    """
    try:
        import ray
        from ray import serve
    except ImportError as err:
        raise ReplicaError(f"--replicas needs Ray Serve: {INSTALL} ({err})") from None
    return ray, serve


def cause(err: BaseException) -> str:
    """The line of Serve's error that says why: the last ``SomeError: message`` of the
    replica's traceback it carries, else its first line.

    >>> cause(RuntimeError("Deploying failed:\\nTraceback ...\\n"
    ...                    "adaptrack.errors.ModelLoadError: no model at /x"))
    'ModelLoadError: no model at /x'
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    said = [m.group(1) for line in lines
            if (m := re.match(r"(?:[\w.]+\.)?(\w+(?:Error|Exception): .*)", line))]
    return said[-1] if said else lines[0] if lines else type(err).__name__


def _deployment_messages(serve: Any, name: str) -> list[str]:
    """What Serve says of each deployment of application ``name`` (a failed one: its
    traceback)."""
    try:
        app = serve.status().applications.get(name)
        return [str(d.message) for d in app.deployments.values() if d.message]
    except Exception:  # Serve itself is down: its first error says enough
        return []


def share(ray: Any, resource: str, count: int) -> float:
    """An equal share of the cluster's ``resource`` ("CPU", "GPU") for each of ``count``
    replicas, at most one node's, whole above 1 (Ray takes fractions below 1 only): what
    Ray can always place."""
    nodes = [n.get("Resources", {}).get(resource, 0.0) for n in ray.nodes() if n.get("Alive")]
    each = min(sum(nodes) / count, max(nodes, default=0.0))
    return float(int(each)) if each >= 1 else math.floor(each * 10_000) / 10_000


def launch(load: Callable[[], LanguageModel], count: int, options: dict[str, Any], *,
           gpus: bool = True, actor_options: dict[str, Any] | None = None) -> Replicas:
    """Start ``count`` replicas, each a :class:`Replica` over ``load()`` with the server
    ``options``, and wait until every one has loaded its model. Uses the Ray this process
    is connected to, else starts one (``ray.init``: the cluster of ``RAY_ADDRESS``, or a
    local one). ``actor_options``: Ray's resources per replica (default: an equal
    :func:`share` of the CPUs and, with ``gpus``, of the GPUs).

    >>> launch(lambda: None, 0, {})
    Traceback (most recent call last):
    ...
    ValueError: count must be at least 1, got 0
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    ray, serve = ray_serve()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # not a line per step
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(include_dashboard=False, log_to_driver=False, logging_level="warning")
        except Exception as err:  # a wrong RAY_ADDRESS, a cluster that is down
            raise ReplicaError(f"cannot start or join Ray: {cause(err)}; fix RAY_ADDRESS or "
                               "unset it for a local Ray") from None
    if actor_options is None:
        actor_options = {"num_cpus": share(ray, "CPU", count)}
        if gpus and share(ray, "GPU", count) > 0:
            actor_options["num_gpus"] = share(ray, "GPU", count)
    # Room for every request the server takes (it answers 429 past them itself) and for
    # the front's health and metrics probes beside them.
    concurrent = int(options.get("max_concurrent", 16)) + int(options.get("max_queue", 64)) + 8
    names = [f"replica-{i}" for i in range(count)]
    app = f"{APP_NAME}-{uuid.uuid4().hex[:8]}"
    replica = serve.deployment(Replica)
    bound = [replica.options(name=name, num_replicas=1, max_ongoing_requests=concurrent,
                             ray_actor_options=actor_options,
                             max_constructor_retry_count=1).bind(name, load, options)
             for name in names]
    root = serve.deployment(_Group).options(name="group", ray_actor_options={"num_cpus": 0})
    try:
        serve.start(proxy_location="Disabled")
        serve.run(root.bind(*bound), name=app, route_prefix=None)
    except Exception as err:
        why = cause(RuntimeError("\n".join([str(err), *_deployment_messages(serve, app)])))
        if started:
            ray.shutdown()
        raise ReplicaError(f"the replicas did not start: {why}") from None
    handles = {name: serve.get_deployment_handle(name, app_name=app) for name in names}
    return Replicas(names, handles, app, started)
