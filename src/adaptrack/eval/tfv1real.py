"""TFv1Real (the AdapTrack paper's §6.1, Table 2): real code cut at its first v1-only call.

The problems come from Python files of pinned PyPI packages (``data/tfv1real-packages.txt``,
or a list of one's own), downloaded with ``pip download --no-deps`` into the cache directory
at evaluation time; nothing from them is committed. The paper's rules, per file:

1. Python files only (``*.py`` in the wheel or sdist);
2. split at the first ``tf.compat.v1`` *in code*: the tokens ``tf`` ``.`` ``compat`` ``.``
   ``v1`` written together, outside comments and strings (:mod:`tokenize`; an f-string
   counts as a string, also on Pythons that tokenize its fields);
3. drop the file if the text before the split holds ``tf.compat.v1`` anywhere (in a
   comment, a docstring, a string);
4. keep it only if the text at the split is a call ``tf.compat.v1.<dotted name>(``: the
   prompt is everything before it up to and including ``tf``, the oracle the rest of the
   name (``.compat.v1.placeholder``), which the model completes as in TFv1's v2 setting;
5. drop prompts longer than :data:`MAX_PROMPT_TOKENS` tokens of the model's tokenizer (the
   paper's 4 096 minus 512 for the completion);
6. drop duplicates, keeping the first in package-list order, then path order: **exact**
   ones (the same oracle and the same prompt once blank lines are removed and runs of
   whitespace collapsed) and **near** ones (the same oracle and a Jaccard similarity of
   at least :data:`NEAR_DUPLICATE` between the sets of the two prompts' code lines:
   non-blank, not only a comment, whitespace collapsed). Comment lines are left out
   because most of these packages open every file with the same 13-line license header,
   which makes any two short files look alike. On the default list, pairs with one oracle
   fall into two groups: 0.81 to 1.0 (a file vendored into another package, a ``v1/``
   copy, tests generated from one template) and 0.71 or less (files that share imports);
   nothing lies between.

Each problem keeps its provenance: package, version, path inside the distribution and the
package's license (from its metadata: ``License-Expression``, else a one-line ``License``
field, else the license classifiers).

**Downloads and the cache.** :func:`cached_dist` tries, in turn, a wheel for any Python, a
Linux wheel built for CPython 3.10 down to 3.6 (the Python files are those of every
platform), then the sdist, for which pip runs the package's ``setup.py`` to read its
metadata (tensorflow-plot and texar of the default list have only an sdist). Files go to
``cache_dir() / "dists"``; a build is kept as JSON in ``cache_dir() / "tfv1real"``, keyed
by the package list, the tokenizer and :data:`RULES_VERSION`.

**The default list** (36 packages, the default model's tokenizer; all download): 5 254
Python files, of which 4 592 hold no ``tf.compat.v1`` in code, 20 hold it earlier in a
comment or string and 100 not at a call; 542 split, 42 prompts too long, 2 exact and 7
near duplicates: **491 problems** with 123 distinct oracles, 63 of them among TFv1's 416
APIs; prompts of 902 tokens at the median, 1 189 on average, 3 541 at most. 19 problems
(9 oracles) call names that TensorFlow 2.16.1's API modules do not list (the Keras-backed
``compat.v1.layers.*`` and ``compat.v1.keras.*``, a class method, ``estimator``), which no
constrained method can write in the v2 setting; they stay, as the rules keep them.

>>> split("import tensorflow as tf\\nx = tf.compat.v1.placeholder(tf.float32)\\n")
('import tensorflow as tf\\nx = tf', '.compat.v1.placeholder')
>>> split("# tf.compat.v1 is gone in 3.0\\nx = tf.compat.v1.placeholder()\\n")
'earlier'
>>> split("s = tf.compat.v1.Session\\n")
'not_call'
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AdaptrackError
from ..lm.default import cache_dir
from ..sampling.engine import prefill
from .apireport import api_report, tfv1_scores
from .apitask import API_HEADER, ApiProblem, ApiTask, api_options, api_record, setting_names
from .checks import POSITIVE, STR, strings
from .dists import REQUIREMENT, decoded_text
from .dists import TFv1RealDataError as TFv1RealDataError
from .dists import cached_dist as cached_dist
from .dists import license_of as license_of
from .dists import packages_file as packages_file
from .dists import read_dist as read_dist
from .dists import read_dist_bytes as read_dist_bytes
from .dists import read_packages as read_packages
from .jobs import Job, Record
from .taskspec import Option, TaskSpec, model_options
from .tfapi import DEFAULT_VERSION
from .tfv1rules import NEAR_DUPLICATE as NEAR_DUPLICATE
from .tfv1rules import REASONS as REASONS
from .tfv1rules import RealProblem as RealProblem
from .tfv1rules import deduplicate as deduplicate
from .tfv1rules import near_duplicate as near_duplicate
from .tfv1rules import split as split

#: The longest prompt kept, in tokens of the model's tokenizer (the paper: 4 096 - 512).
MAX_PROMPT_TOKENS = 3584
#: Changes whenever the rules change what a build gives, so a cached build is not reused.
RULES_VERSION = 1
@dataclass
class PackageStats:
    """What one package gave: its Python files, what :func:`split` said of them, how many
    prompts were too long, and the problems left after deduplication."""

    requirement: str
    file: str = ""
    license: str = ""
    python_files: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    split: int = 0
    too_long: int = 0
    kept: int = 0


@dataclass
class ProblemSet:
    """A TFv1Real build: the problems (sorted by id), the package list and tokenizer it was
    built for, per-package statistics, and the duplicates dropped."""

    problems: list[RealProblem]
    packages: tuple[str, ...]
    tokenizer: str
    stats: list[PackageStats]
    exact_duplicates: int = 0
    near_duplicates: int = 0

    def summary(self) -> dict[str, Any]:
        """Files, usable problems, distinct oracles, and how many of those oracles are
        among TFv1's v1-only APIs (:func:`adaptrack.eval.tfv1.v1_only_apis`)."""
        from .tfv1 import v1_only_apis

        oracles = {p.api for p in self.problems}
        reasons: Counter[str] = Counter()
        for s in self.stats:
            reasons.update(s.reasons)
        return {"packages": len(self.packages),
                "python_files": sum(s.python_files for s in self.stats),
                "reasons": dict(reasons), "split": sum(s.split for s in self.stats),
                "too_long": sum(s.too_long for s in self.stats),
                "exact_duplicates": self.exact_duplicates,
                "near_duplicates": self.near_duplicates, "problems": len(self.problems),
                "oracles": len(oracles), "tfv1_oracles": len(oracles & set(v1_only_apis())),
                "licenses": dict(Counter(p.license for p in self.problems).most_common())}


