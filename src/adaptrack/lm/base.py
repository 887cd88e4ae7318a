"""The model interface every backend implements: token bytes, EOS ids, batched log-probs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from ..errors import ModelOutputError, PromptTooLongError
from ..tokenization.vocab import Vocabulary
from .cost import measure_row_cost

Prefix = tuple[int, ...]


def common_prefix(a: Prefix, b: Prefix) -> int:
    """Length of the common prefix of two token tuples, by binary search over C-speed
    tuple comparisons (backends match a request against the prefixes whose KV they keep).

    >>> common_prefix((1, 2, 3), (1, 2, 4))
    2
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo


class LanguageModel(ABC):
    """A next-token model over a byte-level vocabulary.

    Subclasses implement :meth:`_next_logprobs` and :meth:`encode`; callers use
    :meth:`next_logprobs`, which checks shapes and counts every prefix evaluated in
    ``calls`` (the samplers' ``lm_calls`` stat counts distinct prefixes per ``generate``).
    ``name`` names the model in messages and results. ``context_length`` is the longest
    prefix (prompt and new tokens) the model takes, or ``None`` when unknown or unbounded;
    ``generate`` refuses prompts that do not fit (docs/design.md §6) and backends refuse
    longer prefixes with
    :class:`~adaptrack.errors.PromptTooLongError`.
    """

    vocab: Vocabulary
    name: str = ""
    calls: int = 0
    context_length: int | None = None
    #: The precision the prefix tree stores this model's probabilities in (docs/design.md §3,
    #: numerics): float64 unless the model's own numbers are float32 or coarser, where
    #: float32 loses nothing they had and halves the bytes of an opened prefix.
    probs_dtype: type = np.float64
    #: The relative cost of one more row in a forward pass (``lm/cost.py``), the cost model
    #: a search's width comes from: None until :meth:`measured_row_cost` times it, once per
    #: model; a model whose cost is known declares it (``TableLM``), and so may a caller
    #: that measured it before (nothing is timed then).
    row_cost: float | None = None
    #: The counters of work done that timing the row cost leaves as they were: it is not a
    #: request's work.
    counters: tuple[str, ...] = ("calls",)
    _context_hint = ("shorten the prompt (generate(truncate_prompt=True) keeps its end) or "
                     "lower max_new_tokens")

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt string."""

    @abstractmethod
    def _next_logprobs(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        """Next-token log-probabilities, shape ``(len(prefixes), vocab.size)``."""

    def logprobs_along(self, prefix: Prefix, tokens: Sequence[int]) -> np.ndarray:
        """Log-probs after ``prefix`` and after each extension of it by ``tokens``: row ``i``
        is the distribution after ``prefix + tokens[:i]``, shape ``(len(tokens) + 1, V)``.

        Fast-forward feeds forced tokens this way: backends override
        :meth:`_logprobs_along_many` with one forward pass (a short prefill) instead of
        ``len(tokens) + 1`` prefixes.
        """
        return self.logprobs_along_many([(prefix, tokens)])[0]

    def logprobs_along_many(
        self, requests: Sequence[tuple[Prefix, Sequence[int]]]
    ) -> list[np.ndarray]:
        """:meth:`logprobs_along` for several (prefix, tokens) pairs in one batch."""
        reqs = [(tuple(p), tuple(int(t) for t in toks)) for p, toks in requests]
        self._check_lengths([len(p) + len(toks) for p, toks in reqs])
        out = [np.asarray(a, dtype=np.float64) for a in self._logprobs_along_many(reqs)]
        for (_, toks), rows in zip(reqs, out, strict=True):
            if rows.shape != (len(toks) + 1, self.vocab.size):
                raise ModelOutputError(
                    f"{type(self).__name__} returned scores of shape {rows.shape}, expected "
                    f"({len(toks) + 1}, {self.vocab.size})"
                )
        self.calls += sum(len(toks) + 1 for _, toks in reqs)
        return out

    def _logprobs_along_many(self, requests: list[tuple[Prefix, Prefix]]) -> list[np.ndarray]:
        flat = [p + toks[:i] for p, toks in requests for i in range(len(toks) + 1)]
        rows = self._next_logprobs(flat) if flat else np.empty((0, self.vocab.size))
        ends = np.cumsum([len(toks) + 1 for _, toks in requests])[:-1]
        return list(np.split(np.asarray(rows), ends))

    def _check_lengths(self, lengths: Sequence[int]) -> None:
        """Refuse prefixes longer than ``context_length`` (a guard for direct callers:
        ``generate`` checks the prompt before any model work)."""
        limit = self.context_length
        if limit is not None and lengths and max(lengths) > limit:
            raise PromptTooLongError(
                f"a prefix of {max(lengths)} tokens exceeds {type(self).__name__}'s context "
                f"of {limit} tokens; {self._context_hint}"
            )

    def text_tokens(self, text: str) -> list[int]:
        """Token ids of ``text`` without BOS or other special tokens: the canonical
        tokenization fast-forward compares against."""
        ids = self.encode(text)
        start = 0
        while start < len(ids) and not self.vocab.bytes_of(ids[start]):
            start += 1
        return ids[start:]

    def transient(self, prefixes: Collection[Prefix]) -> AbstractContextManager[None]:
        """A block within which ``prefixes`` are asked only to fill a cache, unlikely to be
        extended (AdapTrack's siblings fetched ahead, docs/design.md §3): a backend that
        keeps per-prefix state (the transformers backend's KV states) need not keep
        theirs. The others ignore it.

        >>> import adaptrack as at
        >>> lm = at.TableLM([b"a", b"<eos>"], lambda prefix: [1, 1], eos=1)
        >>> with lm.transient([(0,)]):
        ...     lm.next_logprobs([(0,)]).shape
        (1, 2)
        """
        return nullcontext()

    def measured_row_cost(self) -> float:
        """:attr:`row_cost`, timed on the first call (a few passes of short prefixes,
        about a second for a small model on a CPU) when the model does not declare it.

        >>> import adaptrack as at
        >>> at.TableLM([b"a", b"<eos>"], lambda prefix: [1, 1], eos=1).measured_row_cost()
        0.0
        """
        if self.row_cost is None:
            ordinary = ([i for i in range(self.vocab.size) if self.vocab.bytes_of(i)]
                        or list(range(self.vocab.size)))
            size = 32 if self.context_length is None else min(32, self.context_length - 1)
            base = tuple(ordinary[(7 * i) % len(ordinary)] for i in range(max(1, size)))
            fresh = (ordinary[(101 * i + 3) % len(ordinary)] for i in range(1 << 30))
            saved = {name: getattr(self, name) for name in self.counters}
            try:
                self._next_logprobs([base])  # the shared context, kept as a prompt is
                self._timed_pass([(*base, next(fresh)) for _ in range(8)])  # warm up
                self.row_cost = measure_row_cost(self._timed_pass, base, fresh)
            finally:
                for name, value in saved.items():
                    setattr(self, name, value)
        return self.row_cost

    def _timed_pass(self, prefixes: list[Prefix]) -> None:
        with self.transient(prefixes):  # rows a search would extend are not these
            self._next_logprobs(prefixes)

    def next_logprobs(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        """Normalized next-token log-probs for each full prefix (prompt ids included)."""
        self._check_lengths([len(p) for p in prefixes])
        out = np.asarray(self._next_logprobs(prefixes), dtype=np.float64)
        if out.shape != (len(prefixes), self.vocab.size):
            raise ModelOutputError(
                f"{type(self).__name__} returned scores of shape {out.shape}, expected "
                f"({len(prefixes)}, {self.vocab.size})"
            )
        self.calls += len(prefixes)
        return out
