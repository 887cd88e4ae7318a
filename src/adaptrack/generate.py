"""``generate`` and ``exact_distribution``: the public entry points (design.md §5)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .constraints.base import Anything, Constraint, Matcher
from .errors import NoValidSequenceError
from .lm.base import LanguageModel
from .sampling.adaptrack import AdapTrack
from .sampling.asap import ASAp
from .sampling.base import Method, run_walks
from .sampling.cd import ConstrainedDecoding
from .sampling.enumerate import enumerate_tree
from .sampling.exact import Exact
from .sampling.tree import FastForward, Node, PrefixTree
from .sampling.unconstrained import Unconstrained

METHODS: dict[str, type[Method]] = {
    "unconstrained": Unconstrained,
    "cd": ConstrainedDecoding,
    "asap": ASAp,
    "adaptrack": AdapTrack,
    "exact": Exact,
}


@dataclass(frozen=True)
class Sample:
    """One generated sequence.

    ``tokens`` are the generated ids after the prompt (EOS included when it ended one);
    ``text`` their bytes decoded as UTF-8, cut after the terminator when one ended it;
    ``complete``: the sequence ended (EOS or terminator) rather than running out of tokens
    or into a dead end; ``valid``: it is complete and the constraint accepts it (always true
    for complete samples of the constrained methods); ``logprob``: log P(tokens | prompt)
    under the model at the sampling temperature (T = 1 when ``temperature=0``);
    ``lm_requests``: prefixes whose next-token distribution this sample used, cache hits
    included (the paper's "calls to LM per sample", Table 5).
    """

    tokens: tuple[int, ...]
    text: str
    complete: bool
    valid: bool
    logprob: float
    lm_requests: int


@dataclass
class GenerationResult:
    """Samples plus stats: ``lm_calls`` (model calls: distinct prefixes evaluated, a
    fast-forwarded chain counting once), ``tree_nodes``, ``evictions``, ``backtracks``,
    ``restarts``, ``incomplete``, ``ff_sequences`` and ``forced_tokens`` (fast-forward),
    ``seconds``, and the constraint's own counters (a predicate adds ``checks``,
    ``check_timeouts`` and ``check_seconds``)."""

    samples: list[Sample]
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def texts(self) -> list[str]:
        return [s.text for s in self.samples]


def _prompt_ids(lm: LanguageModel, prompt: str | Sequence[int]) -> list[int]:
    if isinstance(prompt, str):
        return lm.encode(prompt)
    ids = [int(t) for t in prompt]
    bad = [t for t in ids if not 0 <= t < lm.vocab.size]
    if bad:
        raise ValueError(
            f"prompt token ids {bad[:5]} are outside the vocabulary (0..{lm.vocab.size - 1})"
        )
    return ids


def _check(n: int, temperature: float, top_p: float, max_new_tokens: int, max_nodes: int) -> None:
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be at least 1, got {max_nodes}")


def _fast_forward(option: bool | FastForward) -> FastForward | None:
    if isinstance(option, FastForward):
        return option
    if not isinstance(option, bool):
        raise TypeError(f"fast_forward must be True, False or FastForward(...), got {option!r}")
    return FastForward() if option else None


def _text(matcher: Matcher, lm: LanguageModel, node: Node) -> str:
    data = lm.vocab.decode(node.tokens)
    if node.complete and matcher.terminators and node.tokens:
        last = lm.vocab.bytes_of(node.tokens[-1])
        cut = [i for i, b in enumerate(last) if b in matcher.terminators]
        if cut:  # keep the terminator, drop what the same token carried after it
            data = data[: len(data) - len(last) + cut[0] + 1]
    return data.decode("utf-8", errors="replace")


def generate(
    lm: LanguageModel,
    prompt: str | Sequence[int],
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
    batch_size: int = 32,
    on_sample: Callable[[Sample], None] | None = None,
) -> GenerationResult:
    """Draw ``n`` samples of a continuation of ``prompt`` that satisfies ``constraint``.

    ``method`` is one of ``unconstrained``, ``cd``, ``asap``, ``adaptrack``, ``exact`` (see
    the README for what each guarantees). The ``n`` samples share one prefix tree, so the
    model evaluates each prefix once. ``share_q``, ``max_backtrack`` and
    ``min_backtrack_prob`` are AdapTrack's options. ``max_nodes`` bounds the tree; past it
    ``TreeLimitError`` is raised. ``max_cache_bytes`` bounds the cached next-token facts
    (evicted ones are recomputed; results do not change). Methods whose samples are
    independent (``unconstrained``, ``cd``, ``adaptrack`` without ``share_q``) run
    ``batch_size`` samples in lockstep, so the model sees batches. ``on_sample`` is called
    with each sample as it finishes (a progress hook). The same ``seed`` gives the same
    samples, whatever ``batch_size`` and ``max_cache_bytes``: exactly with an exact model
    (``TableLM``); with a float backend, batch composition changes rounding (~1e-6), which
    can flip a draw that lands that close to a boundary between two tokens.
    ``fast_forward`` (``True``, ``False`` or :class:`FastForward` options): bytes the
    constraint forces are fed as their canonical tokens in one model call (seed 002), and
    each forced token's probability still enters Q. The target is then conditioned on
    forced bytes being tokenized canonically (design.md §2); ``False`` feeds them token by
    token, unconditioned. Forced tokens skip the top-p cutoff.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> bits = at.constraints.choice(["00000"] + [f"1{i:04b}" for i in range(16)])
    >>> res = at.generate(lm, [], bits, method="exact", n=3, seed=0)
    >>> [s.text for s in res.samples]
    ['10011', '11010', '11000']
    >>> all(s.valid for s in res.samples)
    True
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method != "adaptrack" and (share_q or max_backtrack is not None or min_backtrack_prob):
        raise ValueError(
            "share_q, max_backtrack and min_backtrack_prob apply to method='adaptrack' only"
        )
    _check(n, temperature, top_p, max_new_tokens, max_nodes)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if max_cache_bytes < 0:
        raise ValueError(f"max_cache_bytes must be >= 0, got {max_cache_bytes}")
    if max_backtrack is not None and max_backtrack < 0:
        raise ValueError(f"max_backtrack must be >= 0, got {max_backtrack}")
    if not 0 <= min_backtrack_prob <= 1:
        raise ValueError(f"min_backtrack_prob must be in [0, 1], got {min_backtrack_prob}")
    started = time.perf_counter()
    ids = _prompt_ids(lm, prompt)
    matcher = (constraint or Anything()).bind(lm.vocab)
    unconstrained = method == "unconstrained"
    walker = Anything(matcher.terminators).bind(lm.vocab) if unconstrained else matcher
    tree = PrefixTree(lm, ids, walker, temperature=temperature, top_p=top_p,
                      max_new_tokens=max_new_tokens, max_nodes=max_nodes,
                      max_cache_bytes=max_cache_bytes, restrict_length=not unconstrained,
                      fast_forward=None if unconstrained else _fast_forward(fast_forward))
    options = (
        {"share_q": share_q, "max_backtrack": max_backtrack,
         "min_backtrack_prob": min_backtrack_prob}
        if method == "adaptrack" else {}
    )
    sampler = METHODS[method](tree, temperature == 0, **options)
    samples: list[Sample | None] = [None] * n

    def done(i: int, node: Node, requests: int) -> None:
        valid = node.complete and (not unconstrained or matcher.accepts(node.tokens))
        samples[i] = Sample(node.tokens, _text(matcher, lm, node), node.complete, valid,
                            node.logprob, requests)
        if on_sample is not None:
            on_sample(samples[i])

    run_walks(sampler, n, batch_size, seed, done)
    stats = {
        "lm_calls": tree.lm_calls,
        "tree_nodes": tree.num_nodes,
        "evictions": tree.evictions,
        "backtracks": sampler.backtracks,
        "restarts": sampler.restarts,
        "incomplete": sum(not s.complete for s in samples),
        "ff_sequences": tree.ff_sequences,
        "forced_tokens": tree.forced_tokens,
        "seconds": time.perf_counter() - started,
        **matcher.stats(),
    }
    return GenerationResult(samples, stats)  # type: ignore[arg-type]


