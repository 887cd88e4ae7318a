"""The one endpoint of ``adaptrack serve --replicas N``: a Starlette app with the single
server's routes that hands each request to a replica (:mod:`.replicas`) through Ray
Serve's handles, chosen by :class:`~.routing.PrefixRouter`.

The front reads a request's body, routes it by its prompt's prefix and passes it on
whole; the replica answers it as the single-process server does (authorization, 400s,
429, streaming), so the OpenAI logic lives in one place. A replica whose queue is full
(429) passes the request on to the next one; a replica that fails to answer gets 503 (a
request that broke one replica is not sent on to break the others). ``/health`` and
``/metrics`` ask every replica: health is ``ok`` when all are, ``degraded`` (still 200)
when some are, 503 when none is; the metrics are each replica's, labelled
``replica="replica-i"``. The front counts nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .app import disconnected, not_found, read_body
from .errors import APIError
from .replicas import Head, Replicas
from .routing import PrefixRouter, routing_text
from .serving import CLIENT_GONE

#: Seconds the front waits for a replica's health or metrics.
PROBE_SECONDS = 10.0


def _json(status: int, body: dict[str, Any] | None, headers: dict[str, str]) -> Response:
    if body is None:
        return Response(status_code=status, headers=headers)
    return JSONResponse(body, status_code=status, headers=headers)


class _Stream(StreamingResponse):
    """A streamed answer whose events' generator is closed as soon as the response ends
    (Starlette leaves that to the garbage collector when the client left), so that the
    replica hears at once that its request is no longer read."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


class Front:
    """Routes requests over ``replicas`` (:class:`~.routing.PrefixRouter`)."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas
        self.router = PrefixRouter(replicas.names)

    async def generate(self, request: Request, kind: str) -> Response:
        arrived = time.monotonic()
        try:
            body = await read_body(request)
        except APIError as err:
            return JSONResponse(err.body(), status_code=err.status)
        except ClientDisconnect:
            return Response(status_code=CLIENT_GONE)
        text, tried = routing_text(kind, body), set[str]()
        auth = request.headers.get("authorization", "")
        while True:
            name = self.router.route(text, exclude=frozenset(tried))
            tried.add(name)
            handle, rid = self.replicas.handles[name], uuid.uuid4().hex
            stream = handle.options(stream=True).generate.remote(
                kind, body, request.url.path, auth, time.monotonic() - arrived, rid)
            try:
                head = await self._head(stream, request)
            except BaseException as err:
                self.router.done(name)
                stream.cancel()
                if isinstance(err, ClientDisconnect):
                    await self._leave(name, rid)
                    return Response(status_code=CLIENT_GONE)
                if not isinstance(err, Exception):
                    raise
                # Not passed on: a request that broke one replica could break them all.
                fail = APIError(503, f"{name} failed to answer: {_first_line(err)}",
                                code="replica_failed")
                return JSONResponse(fail.body(), status_code=503)
            if head.status == 429 and len(tried) < len(self.replicas.names):
                self.router.done(name)
                continue
            if not head.stream:
                self.router.done(name)
                return _json(head.status, head.body, head.headers)
            return _Stream(self._rest(stream, name, rid), status_code=head.status,
                                     media_type="text/event-stream", headers=head.headers)

    async def _head(self, stream: Any, request: Request) -> Head:
        """The replica's first item, unless the client leaves first
        (:class:`ClientDisconnect`)."""
        first = asyncio.ensure_future(stream.__anext__())
        gone = asyncio.ensure_future(disconnected(request))
        try:
            done, _ = await asyncio.wait({first, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if first not in done:
            first.cancel()
            raise ClientDisconnect()
        head = first.result()
        if not isinstance(head, Head):
            raise RuntimeError(f"the replica sent {type(head).__name__} before its head")
        return head

    async def _rest(self, stream: Any, name: str, rid: str) -> AsyncIterator[str]:
        """The stream's events; closed early (the client left), the replica's request
        is cancelled."""
        over = False
        try:
            async for piece in stream:
                yield piece
            over = True
        finally:
            self.router.done(name)
            if not over:
                stream.cancel()
                await self._leave(name, rid)

    async def _leave(self, name: str, rid: str) -> None:
        """Tell replica ``name`` that the client of request ``rid`` left (Serve's own
        cancellation may not reach a request it already handed over)."""
        with contextlib.suppress(Exception):
            await asyncio.shield(asyncio.wait_for(
                self.replicas.handles[name].leave.remote(rid), PROBE_SECONDS))

    async def models(self, request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        for name in self.replicas.names:  # the first that answers
            try:
                status, body = await asyncio.wait_for(
                    self.replicas.handles[name].models.remote(auth), PROBE_SECONDS)
            except Exception:
                continue
            return JSONResponse(body, status_code=status)
        fail = APIError(503, "no replica answered", code="replica_failed")
        return JSONResponse(fail.body(), status_code=503)

    async def health(self, request: Request) -> Response:
        answers = await self._ask("health")
        each = {name: (a[1] if isinstance(a, tuple) else {"status": "unreachable",
                                                             "error": _first_line(a)})
                for name, a in answers.items()}
        ok = sum(isinstance(a, tuple) and a[0] == 200 for a in answers.values())
        status = "ok" if ok == len(answers) else "degraded" if ok else "unavailable"
        return JSONResponse({"status": status, "replicas": each},
                            status_code=200 if ok else 503)

    async def metrics(self, request: Request) -> Response:
        answers = await self._ask("metrics_text")
        texts = {name: a for name, a in answers.items() if isinstance(a, str)}
        return PlainTextResponse(merge_metrics(texts), media_type="text/plain; version=0.0.4")

    async def _ask(self, method: str) -> dict[str, Any]:
        """Every replica's answer to ``method`` (an exception where it gave none)."""
        async def one(name: str) -> Any:
            return await asyncio.wait_for(
                getattr(self.replicas.handles[name], method).remote(), PROBE_SECONDS)

        names = self.replicas.names
        answers = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
        return dict(zip(names, answers, strict=True))


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:300]