def extract(requirement: str, path: str | Path, encode: Callable[[str], Sequence[int]],
            max_tokens: int = MAX_PROMPT_TOKENS) -> tuple[list[RealProblem], PackageStats]:
    """The problems of one downloaded distribution (before deduplication) and its stats."""
    name, version = requirement.split("==")
    files, metadata = read_dist(path)
    stats = PackageStats(requirement, Path(path).name, license_of(metadata), len(files))
    reasons: Counter[str] = Counter()
    out = []
    for inner, data in files.items():
        text = decoded_text(data)
        got = split(text) if text is not None else "unreadable"
        if isinstance(got, str):
            reasons[got] += 1
            continue
        stats.split += 1
        prompt, oracle = got
        tokens = len(encode(prompt))
        if tokens > max_tokens:
            stats.too_long += 1
            continue
        out.append(RealProblem(name, version, inner, stats.license, prompt, {"v2": oracle},
                               tokens))
    stats.reasons = dict(sorted(reasons.items()))
    return out, stats


def build(packages: Iterable[str], encode: Callable[[str], Sequence[int]], tokenizer: str,
          *, max_tokens: int = MAX_PROMPT_TOKENS, download: bool = True,
          use_cache: bool = True) -> ProblemSet:
    """The TFv1Real problems of ``packages`` for a tokenizer (``encode``, named by the
    string ``tokenizer``, which keys the cache): downloads each package (:func:`cached_dist`),
    applies the rules of the module docstring, and keeps the result as JSON in
    ``cache_dir() / "tfv1real"``, keyed by the package list, the tokenizer and the rules."""
    packages = tuple(packages)
    key = hashlib.sha256(json.dumps([RULES_VERSION, packages, tokenizer, max_tokens,
                                     NEAR_DUPLICATE]).encode()).hexdigest()[:16]
    where = cache_dir() / "tfv1real" / f"problems-{key}.json"
    if use_cache and where.is_file():
        try:
            return _load(where)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged cache file is rebuilt
    found: list[RealProblem] = []
    stats = []
    for requirement in packages:
        problems, s = extract(requirement, cached_dist(requirement, download), encode,
                              max_tokens)
        found += problems
        stats.append(s)
    order = {r.split("==")[0]: i for i, r in enumerate(packages)}
    found.sort(key=lambda p: (order[p.package], p.path))
    kept, exact, near = deduplicate(found)
    for s in stats:
        s.kept = sum(p.package == s.requirement.split("==")[0] for p in kept)
    built = ProblemSet(sorted(kept, key=lambda p: p.id), packages, tokenizer, stats, exact,
                       near)
    _save(built, where)
    return built


