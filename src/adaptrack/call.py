"""One prompt of a :func:`adaptrack.generate` call made ready for the engine: the prompt's
ids fitted to the context, the constraint bound, the tree and the method built from the
:class:`~adaptrack.options.SamplingOptions`, and the samples gathered as walks finish
(docs/design.md §4, §6). Every check runs before any model work.

>>> import adaptrack as at
>>> from adaptrack.options import SamplingOptions
>>> from adaptrack.sampling.engine import Engine
>>> lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
>>> call = PreparedCall(lm, [], at.constraints.choice(["01", "10"]),
...                     SamplingOptions(method="cd", n=2, seed=0))
>>> engine = Engine(lm)
>>> req = call.submit(engine, batch_size=32)
>>> engine.run(); call.outcome(req).texts
['10', '10']
"""

from __future__ import annotations

import numbers
import time
import warnings
from collections.abc import Callable, Sequence

from .constraints.anything import Anything
from .constraints.base import Constraint, Matcher
from .constraints.compose import Stopped
from .errors import AdaptrackError, NoValidSequenceError, PromptTooLongError
from .limits import prompt_text
from .lm.base import LanguageModel
from .lm.cost import width_for
from .options import PARALLEL_WALKS, SamplingOptions
from .results import FreeTextWarning, GenerationResult, Sample
from .sampling.engine import Engine, Request
from .sampling.methods import METHODS, build
from .sampling.tree import Node, PrefixTree
from .sampling.treeoptions import TreeOptions
from .tokenization.tokenizer import Tokenizer


def check_lm(lm: object) -> None:
    """A ``TypeError`` naming the argument when ``lm`` is not a loaded model (a model id
    given where the model goes, or None)."""
    if isinstance(lm, LanguageModel):
        return
    hint = (f"; load it first: lm = adaptrack.load_model({lm!r:.60})"
            if isinstance(lm, str) else " (adaptrack.load_model(...) or a TableLM)")
    raise TypeError(f"lm must be an adaptrack.LanguageModel, got {lm!r:.60} "
                    f"({type(lm).__name__}){hint}")


def prompt_ids(lm: LanguageModel, prompt: str | Sequence[int], max_new_tokens: int = 0,
                truncate: bool = False) -> list[int]:
    """The prompt's token ids; a text longer than the context can hold is refused (or cut,
    with ``truncate``) from its size in bytes before it is tokenized.

    >>> from adaptrack.lm.table import TableLM
    >>> lm = TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> prompt_ids(lm, "01"), prompt_ids(lm, (1, 0))
    ([0, 1], [1, 0])
    >>> prompt_ids(lm, [5])
    Traceback (most recent call last):
    ValueError: prompt token ids [5] are outside the vocabulary (0..2)
    """
    check_lm(lm)
    if isinstance(prompt, str):
        return lm.encode(prompt_text(lm, prompt, max_new_tokens, truncate))
    if isinstance(prompt, bytes | bytearray):
        raise TypeError("prompt must be a str or a sequence of token ids, got bytes")
    try:
        prompt = list(prompt)
    except TypeError:
        raise TypeError(f"prompt must be a str or a sequence of token ids, got {prompt!r} "
                        f"({type(prompt).__name__})") from None
    ids: list[int] = []
    for t in prompt:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"prompt token ids must be ints, got {t!r}")
        ids.append(int(t))
    bad = [t for t in ids if not 0 <= t < lm.vocab.size]
    if bad:
        raise ValueError(
            f"prompt token ids {bad[:5]} are outside the vocabulary (0..{lm.vocab.size - 1})"
        )
    return ids


def bind_constraint(constraint: Constraint | None, lm: LanguageModel) -> Matcher:
    """``constraint`` bound to the model's vocabulary (no constraint: any text), or a
    ``TypeError`` naming what was given instead of a constraint.

    >>> from adaptrack.lm.table import TableLM
    >>> lm = TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> type(bind_constraint(None, lm)).__name__ != "NoneType"
    True
    >>> bind_constraint("01", lm)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: constraint must be an adaptrack.constraints.Constraint ...
    """
    if constraint is None:
        return Anything().bind(lm.vocab)
    if not isinstance(constraint, Constraint):
        raise TypeError(
            f"constraint must be an adaptrack.constraints.Constraint (for example "
            f"constraints.choice([...]) or constraints.regex(...)) or None, got "
            f"{constraint!r:.60} ({type(constraint).__name__})")
    return constraint.bind(lm.vocab)


