"""The engine: the one place that calls the model, serving the walks of many requests
(prompts, methods, samples) with batched model calls (docs/design.md §4, walks).
It consults each request's :class:`~adaptrack.sampling.policy.BudgetPolicy` for its
budgets and the hand-over to the CD fallback.

A request is one prefix tree, one method over it and ``n`` samples. Each step the engine
lets every walk of every request run until it waits for a prefix's expansion, gathers
those prefixes across all trees, and asks the model for all of them at once (at most
``batch_size`` prefixes and ``max_batch_tokens`` returned distributions per call; forced
chains in the same call). Budgets and errors stay per request (a call budget per sample,
where a request's samples are independent: ``Request.share``): a request whose search runs
out of time or fails is closed with its error, and the others go on.

Walks are generators that read like the paper's pseudocode (``sampling/base.py``). A walk
yields a :class:`~adaptrack.sampling.tree.Node` to wait for its expansion (or a tuple of
them that one call serves; those in a :class:`~adaptrack.sampling.base.Prefetch` only fill
the cache, and the model is told so: ``LanguageModel.transient``), or
:data:`BARRIER` to wait until every walk of its request in flight waits at the barrier too;
the method's ``release`` then runs (``exact`` applies the Q updates of the round there, so
that each attempt reads one Q from start to end).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..lm.base import LanguageModel
from .base import BARRIER, Method, Walk
from .expansion import Expansion
from .policy import BudgetPolicy
from .tree import Node, PrefixTree
from .waits import direct, prefetched, waited


@dataclass
class _Slot:
    walk: Walk
    seen: set[int]
    waits: object = None  # a Node, BARRIER, or None before the walk started
    rows: int = 0  # model rows made for prefixes this walk waited for or fetched ahead
    searching: bool = True  # False: the fallback's CD walk of a sample past its share


@dataclass(eq=False)
class Request:
    """``n`` samples of ``method`` over ``tree``; ``on_done(i, node, requests)`` receives
    sample ``i`` as it finishes. ``width`` walks run at once (1: one after another, in
    order). ``error`` is set when the request failed; ``done`` once it is over either way.

    ``policy`` (docs/design.md §6) says the budgets and when its fallback, CD, takes
    over: when the search runs past one of its budgets (a
    :class:`~adaptrack.SearchLimitError`) CD draws the samples still missing, from each
    sample's own random stream, ``fallback_width`` at once: a sample whose walk was in
    flight goes on from the prefix that walk had reached, the others start at the root;
    ``fell_back`` then holds that error and ``fallen`` the indices of the samples it drew.

    With a policy's ``share`` (a method whose samples are independent), the model rows each
    sample's walk may cause (a row made for a prefix it waited for or fetched ahead counts,
    for each walk that asked for it): a walk past its share that needs one more goes on as
    the fallback's CD walk from the prefix it had reached, alone, while the other samples
    search on. Which samples reach their share can depend on what the other walks put in
    the cache (the batch), never on the machine.
    """

    tree: PrefixTree
    method: Method
    n: int
    seed: int | None
    on_done: Callable[[int, Node, int], None]
    width: int = 1
    error: BaseException | None = None
    done: bool = False
    started: int = 0
    policy: BudgetPolicy = field(default_factory=BudgetPolicy)
    fallback_width: int = 1
    fell_back: BaseException | None = None
    fallen: set[int] = field(default_factory=set)
    #: Forward passes that held one of this request's prefixes: the passes it waited for,
    #: whatever else they carried.
    passes: int = 0
    _whole: bool = False  # the fallback took over the whole request
    _redo: list[int] = field(default_factory=list)
    _streams: list[np.random.SeedSequence] = field(default_factory=list)
    _slots: dict[int, _Slot] = field(default_factory=dict)
    # Once the fallback took over: where the walks that were in flight begin again.
    _starts: dict[int, Node] = field(default_factory=dict)


# A prefix to expand for a request; True: a chain head whose forced tokens are fed too.
_Item = tuple["Request", Node, bool]


class Engine:
    """Serves every walk of every submitted request with shared batched model calls.

    >>> import adaptrack as at
    >>> from adaptrack.sampling.cd import ConstrainedDecoding
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    >>> c = at.constraints.choice(["b", "ab"]).bind(lm.vocab)
    >>> engine, out = Engine(lm), {}
    >>> for prompt in ([], [0]):
    ...     def done(i, node, requests, p=tuple(prompt)):
    ...         out[p, i] = node.tokens
    ...     tree = PrefixTree(prompt, c)
    ...     _ = engine.submit(ConstrainedDecoding(tree, greedy=True), 2, 0, done, width=2)
    >>> engine.run(); out
    {((), 0): (0, 1, 2), ((), 1): (0, 1, 2), ((0,), 0): (0, 1, 2), ((0,), 1): (0, 1, 2)}
    >>> lm.calls                                 # three prefixes per prompt, in three calls
    6
    """

    def __init__(self, lm: LanguageModel, batch_size: int = 32,
                 max_batch_tokens: int | None = 1024) -> None:
        """An engine over ``lm``: at most ``batch_size`` prefixes and ``max_batch_tokens``
        returned next-token distributions (None: no bound) per model call."""
        self.lm, self.batch_size, self.max_batch_tokens = lm, batch_size, max_batch_tokens
        self.requests: list[Request] = []
        self._fill: set[int] = set()  # ids of this step's prefixes asked only to fill a cache

    def submit(self, method: Method, n: int, seed: int | None,
               on_done: Callable[[int, Node, int], None], *, width: int = 1,
               policy: BudgetPolicy | None = None, fallback_width: int = 1) -> Request:
        """Queue ``n`` samples of ``method``; ``width`` of its walks run at once; the
        ``policy`` (default: no call budget, no fallback) sets the request's budgets and
        says when the fallback finishes them (:class:`Request`)."""
        policy = BudgetPolicy() if policy is None else policy
        method.width, method.samples = max(1, width), n
        method.unbounded = policy.max_calls is None and policy.early is None
        policy.start(method)
        req = Request(method.tree, method, n, seed, on_done, 1 if method.serial else method.width,
                      policy=policy, fallback_width=max(1, fallback_width))
        req._streams = np.random.SeedSequence(seed).spawn(n)
        self.requests.append(req)
        return req

    def run(self) -> None:
        """Step until every request is done (each either finished or failed)."""
        while self.step():
            pass

    def step(self) -> bool:
        """Advance every open request to its next model call, then make the calls. Returns
        whether some request is still open."""
        for req in self.requests:
            if not req.done:
                self._advance(req)
        self.requests = [r for r in self.requests if not r.done]
        if not self.requests:
            return False
        items: list[_Item] = []
        waited: dict[int, list[Node]] = {}
        self._fill.clear()
        for req in self.requests:
            try:
                req.policy.check(req.tree)  # between model calls: each request its own
                nodes, plain, heads = self._plan(req)
            except Exception as err:  # kept on the request; its owner raises it
                self._fail(req, err)
                continue
            self._fill.update(id(n) for s in req._slots.values() for n in prefetched(s.waits))
            waited[id(req)] = nodes
            items += [(req, n, False) for n in plain] + [(req, n, True) for n in heads]
        # A prefix some walk waits for is not only prefetched.
        self._fill.difference_update(id(n) for req in self.requests
                                     for s in req._slots.values() for n in direct(s.waits))
        self._call(items)
        for req in self.requests:
            if not req.done and id(req) in waited:
                req.tree.finish(waited[id(req)])
        return True

    def _plan(self, req: Request) -> tuple[list[Node], list[Node], list[Node]]:
        """The prefixes ``req``'s walks wait for and ``PrefixTree.plan``'s split of them.
        With a policy's ``share``, a walk past it that needs a model row first goes on as
        the fallback's CD walk, and each searching walk is charged the rows made for it."""
        while True:
            nodes = [n for s in req._slots.values() for n in waited(s.waits)]
            # The fallback's CD walks feed a chain whole, as cd does on its own tree.
            cd = [n for s in req._slots.values() if not s.searching for n in waited(s.waits)]
            plain, heads = req.tree.plan(nodes, eager=req.method.eager_chains, eager_for=cd)
            used = sum(len(s.seen) for s in req._slots.values())
            if req.policy.reads_paths(used):
                req.policy.walked([n for s in req._slots.values() if s.searching
                                   for n in waited(s.waits)])
            if req.policy.share is None or req._whole:
                req.policy.used(used)
                return nodes, plain, heads
            need = {id(n) for n in plain} | {id(n) for n in heads}
            over = [(i, why) for i, s in req._slots.items() if s.searching
                    and (why := req.policy.past_share(s.rows, len(s.seen))) is not None
                    and any(id(n) in need for n in waited(s.waits))]
            if not over:
                break
            for i, why in over:
                self._fall_back_one(req, i, why)
        for s in req._slots.values():
            if s.searching:
                s.rows += len({id(n) for n in waited(s.waits)} & need)
        return nodes, plain, heads

    def _fall_back_one(self, req: Request, i: int, why: BaseException) -> None:
        """Sample ``i``'s walk spent its share (``why``): the fallback's CD walk takes it
        over from the prefix the walk waits for, on the sample's own random stream."""
        slot = req._slots[i]
        reached = direct(slot.waits)
        slot.walk.close()
        cd = req.policy.fallback(req.method)
        if req.fell_back is None:
            req.fell_back = why
        req.fallen.add(i)
        seen: set[int] = set()
        rng = np.random.default_rng(req._streams[i])
        start = reached[0] if reached and req.policy.resumes(why) else None
        walk = cd.walk(seen, rng, start=start)
        req._slots[i] = _Slot(walk, seen, searching=False)
        self._resume(req, i)

    def _call(self, items: list[_Item]) -> None:
        """Ask the model for ``items`` in chunks. Plain prefixes and forced chains share a
        forward pass: with any chain in a chunk, a plain prefix is a chain of no tokens
        (``logprobs_along_many``). A failing chunk is asked again request by request, so
        that the error lands on the request that caused it."""
        items = [it for it in items if not it[0].done]
        for chunk in self._chunks(items):
            try:
                if any(chain for _, _, chain in chunk):
                    found = self.lm.logprobs_along_many(
                        [(r.tree.prompt + n.tokens, n.pending or () if chain else ())
                         for r, n, chain in chunk])
                else:
                    fill = [r.tree.prompt + n.tokens for r, n, _ in chunk if id(n) in self._fill]
                    with self.lm.transient(fill):
                        found = list(self.lm.next_logprobs(
                            [r.tree.prompt + n.tokens for r, n, _ in chunk])[:, None])
            except Exception as err:  # attributed below
                owners = list({id(r): r for r, _, _ in chunk}.values())
                if len(owners) == 1:
                    self._fail(owners[0], err)
                    continue
                for req in owners:
                    self._call([it for it in chunk if it[0] is req])
                continue
            for req in {id(r): r for r, _, _ in chunk}.values():
                req.passes += 1
                if req.done:
                    continue
                mine = [(n, chain, rows) for (r, n, chain), rows in zip(chunk, found,
                                                                          strict=True)
                        if r is req]
                try:
                    plain = [(n, rows[0]) for n, chain, rows in mine if not chain]
                    if plain:
                        req.tree.store([n for n, _ in plain], np.stack([r for _, r in plain]))
                    heads = [(n, rows) for n, chain, rows in mine if chain]
                    if heads:
                        req.tree.store_chains([n for n, _ in heads], [r for _, r in heads])
                except Exception as err:
                    self._fail(req, err)

    def _chunks(self, items: list[_Item]) -> list[list[_Item]]:
        out: list[list[_Item]] = []
        chunk: list[_Item] = []
        rows = 0
        for item in items:
            _, node, chain = item
            k = len(node.pending or ()) + 1 if chain else 1
            full = len(chunk) >= self.batch_size or (
                self.max_batch_tokens is not None and rows + k > self.max_batch_tokens)
            if chunk and full:
                out.append(chunk)
                chunk, rows = [], 0
            chunk.append(item)
            rows += k
        if chunk:
            out.append(chunk)
        return out

    def _advance(self, req: Request) -> None:
        """Run the request's walks until each waits for the model or is done."""
        try:
            for i in sorted(req._slots):  # the model answered what these waited for
                if waited(req._slots[i].waits):
                    self._resume(req, i)
            while True:
                while (req._redo or req.started < req.n) and len(req._slots) < req.width:
                    if req._redo:
                        i = req._redo.pop(0)
                    else:
                        i = req.started
                        req.started += 1
                    seen: set[int] = set()
                    rng = np.random.default_rng(req._streams[i])
                    start = req._starts.pop(i, None)  # only the fallback's CD has starts
                    walk = (req.method.walk(seen, rng) if start is None else
                            req.policy.walk_from(req.method, seen, rng, start))
                    req._slots[i] = _Slot(walk, seen)
                    self._resume(req, i)
                slots = req._slots.values()
                if slots and all(s.waits is BARRIER for s in slots):
                    req.method.release()  # every walk in flight is between attempts
                    for i in sorted(req._slots):
                        self._resume(req, i)
                    continue
                break
        except Exception as err:  # kept on the request; its owner raises it
            self._fail(req, err)
            return
        self._close_if_finished(req)

    @staticmethod
    def _close_if_finished(req: Request) -> None:
        if not req._slots and not req._redo and req.started >= req.n:
            req.done = True

    def _resume(self, req: Request, i: int) -> None:
        slot = req._slots[i]
        try:
            slot.waits = next(slot.walk)
        except StopIteration as stop:
            del req._slots[i]
            req.policy.sample_done(req.tree, i in req.fallen, stop.value, len(slot.seen))
            req.on_done(i, stop.value, len(slot.seen))

    def _fail(self, req: Request, err: BaseException, *, fall_back: bool = True) -> None:
        missing = sorted(req._slots) + list(range(req.started, req.n))
        # Where each walk in flight had reached: the prefix it waits for (its own first).
        reached = {i: nodes[0] for i, s in req._slots.items() if (nodes := direct(s.waits))}
        for slot in req._slots.values():
            slot.walk.close()
        req._slots.clear()
        if fall_back and not req._whole and req.policy.hands_over(err):
            # Walks from the root and as many more from where a walk in flight had reached.
            req.method = req.policy.take_over(req.method, len(missing) + len(reached))
            req._starts = reached if req.policy.resumes(err) else {}
            req.width = req.fallback_width
            req.fell_back, req._redo, req._whole = err, missing, True
            req.fallen.update(missing)
            req.started = req.n
            return
        req._redo.clear()
        req.error, req.done = err, True

    def cancel(self, req: Request, err: BaseException) -> None:
        """End ``req`` with ``err`` between steps (a server's timeout, a client that left):
        its walks are closed and no model call is made for it again; the other requests go
        on. A request already done is left as it is."""
        if not req.done:
            self._fail(req, err, fall_back=False)

    def prefixes(self, req: Request) -> dict[int, Node]:
        """The prefix each running walk of ``req`` waits at, by sample index: for methods
        that never go back (``cd``, ``unconstrained``) the sample so far, which a server
        streams token by token. Walks waiting at a barrier or not started are left out.

        >>> import adaptrack as at
        >>> from adaptrack.sampling.cd import ConstrainedDecoding
        >>> lm = at.TableLM([b"a", b"<eos>"], lambda prefix: [3, 1], eos=1)
        >>> tree = PrefixTree([], at.constraints.choice(["aa"]).bind(lm.vocab))
        >>> engine = Engine(lm)
        >>> req = engine.submit(ConstrainedDecoding(tree, greedy=True), 1, 0, print)
        >>> _ = engine.step(); _ = engine.step(); engine.prefixes(req)[0].tokens
        (0,)
        """
        return {i: s.waits for i, s in req._slots.items() if isinstance(s.waits, Node)}