def model_tokenizer(model: str | None = None) -> tuple[str, Callable[[str], list[int]]]:
    """The tokenizer of a model as :func:`adaptrack.load_model` takes it (``None``: the
    default model), loaded without the weights: a name for it (the model and a hash of
    the tokenizer's definition, so a changed tokenizer gives a new build) and its
    ``encode``, which counts tokens as the transformers backend's ``encode`` does."""
    from ..errors import ModelLoadError
    from ..lm.default import default_gguf
    from ..lm.load import converted_gguf

    try:
        import transformers
    except ImportError:
        raise ModelLoadError("TFv1Real counts prompt tokens with the model's tokenizer, "
                             "which needs transformers: pip install 'adaptrack[hf]'") from None
    path = default_gguf() if model is None else Path(model).expanduser()
    source = str(converted_gguf(path)) if str(path).endswith(".gguf") else str(model)
    try:
        tok = transformers.AutoTokenizer.from_pretrained(source)
    except Exception as err:  # transformers raises many kinds; the message is what matters
        raise ModelLoadError(f"could not load the tokenizer of {model or 'the default model'}"
                             f" ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
                             ) from None
    backend = getattr(tok, "backend_tokenizer", None)
    definition = (backend.to_str() if backend is not None
                  else json.dumps(sorted(tok.get_vocab().items())))
    digest = hashlib.sha256(definition.encode()).hexdigest()[:12]
    return f"{model or 'default'}:{digest}", lambda text: list(tok.encode(text))


