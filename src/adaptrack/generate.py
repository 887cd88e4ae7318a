"""``generate`` and ``exact_distribution``: the public entry points (docs/design.md §5),
with the argument checks and budgets of docs/design.md §6."""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .constraints.anything import Anything
from .constraints.base import Constraint, Matcher
from .constraints.compose import Stopped
from .errors import AdaptrackError, NoValidSequenceError, PromptTooLongError
from .lm.base import LanguageModel
from .sampling.adaptrack import AdapTrack
from .sampling.asap import ASAp
from .sampling.base import Method
from .sampling.cd import ConstrainedDecoding
from .sampling.engine import Engine, Request
from .sampling.enumerate import enumerate_tree
from .sampling.exact import Exact
from .sampling.fastforward import FastForward
from .sampling.tree import END_POLICIES, Node, PrefixTree
from .sampling.unconstrained import Unconstrained

METHODS: dict[str, type[Method]] = {
    "unconstrained": Unconstrained,
    "cd": ConstrainedDecoding,
    "asap": ASAp,
    "adaptrack": AdapTrack,
    "exact": Exact,
}

#: Methods that sample the target conditioned on ending within ``max_new_tokens``: without a
#: constraint they search for free text that stops that early (docs/design.md §2, §6).
SEARCHES = ("asap", "adaptrack", "exact")

#: What draws a search's missing samples once it runs past a budget (docs/design.md §6):
#: ``"cd"``, or None to raise the budget's :class:`~adaptrack.SearchLimitError`.
FALLBACKS = ("cd", None)

#: Walks in flight over one shared Q with ``parallel=True`` (the default of ``exact``): a
#: fixed number, not ``batch_size``, so that the batch size changes no sample.
PARALLEL_WALKS = 32

#: The default time budget of one ``generate`` call, in seconds: far past the runs in
#: docs/benchmarks.md (a TFv1 prompt with n = 20 takes seconds on a CPU), short enough that a
#: search that cannot succeed stops within minutes with ``SearchTimeoutError``.
MAX_SECONDS = 600.0


class FreeTextWarning(UserWarning):
    """A search method (``asap``, ``adaptrack``, ``exact``) was asked for text with no
    constraint: it samples text that ends (EOS) within ``max_new_tokens``, which is a search
    when the model rarely stops that early; ``method="unconstrained"`` is for free text."""


class SearchFallbackWarning(UserWarning):
    """A search ran past a budget and CD drew its missing samples (``fallback="cd"``):
    those samples follow CD's distribution, not the method's (``Sample.fallback``)."""


@dataclass(frozen=True)
class Sample:
    """One generated sequence.

    ``tokens`` are the generated ids after the prompt (EOS included when it ended one);
    ``text`` their bytes decoded as UTF-8, cut after the terminator when one ended it;
    ``complete``: the sequence ended (EOS or terminator) rather than running out of tokens
    or into a dead end (a sample cut at ``max_new_tokens`` under ``allow_truncated`` is not
    complete); ``valid``: it is complete and the constraint accepts it (always true
    for complete samples of the constrained methods); ``logprob``: log P(tokens | prompt)
    under the model at the sampling temperature (T = 1 when ``temperature=0``);
    ``lm_requests``: prefixes whose next-token distribution this sample used, cache hits
    included (the AdapTrack paper's "calls to LM per sample", Table 5); ``fallback``: the
    search ran past a budget before this sample was drawn, so the fallback drew it (CD's
    distribution, not the method's; docs/design.md §6).
    """

    tokens: tuple[int, ...]
    text: str
    complete: bool
    valid: bool
    logprob: float
    lm_requests: int
    fallback: bool = False


