"""The engine of ``adaptrack serve``: one thread that steps an
:class:`~adaptrack.sampling.engine.Engine` over the walks of every request in flight.

Continuous batching: the HTTP side hands prepared calls (:func:`adaptrack.generate.prepare`)
to :meth:`EngineLoop.submit`, a thread-safe queue. The engine thread admits them between
steps, up to ``max_concurrent`` requests at once, so that every walk of every request in
flight waits for the same batched model calls (docs/design.md §4, the engine); a request
that ends leaves at the next step and a waiting one takes its place. Each request keeps its
own budgets and errors: one that fails, runs past its time, or whose client leaves is
cancelled (:meth:`Engine.cancel`) and the others go on.

Tree reuse: a request's prefix tree is kept after it succeeds, in an LRU bounded in bytes
(:data:`TREE_CACHE_BYTES`), under what determines the tree (prompt ids, constraint,
temperature, top_p, max_tokens, fast-forward: :meth:`JobOptions.tree_key`). A later request with
the same key samples from it (:meth:`PreparedCall.use_tree`): the prefixes it evaluated are
not asked of the model again, and a seed gives the samples a fresh tree gives. A tree serves
one request at a time; an identical request that arrives meanwhile builds its own (the
backend's KV cache still shares the prompt's prefill).

Events reach the HTTP side through each job's ``sink``, called on this thread: the
dataclasses of :mod:`.events` (:class:`Delta`, :class:`Final`, then :class:`Done` or
:class:`Failed`). The loop knows no HTTP shape: a job's options are anything with the
attributes of :class:`JobOptions`, and a full queue or a closing loop raise :class:`Busy`
and :class:`Closing`, which the HTTP side answers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..cache import LRU
from ..errors import SearchTimeoutError
from ..generate import PreparedCall, Sample
from ..lm.base import LanguageModel
from ..sampling.engine import Engine, Request
from ..sampling.methods import METHODS
from ..sampling.tree import PrefixTree
from .events import Choice, Delta, Done, Event, Failed, Final
from .metrics import Metrics
from .prefixes import held_back, logprobs_to, node_at, text_so_far, top_alternatives

#: The tree cache's default bound in bytes (an estimate of each tree's memory:
#: :func:`tree_bytes`).
TREE_CACHE_BYTES = 512 << 20
#: A search's default time budget on the server: past it, the CD fallback answers within the
#: rest of ``timeout`` (docs/design.md §6). An interactive client sets less (``max_seconds``).
SEARCH_SECONDS = 60.0
#: Bytes a prefix node costs beyond its tokens (its object, children dict, constraint
#: state): an estimate for :func:`tree_bytes`.
NODE_BYTES = 400


class JobOptions(Protocol):
    """What the loop reads of a request's options (the server's parsed request has it)."""

    @property
    def n(self) -> int: ...
    @property
    def method(self) -> str: ...
    @property
    def stop(self) -> tuple[str, ...]: ...
    @property
    def logprobs(self) -> bool: ...
    @property
    def top_logprobs(self) -> int: ...
    @property
    def tool_calls(self) -> bool: ...
    @property
    def stream(self) -> bool: ...

    def tree_key(self, ids: Sequence[int]) -> Hashable: ...


class Busy(Exception):
    """The queue is full: ``running`` requests in the engine and ``waiting`` more."""

    def __init__(self, running: int, waiting: int) -> None:
        super().__init__(f"{running} requests running and {waiting} waiting")
        self.running, self.waiting = running, waiting


class Closing(Exception):
    """The loop is shutting down and takes no new request."""


def tree_bytes(tree: PrefixTree) -> int:
    """An estimate of a prefix tree's memory: its expansions (opened and cached) and its
    nodes, each with a token tuple and a state of up to ``max_new_tokens`` entries."""
    per_node = NODE_BYTES + 8 * tree.max_new_tokens
    return tree.opened_bytes + tree.cache_bytes + tree.num_nodes * per_node


@dataclass(eq=False)
class Job:
    """One HTTP request in the engine: a prepared call per prompt, the tree keys, the
    parsed options, where events go, and when it arrived and must end (monotonic)."""

    calls: list[PreparedCall]
    keys: list[Hashable]
    opts: JobOptions
    sink: Callable[[Event], None]
    arrived: float = field(default_factory=time.monotonic)
    deadline: float | None = None
    requests: list[Request] = field(default_factory=list)
    choices: dict[int, Choice] = field(default_factory=dict)
    admitted: float | None = None
    over: bool = False
    _base: list[tuple[int, int, int]] = field(default_factory=list)
    _reused: int = 0
    _sent: dict[int, tuple[str, int]] = field(default_factory=dict)  # text, tokens streamed

    @property
    def watched(self) -> bool:
        """Whether the prefixes are read after each step to be streamed token by token
        (methods that never go back; a tool call is sent whole)."""
        # A method whose walks never go back (``forward_only``): a choice's prefix is final
        # as it grows, so it can be streamed token by token while the walk runs.
        return (METHODS[self.opts.method].forward_only and self.opts.stream
                and not self.opts.tool_calls)


class EngineLoop:
    """The engine thread and its queue.

    >>> import adaptrack as at
    >>> from adaptrack.serve.preprocess import parse, prepare_calls
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> loop = EngineLoop(lm)
    >>> loop.start()
    >>> opts = parse(b'{"prompt": "a", "guided_choice": ["ab", "ba"], "seed": 0}', "completion", lm)
    >>> events = []
    >>> done = threading.Event()
    >>> def sink(event):
    ...     events.append(event)
    ...     done.set() if isinstance(event, Done | Failed) else None
    >>> job = loop.submit(prepare_calls(lm, opts), opts, sink)
    >>> done.wait(10), events[-1].choices[0].text
    (True, 'ab')
    >>> loop.close()
    """

    def __init__(self, lm: LanguageModel, *, batch_size: int = 32,
                 max_batch_tokens: int | None = 1024, max_concurrent: int = 16,
                 max_queue: int = 64, timeout: float | None = None,
                 tree_cache_bytes: int = TREE_CACHE_BYTES,
                 metrics: Metrics | None = None) -> None:
        self.lm, self.batch_size, self.max_batch_tokens = lm, batch_size, max_batch_tokens
        self.max_concurrent, self.max_queue, self.timeout = max_concurrent, max_queue, timeout
        self.metrics = metrics or Metrics()
        self.engine = Engine(lm, batch_size=batch_size, max_batch_tokens=max_batch_tokens)
        self.trees: LRU[Hashable, PrefixTree] = LRU(tree_cache_bytes, size=tree_bytes)
        self._cond = threading.Condition()
        self._pending: deque[Job] = deque()
        self._cancels: list[tuple[Job, BaseException]] = []
        self._running: list[Job] = []
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="adaptrack-engine", daemon=True)

    # -- the HTTP side (any thread) ------------------------------------------------------

    @property
    def queue_length(self) -> int:
        return len(self._pending)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def alive(self) -> bool:
        """Whether the engine thread runs (it stops only after :meth:`close`)."""
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def submit(self, calls: list[PreparedCall], opts: JobOptions,
               sink: Callable[[Event], None], arrived: float | None = None) -> Job:
        """Queue a request that arrived at ``arrived`` (``time.monotonic()``; default: now),
        from which its timeout counts; :class:`Busy` when the queue is full, :class:`Closing`
        once the loop is shutting down."""
        keys = [opts.tree_key(call.ids) for call in calls]
        job = Job(calls, keys, opts, sink)
        if arrived is not None:
            job.arrived = arrived
        if self.timeout is not None:
            job.deadline = job.arrived + self.timeout
        with self._cond:
            if self._closing or not self.alive:
                raise Closing("the engine loop is shutting down")
            if len(self._pending) + len(self._running) >= self.max_concurrent + self.max_queue:
                raise Busy(len(self._running), len(self._pending))
            self._pending.append(job)
            self._cond.notify()
        return job

    def cancel(self, job: Job, reason: BaseException) -> None:
        """End ``job`` with ``reason`` at the engine's next turn (its client left, say)."""
        with self._cond:
            self._cancels.append((job, reason))
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish those queued and running, and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._pending or self._running or self._cancels or self._closing):
                    self._cond.wait()
                if self._closing and not (self._pending or self._running or self._cancels):
                    return
                cancels, self._cancels = self._cancels, []
                now = time.monotonic()
                expired = [j for j in self._pending if j.deadline is not None
                           and now > j.deadline]
                for job in expired:
                    self._pending.remove(job)
                admit: list[Job] = []
                while self._pending and len(self._running) + len(admit) < self.max_concurrent:
                    admit.append(self._pending.popleft())
            for job, reason in cancels:
                self._guarded(job, self._cancel, job, reason)
            for job in expired:
                self._guarded(job, self._cancel, job, self._timeout(job))
            for job in admit:
                self._guarded(job, self._admit, job)
            for job in list(self._running):
                if job.deadline is not None and now > job.deadline:
                    self._guarded(job, self._cancel, job, self._timeout(job))
            if not self._running:
                continue
            try:
                self.engine.step()
            except Exception as err:  # a bug, not a request's error: keep serving
                for job in list(self._running):
                    self._guarded(job, self._finish, job, err)
                self.engine = Engine(self.lm, batch_size=self.batch_size,
                                     max_batch_tokens=self.max_batch_tokens)
                continue
            for job in list(self._running):
                if job.watched and not job.over:
                    self._guarded(job, self._watch, job)
                if not job.over and all(r.done for r in job.requests):
                    self._guarded(job, self._finish, job)

    def _guarded(self, job: Job, step: Callable[..., None], *args: Any) -> None:
        """Run one piece of the loop's work on ``job``; if it fails (a bug), that job fails
        with the error and the thread goes on serving the others."""
        try:
            step(*args)
        except Exception as err:
            for req in job.requests:
                self.engine.cancel(req, err)
            if job in self._running:
                self._running.remove(job)
            if not job.over:
                job.over = True
                self._emit(job, Failed(err))

    def _timeout(self, job: Job) -> SearchTimeoutError:
        return SearchTimeoutError(
            f"the request ran past the server's timeout of {self.timeout:g} s "
            f"({time.monotonic() - job.arrived:.1f} s); lower n or max_tokens, or start the "
            "server with a longer --timeout")

    def _emit(self, job: Job, event: Event) -> None:
        try:
            job.sink(event)
        except Exception:  # a sink whose client is gone must not stop the engine
            pass

    def _admit(self, job: Job) -> None:
        if job.over:  # cancelled in the same turn (its client left while it waited)
            return
        job.admitted = time.monotonic()
        for k, (call, key) in enumerate(zip(job.calls, job.keys, strict=True)):
            tree = self.trees.pop(key)
            if tree is not None:
                call.use_tree(tree)
                job._reused += 1
            t = call.tree
            job._base.append((t.lm_calls, t.forced_tokens, t.ff_sequences))
            call.on_sample = lambda sample, job=job, k=k: self._sampled(job, k, sample)
            job.requests.append(call.submit(self.engine, self.batch_size))
        self._running.append(job)

    def _sampled(self, job: Job, k: int, sample: Sample) -> None:
        """A sample of prompt ``k`` finished: its choice is final. A stop string ended it
        as the constraint's (:func:`~adaptrack.constraints.with_stop`), which cut the text."""
        call = job.calls[k]
        i = next(j for j, s in enumerate(call.samples) if s is sample)
        index = k * job.opts.n + i
        text, reason = sample.text, "stop" if sample.complete else "length"
        logprobs = top = None
        if job.opts.logprobs:
            node = node_at(call.tree, sample.tokens)
            logprobs = logprobs_to(node)
            k = job.opts.top_logprobs
            top = top_alternatives(self.lm, call.tree, node, k) if k else None
        self._final(job, Choice(index, text, reason, sample.tokens, logprobs, top))

    def _final(self, job: Job, choice: Choice) -> None:
        job.choices[choice.index] = choice
        if not job.opts.stream:
            return
        if job.watched:  # the rest of the text not streamed yet, then the end
            sent, ntok = job._sent.get(choice.index, ("", 0))
            rest = choice.text[len(sent):] if choice.text.startswith(sent) else ""
            lps = None if choice.token_logprobs is None else choice.token_logprobs[ntok:]
            top = None if choice.top_logprobs is None else choice.top_logprobs[ntok:]
            if rest or lps:
                self._emit(job, Delta(choice.index, rest, choice.tokens[ntok:], lps, top))
        self._emit(job, Final(choice))

    def _watch(self, job: Job) -> None:
        """After a step: stream each running choice's new text, holding back what could
        start a stop string."""
        stops, n, vocab = job.opts.stop, job.opts.n, self.lm.vocab
        for k, req in enumerate(job.requests):
            if req.done:
                continue
            for i, node in self.engine.prefixes(req).items():
                index = k * n + i
                if index in job.choices:
                    continue
                text = text_so_far(vocab.decode(node.tokens))
                visible = len(text) - held_back(text, stops)
                sent, ntok = job._sent.get(index, ("", 0))
                # Whole tokens only, so that a piece's tokens and log-probs match its text.
                upto, shown = len(node.tokens), text
                while upto > ntok and len(shown) > visible:
                    upto -= 1
                    shown = text_so_far(vocab.decode(node.tokens[:upto]))
                if len(shown) > len(sent) and shown.startswith(sent):
                    lps = logprobs_to(node)[ntok:upto] if job.opts.logprobs else None
                    k = job.opts.top_logprobs if job.opts.logprobs else 0
                    top = top_alternatives(self.lm, req.tree, node, k, upto, ntok) if k else None
                    self._emit(job, Delta(index, shown[len(sent):], node.tokens[ntok:upto],
                                          lps, top))
                    job._sent[index] = (shown, upto)

    def _cancel(self, job: Job, reason: BaseException) -> None:
        if job.over:
            return
        if job in self._pending:
            self._pending.remove(job)
        for req in job.requests:
            self.engine.cancel(req, reason)
        self.metrics.add(cancelled=1)
        self._finish(job, reason)

    def _finish(self, job: Job, error: BaseException | None = None) -> None:
        """Answer ``job``: its outcome, or the first error of its requests (the others
        are then cancelled); trees of a success go back to the cache."""
        if job.over:
            return
        job.over = True
        if job in self._running:
            self._running.remove(job)
        if error is None:
            error = next((r.error for r in job.requests if r.error is not None), None)
        if error is not None:
            for req in job.requests:
                self.engine.cancel(req, error)
            self._emit(job, Failed(error))
            return
        stats = self._stats(job)
        for call, key in zip(job.calls, job.keys, strict=True):
            held = self.trees.peek(key)
            if held is None or held.num_nodes <= call.tree.num_nodes:
                self.trees.put(key, call.tree)
        choices = [job.choices[i] for i in sorted(job.choices)]
        done = Done(choices, sum(len(call.ids) for call in job.calls), stats)
        self.metrics.add(prompt_tokens=done.prompt_tokens,
                         completion_tokens=done.completion_tokens,
                         lm_calls=stats["lm_calls"], backtracks=stats["backtracks"],
                         forced_tokens=stats["forced_tokens"],
                         tree_reuses=stats["trees_reused"])
        self._emit(job, done)

    def _stats(self, job: Job) -> dict[str, Any]:
        """The ``adaptrack`` field: this request's model calls and counters (a reused
        tree's earlier calls left out), its time in the queue and in all."""
        out: dict[str, Any] = {"method": job.opts.method, "lm_calls": 0, "backtracks": 0,
                               "restarts": 0, "fetched_ahead": 0, "forced_tokens": 0,
                               "ff_sequences": 0, "tree_nodes": 0, "trees_reused": job._reused}
        for call, (calls, forced, chains) in zip(job.calls, job._base, strict=True):
            tree, sampler = call.tree, call.sampler
            out["lm_calls"] += tree.lm_calls - calls
            out["forced_tokens"] += tree.forced_tokens - forced
            out["ff_sequences"] += tree.ff_sequences - chains
            out["backtracks"] += sampler.backtracks
            out["restarts"] += sampler.restarts
            out["fetched_ahead"] += sampler.fetched
            out["tree_nodes"] += tree.num_nodes
        # Choices the CD fallback drew after the search ran past its budget (not exact).
        n = job.opts.n
        out["fallback_choices"] = [k * n + i for k, call in enumerate(job.calls)
                                   for i, s in enumerate(call.samples)
                                   if s is not None and s.fallback]
        why = next((str(c.request.fell_back) for c in job.calls
                    if c.request is not None and c.request.fell_back is not None), None)
        out["fallback"] = why
        now = time.monotonic()
        out["queue_seconds"] = round((job.admitted or now) - job.arrived, 6)
        out["seconds"] = round(now - job.arrived, 6)
        return out
