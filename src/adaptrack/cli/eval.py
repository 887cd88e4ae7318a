"""``adaptrack eval``: run an evaluation of the paper (TFv1, TFv1Real, binary, the DSL
benchmarks, HumanEval, MBPP) into a resumable JSONL results file."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..eval import registry
from ..eval.pools import POOLS
from ..eval.taskspec import Sampling, TaskOption
from .common import PARSERS, Parser, UsageError, add_sampling_argument, names, positive_int

HELP = ("run an evaluation (TFv1, TFv1Real, binary, DSL; HumanEval and MBPP code "
        "generation)")
DESCRIPTION = ("Run an evaluation into a JSONL results file; an interrupted run resumes "
               "where it stopped.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One subcommand per registered task, its flags made from its options
    (docs/design.md §4, ``eval/``), around the results file's and the pool's."""
    sub = parser.add_subparsers(dest="eval", required=True, parser_class=Parser)
    for spec in registry.TASKS.values():
        task = sub.add_parser(spec.name, help=spec.help, description=spec.description)
        for option in spec.options:
            add_option(task, option)
        task.add_argument("-o", "--out", metavar="FILE", required=True,
                          help="the JSONL results file (appended to when it exists)")
        for option in spec.model_options:
            add_option(task, option)
        _add_run_arguments(task)


def add_option(parser: argparse.ArgumentParser, option: TaskOption) -> None:
    """The flag of one task option: a sampling option's as ``generate`` has it, with the
    task's default and help (:class:`~adaptrack.eval.taskspec.Sampling`), or one of the
    task's own (:class:`~adaptrack.eval.taskspec.Option`)."""
    if isinstance(option, Sampling):
        add_sampling_argument(parser, option.name, option.flag, option.default, option.help)
        return
    if option.flag:
        parser.add_argument(*option.flags, action="store_true", help=option.help)
        return
    kind: Any = option.type
    if option.names is not None:
        kind = names(option.names)
    elif isinstance(kind, str):
        kind = PARSERS[kind]
    parser.add_argument(*option.flags, type=kind, default=option.default,
                        metavar=option.metavar, choices=option.choices,
                        required=option.required, help=option.help)


def _add_run_arguments(task: argparse.ArgumentParser) -> None:
    """Where and how a task's jobs run, and whether the report follows."""
    task.add_argument("--workers", type=positive_int, default=1, metavar="N",
                      help="worker processes (--pool local) or Ray actors (--pool ray), "
                           "each loading the model (default: 1)")
    task.add_argument("--pool", choices=POOLS, default="local",
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

    spec = registry.spec(args.eval)
    if spec is None:  # unregistered after the parser was built
        raise UsageError(f"unknown evaluation {args.eval!r}")
    task = spec.build(vars(args))
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