def exact_distribution(
    lm: LanguageModel,
    prompt: str | Sequence[int],
    constraint: Constraint | None = None,
    max_new_tokens: int = 64,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_nodes: int = 100_000,
    fast_forward: bool | FastForward = True,
) -> dict[tuple[int, ...], float]:
    """The target P(s | c) ∝ P(s)·c(s) by enumeration: {token tuple: probability}.

    Sequences are complete (they end with EOS or a terminator, within ``max_new_tokens``).
    ``fast_forward`` as in :func:`generate`: by default the target is conditioned on
    forced bytes being tokenized canonically, the distribution ``generate`` samples.
    Raises ``TreeLimitError`` when enumeration needs more than ``max_nodes`` prefixes and
    ``NoValidSequenceError`` when no sequence is valid.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> bits = at.constraints.choice(["00000"] + [f"1{i:04b}" for i in range(16)])
    >>> dist = at.exact_distribution(lm, [], bits, max_new_tokens=6)
    >>> len(dist), round(dist[(0, 0, 0, 0, 0, 2)], 4)
    (17, 0.0588)
    """
    _check(1, temperature, top_p, max_new_tokens, max_nodes)
    if temperature == 0:
        raise ValueError("exact_distribution needs temperature > 0")
    matcher = (constraint or Anything()).bind(lm.vocab)
    tree = PrefixTree(lm, _prompt_ids(lm, prompt), matcher, temperature=temperature,
                      top_p=top_p, max_new_tokens=max_new_tokens, max_nodes=max_nodes,
                      fast_forward=_fast_forward(fast_forward))
    dist = enumerate_tree(tree)
    if not dist:
        raise NoValidSequenceError(
            f"the constraint admits no complete sequence within max_new_tokens={max_new_tokens}"
        )
    return dist
