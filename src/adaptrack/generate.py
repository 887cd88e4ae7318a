"""The public entry points (docs/design.md §5): ``generate``, ``generate_each``,
``prepare`` and ``exact_distribution``. Each builds one
:class:`~adaptrack.options.SamplingOptions` (the options, checked once; docs/design.md §6)
and hands it to :class:`~adaptrack.call.PreparedCall` or the enumeration."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .call import (
    PreparedCall,
    bind_constraint,
    check_lm,
    fit_prompt,
    model_tree,
    prompt_ids,
    require_room,
)
from .constraints.base import Constraint
from .errors import AdaptrackError, NoValidSequenceError
from .lm.base import LanguageModel
from .options import (
    FALLBACKS,
    MAX_N,
    MAX_SECONDS,
    PARALLEL_WALKS,
    SEARCH_BUDGET,
    SEARCHES,
    SamplingOptions,
    check_int,
)
from .results import FreeTextWarning, GenerationResult, Sample, SearchFallbackWarning
from .sampling.engine import Engine
from .sampling.enumerate import enumerate_tree
from .sampling.methods import METHODS

__all__ = [
    "FALLBACKS", "MAX_N", "MAX_SECONDS", "METHODS", "PARALLEL_WALKS", "SEARCHES",
    "SEARCH_BUDGET",
    "FreeTextWarning", "GenerationResult", "PreparedCall", "Sample", "SamplingOptions",
    "SearchFallbackWarning", "exact_distribution", "generate", "generate_each", "prepare",
]


def _many(prompt: Any) -> bool:
    """Whether ``prompt`` is a list of prompts (strings or token-id sequences) rather than
    one prompt's token ids."""
    if isinstance(prompt, str | bytes | bytearray) or not isinstance(prompt, list | tuple):
        return False
    return bool(prompt) and all(
        isinstance(p, str) or (isinstance(p, Sequence) and not isinstance(p, bytes | bytearray))
        for p in prompt)


def _engine(lm: LanguageModel, batch_size: int, max_batch_tokens: int | None) -> Engine:
    check_lm(lm)
    check_int("batch_size", batch_size, 1)
    if max_batch_tokens is not None:
        check_int("max_batch_tokens", max_batch_tokens, 1)
    return Engine(lm, batch_size=batch_size, max_batch_tokens=max_batch_tokens)


