"""The routes of ``adaptrack serve``: a Starlette app over one :class:`~.serving.Server`,
which holds the serving logic (routes apart from it, as in vLLM's OpenAI entrypoint).

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /health`` and ``GET /metrics`` (Prometheus text). With an API key, every ``/v1/``
request needs ``Authorization: Bearer KEY`` (401 otherwise); ``/health`` and ``/metrics``
stay open. A route reads the request (its body up to :data:`MAX_BODY_BYTES`), asks the
server, and sends its :class:`~.serving.Answer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..lm.base import LanguageModel
from .errors import APIError
from .guards import HostGuard, JSONAnswer, check_json_body
from .serving import Answer, ClientGone, Server

__all__ = ["MAX_BODY_BYTES", "ClientGone", "Server", "create_app"]

#: The largest request body read (a long prompt or a big schema is far below it); a larger
#: one is refused with 413 before it is held in memory.
MAX_BODY_BYTES = 32 << 20

Handler = Callable[[Request], Awaitable[Response]]


def _respond(answer: Answer) -> Response:
    if answer.stream is not None:
        return StreamingResponse(answer.stream, media_type="text/event-stream",
                                 headers=answer.headers)
    if answer.body is None:
        return Response(status_code=answer.status, headers=answer.headers)
    return JSONAnswer(answer.body, status_code=answer.status, headers=answer.headers)


def _generate(server: Server, kind: str) -> Handler:
    """The route of ``/v1/completions`` (``kind`` ``"completion"``) or of
    ``/v1/chat/completions`` (``"chat"``)."""

    async def route(request: Request) -> Response:
        started, arrived = time.perf_counter(), time.monotonic()
        endpoint = request.url.path
        try:
            server.authorize(request.headers.get("authorization", ""))
            check_json_body(request.headers.get("content-type"))
            body = await read_body(request)
        except APIError as err:
            return _respond(server.error(err, endpoint, started))
        except ClientDisconnect:  # the client left while sending its body
            return _respond(server.gone(endpoint, started))
        return _respond(await server.generate(kind, body, endpoint, started, arrived,
                                              lambda: disconnected(request)))

    return route


def _routes(server: Server) -> list[Route]:
    async def models(request: Request) -> Response:
        started = time.perf_counter()
        try:
            server.authorize(request.headers.get("authorization", ""))
        except APIError as err:
            return _respond(server.error(err, "/v1/models", started))
        server.metrics.request("/v1/models", 200, time.perf_counter() - started)
        return JSONAnswer(server.models())

    async def health(request: Request) -> Response:
        return _respond(server.health())

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(server.metrics_text(), media_type="text/plain; version=0.0.4")

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", _generate(server, "completion"), methods=["POST"]),
        Route("/v1/chat/completions", _generate(server, "chat"), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


async def read_body(request: Request) -> bytes:
    """The request body, or a 413 :class:`APIError` past :data:`MAX_BODY_BYTES`."""
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB",
                           code="body_too_large")
        parts.append(part)
    return b"".join(parts)


async def disconnected(request: Request) -> None:
    """Returns once the client has closed the connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    if status == 405:  # Starlette's exception carries the Allow header
        headers = dict(getattr(exc, "headers", None) or {})
        allowed = headers.get("Allow", "")
        err = APIError(405, f"method not allowed: {request.method} {request.url.path} takes "
                            f"{allowed or 'another method'}", code="method_not_allowed")
        return JSONAnswer(err.body(), status_code=405, headers=headers)
    err = APIError(status, f"no such endpoint: {request.method} {request.url.path} (the API "
                           "is under /v1: models, completions, chat/completions)",
                   code="not_found")
    return JSONAnswer(err.body(), status_code=status)


def create_app(lm: LanguageModel, *, allowed_hosts: Sequence[str] | None = None,
               **options: Any) -> Starlette:
    """The server's ASGI app over ``lm`` (any :class:`~adaptrack.LanguageModel`, a
    ``TableLM`` included); ``options`` are :class:`Server`'s. The engine thread starts
    with the app's lifespan (uvicorn runs it) and stops after the requests in flight.
    A request is served when its ``Host`` is an IP address, a loopback name or one of
    ``allowed_hosts`` (:class:`~.guards.HostGuard`; ``["*"]`` for any), and a POST only
    with an ``application/json`` body (415 otherwise).

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> app = create_app(lm, model_name="toy")
    >>> sorted(r.path for r in app.routes)
    ['/health', '/metrics', '/v1/chat/completions', '/v1/completions', '/v1/models']
    """
    server = Server(lm, **options)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(server.start)
        try:
            yield
        finally:
            await asyncio.to_thread(server.close)

    app = Starlette(routes=_routes(server), lifespan=lifespan,
                    middleware=[Middleware(HostGuard, allowed=allowed_hosts)],
                    exception_handlers={404: not_found, 405: not_found})
    app.state.server = server
    return app
