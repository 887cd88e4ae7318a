"""What tasks that sample from a model share: the model spec and its lazy loading
(:class:`ModelTask`), one greedy and ``n`` sampled ``generate`` calls per job, the paper's
options (:data:`PAPER_OPTIONS`), per-job seeds and the checks of a task's options.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import AdaptrackError
from ..options import SamplingOptions
from .jobs import Record

if TYPE_CHECKING:
    from ..constraints.base import Constraint
    from ..generate import GenerationResult

__all__ = ["PAPER_OPTIONS", "Call", "ModelTask", "check_methods", "check_study",
           "paper_options", "seed_for"]


class Call(NamedTuple):
    """One job's ``generate`` call: its prompt, constraint and options (the sampled call's
    but ``n`` and ``temperature``, which :meth:`ModelTask.greedy_and_sampled` sets)."""

    prompt: Any
    constraint: Constraint | None
    options: SamplingOptions


def seed_for(seed: int, *parts: Any) -> int:
    """A stable per-job seed from the run's seed and the job's identity (any order of
    execution gives every job the same random stream)."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


class ModelTask:
    """What tasks that sample from a model share: the model spec and its lazy loading.

    Subclasses are dataclasses with ``model``, ``backend``, ``device`` and ``dtype`` fields
    (:func:`~adaptrack.lm.load.load_model`'s); the loaded model stays out of pickles, so a
    task travels to workers as its options only.
    """

    model: str | None
    backend: str
    device: str
    dtype: str = "auto"
    _lm: Any = None

    def setup(self, threads: int | None = None) -> None:
        if self._lm is None:
            from ..lm.load import load_model

            self._lm = load_model(self.model, backend=self.backend, device=self.device,
                                  threads=threads, dtype=self.weights_dtype())

    def weights_dtype(self) -> str:
        """The ``dtype`` the model loads with."""
        return self.dtype

    @property
    def lm(self) -> Any:
        self.setup()
        return self._lm

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lm"] = None
        return state

    def model_config(self) -> dict[str, Any]:
        # ``auto`` is determined by the device (float16 on CUDA, float32 on a CPU) and is left
        # out, so results files made before the option existed still resume.
        precision = {} if self.dtype == "auto" else {"dtype": self.dtype}
        return {"model": self.model or "default", "backend": self.backend,
                "device": self.device, **precision}

    def greedy_and_sampled(
        self, calls: list[tuple[Record, Call]], n: int, temperature: float,
        batch_size: int, finish: Callable[[Record, GenerationResult, GenerationResult], Record],
    ) -> list[Record]:
        """Per ``(head, call)``: one greedy and ``n`` sampled ``generate`` calls, all on one
        engine; ``finish(head, greedy, sampled)`` makes the record. A job whose calls raised
        an ``AdaptrackError`` gets ``{**head, "error": ...}``: the run goes on and the report
        scores it as a miss; any other exception is a bug and propagates. The records in
        the order of ``calls`` (:meth:`greedy_and_sampled_each` yields them as they finish)."""
        records: list[Record] = [{}] * len(calls)
        for k, record in self.greedy_and_sampled_each(calls, n, temperature, batch_size,
                                                      finish):
            records[k] = record
        return records

    def greedy_and_sampled_each(
        self, calls: list[tuple[Record, Call]], n: int, temperature: float,
        batch_size: int, finish: Callable[[Record, GenerationResult, GenerationResult], Record],
    ) -> Iterator[tuple[int, Record]]:
        """:meth:`greedy_and_sampled`, yielding ``(index in calls, record)`` as each job's
        two calls are done."""
        from ..generate import generate_each_as_done

        served = generate_each_as_done(self.lm, [
            dict(prompt=call.prompt, constraint=call.constraint, options=options)
            for _, call in calls for options in (
                replace(call.options, n=1, temperature=0),
                replace(call.options, n=n, temperature=temperature))],
            batch_size=batch_size)
        half: dict[int, Any] = {}  # a job's call that finished first
        for i, outcome in served:
            k = i // 2
            if k not in half:
                half[k] = outcome
                continue
            greedy, sampled = (half.pop(k), outcome) if i % 2 else (outcome, half.pop(k))
            head = calls[k][0]
            err = next((o for o in (greedy, sampled) if isinstance(o, BaseException)), None)
            if isinstance(err, AdaptrackError):
                yield k, {**head, "error": f"{type(err).__name__}: {err}"}
            elif err is not None:
                raise err
            else:
                yield k, finish(head, greedy, sampled)


#: What every evaluation task asks of ``generate`` unless it says otherwise: the AdapTrack
#: paper's target (a text ends only at EOS), no budget of model calls (the paper's searches
#: have none; a task bounds them by ``max_seconds``) and a search past its budget scored as
#: a miss, never finished by the CD fallback (docs/design.md §2, §6).
PAPER_OPTIONS = SamplingOptions(end="eos", search_budget=None, fallback=None)


def paper_options(**given: Any) -> SamplingOptions:
    """:data:`PAPER_OPTIONS` with ``given`` (any :class:`SamplingOptions` field), checked
    as :class:`SamplingOptions` checks them.

    >>> opts = paper_options(method="cd", max_new_tokens=8)
    >>> opts.end, opts.search_budget, opts.fallback, opts.max_new_tokens
    ('eos', None, None, 8)
    >>> paper_options(top_k=3)
    Traceback (most recent call last):
    TypeError: SamplingOptions.__init__() got an unexpected keyword argument 'top_k'
    """
    return replace(PAPER_OPTIONS, **given)


def check_study(study: str, n: int, most: int, temperature: float) -> None:
    """ValueError unless a study that compares distributions (binary, DSL) has 1 <= n <=
    ``most`` samples per method (one method's samples are one results line) and a
    temperature > 0.

    >>> check_study("binary", 10, 100, 0.0)
    Traceback (most recent call last):
    ...
    ValueError: the binary study compares distributions: temperature must be > 0
    """
    if not 1 <= n <= most:
        raise ValueError(f"n must be at least 1 and at most {most:,} (one method's "
                         f"samples are one results line), got {n}")
    if not temperature > 0:
        raise ValueError(f"the {study} study compares distributions: temperature must be > 0")


def check_methods(methods: tuple[str, ...]) -> None:
    """ValueError naming the first unknown method (before any model is loaded)."""
    from ..generate import METHODS

    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}"
                         if bad else "give at least one method")