# A driver outside any request (the enumeration, a server reading alternatives, a test) holds
# the model and asks it through these, so that this module stays the one caller of the model.


def expand_many(lm: LanguageModel, tree: PrefixTree, nodes: list[Node]) -> None:
    """Expand the prefixes ``nodes`` of ``tree`` at once by ``lm`` (forced chains fed by
    one more call), for a driver outside any request: the enumeration, a test. Raises the
    tree's budget errors before the call."""
    if all(n.expansion is not None for n in nodes):
        return
    tree.check_spent()
    plain, heads = tree.plan(nodes)
    if plain:
        tree.store(plain, lm.next_logprobs([tree.prompt + n.tokens for n in plain]))
    if heads:
        tree.store_chains(heads, lm.logprobs_along_many(
            [(tree.prompt + h.tokens, h.pending or ()) for h in heads]))
    tree.finish(nodes)


def expand(lm: LanguageModel, tree: PrefixTree, node: Node) -> Expansion:
    """The expansion of ``tree``'s prefix ``node``, asking ``lm`` if it is new
    (:func:`expand_many`); never for a walk, which waits (``Method.expand``).

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> tree = PrefixTree([], at.constraints.choice(["ab", "b"]).bind(lm.vocab))
    >>> e = expand(lm, tree, tree.root); e.ids.tolist(), e.p.round(2).tolist()
    ([0, 1], [0.5, 0.25])
    """
    if node.expansion is None:
        expand_many(lm, tree, [node])
    assert node.expansion is not None
    return node.expansion