def fit_prompt(lm: LanguageModel, ids: list[int], max_new_tokens: int,
                truncate: bool) -> list[int]:
    """The prompt, refused (``PromptTooLongError``) or cut to its last tokens when it and
    ``max_new_tokens`` do not fit the model's context (docs/design.md §6).

    >>> from adaptrack.lm.table import TableLM
    >>> lm = TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> lm.context_length = 5
    >>> fit_prompt(lm, [0, 1, 0, 1], 2, truncate=True)
    [1, 0, 1]
    >>> fit_prompt(lm, [0, 1, 0, 1], 2, truncate=False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    adaptrack.errors.PromptTooLongError: the prompt has 4 tokens and max_new_tokens=2: ...
    """
    context = getattr(lm, "context_length", None)
    if context is None or len(ids) + max_new_tokens <= context:
        return ids
    room = context - max_new_tokens
    if truncate and room > 0:
        return ids[len(ids) - room:]
    how = ("lower max_new_tokens" if room <= 0 else
           f"shorten the prompt, lower max_new_tokens, or pass truncate_prompt=True (keeps "
           f"the last {room} prompt tokens)")
    raise PromptTooLongError(
        f"the prompt has {len(ids)} tokens and max_new_tokens={max_new_tokens}: "
        f"{len(ids) + max_new_tokens} > {type(lm).__name__}'s context of {context} tokens; "
        f"{how}"
    )


#: Bytes forced from the start that :func:`require_room` reads at most (~5 µs a byte).
FORCED_CHECK_BYTES = 1 << 16