def generate(
    lm: LanguageModel,
    prompt: str | Sequence[int] | Sequence[str | Sequence[int]],
    constraint: Constraint | None = None,
    *,
    options: SamplingOptions | None = None,
    batch_size: int = 32,
    max_batch_tokens: int | None = 1024,
    on_sample: Callable[[Sample], None] | None = None,
    **overrides: Any,
) -> Any:
    """Draw ``n`` samples of a continuation of ``prompt`` that satisfies ``constraint``.

    The sampling options are the fields of :class:`~adaptrack.options.SamplingOptions`,
    where their defaults are declared once: either ``options=SamplingOptions(...)``, or
    each as a keyword (``**overrides``: ``method``, ``n``, ``temperature``, ``top_p``,
    ``max_new_tokens``, ``seed``, ``fast_forward``, ``share_q``, ``max_backtrack``,
    ``min_backtrack_prob``, ``parallel``, ``width``, ``end``, ``truncate_prompt``,
    ``allow_truncated``, the budgets ``max_nodes``, ``max_cache_bytes``,
    ``max_opened_bytes``, ``max_seconds``, ``search_budget`` and ``fallback``), checked by
    ``SamplingOptions``: an unknown keyword raises a ``TypeError`` that names it and lists
    the options; with ``options=`` every keyword option must be left out (or at its
    default). ``batch_size`` and ``max_batch_tokens`` are the engine's, not the options.

    ``method`` is one of ``unconstrained``, ``cd``, ``asap``, ``adaptrack``, ``exact`` (see
    docs/methods.md for what each guarantees). The ``n`` samples share one prefix tree, so the
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
    docs/methods.md). A seed gives the same samples whatever
    ``batch_size``, ``max_batch_tokens``, ``max_cache_bytes`` and the other prompts of the
    call, for every method (exactly with an exact model such as ``TableLM``; a float
    backend's batch composition changes rounding by about 1e-6, which can flip a draw that
    close to a boundary); for shared-Q methods the number of walks in flight
    (``parallel``) changes the samples, never the target of ``exact``.

    ``width`` (``exact`` only): the attempts it follows at once, their prefixes evaluated
    in the running attempt's forward pass; None (the default) takes it from the model's
    measured cost of one more row in a pass (``LanguageModel.measured_row_cost``, timed once
    per model: 1 + 1/cost rows within [1, 32]), within a ``parallel`` given as a number
    (``parallel=False``: 1). The samples the search draws are the same at every width; the
    width used is ``stats["width"]`` (docs/design.md §3, width).

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
    call's start (``SearchTimeoutError``); ``search_budget`` (default ``SEARCH_BUDGET`` = 3,
    ``None`` for no limit): ``asap``, ``adaptrack`` and ``exact`` make at most that many
    times ``n`` x ``max_new_tokens`` model calls (at least 64 tokens counted a sample), the
    most CD makes, so that with the fallback below a request costs a bounded multiple of
    CD's worst case (``CallLimitError``). Refused before any model work: a prompt that
    with ``max_new_tokens`` exceeds the model's ``context_length`` (``PromptTooLongError``,
    or with ``truncate_prompt=True`` the prompt keeps its last ``context_length -
    max_new_tokens`` tokens), and, for every constrained method, a constraint whose
    shortest complete sequence provably needs more than ``max_new_tokens`` tokens
    (``NoValidSequenceError``). With no constraint ``asap``, ``adaptrack`` and ``exact`` warn
    (:class:`FreeTextWarning`): they sample text that ends within ``max_new_tokens``;
    ``method="unconstrained"`` is for free text.

    ``fallback`` (docs/design.md §6): when ``asap``, ``adaptrack`` or ``exact`` runs past
    ``max_nodes``, ``max_opened_bytes``, ``search_budget`` or ``max_seconds``, ``"cd"``
    (the default) draws the samples still missing by CD over the same tree, each from its
    own random stream (a sample whose walk was in flight goes on from the prefix that walk
    had reached, the others start at the root); they are marked ``Sample.fallback`` (not
    the method's distribution: CD's, from where the search left them), counted in
    ``stats["fallback_samples"]``, the result's ``fallback`` names the budget, and
    ``generate`` warns (:class:`SearchFallbackWarning`). Where the samples are independent
    (``adaptrack`` without ``share_q``) the call budget is each sample's own instead:
    ``search_budget`` x ``max_new_tokens`` model calls made for its walk, past which that
    sample alone falls back; where n > 1 samples share one Q (``exact``, ``asap``,
    ``share_q``) every sample falls back if the first has not come within (n + 1) / 2 of
    those shares. ``None`` raises the budget's
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
    ['11101', '11000', '10001']
    >>> all(s.valid for s in res.samples)
    True
    >>> try:
    ...     at.generate(lm, [], bits, method="exact", n=3, seed=0, max_nodes=24, fallback=None)
    ... except at.TreeLimitError as err:
    ...     [s.text for s in err.partial.samples]    # what finished before the limit
    ['11101', '11000']
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as said:   # the default: CD draws the third
    ...     res = at.generate(lm, [], bits, method="exact", n=3, seed=0, max_nodes=24)
    >>> [(s.text, s.fallback) for s in res.samples], said[0].category.__name__
    ([('11101', False), ('11000', False), ('10110', True)], 'SearchFallbackWarning')
    >>> [r.texts for r in at.generate(lm, [[], [0]], bits, method="cd", n=2, seed=0)]
    [['10100', '10101'], ['10100', '10101']]
    """
    opts = SamplingOptions.merged(options, overrides, "generate")
    many = _many(prompt)
    prompts = list(prompt) if many else [prompt]
    outcomes = _serve(lm, [(p, constraint, opts, on_sample) for p in prompts], batch_size,
                      max_batch_tokens, up_front=True)
    for out in outcomes:
        if isinstance(out, GenerationResult) and out.fallback is not None:
            warnings.warn(SearchFallbackWarning(
                f"method={opts.method!r}: {out.stats['fallback_samples']:g} of {opts.n} "
                f"samples drawn by CD (not {opts.method}'s distribution) after "
                f"{out.fallback}"), stacklevel=2)
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
    if not isinstance(calls, Sequence):
        raise TypeError(f"calls must be a sequence of dicts, got {type(calls).__name__}")
    return _serve(lm, [_call(call) for call in calls], batch_size, max_batch_tokens,
                  up_front=False)


def generate_each_as_done(
    lm: LanguageModel,
    calls: Sequence[dict[str, Any]],
    *,
    batch_size: int = 32,
    max_batch_tokens: int | None = 1024,
) -> Iterator[tuple[int, Any]]:
    """:func:`generate_each`, yielding ``(index, outcome)`` as each call finishes, in the
    order they finish (the evaluation harness writes a job's record as soon as its calls
    are done). Bad arguments raise here, before any model work.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> calls = [dict(prompt=[], constraint=at.constraints.choice([text]), temperature=0,
    ...               fast_forward=False) for text in ("0000", "1")]
    >>> [(i, r.texts) for i, r in generate_each_as_done(lm, calls)]
    [(1, ['1']), (0, ['0000'])]
    """
    if not isinstance(calls, Sequence):
        raise TypeError(f"calls must be a sequence of dicts, got {type(calls).__name__}")
    return _serve_as_done(lm, [_call(call) for call in calls], batch_size, max_batch_tokens,
                          up_front=False)


#: One prompt for :func:`_serve`: prompt, constraint, options and ``on_sample``.
_Spec = tuple[Any, "Constraint | None", SamplingOptions, "Callable[[Sample], None] | None"]