def _save(built: ProblemSet, where: Path) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    data = {"rules": RULES_VERSION, **asdict(built)}
    tmp = where.with_name(where.name + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    tmp.replace(where)


def _load(where: Path) -> ProblemSet:
    data = json.loads(where.read_text(encoding="utf-8"))
    problems = [RealProblem(**{**p, "duplicates": tuple(p["duplicates"])})
                for p in data["problems"]]
    return ProblemSet(problems, tuple(data["packages"]), data["tokenizer"],
                      [PackageStats(**s) for s in data["stats"]], data["exact_duplicates"],
                      data["near_duplicates"])


# -- the evaluation --------------------------------------------------------------------------


@dataclass
class TFv1RealTask(ApiTask):
    """TFv1Real (the paper's Table 2): per problem and method, one greedy completion and
    ``n`` sampled ones of the text after the ``tf`` of the problem's first v1-only call, in
    the v2 setting (every TF 2.16 name, API-name semantics), exact match against the
    oracle. Shares :class:`~adaptrack.eval.tfv1.ApiTask`'s jobs, records and sweeps; the
    header adds the package list and the tokenizer that built the problems. ``limit``
    takes the first problems of a fixed shuffled order (seed 0): a sample across packages.

    **Long prompts.** A prompt has up to 3 584 tokens, and each job's greedy and sampled
    ``generate`` calls are separate prefix trees. Jobs run in groups of one problem (all
    its methods and sweep values; ``group`` is that count unless set), and before a group
    is served its prompt goes to the model once (:meth:`prepare`): the backends keep the
    KV of what they evaluated and start each tree's root from it, so the prompt is
    evaluated once per problem instead of once per call (its time counts in the run's
    wall time, not in a job's ``seconds``).
    """

    packages: tuple[str, ...] = ()
    group: int = 0
    name = "tfv1real"
    _built: ProblemSet | None = field(default=None, init=False, repr=False, compare=False)
    _by_id: dict[str, RealProblem] | None = field(default=None, init=False, repr=False,
                                                   compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.packages = tuple(self.packages) or read_packages()
        for requirement in self.packages:
            if not isinstance(requirement, str) or not REQUIREMENT.fullmatch(requirement):
                raise ValueError(f"packages: each is name==version, got {requirement!r}")
        self.group = self.group or self.jobs_per_problem()

    def problem_set(self) -> ProblemSet:
        """The build for this task's packages and model (from the cache after the first)."""
        if self._built is None:
            name, encode = model_tokenizer(self.model)
            self._built = build(self.packages, encode, name)
        return self._built

    def problem_list(self) -> list[ApiProblem]:
        out: list[ApiProblem] = list(self.problem_set().problems)
        random.Random(0).shuffle(out)
        return out[:self.limit]

    def lookup(self, problem_id: str) -> ApiProblem:
        if self._by_id is None:
            self._by_id = {p.id: p for p in self.problem_set().problems}
        return self._by_id[problem_id]

    def jobs(self) -> list[Job]:
        """Problem-major, so that a group (:attr:`group`) is one problem's jobs."""
        return [j for p in self.problem_list() for t in self.temperatures
                for j in self._jobs_of(p, t)]

    def config(self) -> dict[str, object]:
        return {**super().config(), "packages": list(self.packages),
                "max_prompt_tokens": MAX_PROMPT_TOKENS,
                "tokenizer": self.problem_set().tokenizer}

    def prepare(self, prompts: list[str]) -> None:
        """Evaluate each prompt once, so that every call of the group starts from its KV."""
        for prompt in prompts:
            try:
                prefill(self.lm, [self.lm.encode(prompt)])
            except AdaptrackError:  # a prompt too long: each of its calls records the error
                pass


def _problems_line(header: dict[str, Any], records: list[Record]) -> str:
    """Where TFv1Real's problems come from, and how many oracles the constraint lacks."""
    packages = header.get("packages") or []
    text = (f"Problems from {len(packages)} PyPI packages, prompts of at most "
            f"{header.get('max_prompt_tokens')} tokens (tokenizer {header.get('tokenizer')}).")
    if header.get("tf_version", DEFAULT_VERSION) == DEFAULT_VERSION:  # shipped: no download
        names = set(setting_names("v2"))
        outside = {r["problem"] for r in records
                   if "v2" in r["oracle"] and r["oracle"]["v2"][1:] not in names}
        if outside:
            many = "problems call" if len(outside) != 1 else "problem calls"
            text += (f" {len(outside)} {many} a name that TensorFlow "
                     f"{DEFAULT_VERSION}'s API modules do not list (Keras-backed "
                     "`compat.v1.layers.*` and `compat.v1.keras.*`, methods of classes, "
                     "`estimator`): the constrained methods cannot match them.")
    return text


def _packages(path: str | None) -> tuple[str, ...]:
    """``--packages``: the requirements of a package list file (none: the default list)."""
    if path is None:
        return ()
    try:
        return read_packages(path)
    except ValueError as err:
        raise ValueError(f"--{err}") from None


def _report(header: dict[str, Any], records: list[Record], plots: Any = None) -> str:
    """Table 2 and Table 5 (:func:`~adaptrack.eval.apireport.api_report`), with where the
    problems come from."""
    return api_report(header, records, plots, about=_problems_line)


SPEC = TaskSpec(
    "tfv1real", help="paper Table 2: complete the first tf.compat.v1 call of real code",
    description="Per TFv1Real problem (a Python file of a pinned PyPI package, cut at its "
                "first tf.compat.v1 call; built on first use and cached) and method: one "
                "greedy and n sampled completions after the call's tf, in the v2 setting; "
                "EM@k against the call (paper Table 2).",
    options=api_options("run the first N problems (a fixed shuffled order)", packages=(
        Option(("--packages",), metavar="FILE", convert=_packages,
               help="the packages to build the problems from, one name==version a line "
                    "(default: the 36 of adaptrack/eval/data/tfv1real-packages.txt)"),)),
    model_options=model_options(temperature=None), task=TFv1RealTask,
    header={**API_HEADER, "packages": strings(), "max_prompt_tokens": POSITIVE,
            "tokenizer": STR},
    record=api_record, scores=tfv1_scores, report=_report)
"""The declaration of the TFv1Real task: its flags, header, records and report (Table 2)."""


if __name__ == "__main__":  # python -m adaptrack.eval.tfv1real [PACKAGES_FILE]: build, summarize
    tokenizer, encode_text = model_tokenizer()
    built = build(read_packages(sys.argv[1] if len(sys.argv) > 1 else None), encode_text,
                  tokenizer)
    for s in built.stats:
        print(f"{s.requirement:45} {s.python_files:5} files {s.split:4} split "
              f"{s.too_long:3} too long {s.kept:4} kept  {s.license}")
    print(json.dumps(built.summary(), indent=1))
