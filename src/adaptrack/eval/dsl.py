"""The DSL benchmarks of the AdapTrack paper's RQ4 (Table 4, Figure 4), taken from ASAp
(Grammar-Aligned Decoding): SLIA (SyGuS string programs), INV-BV (SyGuS bit-vector
invariants), CP (constituency parses) and binary (five random bits).

The data is a directory of one JSONL file per dataset (``slia.jsonl``, ``invbv.jsonl``,
``cp.jsonl``, ``binary.jsonl``; nothing is shipped or downloaded), one problem a line:
``id``, ``prompt`` (the exact text the model sees), ``grammar`` (transformers-CFG EBNF, read
by :func:`adaptrack.constraints.ebnf`) and ``start_symbol``. This project's checkout has it
at :data:`DOCUMENTED_PLACE`.

As the paper runs it: the prompt tokenized without special tokens, temperature 1, top_p 1,
the *eos* end policy (a sample is a grammar string the model ends with EOS; the target is
P(s | c) ∝ P_LM(s) on the grammar's language), AdapTrack with ``share_q`` (and ASAp, which
always shares), ``n`` samples per problem and method drawn in one
:func:`adaptrack.generate` call, in the order recorded (Figure 4's sliding windows read
that order). A prompt longer than the model's context keeps its end (``truncate_prompt``;
the record says how many tokens it kept). A problem whose language is small enough to
enumerate (:data:`ENUMERABLE`: binary's 17 strings) also gets a ``target`` job, the exact
P(s | c) by :func:`adaptrack.exact_distribution`, for a KL with no unknown offset.

Jobs are ``<problem id>/<method>`` (and ``<problem id>/target``); the dataset selection and
``--limit`` pick jobs, not results, so a run over more problems resumes a smaller one.

>>> sorted(DATASETS), METHODS
(['binary', 'cp', 'invbv', 'slia'], ('unconstrained', 'cd', 'asap', 'adaptrack', 'exact'))
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import AdaptrackError
from ..limits import loads
from ..options import SamplingOptions
from . import checks
from .checks import INT, NUMBER, POSITIVE, STAMPS, STR, TARGET, TOKEN_SAMPLES, fields
from .codetask import file_digest
from .dslreport import dsl_report, dsl_scores
from .jobs import Job, Record
from .modeltask import ModelTask, check_methods, check_study, paper_options, seed_for
from .taskspec import Option, Sampling, TaskSpec, methods_option, model_options

#: Dataset file stems and the names the paper's Table 4 gives them, in its column order.
DATASETS = {"slia": "SLIA", "invbv": "INV-BV", "cp": "CP", "binary": "binary"}
METHODS = ("unconstrained", "cd", "asap", "adaptrack", "exact")
#: Where to look when no directory is given: the shared data of this project's checkout.
DOCUMENTED_PLACE = "../shared/data/dsl"
#: The paper's (and ASAp's) budget.
MAX_NEW_TOKENS = 512
#: Datasets whose languages are enumerated for an exact target (binary: 17 strings).
ENUMERABLE = ("binary",)
#: One method's samples make one results line, which must stay under the runner's 64 MiB.
MAX_N = 20_000


class DslDataError(AdaptrackError):
    """A DSL data directory that cannot be read or is not in the expected format."""


@dataclass(frozen=True)
class DslProblem:
    """One problem: its dataset (a key of :data:`DATASETS`), prompt and grammar."""

    id: str
    dataset: str
    prompt: str
    grammar: str
    start: str = "root"


@cache
def _read(path: str) -> tuple[bytes, tuple[DslProblem, ...]]:
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as err:
        raise DslDataError(f"cannot read DSL data file {path!r}: {err.strerror or err} (pass "
                           f"the directory of slia.jsonl, invbv.jsonl, cp.jsonl and "
                           f"binary.jsonl with --data)") from None
    out = []
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = loads(line, f"{path} line {number}")
            out.append(DslProblem(str(r["id"]), file.stem, str(r["prompt"]),
                                  str(r["grammar"]), str(r.get("start_symbol", "root"))))
        except (ValueError, KeyError, TypeError) as err:  # JSONDepthError included
            raise DslDataError(f"{path} line {number} is not a DSL problem record (id, "
                               f"prompt, grammar): {type(err).__name__}: {err}") from None
    return data, tuple(out)


def problems(data: str, datasets: tuple[str, ...] = tuple(DATASETS),
             limit: int | None = None) -> list[DslProblem]:
    """The problems of ``datasets`` in ``data`` (a directory), the first ``limit`` of each."""
    out: list[DslProblem] = []
    for name in datasets:
        out += _read(str(Path(data) / f"{name}.jsonl"))[1][:limit]
    return out


def data_digest(data: str) -> str:
    """The identity of the four files (a results header holds it, so a resumed run samples
    the same prompts and grammars)."""
    return file_digest(b"".join(_read(str(Path(data) / f"{name}.jsonl"))[0]
                                for name in DATASETS))


def prompt_ids(lm: Any, text: str) -> list[int]:
    """``text``'s token ids without special tokens (as the paper tokenizes its prompts): a
    BOS the tokenizer puts in front, a token without bytes, is dropped."""
    ids = list(lm.encode(text))
    while ids and not lm.vocab.bytes_of(ids[0]):
        ids.pop(0)
    return ids


@dataclass
class DslTask(ModelTask):
    """RQ4's DSL problems on a model. The backend defaults to transformers in float32, as
    for the binary study (eval/binary.py): the KL reads sequence log-probs, which must not
    change with the prefix tree that computed them.

    Records, per problem and method: ``problem``, ``dataset``, ``method``, ``samples``
    (token lists in the order drawn), ``texts``, ``logprobs`` (log P_LM(s | prompt) at the
    temperature), ``complete``, ``valid``, ``lm_requests``, ``lm_calls``, ``backtracks``,
    ``prompt_tokens``, ``seconds``; a job that raised an :class:`AdaptrackError` (a search
    limit) keeps ``error`` instead. Target jobs: ``target`` ([tokens, probability, text]
    rows).
    """

    model: str | None = None
    backend: str = "transformers"
    device: str = "auto"
    methods: tuple[str, ...] = METHODS
    datasets: tuple[str, ...] = tuple(DATASETS)
    n: int = 2000
    limit: int | None = None
    #: Problem ids to run (of the selected datasets); None: all.
    problem_ids: tuple[str, ...] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = MAX_NEW_TOKENS
    max_seconds: float | None = None
    seed: int = 0
    data: str = DOCUMENTED_PLACE

    def __post_init__(self) -> None:
        check_methods(self.methods)
        bad = [d for d in self.datasets if d not in DATASETS]
        if bad or not self.datasets:
            raise ValueError(f"unknown dataset {bad[0]!r}; choose from {', '.join(DATASETS)}"
                             if bad else "give at least one dataset")
        check_study("DSL", self.n, MAX_N, self.temperature)

    def weights_dtype(self) -> str:
        """float32 on transformers, whatever the device (see the class doc)."""
        return "float32" if self.backend == "transformers" else "auto"

    def config(self) -> dict[str, object]:
        return {"task": "dsl", **self.model_config(), "n": self.n,
                "temperature": self.temperature, "top_p": self.top_p,
                "max_new_tokens": self.max_new_tokens, "max_seconds": self.max_seconds,
                "seed": self.seed, "data": data_digest(self.data)}

    def problems(self) -> list[DslProblem]:
        found = problems(self.data, self.datasets, self.limit)
        if self.problem_ids is None:
            return found
        missing = set(self.problem_ids) - {p.id for p in found}
        if missing:
            raise ValueError(f"no problem {sorted(missing)[0]!r} among the selected ones "
                             f"({', '.join(self.datasets)}"
                             f"{f', first {self.limit} each' if self.limit else ''})")
        return [p for p in found if p.id in self.problem_ids]

    def jobs(self) -> list[Job]:
        out: list[Job] = []
        for p in self.problems():
            head = {"problem": p.id, "dataset": p.dataset}
            if p.dataset in ENUMERABLE:
                out.append({"key": f"{p.id}/target", **head, "method": "target"})
            out += [{"key": f"{p.id}/{m}", **head, "method": m} for m in self.methods]
        return out

    def options(self, problem: str, method: str) -> SamplingOptions:
        """The options of this task's ``generate`` call for ``method`` (for ``"target"``,
        ``exact_distribution``'s, which reads those that apply): the one place they are
        set."""
        return paper_options(
            **({} if method == "target" else {"method": method}), n=self.n,
            temperature=self.temperature, top_p=self.top_p,
            max_new_tokens=self.max_new_tokens, max_seconds=self.max_seconds,
            truncate_prompt=True, seed=seed_for(self.seed, problem, method),
            share_q=method == "adaptrack")

    def run(self, job: Job) -> Record:
        from ..constraints import ebnf
        from ..generate import exact_distribution, generate

        started = time.perf_counter()
        problem = next(p for p in problems(self.data, (job["dataset"],))
                       if p.id == job["problem"])
        head = {"key": job["key"], "problem": problem.id, "dataset": problem.dataset,
                "method": job["method"]}
        constraint = ebnf(problem.grammar, problem.start)
        ids = prompt_ids(self.lm, problem.prompt)
        options = self.options(problem.id, job["method"])
        try:
            if job["method"] == "target":
                dist = exact_distribution(self.lm, ids, constraint, options=options)
                decode = self.lm.vocab.decode
                rows = [[list(s), p, decode(s).decode("utf-8", "replace")]
                        for s, p in sorted(dist.items(), key=lambda kv: -kv[1])]
                return {**head, "target": rows, "seconds": time.perf_counter() - started}
            res = generate(self.lm, ids, constraint, options=options)
        except AdaptrackError as err:
            return {**head, "error": f"{type(err).__name__}: {err}",
                    "seconds": time.perf_counter() - started}
        return {
            **head, **({"share_q": True} if options.share_q else {}),
            "samples": [list(s.tokens) for s in res.samples],
            "texts": res.texts,
            "logprobs": [s.logprob for s in res.samples],
            "complete": [s.complete for s in res.samples],
            "valid": [s.valid for s in res.samples],
            "lm_requests": [s.lm_requests for s in res.samples],
            "lm_calls": res.stats["lm_calls"],
            "backtracks": res.stats.get("backtracks", 0),
            "prompt_tokens": res.stats.get("prompt_tokens", len(ids)),
            "seconds": time.perf_counter() - started,
        }


# -- the declaration: options, record --------------------------------------------------------


def dsl_record(r: Record) -> str | None:
    """What is wrong with a DSL record (:class:`DslTask`), or None.

    >>> dsl_record({"key": "p/cd", "problem": "p", "dataset": "cp", "method": "cd",
    ...             "error": "SearchTimeoutError: ..."}) is None
    True
    """
    wrong = fields(r, {"problem": STR, "dataset": STR, "method": STR},
                   {**STAMPS, "seconds": NUMBER})
    if wrong or "error" in r:  # a job that raised keeps its error and no results
        return wrong or fields(r, {"error": STR})
    if r["method"] == "target":
        return fields(r, {"target": TARGET})
    complete = (checks.list_of(lambda x: isinstance(x, bool)), "a non-empty list of booleans")
    return (fields(r, TOKEN_SAMPLES, {"complete": complete})
            or checks.samples_match(r, "logprobs"))


def parse_ids(text: str) -> tuple[str, ...]:
    """``--problems``: comma-separated problem ids, in order, without repeats.

    >>> parse_ids("a, b,a")
    ('a', 'b')
    """
    return tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))


SPEC = TaskSpec(
    "dsl", help="paper RQ4: SLIA, INV-BV, CP and binary grammars, KL to the model",
    description="Per DSL problem (the ASAp benchmarks: a prompt and a transformers-CFG EBNF "
                "grammar) and method: n samples in one call, as the paper runs them (prompt "
                "without special tokens, top_p 1, samples end with EOS, AdapTrack with "
                "share_q); the report gives Table 4's KL(Q || P_LM) and Figure 4's "
                "sliding-window KL.",
    options=(
        methods_option(METHODS),
        Option(("--datasets",), names=tuple(DATASETS), metavar="D,D",
               default=",".join(DATASETS),
               help=f"datasets to run (default: {','.join(DATASETS)})"),
        Sampling("n", 2000, note="per problem and method, as in the paper"),
        Option(("--limit",), type="count", metavar="N",
               help="run the first N problems of each dataset"),
        Option(("--problems",), metavar="ID,ID", type=parse_ids, keyword="problem_ids",
               help="run only these problem ids (default: all of the datasets)"),
        Sampling("max_new_tokens", MAX_NEW_TOKENS, note="as in the paper"),
        Sampling("max_seconds", None, note="a job past it is recorded as an error and "
                                           "left out of the report"),
        Option(("--data",), metavar="DIR", default=DOCUMENTED_PLACE,
               help="the directory of slia.jsonl, invbv.jsonl, cp.jsonl and binary.jsonl "
                    f"(default: {DOCUMENTED_PLACE})")),
    # float32 on every device, as for the binary study (DslTask), so no --dtype
    model_options=model_options(backend="transformers", dtype=False), task=DslTask,
    header={"model": STR, "backend": STR, "device": STR, "n": POSITIVE,
            "temperature": NUMBER, "top_p": NUMBER, "max_new_tokens": POSITIVE,
            "max_seconds": checks.optional_number(), "seed": INT, "data": STR},
    record=dsl_record, scores=dsl_scores, report=dsl_report)
"""The declaration of the DSL task: its flags, header, records and report (Table 4)."""


__all__ = ["DATASETS", "METHODS", "SPEC", "DslProblem", "DslTask", "data_digest", "dsl_record",
           "parse_ids", "problems", "prompt_ids"]