def _call(call: Any) -> _Spec:
    """One call of :func:`generate_each` (a dict of :func:`generate`'s arguments)."""
    if not isinstance(call, dict) or "prompt" not in call:
        raise TypeError(f"each call must be a dict with a 'prompt', got {call!r:.60}")
    given = dict(call)
    prompt, constraint = given.pop("prompt"), given.pop("constraint", None)
    on_sample, options = given.pop("on_sample", None), given.pop("options", None)
    return prompt, constraint, SamplingOptions.merged(options, given, "generate"), on_sample


def prepare(lm: LanguageModel, prompt: str | Sequence[int], constraint: Constraint | None = None,
            *, options: SamplingOptions | None = None,
            on_sample: Callable[[Sample], None] | None = None,
            **overrides: Any) -> PreparedCall:
    """One prompt of :func:`generate`, checked and set up but not run, for a caller that
    steps its own :class:`~adaptrack.sampling.engine.Engine` (a server admitting requests as
    they come, ``adaptrack.serve``). ``options=SamplingOptions(...)`` or the keyword
    ``overrides`` (its fields), and ``on_sample``, as in :func:`generate`; ``batch_size`` and
    ``max_batch_tokens`` are the engine's. Bad arguments raise here, and so do
    ``PromptTooLongError`` and an empty language found up front (``NoValidSequenceError``):
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
    opts = SamplingOptions.merged(options, overrides, "prepare")
    return PreparedCall(lm, prompt, constraint, opts, on_sample=on_sample)


def _serve(lm: LanguageModel, calls: Sequence[_Spec], batch_size: int,
           max_batch_tokens: int | None, *, up_front: bool) -> list[Any]:
    """``generate_each``; ``up_front``: an error found before model work (a prompt too
    long, an empty language) is raised at once, else it is that call's outcome."""
    outcomes: list[Any] = [None] * len(calls)
    for i, outcome in _serve_as_done(lm, calls, batch_size, max_batch_tokens,
                                     up_front=up_front):
        outcomes[i] = outcome
    return outcomes


def _serve_as_done(lm: LanguageModel, calls: Sequence[_Spec], batch_size: int,
                   max_batch_tokens: int | None, *, up_front: bool
                   ) -> Iterator[tuple[int, Any]]:
    """:func:`_serve`, yielding ``(index, outcome)`` as each call's request is done."""
    engine = _engine(lm, batch_size, max_batch_tokens)
    started = time.perf_counter()
    prepared: list[PreparedCall | AdaptrackError] = []
    for prompt, constraint, options, on_sample in calls:
        try:
            prepared.append(PreparedCall(lm, prompt, constraint, options, on_sample=on_sample,
                                         started=started))
        except AdaptrackError as err:
            if up_front:
                raise
            err.partial = GenerationResult([], {})  # type: ignore[attr-defined]
            prepared.append(err)
    requests = [c if isinstance(c, AdaptrackError) else c.submit(engine, batch_size)
                for c in prepared]
    waiting = []
    for i, c in enumerate(prepared):
        if isinstance(c, AdaptrackError):
            yield i, c
        else:
            waiting.append(i)
    while waiting:
        more = engine.step()
        done = [i for i in waiting if not more or requests[i].done]  # type: ignore[union-attr]
        waiting = [i for i in waiting if i not in done]
        for i in done:
            yield i, prepared[i].outcome(requests[i])  # type: ignore[union-attr, arg-type]


def exact_distribution(
    lm: LanguageModel,
    prompt: str | Sequence[int],
    constraint: Constraint | None = None,
    *,
    options: SamplingOptions | None = None,
    **overrides: Any,
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
    The options are :class:`~adaptrack.options.SamplingOptions`'s, as ``options=`` or
    keyword ``overrides`` (checked by it, as in :func:`generate`); those read here are
    ``max_new_tokens``, ``temperature``, ``top_p``, ``max_nodes``, ``max_seconds``,
    ``max_cache_bytes`` (the result does not depend on it), ``fast_forward``,
    ``allow_truncated`` and ``end`` (the others do not apply).

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> bits = at.constraints.choice(["00000"] + [f"1{i:04b}" for i in range(16)])
    >>> dist = at.exact_distribution(lm, [], bits, max_new_tokens=6)
    >>> len(dist), round(dist[(0, 0, 0, 0, 0, 2)], 4)
    (17, 0.0588)
    """
    o = SamplingOptions.merged(options, overrides, "exact_distribution")
    if o.greedy:
        raise ValueError("exact_distribution needs temperature > 0, got 0")
    ids = fit_prompt(lm, prompt_ids(lm, prompt, o.max_new_tokens), o.max_new_tokens, False)
    matcher = bind_constraint(constraint, lm)
    if not o.allow_truncated:
        require_room(matcher, o.max_new_tokens)
    # Chains only prefilled: the target the searches sample.
    tree = model_tree(lm, ids, matcher, o.tree_options(forces=False))
    dist = enumerate_tree(lm, tree)
    if not dist:
        raise NoValidSequenceError(
            f"the constraint admits no complete sequence within "
            f"max_new_tokens={o.max_new_tokens}"
        )
    return dist
