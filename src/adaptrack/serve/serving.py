"""The serving logic of ``adaptrack serve``, apart from its routes (``app``): a
:class:`Server` parses and prepares a request in a worker thread (:func:`.preprocess.parse`,
:func:`.preprocess.prepare_calls`), so that every 400, an empty language found up front
included, is answered before the engine sees it; then it waits for the engine's events
(:mod:`.events`) and makes them an :class:`Answer`: a JSON body, a stream of server-sent
events, or an error.

A client that disconnects has its walks cancelled; a request past ``timeout`` gets 504.
With ``stream: true`` the answer is server-sent events in OpenAI's chunk format: ``cd`` and
``unconstrained`` stream token by token (their walks never go back), the methods that can
backtrack (``asap``, ``adaptrack``, ``exact``) send each choice whole once it is final. The
response starts with the first event, so an error found before any output still gets its
own status; an error after output started is sent as an ``{"error": ...}`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import constraints
from ..errors import SearchTimeoutError
from ..generate import MAX_SECONDS, PreparedCall, prepare
from ..lm.base import LanguageModel
from ..sampling.methods import METHODS
from .engine_loop import SEARCH_SECONDS, TREE_CACHE_BYTES, Busy, Closing, EngineLoop, Job
from .errors import APIError, error_for, json_text
from .events import Delta, Done, Event, Failed, Final
from .metrics import Metrics
from .preprocess import ChatTemplate, Options, hf_chat_template, parse, prepare_calls
from .protocol import MAX_N
from .responses import (
    chunk_body,
    final_chunk,
    logprobs_of,
    response_body,
    token_text,
    tool_calls_of,
    usage_body,
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


class ClientGone(Exception):
    """The client closed the connection before its answer was ready (why its walks were
    cancelled; nobody is left to answer)."""


@dataclass(frozen=True)
class Gone:
    """The wait ended because the client left."""


@dataclass(frozen=True)
class Late:
    """The wait ended because the engine ran :data:`GRACE_SECONDS` past its timeout."""


@dataclass(frozen=True)
class Answer:
    """What a route sends: ``status`` with a JSON ``body``, or a ``stream`` of server-sent
    events, or nothing (a client that left); ``headers`` added."""

    status: int
    body: dict[str, Any] | None = None
    stream: AsyncIterator[str] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Reply:
    """One request being answered: where its events arrive and what its answer needs."""

    job: Job
    opts: Options
    queue: asyncio.Queue[Event]
    gone: asyncio.Future[None]
    endpoint: str
    started: float
    rid: str
    created: int = field(default_factory=lambda: int(time.time()))


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
        if api_key is not None and not (isinstance(api_key, str) and api_key.strip()):
            raise ValueError(f"api_key must be a non-empty string, or None to serve without "
                             f"a key; got {api_key!r:.20}")
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
        """Build what requests share once (the token trie, llguidance's tokenizer, the
        model's row cost a search's width comes from), then start the engine thread."""
        _ = self.lm.vocab.trie
        self.lm.measured_row_cost()  # timed here (about a second), not in a request
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

    # -- what the routes ask -----------------------------------------------------------

    def authorize(self, header: str) -> None:
        """Check an ``Authorization`` header against the API key (401 when wrong)."""
        if self.api_key is None:
            return
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 self.api_key.encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' "
                                "with the key the server was started with",
                           code="invalid_api_key")

    def error(self, err: APIError, endpoint: str, started: float) -> Answer:
        """The answer to ``err``, counted."""
        self.metrics.request(endpoint, err.status, time.perf_counter() - started)
        headers = dict(err.headers)
        if err.status == 401:
            headers.setdefault("WWW-Authenticate", "Bearer")
        return Answer(err.status, err.body(), headers=headers)

    def gone(self, endpoint: str, started: float) -> Answer:
        """The answer to a client that left (nobody reads it), counted."""
        self.metrics.request(endpoint, CLIENT_GONE, time.perf_counter() - started)
        return Answer(CLIENT_GONE)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created,
            "owned_by": "adaptrack", "max_model_len": self.lm.context_length}]}

    def health(self) -> Answer:
        if self.stopping or not self.engine.alive:
            return Answer(503, {"status": "stopping"})
        return Answer(200, {"status": "ok", "running": self.engine.running,
                            "waiting": self.engine.queue_length})

    def metrics_text(self) -> str:
        return self.metrics.render(self.engine.queue_length, self.engine.running)

    async def generate(self, kind: str, body: bytes, endpoint: str, started: float,
                       arrived: float, disconnected: Callable[[], Awaitable[None]]) -> Answer:
        """Answer a request of ``kind`` whose ``body`` was read; ``disconnected`` returns
        once the client has left. The timeout counts from ``arrived`` (monotonic)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        try:
            opts, calls = await loop.run_in_executor(self.pool, self._prepare, body, kind)

            def sink(event: Event) -> None:  # called on the engine thread
                loop.call_soon_threadsafe(queue.put_nowait, event)

            job = self._submit(calls, opts, sink, arrived)
        except APIError as err:
            return self.error(err, endpoint, started)
        except Exception as err:  # a bug: this request fails, the server goes on
            return self.error(APIError(500, f"{type(err).__name__}: {err}",
                                       code="internal_error"), endpoint, started)
        gone = asyncio.ensure_future(disconnected())
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        reply = _Reply(job, opts, queue, gone, endpoint, started, rid)
        streaming = False
        try:
            while True:
                event = await self._next(reply)
                if isinstance(event, Gone | Late):
                    return self._abandon(reply, event)
                if isinstance(event, Failed):
                    return self.error(error_for(event.error, opts.constraint_field),
                                      endpoint, started)
                if opts.stream:
                    streaming = True
                    return Answer(200, stream=self._stream(event, reply), headers={
                        "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
                if isinstance(event, Done):
                    self.metrics.request(endpoint, 200, time.perf_counter() - started)
                    return Answer(200, self._body(reply, event))
        finally:
            if not streaming:
                gone.cancel()

    # -- helpers -----------------------------------------------------------------------

    def _prepare(self, body: bytes, kind: str) -> tuple[Options, list[PreparedCall]]:
        opts = parse(body, kind, self.lm, model=self.model_name,
                     chat_template=self.chat_template, max_n=self.max_n)
        # Only a search (asap, adaptrack, exact) has the CD fallback to answer past its
        # budget; cd and unconstrained sampling have the whole timeout.
        budgets = [self.timeout]
        if METHODS[opts.method].searches:
            budgets.append(self.search_seconds)
        limits = [b for b in budgets if b is not None]
        calls = prepare_calls(self.lm, opts, max_seconds=min(limits, default=None),
                              max_cache_bytes=REQUEST_CACHE_BYTES)
        return opts, calls

    def _submit(self, calls: list[PreparedCall], opts: Options,
                sink: Callable[[Event], None], arrived: float) -> Job:
        try:
            return self.engine.submit(calls, opts, sink, arrived=arrived)
        except Closing:
            raise APIError(503, "the server is shutting down; retry later or on another",
                           code="shutting_down") from None
        except Busy as busy:
            raise APIError(429, f"the server is busy: {busy.running} requests running and "
                                f"{busy.waiting} waiting; retry later", code="queue_full",
                           headers={"Retry-After": "1"}) from None

    async def _next(self, reply: _Reply) -> Event | Gone | Late:
        """The job's next event, unless the client leaves first or the engine overruns
        its timeout by :data:`GRACE_SECONDS`."""
        get = asyncio.ensure_future(reply.queue.get())
        limit = None if self.timeout is None else self.timeout + GRACE_SECONDS
        waiting: set[asyncio.Future[Any]] = {get, reply.gone}
        done, _ = await asyncio.wait(waiting, timeout=limit,
                                     return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()
        return Gone() if reply.gone in done else Late()

    def _abandon(self, reply: _Reply, why: Gone | Late) -> Answer:
        """Cancel the job of a client that left, or of an engine that overran."""
        if isinstance(why, Gone):
            self.engine.cancel(reply.job, ClientGone("the client disconnected"))
            return self.gone(reply.endpoint, reply.started)
        err = SearchTimeoutError(f"no answer within the server's timeout of {self.timeout:g} s")
        self.engine.cancel(reply.job, err)
        return self.error(APIError(504, str(err), code="timeout"), reply.endpoint,
                          reply.started)

    def _body(self, reply: _Reply, done: Done) -> dict[str, Any]:
        return response_body(self.lm, reply.opts.kind, reply.rid, reply.created,
                             self.model_name, done.choices,
                             usage_body(done.prompt_tokens, done.completion_tokens),
                             done.stats, tools=reply.opts.tool_calls)

    async def _stream(self, event: Event | Gone | Late, reply: _Reply) -> AsyncIterator[str]:
        """The server-sent events of a streamed answer, from its first engine event on."""
        chunks = _Chunks(self, reply)
        status = 200
        over = False
        try:
            while True:
                if isinstance(event, Gone | Late):
                    status = CLIENT_GONE if isinstance(event, Gone) else 504
                    self.engine.cancel(reply.job, ClientGone("the client disconnected")
                                       if isinstance(event, Gone)
                                       else SearchTimeoutError("past the timeout"))
                    if isinstance(event, Late):
                        yield _sse(APIError(504, "no answer within the server's timeout",
                                            code="timeout").body())
                        yield "data: [DONE]\n\n"
                    return
                for piece in chunks.of(event):
                    yield piece
                if isinstance(event, Failed):
                    status = error_for(event.error, reply.opts.constraint_field).status
                if isinstance(event, Done | Failed):
                    over = True
                    return
                event = await self._next(reply)
        finally:
            reply.gone.cancel()
            if not over and status == 200:  # the stream was closed under us: client gone
                status = CLIENT_GONE
                self.engine.cancel(reply.job, ClientGone("the client disconnected"))
            self.metrics.request(reply.endpoint, status, time.perf_counter() - reply.started)


class _Chunks:
    """The server-sent events of one streamed answer, event by event."""

    def __init__(self, server: Server, reply: _Reply) -> None:
        self.server, self.reply, self.opts = server, reply, reply.opts
        self.begun: set[int] = set()
        self.sent: dict[int, int] = {}  # characters of token text streamed per choice

    def _chunk(self, index: int, text: str | None, **extra: Any) -> str:
        r, s = self.reply, self.server
        first = index not in self.begun
        self.begun.add(index)
        return _sse(chunk_body(self.opts.kind, self.opts.include_usage, r.rid, r.created,
                               s.model_name, index, text, first=first, **extra))

    def of(self, event: Event) -> list[str]:
        lm, opts = self.server.lm, self.opts
        if isinstance(event, Delta):
            offset = self.sent.get(event.index, 0)
            lps = logprobs_of(lm, opts.kind, event.tokens, event.logprobs, offset, event.top)
            if event.logprobs is not None:  # offsets are only sent with log-probs
                self.sent[event.index] = offset + sum(len(token_text(lm, t)[0])
                                                      for t in event.tokens)
            return [self._chunk(event.index, event.text, logprobs=lps)]
        if isinstance(event, Final):
            choice, out = event.choice, []
            reason = choice.finish_reason
            if not self.reply.job.watched:  # sent whole, once final
                lps = logprobs_of(lm, opts.kind, choice.tokens, choice.token_logprobs,
                                  top=choice.top_logprobs)
                if opts.tool_calls:  # the text before the calls, then the calls
                    content, calls = tool_calls_of(choice.text)
                    out.append(self._chunk(choice.index, content, logprobs=lps))
                    if calls:
                        out.append(self._chunk(choice.index, None, tool_calls=calls))
                        reason = "tool_calls" if reason == "stop" else reason
                else:
                    out.append(self._chunk(choice.index, choice.text, logprobs=lps))
            out.append(self._chunk(choice.index, "", finish_reason=reason))
            return out
        if isinstance(event, Done):
            r, out = self.reply, []
            if opts.include_usage:
                usage = usage_body(event.prompt_tokens, event.completion_tokens)
                out.append(_sse(final_chunk(opts.kind, r.rid, r.created,
                                            self.server.model_name, usage, event.stats)))
            return [*out, "data: [DONE]\n\n"]
        return [_sse(error_for(event.error, opts.constraint_field).body()), "data: [DONE]\n\n"]


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json_text(data, allow_nan=True)}\n\n"