@dataclass
class GenerationResult:
    """Samples plus stats: ``lm_calls`` (model calls: distinct prefixes evaluated, a
    fast-forwarded chain counting once), ``tree_nodes``, ``evictions``, ``backtracks``,
    ``restarts``, ``incomplete``, ``ff_sequences`` (chains fed in one call each) and
    ``forced_tokens`` (the tokens fed in them; ``cd`` and ``asap`` feed a chain from its
    head, ``adaptrack`` and ``exact`` only once a walk steps into it, so the
    head is then a call of its own and the chain starts after the first forced token),
    ``ff_unencodable`` (prefixes left without a chain because the tokenizer cannot encode
    their forced bytes: see :class:`~adaptrack.sampling.fastforward.FastForward`),
    ``seconds``, ``prompt_tokens`` (after any truncation), ``fallback_samples`` (samples
    the fallback drew) and the constraint's own counters (a predicate adds ``checks``,
    ``check_timeouts`` and ``check_seconds``). ``fallback``: the message of the budget the
    search ran past, when the fallback drew some samples (else None)."""

    samples: list[Sample]
    stats: dict[str, float] = field(default_factory=dict)
    fallback: str | None = None

    @property
    def texts(self) -> list[str]:
        return [s.text for s in self.samples]


def _integer(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        bound = ">= 0" if minimum == 0 else f"at least {minimum}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return int(value)


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


#: More samples than this in one call is refused: each one is kept in memory until the end.
MAX_N = 10_000_000


def _check(n: int, temperature: float, top_p: float, max_new_tokens: int, max_nodes: int) -> None:
    if _integer("n", n, 1) > MAX_N:
        raise ValueError(f"n must be at most {MAX_N:_}, got {n}; split the work into several "
                         "calls")
    t = _real("temperature", temperature)
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"temperature must be >= 0 and finite (0 means greedy), "
                         f"got {temperature}")
    p = _real("top_p", top_p)
    if not 0 < p <= 1:  # also refuses nan
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    _integer("max_new_tokens", max_new_tokens, 1)
    _integer("max_nodes", max_nodes, 1)


def _check_seconds(max_seconds: float | None) -> float | None:
    if max_seconds is None:
        return None
    seconds = _real("max_seconds", max_seconds)
    if not seconds > 0:  # also refuses nan; inf means no limit
        raise ValueError(f"max_seconds must be > 0 or None (no limit), got {max_seconds}")
    return None if math.isinf(seconds) else seconds


def _prompt_ids(lm: LanguageModel, prompt: str | Sequence[int]) -> list[int]:
    if isinstance(prompt, str):
        return lm.encode(prompt)
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


def _bind(constraint: Constraint | None, lm: LanguageModel) -> Matcher:
    if constraint is None:
        return Anything().bind(lm.vocab)
    if not isinstance(constraint, Constraint):
        raise TypeError(
            f"constraint must be an adaptrack.constraints.Constraint (for example "
            f"constraints.choice([...]) or constraints.regex(...)) or None, got "
            f"{constraint!r:.60} ({type(constraint).__name__})")
    return constraint.bind(lm.vocab)


def _fit_prompt(lm: LanguageModel, ids: list[int], max_new_tokens: int,
                truncate: bool) -> list[int]:
    """The prompt, refused (``PromptTooLongError``) or cut to its last tokens when it and
    ``max_new_tokens`` do not fit the model's context (docs/design.md §6)."""
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


def _require_room(matcher: Matcher, max_new_tokens: int) -> None:
    """``NoValidSequenceError`` before any model work when the constraint's shortest
    complete sequence needs more than ``max_new_tokens`` tokens (docs/design.md §6): a search
    could otherwise open every prefix of an empty language (hours on a real model)."""
    need = int(getattr(matcher, "min_new_tokens", lambda: 1)())
    if need > max_new_tokens:
        what = (f"at least {need} tokens (EOS or terminator included)" if need < 1 << 32
                else "more tokens than any limit")
        raise NoValidSequenceError(
            f"the constraint's shortest complete sequence needs {what}, more than "
            f"max_new_tokens={max_new_tokens}: no valid sequence fits; raise max_new_tokens "
            "or check the constraint"
        )


def _end(end: Any) -> str:
    if not isinstance(end, str) or end not in END_POLICIES:
        raise ValueError(f"end must be one of {', '.join(map(repr, END_POLICIES))} (where an "
                         f"accepted text ends: docs/design.md §2), got {end!r}")
    return end


