"""The HTTP side of ``adaptrack serve``: a Starlette app over one :class:`EngineLoop`.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /health`` and ``GET /metrics`` (Prometheus text). With an API key, every ``/v1/``
request needs ``Authorization: Bearer KEY`` (401 otherwise); ``/health`` and ``/metrics``
stay open.

A request is parsed and prepared in a worker thread (:func:`protocol.parse`,
:func:`protocol.prepare_calls`): every 400 and the 422 of an empty language found up front
are answered before the engine sees it. Then it waits for the engine's events. A client
that disconnects has its walks cancelled; a request past ``timeout`` gets 504. With
``stream: true`` the answer is server-sent events in OpenAI's chunk format: ``cd`` and
``unconstrained`` stream token by token (their walks never go back), the methods that can
backtrack (``asap``, ``adaptrack``, ``exact``) send each choice whole once it is final. The
response starts with the first event, so an error found before any output still gets its
own status; an error after output started is sent as an ``{"error": ...}`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import constraints
from ..errors import SearchTimeoutError
from ..generate import MAX_SECONDS, SEARCHES, prepare
from ..lm.base import LanguageModel
from .engine_loop import SEARCH_SECONDS, TREE_CACHE_BYTES, EngineLoop, Job
from .metrics import Metrics
from .protocol import (
    MAX_N,
    APIError,
    ChatTemplate,
    Choice,
    Options,
    chunk_body,
    final_chunk,
    hf_chat_template,
    logprobs_body,
    parse,
    prepare_calls,
    response_body,
    token_text,
)

#: Bytes of droppable expansions one request's tree may hold (``generate``'s
#: ``max_cache_bytes``): a server holds many trees at once, and a walk that never goes back
#: does not revisit what was dropped.
REQUEST_CACHE_BYTES = 64 << 20
#: Seconds past the engine's own timeout after which the HTTP side stops waiting (the
#: engine checks its time between model calls: one long call can run over).
GRACE_SECONDS = 30.0
#: The status a request whose client left is counted under (nginx's convention).
CLIENT_GONE = 499
#: The largest request body read (a long prompt or a big schema is far below it); a larger
#: one is refused with 413 before it is held in memory.
MAX_BODY_BYTES = 32 << 20


class ClientGone(Exception):
    """The client closed the connection before its answer was ready (why its walks were
    cancelled; nobody is left to answer)."""


class Server:
    """What the endpoints share: the model, the engine loop, the options and the metrics.

    ``timeout`` (seconds, None for none) bounds each request from its arrival;
    ``search_seconds`` bounds a search (a request's ``max_seconds`` may lower it), after
    which the CD fallback draws the missing choices, unless the request says
    ``"fallback": "none"`` (then 504, as past ``timeout``);
    ``max_concurrent`` requests run in the engine at once and ``max_queue`` more wait;
    ``chat_template`` renders ``messages`` (default: the tokenizer's chat template)."""

    def __init__(self, lm: LanguageModel, *, model_name: str = "default",
                 api_key: str | None = None, max_concurrent: int = 16, max_queue: int = 64,
                 timeout: float | None = MAX_SECONDS, batch_size: int = 32,
                 max_batch_tokens: int | None = 1024,
                 tree_cache_bytes: int = TREE_CACHE_BYTES,
                 chat_template: ChatTemplate | None = None, max_n: int = MAX_N,
                 search_seconds: float | None = SEARCH_SECONDS) -> None:
        self.lm, self.model_name, self.api_key = lm, model_name, api_key
        self.timeout, self.max_n = timeout, max_n
        self.search_seconds = search_seconds
        self.chat_template = chat_template or hf_chat_template(lm)
        self.metrics = Metrics()
        self.engine = EngineLoop(lm, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                                 max_concurrent=max_concurrent, max_queue=max_queue,
                                 timeout=timeout, tree_cache_bytes=tree_cache_bytes,
                                 metrics=self.metrics)
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="adaptrack-prepare")
        self.created = int(time.time())
        self.stopping = False

    # -- life --------------------------------------------------------------------------

    def start(self) -> None:
        """Build what requests share once (the token trie, llguidance's tokenizer), then
        start the engine thread."""
        _ = self.lm.vocab.trie
        with contextlib.suppress(Exception):  # a model without a text token: nothing to warm
            first = int(self.lm.vocab.text_ids[0])
            prepare(self.lm, [first], constraints.json_schema({"type": "object"}),
                    max_new_tokens=8)
        self.engine.start()

    def close(self) -> None:
        """Refuse new requests, finish those in flight, stop the engine thread."""
        self.stopping = True
        self.engine.close()
        self.pool.shutdown(wait=True)

    # -- helpers -----------------------------------------------------------------------

    def _error(self, err: APIError, endpoint: str, started: float) -> JSONResponse:
        self.metrics.request(endpoint, err.status, time.perf_counter() - started)
        headers = dict(err.headers)
        if err.status == 401:
            headers.setdefault("WWW-Authenticate", "Bearer")
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 self.api_key.encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' "
                                "with the key the server was started with",
                           code="invalid_api_key")

    def _prepare(self, body: bytes, kind: str) -> tuple[Options, list[Any]]:
        opts = parse(body, kind, self.lm, model=self.model_name,
                     chat_template=self.chat_template, max_n=self.max_n)
        # Only a search (asap, adaptrack, exact) has the CD fallback to answer past its
        # budget; cd and unconstrained sampling have the whole timeout.
        budgets = [self.timeout]
        if opts.method in SEARCHES:
            budgets.append(self.search_seconds)
        limits = [b for b in budgets if b is not None]
        calls = prepare_calls(self.lm, opts, max_seconds=min(limits, default=None),
                              max_cache_bytes=REQUEST_CACHE_BYTES)
        return opts, calls

    async def _next(self, queue: asyncio.Queue[Any], gone: asyncio.Future[None]) -> Any:
        """The job's next event; ``None`` when the client left first, ``"late"`` when the
        engine overran its timeout by :data:`GRACE_SECONDS`."""
        get = asyncio.ensure_future(queue.get())
        limit = None if self.timeout is None else self.timeout + GRACE_SECONDS
        done, _ = await asyncio.wait({get, gone}, timeout=limit,
                                     return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()
        return None if gone in done else "late"

    # -- endpoints ---------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            self._authorize(request)
        except APIError as err:
            return self._error(err, "/v1/models", started)
        self.metrics.request("/v1/models", 200, time.perf_counter() - started)
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created,
            "owned_by": "adaptrack", "max_model_len": self.lm.context_length}]})

    async def health(self, request: Request) -> Response:
        if self.stopping or not self.engine.alive:
            return JSONResponse({"status": "stopping"}, status_code=503)
        return JSONResponse({"status": "ok", "running": self.engine.running,
                             "waiting": self.engine.queue_length})

    async def metrics_text(self, request: Request) -> Response:
        return PlainTextResponse(
            self.metrics.render(self.engine.queue_length, self.engine.running),
            media_type="text/plain; version=0.0.4")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def _generate(self, request: Request, kind: str) -> Response:
        started, arrived = time.perf_counter(), time.monotonic()
        endpoint = request.url.path
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        try:
            self._authorize(request)
            body = await _body(request)
            opts, calls = await loop.run_in_executor(self.pool, self._prepare, body, kind)

            def sink(event: Any) -> None:  # called on the engine thread
                loop.call_soon_threadsafe(queue.put_nowait, event)

            # The timeout counts from arrival: parsing and preparing are part of it.
            job = self.engine.submit(calls, opts, sink, arrived=arrived)
        except APIError as err:
            return self._error(err, endpoint, started)
        except ClientDisconnect:  # the client left while sending its body
            self.metrics.request(endpoint, CLIENT_GONE, time.perf_counter() - started)
            return Response(status_code=CLIENT_GONE)
        except Exception as err:  # a bug: this request fails, the server goes on
            return self._error(APIError(500, f"{type(err).__name__}: {err}",
                                        code="internal_error"), endpoint, started)
        gone = asyncio.ensure_future(_disconnected(request))
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        streaming = False
        try:
            while True:
                event = await self._next(queue, gone)
                answer = self._settle(event, job, endpoint, started)
                if answer is not None:
                    return answer
                if event[0] == "error":
                    return self._error(event[1], endpoint, started)
                if event[0] == "done" and not opts.stream:
                    self.metrics.request(endpoint, 200, time.perf_counter() - started)
                    out = event[1]
                    return JSONResponse(response_body(self.lm, opts, rid, created,
                                                      self.model_name, out.choices, out.usage,
                                                      out.stats))
                if opts.stream:
                    streaming = True
                    return StreamingResponse(
                        self._events(event, queue, gone, job, opts, rid, created, endpoint,
                                     started),
                        media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        finally:
            if not streaming:
                gone.cancel()

    def _settle(self, event: Any, job: Job, endpoint: str, started: float) -> Response | None:
        """The answer when the client left (nothing to send) or the engine overran."""
        if event is None:
            self.engine.cancel(job, ClientGone("the client disconnected"))
            self.metrics.request(endpoint, CLIENT_GONE, time.perf_counter() - started)
            return Response(status_code=CLIENT_GONE)
        if event == "late":
            err = SearchTimeoutError(f"no answer within the server's timeout of "
                                     f"{self.timeout:g} s")
            self.engine.cancel(job, err)
            return self._error(APIError(504, str(err), code="timeout"), endpoint, started)
        return None

    async def _events(self, event: Any, queue: asyncio.Queue[Any], gone: asyncio.Future[None],
                      job: Job, opts: Options, rid: str, created: int, endpoint: str,
                      started: float) -> AsyncIterator[str]:
        """The server-sent events of a streamed answer, from its first engine event on."""
        begun: set[int] = set()
        sent: dict[int, int] = {}  # characters of token text streamed per choice (offsets)
        status = 200
        over = False
        try:
            while True:
                if event is None or event == "late":
                    status = CLIENT_GONE if event is None else 504
                    self.engine.cancel(job, ClientGone("the client disconnected") if event
                                       is None else SearchTimeoutError("past the timeout"))
                    if event == "late":
                        yield _sse(APIError(504, "no answer within the server's timeout",
                                            code="timeout").body())
                        yield "data: [DONE]\n\n"
                    return
                kind = event[0]
                if kind == "delta":
                    _, index, text, tokens, lps = event
                    yield _sse(chunk_body(opts, rid, created, self.model_name, index, text,
                                          logprobs=self._lp(opts, index, tokens, lps,
                                                            sent.get(index, 0)),
                                          first=index not in begun))
                    if lps is not None:  # offsets are only sent with log-probs
                        sent[index] = sent.get(index, 0) + sum(
                            len(token_text(self.lm, t)[0]) for t in tokens)
                    begun.add(index)
                elif kind == "choice":
                    choice: Choice = event[1]
                    if not job.watched:  # sent whole, once final
                        yield _sse(chunk_body(opts, rid, created, self.model_name,
                                              choice.index, choice.text,
                                              logprobs=logprobs_body(self.lm, opts.kind,
                                                                     choice),
                                              first=choice.index not in begun))
                        begun.add(choice.index)
                    yield _sse(chunk_body(opts, rid, created, self.model_name, choice.index,
                                          "", finish_reason=choice.finish_reason,
                                          first=choice.index not in begun))
                    begun.add(choice.index)
                elif kind == "done":
                    if opts.include_usage:
                        yield _sse(final_chunk(opts, rid, created, self.model_name,
                                               event[1].usage, event[1].stats))
                    yield "data: [DONE]\n\n"
                    over = True
                    return
                elif kind == "error":
                    status = event[1].status
                    yield _sse(event[1].body())
                    yield "data: [DONE]\n\n"
                    over = True
                    return
                event = await self._next(queue, gone)
        finally:
            gone.cancel()
            if not over and status == 200:  # the stream was closed under us: client gone
                status = CLIENT_GONE
                self.engine.cancel(job, ClientGone("the client disconnected"))
            self.metrics.request(endpoint, status, time.perf_counter() - started)

    def _lp(self, opts: Options, index: int, tokens: tuple[int, ...],
            lps: list[float] | None, offset: int) -> dict[str, Any] | None:
        if lps is None:
            return None
        return logprobs_body(self.lm, opts.kind, Choice(index, "", "", tuple(tokens), lps),
                             offset)


async def _body(request: Request) -> bytes:
    """The request body, or a 413 :class:`APIError` past :data:`MAX_BODY_BYTES`."""
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB",
                           code="body_too_large")
        parts.append(part)
    return b"".join(parts)


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed the connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    what = "no such endpoint" if status == 404 else "method not allowed"
    err = APIError(status, f"{what}: {request.method} {request.url.path} (the API is under "
                           "/v1: models, completions, chat/completions)", code="not_found")
    return JSONResponse(err.body(), status_code=status)


def create_app(lm: LanguageModel, **options: Any) -> Starlette:
    """The server's ASGI app over ``lm`` (any :class:`~adaptrack.LanguageModel`, a
    ``TableLM`` included); ``options`` are :class:`Server`'s. The engine thread starts
    with the app's lifespan (uvicorn runs it) and stops after the requests in flight.

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

    app = Starlette(routes=[
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
    ], lifespan=lifespan, exception_handlers={404: _not_found, 405: _not_found})
    app.state.server = server
    return app
