"""TFv1 (paper §6.1, RQ1): complete ``return tf`` with a TensorFlow v1-only API.

Each problem is one v1-only API, such as ``compat.v1.losses.mean_pairwise_squared_error``,
asked for by a wrapper function (paper Figure 3). In the **v1 setting** the constraint holds
every TF 1 name (the ``compat.v1`` names with ``compat.v1.`` removed) and the oracle is
``.losses.mean_pairwise_squared_error``; in the **v2 setting** the constraint holds every
TF 2.16 name and the oracle is ``.compat.v1.losses.mean_pairwise_squared_error``. The model
cannot tell the version from the prompt, so its intent mixes both.

The problems are the paper's filters (§6.1) applied to TF 2.16.1's public API as read from
the ``tensorflow-cpu`` wheel (:mod:`adaptrack.eval.tfapi`):

1. names under ``compat.v1``, without TensorFlow's nested copies of the namespace
   (``compat.v1.compat.v1.*``, ``compat.v1.compat.v2.*``, which the website does not list);
2. whose last part is not the last part of any v2 name (a name outside ``compat.v1`` and
   ``compat.v2``);
3. every part starting with a lowercase letter (no classes or their methods; the paper's
   words);
4. not a dotted prefix of another such name (no subpackages).

That gives 416 APIs; the paper, which read the website (with Keras), got 419. The list
ships as ``data/tfv1-2.16.1.txt``; ``python -m adaptrack.eval.tfv1`` rebuilds it.

>>> probs = problems()
>>> len(probs)
416
>>> p = next(p for p in probs if p.api.endswith("mean_pairwise_squared_error"))
>>> p.oracle["v1"], p.oracle["v2"]
('.losses.mean_pairwise_squared_error', '.compat.v1.losses.mean_pairwise_squared_error')
>>> print(p.prompt)
import tensorflow as tf
<BLANKLINE>
def mean_pairwise_squared_error(*args, **kwargs):
    \"\"\"
    wrapper for losses.mean_pairwise_squared_error
    \"\"\"
    return tf
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..constraints import API_TERMINATORS, Choice, anything, api_names, choice
from .jobs import Job, Record
from .modeltask import ModelTask, check_methods, seed_for
from .tfapi import DEFAULT_VERSION, tensorflow_api_names, write_names

if TYPE_CHECKING:
    from ..generate import GenerationResult

V1 = "compat.v1."
SETTINGS = ("v1", "v2")
_NESTED_COPIES = ("compat.v1.compat.v1", "compat.v1.compat.v2")

# Paper Figure 3, with the API's last part as the wrapper's name.
PROMPT = '''import tensorflow as tf

def {function}(*args, **kwargs):
    """
    wrapper for {v1_name}
    """
    return tf'''


@dataclass(frozen=True)
class Problem:
    """One TFv1 problem: ``api`` is the full TF 2 name (``compat.v1.…``); ``oracle`` maps a
    setting to the exact text expected after ``return tf`` (no terminator)."""

    api: str
    prompt: str
    oracle: dict[str, str]

    @property
    def id(self) -> str:
        """The problem's name in jobs and records: its API."""
        return self.api


def _is_nested_copy(name: str) -> bool:
    return any(name == c or name.startswith(c + ".") for c in _NESTED_COPIES)


def filter_v1_only(names: list[str]) -> list[str]:
    """The paper's four filters (module docstring) over a TF 2 API list, sorted.

    >>> filter_v1_only(["compat.v1.placeholder", "compat.v1.reduce_sum", "reduce_sum",
    ...                 "compat.v1.Session", "compat.v1.app", "compat.v1.app.run",
    ...                 "compat.v1.compat.v1.placeholder"])
    ['compat.v1.app.run', 'compat.v1.placeholder']
    """
    v1 = [n for n in names if n.startswith(V1) and not _is_nested_copy(n)]
    v2_last_parts = {n.rsplit(".", 1)[-1] for n in names
                     if not n.startswith((V1, "compat.v2.")) and n not in ("compat.v1",
                                                                            "compat.v2")}
    kept = [n for n in v1 if n.rsplit(".", 1)[-1] not in v2_last_parts
            and all(part[:1].islower() for part in n.split("."))]
    # Rule 4 checks against every compat.v1 name: a module is a prefix of its members.
    modules = {n.rsplit(".", 1)[0] for n in v1}
    return sorted(n for n in kept if n not in modules)


def data_file(version: str = DEFAULT_VERSION) -> Path:
    return Path(str(resources.files("adaptrack.eval") / "data" / f"tfv1-{version}.txt"))