def require_room(matcher: Matcher, max_new_tokens: int) -> None:
    """``NoValidSequenceError`` before any model work when the constraint's shortest
    complete sequence needs more than ``max_new_tokens`` tokens (docs/design.md §6): the
    matcher's ``min_new_tokens``, or the bytes it forces from the start over the longest
    token. A search could otherwise open every prefix of an empty language (hours on a real
    model), and CD would answer an invalid text.

    >>> from adaptrack.constraints import choice
    >>> from adaptrack.lm.table import TableLM
    >>> lm = TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> require_room(bind_constraint(choice(["0101"]), lm), 5)  # 4 tokens and EOS fit
    >>> require_room(bind_constraint(choice(["0101"]), lm), 3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    adaptrack.errors.NoValidSequenceError: ...
    """
    need = int(getattr(matcher, "min_new_tokens", lambda: 1)())
    longest = matcher.vocab.max_token_len
    if need <= max_new_tokens and longest:
        # Bytes the constraint forces from the start (a grammar that only ever repeats
        # itself, a long literal): a text of k tokens holds at most k x longest of them.
        limit = min(max_new_tokens * longest + 1, FORCED_CHECK_BYTES)
        need = max(need, -(-len(matcher.forced_bytes(matcher.start(), limit)) // longest))
    if need > max_new_tokens:
        what = (f"at least {need} tokens (EOS or terminator included)" if need < 1 << 32
                else "more tokens than any limit")
        raise NoValidSequenceError(
            f"the constraint's shortest complete sequence needs {what}, more than "
            f"max_new_tokens={max_new_tokens}: no valid sequence fits; raise max_new_tokens "
            "or check the constraint"
        )


def _text(matcher: Matcher, lm: LanguageModel, node: Node) -> str:
    data = lm.vocab.decode(node.tokens)
    if node.truncated:  # cut by the length limit: nothing ended it, nothing to cut
        return data.decode("utf-8", errors="replace")
    if node.complete and matcher.terminators and node.tokens:
        last = lm.vocab.bytes_of(node.tokens[-1])
        cut = [i for i, b in enumerate(last) if b in matcher.terminators]
        if cut:  # keep the terminator, drop what the same token carried after it
            data = data[: len(data) - len(last) + cut[0] + 1]
    if node.complete:  # a constraint that ends on a stop string cuts it here
        data = matcher.final_text(data)
    return data.decode("utf-8", errors="replace")


def _tree(lm: LanguageModel, ids: list[int], matcher: Matcher, free: bool,
          options: SamplingOptions, stop: tuple[str, ...] = ()) -> PrefixTree:
    """The call's prefix tree. Unconstrained sampling walks without the constraint's
    length rule, chains and end policy, but keeps the stop strings of anything() and
    with_stop() (``stop``)."""
    o = options
    unconstrained = not METHODS[o.method].constrained
    walker = (Anything(matcher.terminators, stop).bind(lm.vocab) if unconstrained and not free
              else matcher)
    return model_tree(lm, ids, walker, o.tree_options(constrained=not unconstrained))


def model_tree(lm: LanguageModel, ids: Sequence[int], matcher: Matcher,
               options: TreeOptions) -> PrefixTree:
    """The prefix tree of ``lm``'s prompt ``ids``: the tree holds no model, only what it
    needs of it (the dtype of its probabilities; its tokenizer, for forced chains)."""
    tokenizer = None if options.fast_forward is None else Tokenizer.for_model(lm)
    return PrefixTree(ids, matcher, options, dtype=lm.probs_dtype, tokenizer=tokenizer)


class PreparedCall:
    """One prompt of a ``generate`` call: its tree, method, samples and result.
    ``submit(engine, batch_size)`` queues it, ``outcome(request)`` gives its result or
    error once the request is done. ``on_sample`` is called with each sample as it
    finishes; ``started`` is when the call's time budget started (default: now)."""

    def __init__(self, lm: LanguageModel, prompt: str | Sequence[int],
                 constraint: Constraint | None, options: SamplingOptions, *,
                 on_sample: Callable[[Sample], None] | None = None,
                 started: float | None = None) -> None:
        if not isinstance(options, SamplingOptions):
            raise TypeError(f"options must be a SamplingOptions, got {options!r:.60}")
        if on_sample is not None and not callable(on_sample):
            raise TypeError(f"on_sample must be callable or None, got {on_sample!r}")
        self.options = o = options
        self.request: Request | None = None
        self.started = time.perf_counter() if started is None else started
        self.lm, self.n, self.seed, self.parallel = lm, o.n, o.seed, o.parallel
        self.on_sample = on_sample
        self.ids = fit_prompt(lm, prompt_ids(lm, prompt, o.max_new_tokens,
                                               o.truncate_prompt),
                               o.max_new_tokens, o.truncate_prompt)
        self.matcher = matcher = bind_constraint(constraint, lm)
        self.unconstrained = not METHODS[o.method].constrained
        free = constraint is None or isinstance(constraint, Anything)
        if not self.unconstrained and not o.allow_truncated:  # a cut text is a valid end
            require_room(matcher, o.max_new_tokens)
        if METHODS[o.method].searches and not o.allow_truncated:
            if free:
                warnings.warn(FreeTextWarning(
                    f"method={o.method!r} with no constraint samples text that ends (EOS) "
                    f"within max_new_tokens={o.max_new_tokens}, a search that can take long "
                    "when the model rarely stops that early; use method='unconstrained' for "
                    "free text"), stacklevel=3)
        stop = constraint.stop if isinstance(constraint, Stopped) else ()
        self.policy = o.budget_policy()
        self.tree = _tree(lm, self.ids, matcher, free, o, stop)
        self.policy.bind(self.tree)
        self.sampler = build(o.method, self.tree, o.greedy, o)
        self.samples: list[Sample | None] = [None] * o.n
        #: The request's width once submitted (``stats["width"]``): exact's attempts
        #: followed at once, else its walks in flight (at most n).
        self.width = 0
        self.left = o.n
        self.finished: float | None = None  # when the last sample finished

    def submit(self, engine: Engine, batch_size: int) -> Request:
        sampler, parallel = self.sampler, self.parallel
        if sampler.independent:
            width = batch_size  # samples independent: the width changes no sample
        elif not sampler.runs_in_parallel(None if parallel is None else bool(parallel)):
            width = 1
        else:  # a fixed width, not batch_size: the walks in flight decide the samples
            width = PARALLEL_WALKS if isinstance(parallel, bool | None) else int(parallel)
        if sampler.spends_width:  # rows that change no sample: the option, or the device's
            rows = sampler.asked_width or width_for(self.lm.measured_row_cost())
            width = rows if parallel is None or parallel is True else min(rows, width)
        self.width = width if sampler.spends_width else min(width, self.n)
        self.request = engine.submit(sampler, self.n, self.seed, self.done, width=width,
                                     policy=self.policy, fallback_width=batch_size)
        return self.request

    def done(self, i: int, node: Node, requests: int) -> None:
        complete = node.complete and not node.truncated
        valid = complete and (not self.unconstrained or self.matcher.accepts(node.tokens))
        fell = self.request is not None and i in self.request.fallen
        self.samples[i] = sample = Sample(node.tokens, _text(self.matcher, self.lm, node),
                                          complete, valid, node.logprob, requests, fell)
        self.left -= 1
        if not self.left:  # other prompts of the call may still run: this one's time ends
            self.finished = time.perf_counter()
        if self.on_sample is not None:
            self.on_sample(sample)

    def result(self) -> GenerationResult:
        finished = [s for s in self.samples if s is not None]
        tree, sampler = self.tree, self.sampler
        stats = {
            "lm_calls": tree.lm_calls,
            "tree_nodes": tree.num_nodes,
            "evictions": tree.evictions,
            "backtracks": sampler.backtracks,
            "restarts": sampler.restarts,
            "fetched_ahead": sampler.fetched,
            "incomplete": sum(not s.complete for s in finished),
            "ff_sequences": tree.ff_sequences,
            "forced_tokens": tree.forced_tokens,
            "ff_unencodable": tree.ff_unencodable,
            "prompt_tokens": len(self.ids),
            "fallback_samples": sum(s.fallback for s in finished),
            "forward_passes": 0 if self.request is None else self.request.passes,
            "width": self.width,
            "seconds": (self.finished or time.perf_counter()) - self.started,
            **self.matcher.stats(),
        }
        req = self.request
        why = None if req is None or req.fell_back is None else str(req.fell_back)
        return GenerationResult(finished, stats, why)

    def outcome(self, req: Request) -> GenerationResult | BaseException:
        """The result, or the request's error carrying the finished samples."""
        if req.error is None:
            return self.result()
        if isinstance(req.error, AdaptrackError):
            req.error.partial = self.result()  # type: ignore[attr-defined]
        return req.error

    def use_tree(self, tree: PrefixTree) -> None:
        """Sample from ``tree`` instead of the call's own, before :meth:`submit`: a tree an
        earlier call built for the same prompt ids, constraint, temperature, top_p,
        max_new_tokens, allow_truncated and fast-forward (a server's cache of trees,
        ``adaptrack.serve``; a tree whose length rule differs is a ``ValueError``).
        Its expansions are reused; the method starts afresh on it (its own Q, counters and
        random streams), so a seed gives the samples a fresh tree gives. The budgets stay
        this call's: time counts from this call's start, nodes, opened bytes and model calls
        from what the tree already holds. ``result()``'s tree counters then include the
        earlier calls'."""
        own = self.tree
        if (tree.allow_truncated, tree.restrict_length, tree.leave) != (
                own.allow_truncated, own.restrict_length, own.leave):
            raise ValueError("use_tree: the tree was built with another length rule "
                             "(allow_truncated, or another method's) or end policy; build a "
                             "new one")
        tree.started, tree.max_seconds = own.started, own.max_seconds
        tree.max_nodes = tree.num_nodes + own.max_nodes
        self.policy.bind(tree)
        tree.max_opened_bytes = tree.opened_bytes + own.max_opened_bytes
        self.tree = tree
        self.sampler = build(self.options.method, tree, self.options.greedy, self.options)
