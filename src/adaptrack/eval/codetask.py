"""What the code tasks (HumanEval, MBPP) share: problems, the constraint, checks and a job.

A :class:`CodeProblem` is a prompt the model continues, the code the completion continues
(``prefix``: the function's signature and docstring for HumanEval, nothing for MBPP, whose
completions are whole programs), the stop strings that end a completion, and the test code
run after it. A completion is the generated text cut at its first stop string (as the
Codex paper's sampling stops there); the program run in the sandbox
(:mod:`adaptrack.eval.sandbox`) is ``prefix + completion + "\\n" + tests``.

Per completion a job records: the sandbox's outcome (``pass``, ``fail``, ``timeout``,
``error``), whether ``prefix + completion`` parses (:func:`ast.parse`), and whether the
constraint (the python constraint with ``names=True``) accepts the completion: the "name
check". The constrained methods decode with that constraint, built by the task's
``constraint`` function (default :func:`python_constraint`).

>>> p = CodeProblem("t/0", "def f():\\n", "def f():\\n", ("\\ndef",), "assert f() == 1")
>>> cut_at_stop("    return 1\\ndef g(): pass", p.stop)
'    return 1'
>>> parses(p, "    return 1")
True
>>> run_completion(p, "    return 1", timeout=10, memory_bytes=2**30,
...                allow_unsandboxed=True).status
'pass'
"""

from __future__ import annotations

import ast
import hashlib
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import constraints
from ..constraints import DONE, Constraint, anything
from ..constraints.stop import cut_text
from ..errors import AdaptrackError
from ..tokenization.vocab import Vocabulary
from .jobs import Job, Record
from .modeltask import Call, ModelTask, check_methods, paper_options, seed_for
from .sandbox import Outcome, require_isolation, run_program

if TYPE_CHECKING:
    from ..generate import GenerationResult

#: The Codex paper's stop strings for HumanEval: a completion ends where top-level code
#: that is not the function's body begins.
STOP = ("\ndef", "\nclass", "\nif", "\nprint")
METHODS = ("unconstrained", "cd", "adaptrack", "exact")
#: The default budget of one problem's jobs, together (``CodeTask.max_seconds``).
MAX_SECONDS = 1800.0

ConstraintFactory = Callable[[str, tuple[str, ...]], Constraint]


@dataclass(frozen=True)
class CodeProblem:
    """One code problem (module docstring): ``task_id``, the model's ``prompt``, the
    ``prefix`` the completion continues, the ``stop`` strings and the ``tests``."""

    task_id: str
    prompt: str
    prefix: str
    stop: tuple[str, ...]
    tests: str

    def program(self, completion: str) -> str:
        """The program the sandbox runs for ``completion``."""
        return self.prefix + completion + "\n" + self.tests + "\n"


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """``text`` up to its first stop string (all of it when it holds none), by the rule the
    constraints end text with (:func:`adaptrack.constraints.stop.cut_text`)."""
    return cut_text(text, stop)


def parses(problem: CodeProblem, completion: str) -> bool:
    """Whether ``prefix + completion`` is a Python program (:func:`ast.parse`)."""
    try:
        # A SyntaxWarning (``"\\d"``, ``1if``) is about the untrusted program, not the harness:
        # printed, it would interleave with the progress bar.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(problem.prefix + completion)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the source
        return False
    return True


def python_constraint(prefix: str, stop: tuple[str, ...]) -> Constraint:
    """The python constraint for a completion of ``prefix``: every name it uses must be
    defined (``names=True``), and attribute chains of the standard library's modules and of
    those ``prefix`` imports must exist (``modules=None``; other modules' are not checked).
    :class:`~adaptrack.errors.AdaptrackError` when this installation has none."""
    make = getattr(constraints, "python", None)
    if make is None:
        raise AdaptrackError("adaptrack.constraints.python is missing from this installation, "
                             "so the constrained methods cannot run; use --methods "
                             "unconstrained")
    constraint: Constraint = make(prefix=prefix, names=True, modules=None, stop=stop)
    return constraint


def has_python_constraint() -> bool:
    return getattr(constraints, "python", None) is not None


# Every byte a token, and EOS: a constraint walked over text, one byte at a time.
_BYTES = Vocabulary([bytes([b]) for b in range(256)] + [None], eos_ids=[256])


def _walk(matcher: Any, data: bytes, eos: bool) -> bool:
    state = matcher.start()
    tokens = list(data) + ([256] if eos else [])
    for i, token in enumerate(tokens):
        state = matcher.advance(state, token)
        if state is None:
            return False
        if state is DONE:
            return i == len(tokens) - 1
    return False


