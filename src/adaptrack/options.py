"""The sampling options of one ``generate`` call, declared once (docs/design.md §4, §6).

:class:`SamplingOptions` is a frozen object that checks its values when it is made, with the
errors :func:`adaptrack.generate` raises for bad arguments (``TypeError`` for a wrong type,
``ValueError`` for a value out of range, each naming the option). ``generate``,
``generate_each``, ``prepare`` and ``exact_distribution`` build one from their keyword
arguments (or take one as ``options=``), the server from its request model, and the
command line from flags generated from the fields (each field's :class:`Flag`, in
``dataclasses.fields(SamplingOptions)[i].metadata["flag"]``).

>>> opts = SamplingOptions(method="exact", n=4, temperature=0.5)
>>> opts.n, opts.max_new_tokens, opts.chains(forces=False)
(4, 64, FastForward(max_tokens=4, conservative=False, tokenizer=None, force=False))
>>> SamplingOptions(top_p=0)
Traceback (most recent call last):
ValueError: top_p must be in (0, 1], got 0
>>> SamplingOptions(method="cd", share_q=True)
Traceback (most recent call last):
ValueError: share_q, max_backtrack and min_backtrack_prob apply to method='adaptrack' only
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .flags import Flag, flag
from .lm.cost import MAX_WIDTH
from .sampling.fastforward import FastForward
from .sampling.methods import METHODS, foreign_options, owners
from .sampling.policy import EARLY_RATIO, SEARCH_TOKENS, BudgetPolicy
from .sampling.treeoptions import END_POLICIES, TreeOptions

#: The built-in methods that sample the target conditioned on ending within
#: ``max_new_tokens``: without a constraint they search for free text that stops that early
#: (docs/design.md §2, §6). Each method declares it (``searches``); the code reads that.
SEARCHES = tuple(name for name, m in METHODS.items() if m.searches)

#: What draws a search's missing samples once it runs past a budget (docs/design.md §6):
#: ``"cd"``, or None to raise the budget's :class:`~adaptrack.SearchLimitError`.
FALLBACKS = ("cd", None)

#: Walks a fallback sample may take from the root: CD walks into a dead end near the length
#: limit where a search ran out of budget (a long string that cannot close in time), backs
#: up past it for a while (sampling/cd.py), and each new walk masks the dead ends met
#: before, so the answer is a text that finishes.
FALLBACK_TRIES = 4

#: Walks in flight over one shared Q with ``parallel=True`` (the default of ``exact``): a
#: fixed number, not ``batch_size``, so that the batch size changes no sample.
PARALLEL_WALKS = 32

#: The widest ``width`` one may ask for: past it a pass's rows outnumber what any search
#: of ``max_new_tokens`` tokens can use, and each row followed ahead keeps a course.
MAX_WIDTH_OPTION = 1024

#: The default time budget of one ``generate`` call, in seconds: far past the runs in
#: docs/benchmarks/ (a TFv1 prompt with n = 20 takes seconds on a CPU), short enough that a
#: search that cannot succeed stops within minutes with ``SearchTimeoutError``.
MAX_SECONDS = 600.0

#: The default model-call budget of a search (asap, adaptrack, exact), as a multiple of the
#: calls CD makes at most, n x max_new_tokens (counting at least SEARCH_TOKENS tokens a
#: sample): past it the CD fallback draws the samples still missing, so a request costs a
#: bounded multiple of CD's worst case (docs/design.md §6; measured in
#: docs/benchmarks/budgets.md).
SEARCH_BUDGET = 3.0
#: More samples than this in one call is refused: each one is kept in memory until the end.
MAX_N = 10_000_000

#: The options a prefix tree shares with a call take the tree's defaults, declared there.
_TREE = TreeOptions()


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``, else the error naming ``name``.

    >>> check_int("n", 0, 1)
    Traceback (most recent call last):
    ValueError: n must be at least 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        bound = ">= 0" if minimum == 0 else f"at least {minimum}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return int(value)


def check_real(name: str, value: Any) -> float:
    """``value`` as a float (any real number but a bool), else a ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def checkflag(name: str, value: Any) -> bool:
    """``value`` when it is True or False, else a ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_limit(name: str, value: Any) -> float | None:
    """A budget (``max_seconds``, ``search_budget``): a number > 0, None or ``inf`` for no
    limit (both give None).

    >>> check_limit("max_seconds", float("inf")) is None, check_limit("search_budget", 2)
    (True, 2.0)
    """
    if value is None:
        return None
    limit = check_real(name, value)
    if not limit > 0:  # also refuses nan; inf means no limit
        raise ValueError(f"{name} must be > 0 or None (no limit), got {value}")
    return None if math.isinf(limit) else limit


def option_flags() -> list[tuple[str, Flag, Any]]:
    """Each field of :class:`SamplingOptions`: its name, its :class:`Flag` and its default.

    >>> name, flag, default = option_flags()[1]
    >>> name, flag.name, flag.describe(default)
    ('n', '-n', 'number of samples (default: 1)')
    """
    return [(f.name, f.metadata["flag"], f.default) for f in fields(SamplingOptions)]


@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    """What one prompt of :func:`adaptrack.generate` is sampled with, checked once when it is
    made: the method, ``n``, the model's distribution (``temperature``, ``top_p``), the
    length (``max_new_tokens``, ``truncate_prompt``, ``allow_truncated``, ``end``),
    fast-forward, AdapTrack's options, the walks in flight (``parallel``) and the budgets
    with their ``fallback`` (docs/design.md §6). :func:`adaptrack.generate` documents each
    option. Numbers are stored as ``int`` and ``float``, ``max_seconds=inf`` and
    ``search_budget=inf`` as None.

    >>> SamplingOptions(n=2.0)
    Traceback (most recent call last):
    TypeError: n must be an int, got 2.0 (float)
    >>> SamplingOptions(max_seconds=float("inf")).max_seconds is None
    True
    """

    method: str = field(default="adaptrack", metadata=flag(
        "--method", "choice", "sampling method (default: {default})",
        choices=METHODS.keys()))
    n: int = field(default=1, metadata=flag(
        "-n", "count", "number of samples (default: {default})"))
    temperature: float = field(default=_TREE.temperature, metadata=flag(
        "--temperature", "non_negative",
        "sampling temperature; 0 is greedy (default: {default})",
        metavar="T"))
    top_p: float = field(default=_TREE.top_p, metadata=flag(
        "--top-p", "probability", "nucleus sampling mass in (0, 1] (default: {default})",
        metavar="P"))
    seed: int | None = field(default=None, metadata=flag(
        "--seed", "natural",
        "random seed, >= 0 (the same seed, the same samples; default: {default})",
        metavar="INT"))
    max_new_tokens: int = field(default=_TREE.max_new_tokens, metadata=flag(
        "--max-new-tokens", "count", "most tokens per sample (default: {default})",
        metavar="N"))
    truncate_prompt: bool = field(default=False, metadata=flag(
        "--truncate-prompt", "switch",
        "when the prompt and --max-new-tokens exceed the model's context, keep the prompt's "
        "last tokens (default: stop with an error)"))
    allow_truncated: bool = field(default=_TREE.allow_truncated, metadata=flag(
        "--allow-truncated", "switch",
        "a valid prefix that reaches --max-new-tokens ends its sample, marked incomplete "
        "(default: the searches sample text that ends within --max-new-tokens)"))
    end: str = field(default=_TREE.end, metadata=flag(
        "--end", "choice",
        "where a text the constraint accepts ends: 'leave', where the model's next token "
        "cannot continue it (EOS or any token the constraint rejects); 'eos', only at EOS, "
        "the AdapTrack paper's target (default: {default})", choices=END_POLICIES))
    fast_forward: bool | FastForward = field(default=True, metadata=flag(
        "--no-fast-forward", "negated",
        "feed bytes the constraint forces token by token instead of as their canonical "
        "tokens in one model call"))
    share_q: bool = field(default=False, metadata=flag(
        "--share-q", "switch",
        "share AdapTrack's learned valid-mass estimates across samples (--method adaptrack "
        "only)"))
    max_backtrack: int | None = field(default=None, metadata=flag(
        "--max-backtrack", "natural",
        "AdapTrack backtracks at most this many tokens (--method adaptrack only; not exact; "
        "default: no limit)", metavar="N"))
    min_backtrack_prob: float = field(default=0.0, metadata=flag(
        "--min-backtrack-prob", "fraction",
        "AdapTrack backtracks only where the valid mass dropped by at least this fraction "
        "(--method adaptrack only; not exact; default: {default:g})", metavar="P"))
    parallel: bool | int | None = field(default=None, metadata=flag(
        "--parallel", "walks",
        f"walks in flight over one shared Q (exact; asap, adaptrack --share-q): 'on' "
        f"({PARALLEL_WALKS}), 'off' (one at a time), a number, or 'auto', the method's "
        "default: on for exact, off otherwise (default: {default})", metavar="WALKS"))
    width: int | None = field(default=None, metadata=flag(
        "--width", "count",
        "exact: attempts followed at once, their model calls in one forward pass; the "
        "samples it draws are the same at every width (default: from the model's measured "
        f"cost of one more row in a pass, 1 to {MAX_WIDTH}; at most {MAX_WIDTH_OPTION})",
        metavar="ROWS"))
    max_nodes: int = field(default=_TREE.max_nodes, metadata=flag(
        "--max-nodes", "count",
        "budget: most prefixes in the search tree (default: {default})", metavar="N"))
    max_cache_bytes: int = field(default=_TREE.max_cache_bytes, metadata=flag(
        "--max-cache-bytes", "natural",
        "bytes of expansions kept as a cache: dropped ones are recomputed, samples unchanged "
        "(default: {default})", metavar="BYTES"))
    max_opened_bytes: int = field(default=_TREE.max_opened_bytes, metadata=flag(
        "--max-opened-bytes", "natural",
        "budget: bytes of expansions the search holds (default: {default})",
        metavar="BYTES"))
    max_seconds: float | None = field(default=MAX_SECONDS, metadata=flag(
        "--max-seconds", "limit",
        "time budget of the search in seconds, 'inf' for none (default: {default:g})",
        metavar="S",
        note="past it the command stops with an error after printing the finished samples"))
    search_budget: float | None = field(default=SEARCH_BUDGET, metadata=flag(
        "--search-budget", "limit",
        "budget: model calls a search (asap, adaptrack, exact) may make, as a multiple of "
        f"n x --max-new-tokens (at least {SEARCH_TOKENS}), the most CD makes (adaptrack "
        "without --share-q: each sample's share; a shared Q: the first sample due within "
        "(n + 1) / 2 shares); 'inf' for none (default: {default:g})", metavar="K"))
    early_handover: float | None = field(default=EARLY_RATIO, metadata=flag(
        "--early-handover", "limit",
        "a search that has used this many times CD's estimated model calls a sample (from "
        "the constraint's bound, less the tokens fast-forward fed, and the samples that "
        "finished) hands the samples it has "
        "not drawn to the fallback, unless the samples it drew say the rest come within one "
        "more; 'inf' for only --search-budget (default: {default:g})", metavar="R"))
    fallback: str | None = field(default="cd", metadata=flag(
        "--fallback", "choice",
        "when a search (asap, adaptrack, exact) runs past a budget: 'cd' draws the missing "
        "samples by CD, marked 'fallback' (not the method's distribution); 'none' stops with "
        "an error after printing the finished samples (default: {default})",
        choices=("cd", "none")))

    def __post_init__(self) -> None:
        method = self.method
        if not isinstance(method, str) or method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        self._check_own_options()
        self._set("n", self._n(self.n))
        self._set("temperature", self._temperature(self.temperature))
        top_p = check_real("top_p", self.top_p)
        if not 0 < top_p <= 1:  # also refuses nan
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self._set("top_p", top_p)
        for name, least in (("max_new_tokens", 1), ("max_nodes", 1)):
            self._set(name, check_int(name, getattr(self, name), least))
        if self.seed is not None:
            self._set("seed", check_int("seed", self.seed, 0))
        for name in ("share_q", "truncate_prompt", "allow_truncated"):
            checkflag(name, getattr(self, name))
        if self.parallel is not None and not isinstance(self.parallel, bool):
            self._set("parallel", check_int("parallel", self.parallel, 1))
        if self.width is not None:
            self._set("width", check_int("width", self.width, 1))
            if self.width > MAX_WIDTH_OPTION:
                raise ValueError(f"width must be at most {MAX_WIDTH_OPTION}, got {self.width}")
        for name, least in (("max_cache_bytes", 0), ("max_opened_bytes", 0)):
            self._set(name, check_int(name, getattr(self, name), least))
        if self.max_backtrack is not None:
            self._set("max_backtrack", check_int("max_backtrack", self.max_backtrack, 0))
        share = check_real("min_backtrack_prob", self.min_backtrack_prob)
        if not 0 <= share <= 1:
            raise ValueError(f"min_backtrack_prob must be in [0, 1], got "
                             f"{self.min_backtrack_prob}")
        self._set("min_backtrack_prob", share)
        for name in ("max_seconds", "search_budget", "early_handover"):
            self._set(name, check_limit(name, getattr(self, name)))
        self._check_choices()

    def _check_own_options(self) -> None:
        """An option that only other methods read (``Method.options``) left at its default."""
        given = [f.name for f in fields(self)
                 if owners(f.name) and getattr(self, f.name) != f.default]
        foreign = foreign_options(self.method, given)
        if foreign:
            them = owners(foreign[0])
            if len(them) == 1:  # name all of that method's options, as its docs do
                names = METHODS[them[0]].options
                listed = (f"{', '.join(names[:-1])} and {names[-1]} apply" if len(names) > 1
                          else f"{names[0]} applies")
                raise ValueError(f"{listed} to method={them[0]!r} only")
            raise ValueError(f"{foreign[0]} applies to method "
                             f"{' or '.join(map(repr, them))} only")

    def _check_choices(self) -> None:
        if not isinstance(self.end, str) or self.end not in END_POLICIES:
            raise ValueError(f"end must be one of {', '.join(map(repr, END_POLICIES))} (where "
                             f"an accepted text ends: docs/design.md §2), got {self.end!r}")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be 'cd' or None (raise SearchLimitError), got "
                             f"{self.fallback!r}")
        if not isinstance(self.fast_forward, bool | FastForward):
            raise TypeError(f"fast_forward must be True, False or FastForward(...), got "
                            f"{self.fast_forward!r}")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # normalising a frozen object while it is made

    @staticmethod
    def _n(n: Any) -> int:
        if check_int("n", n, 1) > MAX_N:
            raise ValueError(f"n must be at most {MAX_N:_}, got {n}; split the work into "
                             "several calls")
        return int(n)

    @staticmethod
    def _temperature(temperature: Any) -> float:
        t = check_real("temperature", temperature)
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"temperature must be >= 0 and finite (0 means greedy), "
                             f"got {temperature}")
        return t

    @property
    def greedy(self) -> bool:
        """Temperature 0: each step takes the likeliest valid token."""
        return self.temperature == 0

    @property
    def max_calls(self) -> int | None:
        """The model calls a search may make: ``search_budget`` x n x ``max_new_tokens``,
        the tokens counted as at least :data:`SEARCH_TOKENS`; None for the other methods,
        which never search, or without a budget.

        >>> SamplingOptions(n=2, max_new_tokens=100, search_budget=3).max_calls
        600
        >>> SamplingOptions(max_new_tokens=10).max_calls   # 3 x 64: a short request
        192
        >>> SamplingOptions(method="cd").max_calls is None
        True
        """
        return self.budget_policy().max_calls

    @property
    def sample_calls(self) -> float | None:
        """One sample's share of :attr:`max_calls`: ``search_budget`` x ``max_new_tokens``
        (at least :data:`SEARCH_TOKENS`). With the fallback, the walk of a method whose
        samples are independent (``adaptrack`` without ``share_q``) falls back alone once
        that many model calls were made for it; the others search on. Where n > 1 samples
        share one Q, every sample falls back if the first has not come within (n + 1) / 2
        shares (docs/design.md §6).

        >>> SamplingOptions(n=5, max_new_tokens=100, search_budget=3).sample_calls
        300.0
        """
        return self.budget_policy().sample_calls

    def budget_policy(self) -> BudgetPolicy:
        """A new :class:`~adaptrack.sampling.policy.BudgetPolicy` for one request with
        these options: a search's call budget and its fallback (docs/design.md §6); no
        call budget and no fallback for a method that does not search."""
        searches = METHODS[self.method].searches
        return BudgetPolicy.for_search(
            self.search_budget if searches else None, self.max_new_tokens, self.n,
            fallback_tries=FALLBACK_TRIES if self.search_fallback == "cd" else None,
            early=self.early_handover)

    @property
    def search_fallback(self) -> str | None:
        """The fallback that applies: ``fallback`` for a search, None for the others (which
        never run past a budget by searching)."""
        return self.fallback if METHODS[self.method].searches else None

    def chains(self, forces: bool | None = None) -> FastForward | None:
        """The fast-forward options of a tree (None: no chains); ``force=None`` becomes
        ``forces``, by default the method's own choice (docs/design.md §2)."""
        if self.fast_forward is False:
            return None
        ff = FastForward() if self.fast_forward is True else self.fast_forward
        if ff.force is not None:
            return ff
        return replace(ff, force=METHODS[self.method].forces_chains if forces is None
                       else forces)

    def tree_options(self, *, constrained: bool = True,
                     forces: bool | None = None) -> TreeOptions:
        """The options of a prefix tree for a call with these: ``constrained=False``
        (unconstrained sampling) walks without the constraint's length rule, chains and end
        policy; ``forces`` as in :meth:`chains`. The call budget is the policy's
        (:meth:`budget_policy`), set on the tree when it is bound.

        >>> SamplingOptions(max_new_tokens=8).tree_options(constrained=False).end
        'eos'
        """
        return TreeOptions(
            temperature=self.temperature, top_p=self.top_p,
            max_new_tokens=self.max_new_tokens, max_nodes=self.max_nodes,
            max_cache_bytes=self.max_cache_bytes, max_opened_bytes=self.max_opened_bytes,
            max_seconds=self.max_seconds, restrict_length=constrained,
            allow_truncated=self.allow_truncated,
            fast_forward=self.chains(forces) if constrained else None,
            end=self.end if constrained else "eos")

    @classmethod
    def merged(cls, options: SamplingOptions | None, given: dict[str, Any],
               caller: str) -> SamplingOptions:
        """``options`` when given (then every option in ``given`` must be at its default),
        else the options ``given``; ``caller`` names the function in the errors.

        >>> SamplingOptions.merged(SamplingOptions(n=3), {"n": 1}, "generate").n
        3
        >>> SamplingOptions.merged(SamplingOptions(n=3), {"n": 2}, "generate")
        Traceback (most recent call last):
        TypeError: generate() got options= and the keyword option n=2: pass one or the other
        >>> SamplingOptions.merged(None, {"top_k": 3}, "prepare")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: prepare() got an unknown argument 'top_k'; the sampling options are ...
        """
        defaults = {f.name: f.default for f in fields(cls)}
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise TypeError(f"{caller}() got an unknown argument {unknown[0]!r}; the sampling "
                            f"options are {', '.join(defaults)}")
        if options is None:
            return cls(**given)
        if not isinstance(options, SamplingOptions):
            raise TypeError(f"options must be a SamplingOptions or None, got {options!r:.60}")
        changed = [k for k, v in given.items()
                   if v is not defaults[k] and (type(v) is not type(defaults[k])
                                                or v != defaults[k])]
        if changed:
            raise TypeError(f"{caller}() got options= and the keyword option {changed[0]}="
                            f"{given[changed[0]]!r}: pass one or the other")
        return options