def peek(lm: LanguageModel, tree: PrefixTree, nodes: list[Node]) -> list[Expansion]:
    """The expansions of ``nodes``, those not in the tree made from one call of ``lm`` and
    not kept (a server reading a sample's alternatives after its walk)."""
    missing = [n for n in nodes if n.expansion is None]
    made: dict[int, Expansion] = {}
    if missing:
        rows = lm.next_logprobs([tree.prompt + n.tokens for n in missing])
        made = {id(n): tree.expander.expansion(n, row)
                for n, row in zip(missing, rows, strict=True)}
    return [n.expansion if n.expansion is not None else made[id(n)] for n in nodes]


def score_tokens(lm: LanguageModel, prompt: Sequence[int],
                 tails: Sequence[Sequence[int]]) -> list[float]:
    """log P(tail | prompt) under ``lm`` for each of ``tails``, in one batched model call.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> [round(s, 3) for s in score_tokens(lm, [], [[0], [0, 2], []])]
    [-0.693, -2.079, 0.0]
    """
    rows = lm.logprobs_along_many([(tuple(prompt), tuple(t)) for t in tails])
    return [math.fsum(float(r[i, t]) for i, t in enumerate(tail))
            for r, tail in zip(rows, tails, strict=True)]


def prefill(lm: LanguageModel, prompts: Sequence[Sequence[int]]) -> None:
    """Evaluate each prompt once, so that later calls start from its kept KV state."""
    for prompt in prompts:
        lm.next_logprobs([tuple(prompt)])