@cache
def v1_only_apis(version: str = DEFAULT_VERSION) -> tuple[str, ...]:
    """The TFv1 APIs of ``version`` (shipped for 2.16.1, else built from the wheel)."""
    path = data_file(version)
    if path.is_file():
        return tuple(path.read_text(encoding="utf-8").split())
    return tuple(filter_v1_only(tensorflow_api_names(version)))


def problem(api: str) -> Problem:
    """The Figure 3 problem for one ``compat.v1.…`` API name."""
    if not api.startswith(V1):
        raise ValueError(f"TFv1 problems are compat.v1 APIs; {api!r} does not start with {V1!r}")
    v1_name = api.removeprefix(V1)
    return Problem(api, PROMPT.format(function=api.rsplit(".", 1)[-1], v1_name=v1_name),
                   {"v1": "." + v1_name, "v2": "." + api})


def problems(version: str = DEFAULT_VERSION, limit: int | None = None) -> list[Problem]:
    """The TFv1 problems in a fixed shuffled order (seed 0), so that the first ``limit``
    are a sample across TensorFlow's modules rather than the first letters of the list."""
    apis = list(v1_only_apis(version))
    random.Random(0).shuffle(apis)
    return [problem(a) for a in apis[:limit]]


# The paper's Figure 3: one TFv1 problem, in the v2 setting, with a short list of real TF 2.16
# names around it, so that ``adaptrack demo`` needs no TensorFlow API list. The completion
# is "." + a name + "(" (the terminator).
FIGURE3_API = "compat.v1.losses.mean_pairwise_squared_error"
FIGURE3_PROMPT = problem(FIGURE3_API).prompt
#: What the model means: right in TF 1, missing in TF 2.
FIGURE3_V1_INTENT = problem(FIGURE3_API).oracle["v1"] + "("
#: The paper's answer in the v2 setting.
FIGURE3_V2_ANSWER = problem(FIGURE3_API).oracle["v2"] + "("
TF2_NAMES = (
    "compat.v1.losses.mean_pairwise_squared_error", "compat.v1.losses.mean_squared_error",
    "compat.v1.losses.absolute_difference", "compat.v1.losses.log_loss",
    "compat.v1.losses.huber_loss", "compat.v1.losses.hinge_loss",
    "compat.v1.losses.cosine_distance", "compat.v1.losses.sigmoid_cross_entropy",
    "compat.v1.losses.softmax_cross_entropy", "compat.v1.losses.compute_weighted_loss",
    "compat.v1.reduce_sum", "compat.v1.placeholder", "compat.v1.get_variable",
    "compat.v1.metrics.mean_squared_error", "losses.mean_squared_error",
    "losses.mean_absolute_error", "losses.mean_squared_logarithmic_error",
    "losses.mean_absolute_percentage_error", "losses.huber", "losses.log_cosh",
    "losses.binary_crossentropy", "losses.categorical_crossentropy",
    "losses.sparse_categorical_crossentropy", "losses.kl_divergence",
    "losses.cosine_similarity", "losses.hinge", "losses.squared_hinge", "losses.poisson",
    "losses.MeanSquaredError", "losses.Huber", "math.reduce_sum", "math.reduce_mean",
    "math.squared_difference", "math.square", "math.pow", "math.abs", "math.sqrt",
    "math.log", "math.exp", "reduce_sum", "reduce_mean", "reduce_max", "square", "pow", "abs",
    "sqrt", "cast", "constant", "Variable", "matmul", "add", "subtract", "multiply", "divide",
    "reshape", "transpose", "concat", "stack", "nn.l2_loss", "nn.softmax", "nn.relu",
    "nn.sigmoid_cross_entropy_with_logits", "nn.softmax_cross_entropy_with_logits",
    "keras.losses.mean_squared_error", "keras.losses.MeanSquaredError",
    "metrics.mean_squared_error", "metrics.MeanSquaredError", "function", "print",
)


def figure3_constraint() -> Choice:
    """The v2 setting of Figure 3 on :data:`TF2_NAMES`: "." + one of them + "(".

    >>> c = figure3_constraint()
    >>> len(c.strings), FIGURE3_V2_ANSWER
    (69, '.compat.v1.losses.mean_pairwise_squared_error(')
    """
    return choice(["." + name for name in TF2_NAMES], terminators="(")


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
                            if n.startswith(V1) and not _is_nested_copy(n)))
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


def sweep_values(value: Any, name: str, check: Any) -> tuple[Any, ...]:
    """The values of a sweepable option (one value, or a sequence of them), each checked by
    ``check(value) -> bool``; ValueError naming the option for a bad or repeated value."""
    values = tuple(value) if isinstance(value, list | tuple) else (value,)
    if not values:
        raise ValueError(f"{name} needs at least one value")
    for v in values:
        if not check(v):
            raise ValueError(f"{name} got {v!r}; {SWEEP_WORDS[name]}")
    if len(set(values)) < len(values):
        raise ValueError(f"{name} lists a value twice: {list(values)!r}")
    return values


