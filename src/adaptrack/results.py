"""What a :func:`adaptrack.generate` call returns: its samples, its result with the stats,
and the warnings it gives (docs/design.md §5, §6).

>>> s = Sample((0, 2), "a", complete=True, valid=True, logprob=-0.5, lm_requests=2)
>>> GenerationResult([s], {"lm_calls": 2}).texts
['a']
"""

from __future__ import annotations

from dataclasses import dataclass, field


class FreeTextWarning(UserWarning):
    """A search method (``asap``, ``adaptrack``, ``exact``) was asked for text with no
    constraint: it samples text that ends (EOS) within ``max_new_tokens``, which is a search
    when the model rarely stops that early; ``method="unconstrained"`` is for free text."""


class SearchFallbackWarning(UserWarning):
    """A search ran past a budget, or handed over early, and CD drew its missing samples
    (``fallback="cd"``): those samples follow CD (from the root after an early hand-over,
    each the sample ``cd`` draws with that seed; else from where the search left them), not
    the method's distribution (``Sample.fallback``)."""


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
    search ran past a budget before this sample was drawn, so the fallback drew it (CD
    from the root, or from the prefix its walk had reached: not the method's distribution;
    docs/design.md §6).
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

