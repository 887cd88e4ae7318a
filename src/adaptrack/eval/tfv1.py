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

import random
import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..constraints import API_TERMINATORS, Choice, anything, api_names, choice
from .runner import Job, ModelTask, Record, check_methods, seed_for
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


@dataclass
class TFv1Task(ModelTask):
    """The RQ1 run (paper §6.1): per problem, method and setting, one greedy completion and
    ``n`` sampled ones. Unconstrained decoding ignores the setting, so it runs once per
    problem and is scored against both oracles (as in the paper).

    One job's record: ``problem``, ``method``, ``setting`` (``None`` for unconstrained),
    ``oracle`` ({setting: text}), ``greedy`` and ``samples`` (the API each completion wrote,
    see :func:`api_text`), ``texts`` (the raw sampled completions), ``lm_requests`` (per
    sample), ``lm_calls``, ``backtracks``, ``incomplete``, ``seconds``; or ``error``.
    """

    model: str | None = None
    backend: str = "auto"
    device: str = "auto"
    methods: tuple[str, ...] = METHODS
    settings: tuple[str, ...] = SETTINGS
    n: int = 20
    limit: int | None = None
    temperature: float = 1.0
    max_new_tokens: int = 32
    seed: int = 0
    version: str = DEFAULT_VERSION
    #: Jobs a worker runs together on one engine (``run_many``), and prefixes per model call.
    #: Neither changes a record's samples, so neither is in the header.
    group: int = 32
    batch_size: int = 32

    def __post_init__(self) -> None:
        check_methods(self.methods)
        bad = [s for s in self.settings if s not in SETTINGS]
        if bad:
            raise ValueError(f"unknown setting {bad[0]!r}; choose from {', '.join(SETTINGS)}")
        if not self.settings:
            raise ValueError("give at least one setting")
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("n and max_new_tokens must be at least 1")
        if not self.temperature > 0:
            raise ValueError("the samples need temperature > 0 (EM@1 is greedy already); "
                             f"got {self.temperature}")

    def config(self) -> dict[str, object]:
        return {"task": "tfv1", **self.model_config(), "n": self.n,
                "temperature": self.temperature, "max_new_tokens": self.max_new_tokens,
                "seed": self.seed, "tf_version": self.version}

    def jobs(self) -> list[Job]:
        out = []
        for p in problems(self.version, self.limit):
            for method in self.methods:
                for setting in [None] if method == "unconstrained" else self.settings:
                    out.append({"key": f"{p.api}|{method}|{setting or '*'}", "problem": p.api,
                                "method": method, "setting": setting})
        return out

    def run(self, job: Job) -> Record:
        return self.run_many([job])[0]

    def run_many(self, jobs: list[Job]) -> list[Record]:
        """The records of ``jobs``, in order, from one engine: every job's greedy and
        sampled ``generate`` calls share its batched model calls. A job's ``seconds`` runs
        from the group's start to its own last sample (jobs of a group overlap in time)."""
        calls = []
        for job in jobs:
            p, method, setting = problem(job["problem"]), job["method"], job["setting"]
            oracle = p.oracle if setting is None else {setting: p.oracle[setting]}
            # Unconstrained stops where the name ends, like the constrained methods.
            constraint = (anything(API_TERMINATORS) if setting is None
                          else setting_constraint(setting, self.version))
            calls.append(({"key": job["key"], "problem": p.api, "method": method,
                           "setting": setting, "oracle": oracle},
                          dict(prompt=p.prompt, constraint=constraint, method=method,
                               max_new_tokens=self.max_new_tokens,
                               seed=seed_for(self.seed, p.api, method, setting))))

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

        records = self.greedy_and_sampled(calls, self.n, self.temperature, self.batch_size,
                                          finish)
        return records


if __name__ == "__main__":  # python -m adaptrack.eval.tfv1 [VERSION]: rebuild the list
    ver = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_VERSION
    apis = filter_v1_only(tensorflow_api_names(ver))
    write_names(apis, data_file(ver))
    print(f"{len(apis)} TFv1 APIs -> {data_file(ver)}")