SWEEP_WORDS = {
    "temperature": "the samples need temperature > 0 and finite (EM@1 is greedy already)",
    "max_backtrack": "each value is an int >= 0, or None for no limit",
}


def _temperature_ok(t: Any) -> bool:
    return (isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
            and t > 0)


def _backtrack_ok(b: Any) -> bool:
    return b is None or (isinstance(b, int) and not isinstance(b, bool) and b >= 0)


def _parse_list(text: str, item: Any, check: Any, words: str) -> list[Any]:
    try:
        values = [item(v.strip()) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(check(v) for v in values):
        raise argparse.ArgumentTypeError(f"must be {words}, got {text!r}")
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"must not list a value twice, got {text!r}")
    return values


def parse_temperatures(text: str) -> list[float]:
    """``--temperature``'s values: comma-separated finite numbers > 0 (an argparse type).

    >>> parse_temperatures("0.1,0.5,1")
    [0.1, 0.5, 1.0]
    """
    return _parse_list(text, float, _temperature_ok, "comma-separated finite numbers > 0")


def parse_backtracks(text: str) -> list[int | None]:
    """``--max-backtrack``'s values: comma-separated integers >= 0 or ``unlimited``.

    >>> parse_backtracks("1,2,4,8,unlimited")
    [1, 2, 4, 8, None]
    """
    return _parse_list(text, lambda v: None if v == "unlimited" else int(v), _backtrack_ok,
                       "comma-separated integers >= 0 or 'unlimited'")


def backtrack_label(b: int | None) -> str:
    """How keys and reports write a max_backtrack value (``None`` is ``unlimited``)."""
    return "unlimited" if b is None else str(b)


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
        self.temperatures = sweep_values(self.temperature, "temperature", _temperature_ok)
        self.backtracks = sweep_values(self.max_backtrack, "max_backtrack", _backtrack_ok)
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
        """The records of ``jobs``, in order: each temperature's jobs from one engine, where
        every job's greedy and sampled ``generate`` calls share batched model calls. A
        job's ``seconds`` runs from its engine's start to its own last sample (jobs of a
        group overlap in time)."""
        by_temperature: dict[float, list[int]] = {}
        for i, job in enumerate(jobs):
            by_temperature.setdefault(job.get("temperature", self.temperatures[0]),
                                      []).append(i)
        records: list[Record] = [{}] * len(jobs)
        for t, indices in by_temperature.items():
            for i, record in zip(indices, self._serve([jobs[i] for i in indices], t),
                                 strict=True):
                records[i] = record
        return records

    def _serve(self, jobs: list[Job], temperature: float) -> list[Record]:
        calls = []
        for job in jobs:
            p, method, setting = self.lookup(job["problem"]), job["method"], job["setting"]
            b = job.get("max_backtrack") if method == "adaptrack" else None
            oracle = p.oracle if setting is None else {setting: p.oracle[setting]}
            # Unconstrained stops where the name ends, like the constrained methods.
            constraint = (anything(API_TERMINATORS) if setting is None
                          else setting_constraint(setting, self.version))
            options = dict(prompt=p.prompt, constraint=constraint, method=method,
                           max_new_tokens=self.max_new_tokens,
                           seed=seed_for(self.seed, p.id, method, setting))
            if b is not None:
                options["max_backtrack"] = b
            calls.append(({"key": job["key"], "problem": p.id, "method": method,
                           "setting": setting, "oracle": oracle, "temperature": temperature,
                           "max_backtrack": b}, options))
        self.prepare(list(dict.fromkeys(options["prompt"] for _, options in calls)))

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

        return self.greedy_and_sampled(calls, self.n, temperature, self.batch_size, finish)


@dataclass
class TFv1Task(ApiTask):
    """The RQ1 run (paper §6.1): per TFv1 problem, method and setting, one greedy completion
    and ``n`` sampled ones (:class:`ApiTask`). Unconstrained decoding ignores the setting,
    so it runs once per problem and is scored against both oracles (as in the paper)."""

    settings: tuple[str, ...] = SETTINGS

    name = "tfv1"

    def problem_list(self) -> list[ApiProblem]:
        return list(problems(self.version, self.limit))

    def lookup(self, problem_id: str) -> ApiProblem:
        return problem(problem_id)


if __name__ == "__main__":  # python -m adaptrack.eval.tfv1 [VERSION]: rebuild the list
    ver = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_VERSION
    apis = filter_v1_only(tensorflow_api_names(ver))
    write_names(apis, data_file(ver))
    print(f"{len(apis)} TFv1 APIs -> {data_file(ver)}")