def _fast_forward(option: bool | FastForward, forces: bool) -> FastForward | None:
    """The options for a tree; ``force=None`` becomes ``forces`` (the method's choice)."""
    if not isinstance(option, bool | FastForward):
        raise TypeError(f"fast_forward must be True, False or FastForward(...), got {option!r}")
    if option is False:
        return None
    ff = FastForward() if option is True else option
    return ff if ff.force is not None else replace(ff, force=forces)


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


def _many(prompt: Any) -> bool:
    """Whether ``prompt`` is a list of prompts (strings or token-id sequences) rather than
    one prompt's token ids."""
    if isinstance(prompt, str | bytes | bytearray) or not isinstance(prompt, list | tuple):
        return False
    return bool(prompt) and all(
        isinstance(p, str) or (isinstance(p, Sequence) and not isinstance(p, bytes | bytearray))
        for p in prompt)


class _Call:
    """One prompt of a ``generate`` call: its tree, method, samples and result."""

    def __init__(self, lm: LanguageModel, prompt: str | Sequence[int],
                 constraint: Constraint | None, method: str, n: int, temperature: float,
                 top_p: float, max_new_tokens: int, seed: int | None,
                 fast_forward: bool | FastForward, *, share_q: bool = False,
                 max_backtrack: int | None = None, min_backtrack_prob: float = 0.0,
                 max_nodes: int = 100_000, max_cache_bytes: int = 1 << 30,
                 max_opened_bytes: int = 1 << 30, max_seconds: float | None = MAX_SECONDS,
                 truncate_prompt: bool = False, allow_truncated: bool = False,
                 parallel: bool | int | None = None, end: str = "leave",
                 fallback: str | None = "cd",
                 on_sample: Callable[[Sample], None] | None = None,
                 started: float | None = None) -> None:
        if not isinstance(method, str) or method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if method != "adaptrack" and (share_q or max_backtrack is not None
                                      or min_backtrack_prob):
            raise ValueError(
                "share_q, max_backtrack and min_backtrack_prob apply to method='adaptrack' only"
            )
        _check(n, temperature, top_p, max_new_tokens, max_nodes)
        if seed is not None:
            _integer("seed", seed, 0)
        _flag("share_q", share_q)
        _flag("truncate_prompt", truncate_prompt)
        _flag("allow_truncated", allow_truncated)
        if parallel is not None and not isinstance(parallel, bool):
            _integer("parallel", parallel, 1)
        _integer("max_cache_bytes", max_cache_bytes, 0)
        _integer("max_opened_bytes", max_opened_bytes, 0)
        if max_backtrack is not None:
            _integer("max_backtrack", max_backtrack, 0)
        mbp = _real("min_backtrack_prob", min_backtrack_prob)
        if not 0 <= mbp <= 1:
            raise ValueError(f"min_backtrack_prob must be in [0, 1], got {min_backtrack_prob}")
        seconds = _check_seconds(max_seconds)
        _end(end)
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be 'cd' or None (raise SearchLimitError), got "
                             f"{fallback!r}")
        self.fallback = fallback if method in SEARCHES else None
        self.request: Request | None = None
        ff = _fast_forward(fast_forward, METHODS[method].forces_chains)
        if on_sample is not None and not callable(on_sample):
            raise TypeError(f"on_sample must be callable or None, got {on_sample!r}")
        self.started = time.perf_counter() if started is None else started
        self.lm, self.n, self.seed, self.parallel = lm, n, seed, parallel
        self.on_sample = on_sample
        self.ids = _fit_prompt(lm, _prompt_ids(lm, prompt), max_new_tokens, truncate_prompt)
        self.matcher = matcher = _bind(constraint, lm)
        self.unconstrained = unconstrained = method == "unconstrained"
        if method in SEARCHES and not allow_truncated:  # a cut text is a valid end
            _require_room(matcher, max_new_tokens)
            if constraint is None or isinstance(constraint, Anything):
                warnings.warn(FreeTextWarning(
                    f"method={method!r} with no constraint samples text that ends (EOS) "
                    f"within max_new_tokens={max_new_tokens}, a search that can take long "
                    "when the model rarely stops that early; use method='unconstrained' for "
                    "free text"), stacklevel=3)
        # Unconstrained sampling ignores a constraint, but keeps the stop strings of
        # anything() and with_stop().
        free = constraint is None or isinstance(constraint, Anything)
        stop = constraint.stop if isinstance(constraint, Stopped) else ()
        walker = (Anything(matcher.terminators, stop).bind(lm.vocab)
                  if unconstrained and not free else matcher)
        self.tree = PrefixTree(lm, self.ids, walker, temperature=temperature, top_p=top_p,
                               max_new_tokens=max_new_tokens, max_nodes=max_nodes,
                               max_cache_bytes=max_cache_bytes,
                               max_opened_bytes=max_opened_bytes, max_seconds=seconds,
                               restrict_length=not unconstrained,
                               allow_truncated=allow_truncated,
                               fast_forward=None if unconstrained else ff,
                               end="eos" if unconstrained else end)
        self.sampler: Method
        if method == "adaptrack":
            self.sampler = AdapTrack(self.tree, temperature == 0, share_q=share_q,
                                     max_backtrack=max_backtrack, min_backtrack_prob=mbp)
        else:
            self.sampler = METHODS[method](self.tree, temperature == 0)
        self.samples: list[Sample | None] = [None] * n
        self.left = n
        self.finished: float | None = None  # when the last sample finished

    def submit(self, engine: Engine, batch_size: int) -> Request:
        sampler, parallel = self.sampler, self.parallel
        if sampler.independent:
            width = batch_size  # samples independent: the width changes no sample
        elif not sampler.runs_in_parallel(None if parallel is None else bool(parallel)):
            width = 1
        else:  # a fixed width, not batch_size: the walks in flight decide the samples
            width = PARALLEL_WALKS if isinstance(parallel, bool | None) else int(parallel)
        fallback = None
        if self.fallback == "cd":
            def fallback() -> Method:
                return ConstrainedDecoding(self.tree, self.sampler.greedy)
        self.request = engine.submit(sampler, self.n, self.seed, self.done, width=width,
                                     fallback=fallback, fallback_width=batch_size)
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
            "incomplete": sum(not s.complete for s in finished),
            "ff_sequences": tree.ff_sequences,
            "forced_tokens": tree.forced_tokens,
            "ff_unencodable": tree.ff_unencodable,
            "prompt_tokens": len(self.ids),
            "fallback_samples": sum(s.fallback for s in finished),
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
        this call's: time counts from this call's start, nodes and opened bytes from what
        the tree already holds. ``result()``'s tree counters then include the earlier
        calls'."""
        own = self.tree
        if (tree.allow_truncated, tree.restrict_length, tree.leave) != (
                own.allow_truncated, own.restrict_length, own.leave):
            raise ValueError("use_tree: the tree was built with another length rule "
                             "(allow_truncated, or another method's) or end policy; build a "
                             "new one")
        tree.started, tree.max_seconds = own.started, own.max_seconds
        tree.max_nodes = tree.num_nodes + own.max_nodes
        tree.max_opened_bytes = tree.opened_bytes + own.max_opened_bytes
        old = self.sampler
        self.tree = tree
        if isinstance(old, AdapTrack):
            self.sampler = AdapTrack(tree, old.greedy, share_q=old.share_q,
                                     max_backtrack=old.max_backtrack,
                                     min_backtrack_prob=old.min_backtrack_prob)
        else:
            self.sampler = type(old)(tree, old.greedy)