def accepts_text(constraint: Constraint, text: str, stop: tuple[str, ...] = ()) -> bool:
    """Whether ``constraint`` accepts ``text`` as a whole output: ended by EOS, or by one of
    the ``stop`` strings (a constraint may end a completion where a stop string begins).

    >>> from adaptrack.constraints import choice
    >>> accepts_text(choice(["ab"]), "ab"), accepts_text(choice(["ab"]), "a")
    (True, False)
    """
    matcher = constraint.bind(_BYTES)
    data = text.encode("utf-8")
    return (_walk(matcher, data, eos=True)
            or any(_walk(matcher, data + s.encode("utf-8"), eos=False) for s in stop))


def run_completion(problem: CodeProblem, completion: str, *, timeout: float,
                   memory_bytes: int, allow_unsandboxed: bool = False) -> Outcome:
    """The sandbox's outcome of ``completion``'s program
    (:func:`~adaptrack.eval.sandbox.run_program`)."""
    return run_program(problem.program(completion), timeout=timeout, memory_bytes=memory_bytes,
                       allow_unsandboxed=allow_unsandboxed)


@dataclass
class CodeTask(ModelTask):
    """A code benchmark run (subclasses give the problems and the header): per problem and
    method, one greedy completion (pass@1) and ``n`` sampled ones (pass@k by eq. 5), each
    executed in the sandbox.

    One job's record: ``problem``, ``method``, ``greedy`` (one completion) and ``samples``
    (``n``), each completion an object ``{"text", "status", "detail", "parses", "names"}``
    (``names``: the name check, ``null`` without the python constraint); ``lm_requests``
    (per sample), ``lm_calls``, ``backtracks``, ``incomplete``, ``seconds`` (generation),
    ``exec_seconds`` and ``isolated`` (whether the programs ran in the sandbox); or ``error``
    (an :class:`~adaptrack.errors.AdaptrackError` of generation, scored as a miss).
    """

    model: str | None = None
    backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    methods: tuple[str, ...] = METHODS
    n: int = 10
    limit: int | None = None
    temperature: float = 1.0
    #: The constraint is lazy (each candidate token costs a parse), so the nucleus's cut
    #: (docs/design.md §2) bounds the checks per step; with top_p=1 every token of the
    #: vocabulary is checked at every step.
    top_p: float = 0.95
    max_new_tokens: int = 256
    seed: int = 0
    #: The search budget of each generate call (None: none), counted from the start of the
    #: group of jobs it runs with (``group``: its problem's): past it the job records a
    #: SearchTimeoutError, scored as a miss. Shared by the problem's methods: on a 2-core
    #: CPU the default model's four methods at n = 20 take 5 to 15 minutes together.
    max_seconds: float | None = MAX_SECONDS
    #: A completion that reaches ``max_new_tokens`` is cut there and scored, as the Codex
    #: paper's sampling cuts it, for every method: the searching methods then sample the
    #: same length distribution as unconstrained sampling (``generate``'s
    #: ``allow_truncated``). False makes them sample only completions that end in time, a
    #: search that a small model, which rarely stops early, can spend minutes on.
    allow_truncated: bool = True
    #: Sandbox limits per program: wall seconds and address-space bytes.
    timeout: float = 10.0
    memory_bytes: int = 2**30
    #: Run the programs without isolation where bubblewrap is unavailable (as the
    #: harness's user, with its files and network) instead of refusing to start
    #: (:class:`~adaptrack.errors.SandboxUnavailableError`); ``--unsafe-run-code``.
    allow_unsandboxed: bool = False
    #: Builds the constrained methods' constraint from (prefix, stop); a module-level
    #: function, so that the task pickles to worker processes.
    constraint: ConstraintFactory | None = None
    #: Programs run at once (each in its own process); jobs a worker runs together, and
    #: prefixes per model call. None changes a record, so none is in the header.
    exec_workers: int = 2
    #: Jobs served by one engine (None: one problem's, all its methods). Every walk in
    #: flight shares each model call, so a job's budget runs while the others run too.
    group: int | None = None
    batch_size: int = 32

    def __post_init__(self) -> None:
        check_methods(self.methods)
        if self.group is None:
            self.group = len(self.methods)
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("n and max_new_tokens must be at least 1")
        if not self.temperature > 0:
            raise ValueError("the samples need temperature > 0 (pass@1 is greedy already); "
                             f"got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0 or None (no limit), got {self.max_seconds}")
        if not self.timeout > 0 or self.memory_bytes < 2**24:
            raise ValueError(f"timeout must be > 0 and memory_bytes at least 16 MiB, got "
                             f"{self.timeout} and {self.memory_bytes}")
        # Before any model work: a run that could not execute its completions is refused.
        require_isolation(self.allow_unsandboxed)
        constrained = [m for m in self.methods if m != "unconstrained"]
        if constrained and self.constraint is None and not has_python_constraint():
            raise ValueError(f"method {constrained[0]!r} decodes with "
                             "adaptrack.constraints.python, which this installation lacks; "
                             "pass --methods unconstrained")

    # -- what subclasses give ----------------------------------------------------------

    name = "code"

    def problems(self) -> list[CodeProblem]:
        raise NotImplementedError

    def data_config(self) -> dict[str, Any]:
        return {}

    # -- the Task protocol --------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {"task": self.name, **self.model_config(), "n": self.n,
                "temperature": self.temperature, "top_p": self.top_p,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                "max_seconds": self.max_seconds, "allow_truncated": self.allow_truncated,
                "timeout": self.timeout,
                "memory_bytes": self.memory_bytes,
                **self.data_config()}

    def jobs(self) -> list[Job]:
        return [{"key": f"{p.task_id}|{m}", "problem": p.task_id, "method": m}
                for p in self.problems()[:self.limit] for m in self.methods]

    def run(self, job: Job) -> Record:
        return self.run_many([job])[0]

    def group_key(self, job: Job) -> str:
        """Jobs served together are one problem's (its budget is theirs alone)."""
        return str(job["problem"])

    def _constraint(self, problem: CodeProblem) -> Constraint:
        make = self.constraint or python_constraint
        return make(problem.prefix, problem.stop)

    def run_many(self, jobs: list[Job]) -> list[Record]:
        """The records of ``jobs``, in order (:meth:`run_each`)."""
        return list(self.run_each(jobs))

    def run_each(self, jobs: list[Job]) -> Iterator[Record]:
        """The records of ``jobs``, in order, each as soon as it is scored: their greedy
        and sampled ``generate`` calls share one engine; then every completion runs in the
        sandbox."""
        by_id = {p.task_id: p for p in self.problems()}
        calls = []
        for job in jobs:
            p, method = by_id[job["problem"]], job["method"]
            # Free text ends at the stop strings too: the same completions, cut as they are
            # written instead of after max_new_tokens.
            constraint = (anything(stop=p.stop) if method == "unconstrained"
                          else self._constraint(p))
            calls.append(({"key": job["key"], "problem": p.task_id, "method": method},
                          Call(p.prompt, constraint, paper_options(
                              method=method, max_new_tokens=self.max_new_tokens,
                              top_p=self.top_p, max_seconds=self.max_seconds,
                              allow_truncated=self.allow_truncated,
                              seed=seed_for(self.seed, p.task_id, method)))))

        def finish(head: Record, greedy: GenerationResult, sampled: GenerationResult) -> Record:
            return {**head, "texts": [greedy.samples[0].text, *sampled.texts],
                    "lm_requests": [s.lm_requests for s in sampled.samples],
                    "lm_calls": sampled.stats["lm_calls"],
                    "backtracks": sampled.stats["backtracks"],
                    "incomplete": sampled.stats["incomplete"],
                    "seconds": max(greedy.stats["seconds"], sampled.stats["seconds"])}

        records = self.greedy_and_sampled(calls, self.n, self.temperature, self.batch_size,
                                          finish)
        # Scored after the whole group's generation: a program's run time is not taken
        # from the other jobs' search budgets.
        for r in records:
            yield self._score(by_id[r["problem"]], r) if "texts" in r else r

    def _score(self, problem: CodeProblem, record: Record) -> Record:
        """``record`` with its completions cut, checked and executed (programs in parallel
        processes, each program once however often it was sampled)."""
        import time

        texts = record.pop("texts")
        completions = [cut_at_stop(t, problem.stop) for t in texts]
        names_of: Callable[[str], bool | None]
        if self.constraint is not None or has_python_constraint():
            constraint = self._constraint(problem)
            names_of = lambda c: accepts_text(constraint, c, problem.stop)  # noqa: E731
        else:
            names_of = lambda c: None  # noqa: E731
        started = time.perf_counter()
        unique = list(dict.fromkeys(completions))
        with ThreadPoolExecutor(max(1, self.exec_workers)) as pool:
            outcomes = dict(zip(unique, pool.map(
                lambda c: run_completion(problem, c, timeout=self.timeout,
                                         memory_bytes=self.memory_bytes,
                                         allow_unsandboxed=self.allow_unsandboxed), unique),
                strict=True))
        checked = {c: (parses(problem, c), names_of(c)) for c in unique}
        rows = [{"text": c, "status": outcomes[c].status, "detail": outcomes[c].detail,
                 "parses": checked[c][0], "names": checked[c][1]} for c in completions]
        return {**record, "greedy": rows[0], "samples": rows[1:],
                "exec_seconds": time.perf_counter() - started,
                "isolated": all(o.isolated for o in outcomes.values())}


def file_digest(data: bytes) -> str:
    """The first 16 hex digits of ``data``'s SHA-256 (a data file's identity in headers)."""
    return hashlib.sha256(data).hexdigest()[:16]


__all__ = ["METHODS", "STOP", "CodeProblem", "CodeTask", "accepts_text", "cut_at_stop",
           "parses", "python_constraint", "run_completion"]
