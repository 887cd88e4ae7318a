"""``adaptrack generate``: sample continuations of a prompt under a constraint.

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_arguments(parser)
>>> args = parser.parse_args(["--prompt", "x", "-n", "3", "--max-seconds", "5"])
>>> args.n, args.method, args.max_seconds, args.truncate_prompt
(3, 'adaptrack', 5.0, False)
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from typing import Any, TextIO

from ..errors import AdaptrackError, PromptTooLongError, SearchTimeoutError
from ..generate import GenerationResult, Sample, SearchFallbackWarning, generate
from ..limits import prompt_byte_limit
from ..lm.load import load_model
from .common import (
    UsageError,
    add_constraint_arguments,
    add_sampling_arguments,
    constraint_from_args,
    number,
    one_line,
    sampling_options,
    utf8_text,
)
from .model import add_model_arguments
from .prompt import open_prompt, read_prompt

HELP = "sample continuations of a prompt under a constraint"
DESCRIPTION = ("Sample continuations of a prompt, optionally constrained: choices, API names, "
               "a regex, a JSON schema or a grammar.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", type=utf8_text, help="the prompt text")
    prompt.add_argument("--prompt-file", metavar="PATH",
                        help="read the prompt from a file, used verbatim (a final newline "
                             "included); '-' reads stdin")
    add_constraint_arguments(parser)
    add_sampling_arguments(parser)
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: samples, stats, model, method (and "
                             "error, when the run stopped early)")


def run(args: argparse.Namespace) -> int:
    """Generate; with ``--json`` an error before any sample is printed as one JSON object
    too (``samples`` empty), so that stdout always holds the JSON it promised."""
    try:
        return _run(args)
    except _Printed:
        raise
    except (UsageError, AdaptrackError, ValueError) as err:
        if args.json:
            print(json.dumps({"samples": [], "stats": {}, "model": args.model or "default",
                              "method": args.method,
                              "error": f"{getattr(err, 'kind', type(err).__name__)}: "
                                       f"{one_line(err)}"},
                             ensure_ascii=False))
        raise


class _Printed(UsageError):
    """An error after some samples, which are already printed (with the error)."""


class _Failed(UsageError):
    """The library's error before any sample, as a usage error that keeps its kind."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _run(args: argparse.Namespace) -> int:
    options = sampling_options(args)
    source = None if args.prompt is not None else open_prompt(args.prompt_file)
    try:
        constraint = constraint_from_args(args)
        lm = load_model(args.model, backend=args.backend, device=args.device,
                        dtype=args.dtype)
    except BaseException:
        if source is not None and args.prompt_file != "-":
            source.close()
        raise
    prompt = args.prompt if source is None else read_prompt(
        source, args.prompt_file, prompt_byte_limit(lm, options.max_new_tokens),
        options.truncate_prompt)
    model = str(getattr(lm, "name", None) or args.model or "default")
    on_sample, close = _progress(options.n)
    try:
        with warnings.catch_warnings():  # the result printed says what the fallback drew
            warnings.simplefilter("ignore", SearchFallbackWarning)
            res = generate(lm, prompt, constraint, on_sample=on_sample, options=options)
    except AdaptrackError as err:
        message = one_line(err) + _options_hint(err)
        partial = getattr(err, "partial", None)
        if not (isinstance(partial, GenerationResult) and partial.samples):
            raise _Failed(message, type(err).__name__) from None
        close()
        error = f"{type(err).__name__}: {message}"
        print_result(partial, model, options.method, args.json, sys.stdout, error=error)
        raise _Printed(f"{message} ({len(partial.samples)} of {options.n} samples "
                       "finished, printed on stdout)") from None
    finally:
        close()
    print_result(res, model, options.method, args.json, sys.stdout)
    return 0


def _options_hint(err: AdaptrackError) -> str:
    """The options that carry the library's advice (which names keyword arguments)."""
    if isinstance(err, PromptTooLongError):
        return " (options: --truncate-prompt, --max-new-tokens)"
    if isinstance(err, SearchTimeoutError):
        return " (options: --max-seconds, 'inf' for no limit; -n; --max-new-tokens)"
    return ""


def _progress(n: int) -> tuple[Callable[[Sample], None] | None, Callable[[], None]]:
    """An ``on_sample`` callback drawing a progress bar on stderr, and a closer (safe to
    call twice)."""
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
                count[0] = 0

        return tick, close
    bar = tqdm(total=n, unit="sample", file=sys.stderr, leave=False)
    return (lambda _: bar.update()), bar.close


def print_result(res: GenerationResult, model: str, method: str, as_json: bool,
                 out: TextIO, error: str | None = None) -> None:
    """Print samples and stats as text, or as one JSON object (with ``error`` when the run
    stopped early after ``res``'s samples)."""
    if as_json:
        doc: dict[str, Any] = {
            "samples": [
                {"text": s.text, "tokens": [int(t) for t in s.tokens],
                 "complete": bool(s.complete), "valid": bool(s.valid),
                 "logprob": number(s.logprob), "lm_requests": int(s.lm_requests),
                 "fallback": bool(s.fallback)}
                for s in res.samples
            ],
            "stats": {k: number(v) for k, v in res.stats.items()},
            "model": model,
            "method": method,
        }
        if res.fallback is not None:
            doc["fallback"] = res.fallback
        if error is not None:
            doc["error"] = error
        print(json.dumps(doc, ensure_ascii=False), file=out)
        return
    n = len(res.samples)
    for i, s in enumerate(res.samples, 1):
        flags = ("complete" if s.complete else "incomplete") + ", " + (
            "valid" if s.valid else "invalid") + (", drawn by the CD fallback" if s.fallback
                                                  else "")
        print(f"=== sample {i}/{n}: {flags}, logprob {s.logprob:.4f}, {len(s.tokens)} tokens, "
              f"{s.lm_requests} lm requests ===", file=out)
        print(s.text, file=out)
    stats = " ".join(
        f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.stats.items()
    )
    print(f"=== {method} on {model}: {stats}", file=out)
    if res.fallback is not None:
        print(f"=== fallback: {res.fallback}", file=out)
