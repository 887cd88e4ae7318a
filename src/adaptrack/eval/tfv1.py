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

from ..constraints import Choice, choice
from .apireport import api_report, tfv1_scores
from .apitask import API_HEADER as API_HEADER
from .apitask import METHODS as METHODS
from .apitask import SETTINGS as SETTINGS
from .apitask import V1 as V1
from .apitask import ApiProblem as ApiProblem
from .apitask import ApiTask as ApiTask
from .apitask import api_options, api_record, is_nested_copy
from .apitask import api_text as api_text
from .apitask import setting_constraint as setting_constraint
from .apitask import setting_names as setting_names
from .sweeps import SWEEP_WORDS as SWEEP_WORDS
from .sweeps import backtrack_label as backtrack_label
from .sweeps import parse_backtracks as parse_backtracks
from .sweeps import parse_temperatures as parse_temperatures
from .sweeps import sweep_values as sweep_values
from .taskspec import Option, TaskSpec, model_options
from .tfapi import DEFAULT_VERSION, tensorflow_api_names, write_names

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


def filter_v1_only(names: list[str]) -> list[str]:
    """The paper's four filters (module docstring) over a TF 2 API list, sorted.

    >>> filter_v1_only(["compat.v1.placeholder", "compat.v1.reduce_sum", "reduce_sum",
    ...                 "compat.v1.Session", "compat.v1.app", "compat.v1.app.run",
    ...                 "compat.v1.compat.v1.placeholder"])
    ['compat.v1.app.run', 'compat.v1.placeholder']
    """
    v1 = [n for n in names if n.startswith(V1) and not is_nested_copy(n)]
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


SPEC = TaskSpec(
    "tfv1", help="paper RQ1: complete a TensorFlow v1-only API in the v1 and v2 settings",
    description="Per TFv1 problem, method and setting: one greedy and n sampled "
                "completions; EM@k and LM calls per sample (paper Tables 1 and 5).",
    options=api_options(
        "run the first N of the problems (416 for TF 2.16.1; a fixed shuffled order)",
        settings=(Option(("--settings",), names=SETTINGS, default=",".join(SETTINGS),
                         metavar="S,S",
                         help="TensorFlow settings: v1, v2 or both (default: v1,v2)"),)),
    model_options=model_options(temperature=None), task=TFv1Task, header=API_HEADER,
    record=api_record, scores=tfv1_scores, report=api_report)
"""The declaration of the TFv1 task: its flags, header, records and report (Table 1)."""


if __name__ == "__main__":  # python -m adaptrack.eval.tfv1 [VERSION]: rebuild the list
    ver = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_VERSION
    apis = filter_v1_only(tensorflow_api_names(ver))
    write_names(apis, data_file(ver))
    print(f"{len(apis)} TFv1 APIs -> {data_file(ver)}")