def merge_metrics(texts: dict[str, str]) -> str:
    """One Prometheus text from each replica's (by name): every sample gets a ``replica``
    label, each family's samples together under its HELP and TYPE.

    >>> print(merge_metrics({"r0": "# TYPE x counter\\nx 1\\n", "r1": "# TYPE x counter\\nx 2\\n"}))
    # TYPE x counter
    x{replica="r0"} 1
    x{replica="r1"} 2
    <BLANKLINE>
    """
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for name, text in texts.items():
        family = ""
        for line in text.splitlines():
            if line.startswith("#"):
                parts = line.split(maxsplit=3)
                family = parts[2] if len(parts) > 2 else family
                if len(heads.setdefault(family, [])) < 2 and line not in heads[family]:
                    heads[family].append(line)
                samples.setdefault(family, [])
            elif line.strip():
                metric, brace, rest = line.partition("{")
                label = f'replica="{name}"'
                if brace:
                    line = f"{metric}{{{label},{rest}"
                else:
                    metric, _, value = line.partition(" ")
                    line = f"{metric}{{{label}}} {value}"
                samples.setdefault(family, []).append(line)
    out = []
    for family, lines in samples.items():
        out += heads.get(family, []) + lines
    return "\n".join(out) + "\n"


def create_front(replicas: Replicas) -> Starlette:
    """The endpoint's ASGI app over running ``replicas`` (:func:`.replicas.launch`),
    with the single server's routes."""
    front = Front(replicas)

    async def completions(request: Request) -> Response:
        return await front.generate(request, "completion")

    async def chat(request: Request) -> Response:
        return await front.generate(request, "chat")

    routes = [Route("/v1/models", front.models, methods=["GET"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/health", front.health, methods=["GET"]),
              Route("/metrics", front.metrics, methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.state.front = front
    return app