def _engine(lm: LanguageModel, batch_size: int, max_batch_tokens: int | None) -> Engine:
    _integer("batch_size", batch_size, 1)
    if max_batch_tokens is not None:
        _integer("max_batch_tokens", max_batch_tokens, 1)
    return Engine(lm, batch_size=batch_size, max_batch_tokens=max_batch_tokens)


def generate(
    lm: LanguageModel,
    prompt: str | Sequence[int] | Sequence[str | Sequence[int]],
    constraint: Constraint | None = None,
    method: str = "adaptrack",
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    seed: int | None = None,
    fast_forward: bool | FastForward = True,
    *,
    share_q: bool = False,
    max_backtrack: int | None = None,
    min_backtrack_prob: float = 0.0,
    max_nodes: int = 100_000,
    max_cache_bytes: int = 1 << 30,
    max_opened_bytes: int = 1 << 30,
    max_seconds: float | None = MAX_SECONDS,
    truncate_prompt: bool = False,
    allow_truncated: bool = False,
    batch_size: int = 32,
    max_batch_tokens: int | None = 1024,
    parallel: bool | int | None = None,
    end: str = "leave",
    fallback: str | None = "cd",
    on_sample: Callable[[Sample], None] | None = None,
) -> Any:
    """Draw ``n`` samples of a continuation of ``prompt`` that satisfies ``constraint``.

    ``method`` is one of ``unconstrained``, ``cd``, ``asap``, ``adaptrack``, ``exact`` (see
    the README for what each guarantees). The ``n`` samples share one prefix tree, so the
    model evaluates each prefix once. ``share_q``, ``max_backtrack`` and
    ``min_backtrack_prob`` are AdapTrack's options. ``on_sample`` is called with each sample
    as it finishes (a progress hook).

    ``prompt`` may be a list of prompts (strings or token-id lists): each gets its own tree
    and the same options and seed, and the result is a list of :class:`GenerationResult`,
    one per prompt in order (``[]`` is one empty prompt, as always). Every waiting prefix
    of every prompt goes to the model in one batched call (at most ``batch_size`` prefixes
    and ``max_batch_tokens`` returned distributions per call;
    :class:`adaptrack.sampling.engine.Engine`).

    Walks in flight: methods whose samples are independent (``unconstrained``, ``cd``,
    ``adaptrack`` without ``share_q``) run ``batch_size`` samples at once. Methods whose
    samples share Q run several walks over that one Q where ``parallel`` says so: ``True``
    for ``PARALLEL_WALKS`` (32) walks, an int for that many, ``False`` (or 1) for one at a
    time, ``None`` for the method's default: parallel for ``exact`` (in rounds that keep it
    exact, of at most that many attempts; docs/design.md §3), one at a time for ``asap``
    and ``adaptrack`` with ``share_q`` (in parallel they are further from the target;
    README). A seed gives the same samples whatever
    ``batch_size``, ``max_batch_tokens``, ``max_cache_bytes`` and the other prompts of the
    call, for every method (exactly with an exact model such as ``TableLM``; a float
    backend's batch composition changes rounding by about 1e-6, which can flip a draw that
    close to a boundary); for shared-Q methods the number of walks in flight
    (``parallel``) changes the samples, never the target of ``exact``.

    ``fast_forward`` (``True``, ``False`` or :class:`FastForward` options): bytes the
    constraint forces are fed as their canonical tokens in one model call. ``cd`` then
    forces them: a forced token is the only valid one and skips the top-p cutoff, and its
    target is conditioned on forced bytes being tokenized canonically. ``asap``,
    ``adaptrack`` and ``exact`` only prefill the chain: every valid token stays valid, so
    their target and, with an exact model, their samples are those of
    ``fast_forward=False``, with fewer model calls wherever a walk follows the canonical
    tokens (docs/design.md §2). ``FastForward(force=True)`` or ``force=False`` chooses for
    every method.

    ``end``: where a text the constraint accepts ends (docs/design.md §2). ``"leave"`` (the
    default): where the model's next token cannot continue it, EOS or any token the
    constraint rejects there, the way a reader of unconstrained output would cut it; the
    target is P(s) · P(leave | s) over accepted texts s, and the token that left is
    reported as EOS. ``"eos"``: only where the model emits EOS, the AdapTrack paper's
    target (its RQ4 studies use it); after a prompt that does not make the model stop,
    every complete text then has a tiny weight and the searches take long. ``unconstrained``
    ignores it.

    ``allow_truncated``: by default ``max_new_tokens`` is part of the constraint (a prefix
    that cannot end within it is invalid), so the searching methods sample text that ends
    in time, and search long when the model rarely ends that early. With
    ``allow_truncated=True`` a valid prefix that reaches ``max_new_tokens`` ends its sample
    (``complete=False``), as unconstrained sampling stops there: the target is the model's
    text cut at the limit, conditioned on every prefix being valid (docs/design.md §2).
    Use it where a cut output is still scored, as code benchmarks score a completion cut
    at the token limit.

    Budgets (docs/design.md §6), each raising a :class:`~adaptrack.SearchLimitError` that
    names it: ``max_nodes`` prefixes in the tree (``TreeLimitError``); ``max_opened_bytes``
    for the expansions the search holds (``TreeLimitError``; ``max_cache_bytes`` bounds the
    others, which are dropped and recomputed, results unchanged); ``max_seconds`` (default
    ``MAX_SECONDS`` = 600 s, ``None`` for no limit) of sampling per prompt, counted from the
    call's start (``SearchTimeoutError``). Refused before any model work: a prompt that with
    ``max_new_tokens`` exceeds the model's ``context_length`` (``PromptTooLongError``, or
    with ``truncate_prompt=True`` the prompt keeps its last ``context_length -
    max_new_tokens`` tokens), and, for ``asap``, ``adaptrack`` and ``exact``, a constraint
    whose shortest complete sequence needs more than ``max_new_tokens`` tokens
    (``NoValidSequenceError``). With no constraint these three methods warn
    (:class:`FreeTextWarning`): they sample text that ends within ``max_new_tokens``;
    ``method="unconstrained"`` is for free text.

    ``fallback`` (docs/design.md §6): when ``asap``, ``adaptrack`` or ``exact`` runs past
    ``max_nodes``, ``max_opened_bytes`` or ``max_seconds``, ``"cd"`` (the default) draws
    the samples still missing by CD over the same tree, each from its own random stream;
    they are marked ``Sample.fallback`` (CD's distribution, not the method's), counted in
    ``stats["fallback_samples"]``, the result's ``fallback`` names the budget, and
    ``generate`` warns (:class:`SearchFallbackWarning`). ``None`` raises the budget's
    :class:`~adaptrack.SearchLimitError` instead, as below.

    An :class:`~adaptrack.AdaptrackError` raised while sampling carries the samples that
    finished before it: ``err.partial`` is a :class:`GenerationResult` of them (in sample
    order, possibly none) with the stats so far. With a list of prompts, a failing prompt
    does not stop the others: once all are over, the first error (in prompt order) is
    raised, its ``partial`` for its own prompt and ``err.results`` the list of every
    prompt's :class:`GenerationResult` or error.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> bits = at.constraints.choice(["00000"] + [f"1{i:04b}" for i in range(16)])
    >>> res = at.generate(lm, [], bits, method="exact", n=3, seed=0)
    >>> [s.text for s in res.samples]
    ['11101', '10111', '11001']
    >>> all(s.valid for s in res.samples)
    True
    >>> try:
    ...     at.generate(lm, [], bits, method="exact", n=3, seed=0, max_nodes=20, fallback=None)
    ... except at.TreeLimitError as err:
    ...     [s.text for s in err.partial.samples]    # what finished before the limit
    ['11101', '10111']
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as said:   # the default: CD draws the third
    ...     res = at.generate(lm, [], bits, method="exact", n=3, seed=0, max_nodes=20)
    >>> [(s.text, s.fallback) for s in res.samples], said[0].category.__name__
    ([('11101', False), ('10111', False), ('10110', True)], 'SearchFallbackWarning')
    >>> [r.texts for r in at.generate(lm, [[], [0]], bits, method="cd", n=2, seed=0)]
    [['10100', '10101'], ['10100', '10101']]
    """
    many = _many(prompt)
    prompts = list(prompt) if many else [prompt]
    options = dict(constraint=constraint, method=method, n=n, temperature=temperature,
                   top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                   fast_forward=fast_forward, share_q=share_q, max_backtrack=max_backtrack,
                   min_backtrack_prob=min_backtrack_prob, max_nodes=max_nodes,
                   max_cache_bytes=max_cache_bytes, max_opened_bytes=max_opened_bytes,
                   max_seconds=max_seconds, truncate_prompt=truncate_prompt,
                   allow_truncated=allow_truncated, parallel=parallel, end=end,
                   fallback=fallback, on_sample=on_sample)
    outcomes = _serve(lm, [{"prompt": p, **options} for p in prompts], batch_size,
                      max_batch_tokens, up_front=True)
    for out in outcomes:
        if isinstance(out, GenerationResult) and out.fallback is not None:
            warnings.warn(SearchFallbackWarning(
                f"method={method!r}: {out.stats['fallback_samples']:g} of {n} samples drawn by "
                f"CD (not {method}'s distribution) after {out.fallback}"), stacklevel=2)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        if many:
            failed[0].results = outcomes  # type: ignore[attr-defined]
        raise failed[0]
    return outcomes if many else outcomes[0]


