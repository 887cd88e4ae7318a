"""What the TFv1 and TFv1Real runs share (:class:`ApiTask`): the TensorFlow settings and
their constraints, the text of an API a completion wrote, the jobs (problem × method ×
setting × sweep value), their records, and the declaration of their options and records
(:func:`api_options`, :func:`api_record`, :data:`API_HEADER`), from which each task's
:class:`~adaptrack.eval.taskspec.TaskSpec` is made.

>>> api_text(".losses.log_loss(labels")
'.losses.log_loss'
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

from ..constraints import API_TERMINATORS, Choice, anything, api_names
from . import checks
from .checks import INT, NUMBER, POSITIVE, STAMPS, STR, Check, fields
from .jobs import Job, Record
from .modeltask import Call, ModelTask, check_methods, paper_options, seed_for
from .sweeps import (
    backtrack_label,
    backtrack_ok,
    parse_backtracks,
    parse_temperatures,
    sweep_values,
    temperature_ok,
)
from .taskspec import Option, Sampling, TaskOption, methods_option
from .tfapi import DEFAULT_VERSION, tensorflow_api_names

if TYPE_CHECKING:
    from ..generate import GenerationResult

__all__ = ["API_HEADER", "METHODS", "SETTINGS", "ApiProblem", "ApiTask", "api_options",
           "api_record", "api_text", "setting_constraint", "setting_names"]

V1 = "compat.v1."
SETTINGS = ("v1", "v2")
_NESTED_COPIES = ("compat.v1.compat.v1", "compat.v1.compat.v2")


def is_nested_copy(name: str) -> bool:
    return any(name == c or name.startswith(c + ".") for c in _NESTED_COPIES)


@cache
def setting_names(setting: str, version: str = DEFAULT_VERSION) -> tuple[str, ...]:
    """The names valid in a setting: ``v2`` every TF ``version`` name, ``v1`` the
    ``compat.v1`` names with the prefix removed (how TF 1 spells them), without
    TensorFlow's nested copies (``compat.v1.compat.v1.*``), which the paper's list (the
    website's) does not have: so ``.compat.v1.…``, the v2 answer, is not valid in v1."""
    names = tensorflow_api_names(version)
    if setting == "v2":
        return tuple(names)
    if setting == "v1":
        return tuple(sorted(n.removeprefix(V1) for n in names
                            if n.startswith(V1) and not is_nested_copy(n)))
    raise ValueError(f"unknown TFv1 setting {setting!r}; choose one of {', '.join(SETTINGS)}")


@cache
def setting_constraint(setting: str, version: str = DEFAULT_VERSION) -> Choice:
    """``.`` + a name valid in ``setting`` + a character that cannot continue a name."""
    return api_names(setting_names(setting, version))


def api_text(text: str) -> str:
    """The API a completion wrote: ``text`` up to its first terminator (``(``, space, …)."""
    for i, ch in enumerate(text):
        if ch in _TERMINATOR_CHARS:
            return text[:i]
    return text


_TERMINATOR_CHARS = frozenset(API_TERMINATORS.decode("ascii"))


METHODS = ("unconstrained", "cd", "adaptrack", "exact")


class ApiProblem(Protocol):
    """What :class:`ApiTask` needs of a problem: an ``id``, the ``prompt`` (ending in
    ``tf``) and the ``oracle`` ({setting: text expected after the prompt})."""

    @property
    def id(self) -> str: ...

    @property
    def prompt(self) -> str: ...

    @property
    def oracle(self) -> dict[str, str]: ...


@dataclass
class ApiTask(ModelTask):
    """What the TFv1 and TFv1Real runs share (the paper's §6.1 and its robustness study):
    per problem, method and setting, one greedy completion and ``n`` sampled ones of the
    text after the prompt's ``tf``, stopped where the API name ends. Subclasses give the
    problems (:meth:`problem_list`, :meth:`lookup`), the settings and the header's name.

    **Sweeps.** ``temperature`` and ``max_backtrack`` take one value or a list. With a
    list, every job runs at each value (the paper's Figures 5 and 7): its key gains
    ``|T=…`` or ``|B=…`` and the header lists the values. ``max_backtrack`` (how many
    tokens back AdapTrack may go, the paper's §7.2.2; default ``None``: no limit) applies
    to AdapTrack only, as ``generate`` allows it for no other method: the other methods
    run once per temperature, unaffected, and a report draws them flat across it. Every
    value of a sweep uses the job's seed (common random numbers), so differences between
    values are not sampling noise of different streams. With one value of each, keys and
    header are those of a run without sweeps, so older results files resume and report.

    One job's record: ``problem``, ``method``, ``setting`` (``None`` for unconstrained),
    ``oracle`` ({setting: text}), ``temperature``, ``max_backtrack``, ``greedy`` and
    ``samples`` (the API each completion wrote, see :func:`api_text`), ``texts`` (the raw
    sampled completions), ``lm_requests`` (per sample), ``lm_calls``, ``backtracks``,
    ``incomplete``, ``seconds``; or ``error``.
    """

    model: str | None = None
    backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    methods: tuple[str, ...] = METHODS
    n: int = 20
    limit: int | None = None
    temperature: float | Sequence[float] = 1.0
    max_backtrack: int | Sequence[int | None] | None = None
    max_new_tokens: int = 32
    seed: int = 0
    version: str = DEFAULT_VERSION
    #: Jobs a worker runs together on one engine (``run_many``), and prefixes per model call.
    #: Neither changes a record's samples, so neither is in the header.
    group: int = 32
    batch_size: int = 32

    name = "api"

    def __post_init__(self) -> None:
        check_methods(self.methods)
        bad = [s for s in self.settings if s not in SETTINGS]
        if bad:
            raise ValueError(f"unknown setting {bad[0]!r}; choose from {', '.join(SETTINGS)}")
        if not self.settings:
            raise ValueError("give at least one setting")
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("n and max_new_tokens must be at least 1")
        self.temperatures = sweep_values(self.temperature, "temperature", temperature_ok)
        self.backtracks = sweep_values(self.max_backtrack, "max_backtrack", backtrack_ok)
        if self.backtracks != (None,) and "adaptrack" not in self.methods:
            raise ValueError("max_backtrack applies to the adaptrack method only; add it to "
                             f"methods (got {', '.join(self.methods)})")

    @property
    def settings(self) -> tuple[str, ...]:  # a dataclass field in TFv1Task
        return ("v2",)

    def problem_list(self) -> list[ApiProblem]:
        """The problems to run, in order (``limit`` applied)."""
        raise NotImplementedError

    def lookup(self, problem_id: str) -> ApiProblem:
        """The problem a job names."""
        raise NotImplementedError

    def sweep_config(self) -> dict[str, object]:
        """The header's temperature (a number, or the list swept) and max_backtrack (absent
        without a limit, so a run without sweeps has the header it always had)."""
        ts, bs = self.temperatures, self.backtracks
        out: dict[str, object] = {"temperature": ts[0] if len(ts) == 1 else list(ts)}
        if bs != (None,):
            out["max_backtrack"] = bs[0] if len(bs) == 1 else list(bs)
        return out

    def config(self) -> dict[str, object]:
        return {"task": self.name, **self.model_config(), "n": self.n, **self.sweep_config(),
                "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                "tf_version": self.version}

    def jobs_per_problem(self) -> int:
        """How many jobs each problem has (every method, setting and sweep value)."""
        return len(self.temperatures) * sum(
            (1 if m == "unconstrained" else len(self.settings))
            * (len(self.backtracks) if m == "adaptrack" else 1) for m in self.methods)

    def _jobs_of(self, p: ApiProblem, t: float) -> list[Job]:
        out = []
        for method in self.methods:
            for setting in [None] if method == "unconstrained" else self.settings:
                for b in self.backtracks if method == "adaptrack" else (None,):
                    key = f"{p.id}|{method}|{setting or '*'}"
                    if len(self.temperatures) > 1:
                        key += f"|T={t!r}"
                    if len(self.backtracks) > 1 and method == "adaptrack":
                        key += f"|B={backtrack_label(b)}"
                    out.append({"key": key, "problem": p.id, "method": method,
                                "setting": setting, "temperature": t, "max_backtrack": b})
        return out

    def jobs(self) -> list[Job]:
        """Temperature-major: a group of jobs (``run_many``) mostly shares one temperature,
        and a partial sweep has whole temperatures done."""
        return [j for t in self.temperatures for p in self.problem_list()
                for j in self._jobs_of(p, t)]

    def run(self, job: Job) -> Record:
        return self.run_many([job])[0]

    def prepare(self, prompts: list[str]) -> None:
        """Called with the group's distinct prompts before it is served (a hook)."""

    def run_many(self, jobs: list[Job]) -> list[Record]:
        """The records of ``jobs``, in order (:meth:`run_each`)."""
        by_key = {r["key"]: r for r in self.run_each(jobs)}
        return [by_key[job["key"]] for job in jobs]

    def run_each(self, jobs: list[Job]) -> Iterator[Record]:
        """The records of ``jobs`` as each finishes: each temperature's jobs from one
        engine, where every job's greedy and sampled ``generate`` calls share batched model
        calls. A job's ``seconds`` runs from its engine's start to its own last sample
        (jobs of a group overlap in time)."""
        by_temperature: dict[float, list[Job]] = {}
        for job in jobs:
            by_temperature.setdefault(job.get("temperature", self.temperatures[0]),
                                      []).append(job)
        for t, group in by_temperature.items():
            yield from self._serve(group, t)

    def _serve(self, jobs: list[Job], temperature: float) -> Iterator[Record]:
        calls = []
        for job in jobs:
            p, method, setting = self.lookup(job["problem"]), job["method"], job["setting"]
            b = job.get("max_backtrack") if method == "adaptrack" else None
            oracle = p.oracle if setting is None else {setting: p.oracle[setting]}
            # Unconstrained stops where the name ends, like the constrained methods.
            constraint = (anything(API_TERMINATORS) if setting is None
                          else setting_constraint(setting, self.version))
            options = paper_options(method=method, max_new_tokens=self.max_new_tokens,
                                    seed=seed_for(self.seed, p.id, method, setting),
                                    max_backtrack=b)
            calls.append(({"key": job["key"], "problem": p.id, "method": method,
                           "setting": setting, "oracle": oracle, "temperature": temperature,
                           "max_backtrack": b}, Call(p.prompt, constraint, options)))
        self.prepare(list(dict.fromkeys(call.prompt for _, call in calls)))

        def finish(head: Record, greedy: GenerationResult, sampled: GenerationResult) -> Record:
            return {**head,
                    "greedy": api_text(greedy.samples[0].text),
                    "samples": [api_text(s.text) for s in sampled.samples],
                    "texts": sampled.texts,
                    "lm_requests": [s.lm_requests for s in sampled.samples],
                    "lm_calls": sampled.stats["lm_calls"],
                    "backtracks": sampled.stats["backtracks"],
                    "incomplete": sampled.stats["incomplete"],
                    "seconds": max(greedy.stats["seconds"], sampled.stats["seconds"])}

        for _, record in self.greedy_and_sampled_each(calls, self.n, temperature,
                                                      self.batch_size, finish):
            yield record



# -- the declaration: options and records -----------------------------------------------


def _backtrack(x: Any) -> bool:
    return x is None or (checks.is_int(x) and x >= 0)


_SWEEP_HEADER: dict[str, Check] = {  # a sweep's header lists its values
    "temperature": (lambda x: checks.is_num(x) or checks.list_of(checks.is_num)(x),
                    "a number or a non-empty list of numbers"),
    "max_backtrack": (lambda x: _backtrack(x) or checks.list_of(_backtrack)(x),
                      "an integer >= 0, null, or a non-empty list of them")}
_SWEEP: dict[str, Check] = {"temperature": NUMBER,  # a record holds one of them
                            "max_backtrack": (_backtrack, "an integer >= 0 or null")}

#: The fields of an API task's header (:meth:`ApiTask.config`).
API_HEADER: dict[str, Check] = {
    "model": STR, "backend": STR, "device": STR, "n": POSITIVE, **_SWEEP_HEADER,
    "max_new_tokens": POSITIVE, "seed": INT, "tf_version": STR}

_JOB: dict[str, Check] = {
    "problem": STR, "method": STR,
    "setting": (lambda x: x is None or isinstance(x, str), "a string or null"),
    "oracle": (lambda x: isinstance(x, dict) and len(x) > 0
               and all(isinstance(v, str) for v in x.values()),
               "an object of strings")}
_DONE: dict[str, Check] = {
    "greedy": STR, "samples": checks.strings(),
    "lm_requests": (checks.list_of(checks.is_int), "a non-empty list of integers"),
    "lm_calls": INT, "seconds": NUMBER}


def api_record(r: Record) -> str | None:
    """What is wrong with an API task's record (:class:`ApiTask`), or None.

    >>> api_record({"key": "k", "problem": "p", "method": "cd", "setting": "v2",
    ...             "oracle": {"v2": ".f"}, "greedy": ".f"})
    "no 'samples' field"
    """
    wrong = fields(r, _JOB, {**STAMPS, **_SWEEP})
    if wrong or "error" in r:  # a job that raised keeps its error and no results
        return wrong or fields(r, {"error": STR})
    return fields(r, _DONE, {"backtracks": NUMBER, "incomplete": INT})


def api_options(limit_help: str, settings: tuple[Option, ...] = (),
                packages: tuple[Option, ...] = ()) -> tuple[TaskOption, ...]:
    """The options of an API task: its ``settings`` option after the methods, its
    ``packages`` before the sweepable ones."""
    return (
        methods_option(METHODS), *settings,
        Sampling("n", 20, note="per problem, method and setting, besides the greedy one"),
        Option(("--limit",), type="count", metavar="N", help=limit_help),
        Sampling("max_new_tokens", 32),
        *packages,
        Option(("--temperature",), type=parse_temperatures, default=[1.0], metavar="T,T",
               help="sampling temperature > 0, or several to sweep (the paper's Figure 5: "
                    "0.1,0.2,...,1.0; default: 1.0)"),
        Option(("--max-backtrack",), type=parse_backtracks, default=[None], metavar="B,B",
               help="how many tokens back AdapTrack may backtrack (the paper's §7.2.2), or "
                    "several to sweep (its Figure 7: 1,2,4,8,unlimited; default: "
                    "unlimited); the other methods run once, unaffected"))