def generate_each(
    lm: LanguageModel,
    calls: Sequence[dict[str, Any]],
    *,
    batch_size: int = 32,
    max_batch_tokens: int | None = 1024,
) -> list[Any]:
    """Several :func:`generate` calls served together by one engine: each call is a dict of
    :func:`generate`'s arguments after ``lm`` (one prompt each); returns, in order, each
    call's :class:`GenerationResult` or the :class:`~adaptrack.AdaptrackError` it raised
    (with ``partial``). Bad arguments raise before any model work. The evaluation harness
    runs a greedy and a sampled call per problem, many problems at once, this way.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> bits = at.constraints.choice(["00000", "11111"])
    >>> out = generate_each(lm, [dict(prompt=[], constraint=bits, temperature=0),
    ...                          dict(prompt=[], constraint=bits, n=3, seed=0, max_nodes=2,
    ...                               fallback=None)])
    >>> out[0].texts, type(out[1]).__name__
    (['00000'], 'TreeLimitError')
    """
    return _serve(lm, calls, batch_size, max_batch_tokens, up_front=False)


#: A call of :func:`prepare`: ``submit(engine, batch_size)`` queues it, ``outcome(request)``
#: gives its result or error once the request is done.
PreparedCall = _Call


def prepare(lm: LanguageModel, prompt: str | Sequence[int], constraint: Constraint | None = None,
            method: str = "adaptrack", n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
            max_new_tokens: int = 64, seed: int | None = None,
            fast_forward: bool | FastForward = True, **options: Any) -> PreparedCall:
    """One prompt of :func:`generate`, checked and set up but not run, for a caller that
    steps its own :class:`~adaptrack.sampling.engine.Engine` (a server admitting requests as
    they come, ``adaptrack.serve``). ``options`` are :func:`generate`'s keyword options but
    ``batch_size`` and ``max_batch_tokens`` (the engine's). Bad arguments raise here, and so
    do ``PromptTooLongError`` and an empty language found up front (``NoValidSequenceError``):
    all before any model work.

    >>> import adaptrack as at
    >>> from adaptrack.sampling.engine import Engine
    >>> lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> call = prepare(lm, [], at.constraints.choice(["01", "10"]), method="cd", n=2, seed=0)
    >>> engine = Engine(lm)
    >>> req = call.submit(engine, batch_size=32)
    >>> engine.run(); call.outcome(req).texts
    ['10', '10']
    """
    try:
        return _Call(lm, prompt, constraint, method, n, temperature, top_p, max_new_tokens, seed,
                     fast_forward, **options)
    except TypeError as err:
        if "unexpected keyword" in str(err):
            raise TypeError(f"prepare() got an unknown argument: {err}") from None
        raise


def _serve(lm: LanguageModel, calls: Sequence[dict[str, Any]], batch_size: int,
           max_batch_tokens: int | None, *, up_front: bool) -> list[Any]:
    """``generate_each``; ``up_front``: an error found before model work (a prompt too
    long, an empty language) is raised at once, else it is that call's outcome."""
    engine = _engine(lm, batch_size, max_batch_tokens)
    if not isinstance(calls, Sequence):
        raise TypeError(f"calls must be a sequence of dicts, got {type(calls).__name__}")
    started = time.perf_counter()
    prepared: list[_Call | AdaptrackError] = []
    for call in calls:
        if not isinstance(call, dict) or "prompt" not in call:
            raise TypeError(f"each call must be a dict with a 'prompt', got {call!r:.60}")
        options = {"constraint": None, "method": "adaptrack", "n": 1, "temperature": 1.0,
                   "top_p": 1.0, "max_new_tokens": 64, "seed": None, "fast_forward": True,
                   **call}
        prompt = options.pop("prompt")
        args = [options.pop(k) for k in ("constraint", "method", "n", "temperature", "top_p",
                                         "max_new_tokens", "seed", "fast_forward")]
        try:
            prepared.append(_Call(lm, prompt, *args, **options, started=started))
        except AdaptrackError as err:
            if up_front:
                raise
            err.partial = GenerationResult([], {})  # type: ignore[attr-defined]
            prepared.append(err)
        except TypeError as err:
            if "unexpected keyword" in str(err):
                raise TypeError(f"generate() got an unknown argument: {err}") from None
            raise
    requests = [c if isinstance(c, AdaptrackError) else c.submit(engine, batch_size)
                for c in prepared]
    engine.run()
    return [c if isinstance(c, AdaptrackError) else c.outcome(r)  # type: ignore[arg-type]
            for c, r in zip(prepared, requests, strict=True)]


def exact_distribution(
    lm: LanguageModel,
    prompt: str | Sequence[int],
    constraint: Constraint | None = None,
    max_new_tokens: int = 64,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_nodes: int = 100_000,
    max_seconds: float | None = MAX_SECONDS,
    fast_forward: bool | FastForward = True,
    allow_truncated: bool = False,
    end: str = "leave",
) -> dict[tuple[int, ...], float]:
    """The target P(s | c) ∝ P(s)·c(s) by enumeration: {token tuple: probability}.

    Sequences are complete (they end with EOS or a terminator, within ``max_new_tokens``);
    with ``allow_truncated``, valid prefixes of ``max_new_tokens`` tokens count as well.
    ``fast_forward`` as in :func:`generate`: by default chains are only prefilled, so the
    target is the one without fast-forward (the distribution ``asap``, ``adaptrack`` and
    ``exact`` sample); ``FastForward(force=True)`` conditions it on forced bytes being
    tokenized canonically. ``end`` as in :func:`generate`: with ``"leave"`` a sequence's
    last token is EOS standing for every token that leaves the accepted text.
    Raises ``TreeLimitError`` when enumeration needs more than ``max_nodes`` prefixes,
    ``SearchTimeoutError`` past ``max_seconds``, ``PromptTooLongError`` when the prompt and
    ``max_new_tokens`` exceed the model's context, and ``NoValidSequenceError`` when no
    sequence is valid (before any model work when the constraint's shortest complete
    sequence is longer than ``max_new_tokens``).

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> bits = at.constraints.choice(["00000"] + [f"1{i:04b}" for i in range(16)])
    >>> dist = at.exact_distribution(lm, [], bits, max_new_tokens=6)
    >>> len(dist), round(dist[(0, 0, 0, 0, 0, 2)], 4)
    (17, 0.0588)
    """
    _check(1, temperature, top_p, max_new_tokens, max_nodes)
    if temperature == 0:
        raise ValueError("exact_distribution needs temperature > 0, got 0")
    seconds = _check_seconds(max_seconds)
    _end(end)
    ff = _fast_forward(fast_forward, False)  # the target asap, adaptrack and exact sample
    ids = _fit_prompt(lm, _prompt_ids(lm, prompt), max_new_tokens, False)
    matcher = _bind(constraint, lm)
    if not allow_truncated:
        _require_room(matcher, max_new_tokens)
    tree = PrefixTree(lm, ids, matcher, temperature=temperature, top_p=top_p,
                      max_new_tokens=max_new_tokens, max_nodes=max_nodes,
                      max_seconds=seconds, fast_forward=ff, allow_truncated=allow_truncated,
                      end=end)
    dist = enumerate_tree(tree)
    if not dist:
        raise NoValidSequenceError(
            f"the constraint admits no complete sequence within max_new_tokens={max_new_tokens}"
        )
    return dist
