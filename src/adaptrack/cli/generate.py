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
from ..generate import (
    MAX_SECONDS,
    METHODS,
    GenerationResult,
    Sample,
    SearchFallbackWarning,
    generate,
)
from ..lm.load import BACKENDS, DEVICES, DTYPES, load_model
from ..sampling.tree import END_POLICIES
from .common import (
    UsageError,
    add_constraint_arguments,
    constraint_from_args,
    non_negative_float,
    non_negative_int,
    number,
    one_line,
    positive_int,
    probability,
    read_text,
    seconds,
    utf8_text,
)

HELP = "sample continuations of a prompt under a constraint"
DESCRIPTION = ("Sample continuations of a prompt, optionally constrained: choices, API names, "
               "a regex, a JSON schema or a grammar.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="SPEC",
                        help="a .gguf path, a Hugging Face model id or a local model directory "
                             "(default: the default model, see `adaptrack setup`)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="model backend (default: auto: llama.cpp for a .gguf when "
                             "installed)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="device (default: auto: CUDA when available)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto",
                        help="weight precision, transformers only (default: auto: float16 on "
                             "CUDA, float32 on a CPU; bfloat16 is about 1.9x faster on CPUs "
                             "with AVX-512 BF16 and samples a nearby model; float16 is slow on "
                             "a CPU)")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", type=utf8_text, help="the prompt text")
    prompt.add_argument("--prompt-file", metavar="PATH",
                        help="read the prompt from a file, used verbatim (a final newline "
                             "included); '-' reads stdin")
    parser.add_argument("--truncate-prompt", action="store_true",
                        help="when the prompt and --max-new-tokens exceed the model's context, "
                             "keep the prompt's last tokens (default: stop with an error)")
    add_constraint_arguments(parser)
    parser.add_argument("--method", choices=list(METHODS), default="adaptrack",
                        help="sampling method (default: adaptrack)")
    parser.add_argument("-n", type=positive_int, default=1,
                        help="number of samples (default: 1)")
    parser.add_argument("--temperature", type=non_negative_float, default=1.0, metavar="T",
                        help="sampling temperature; 0 is greedy (default: 1.0)")
    parser.add_argument("--top-p", type=probability, default=1.0, metavar="P",
                        help="nucleus sampling mass in (0, 1] (default: 1.0)")
    parser.add_argument("--seed", type=non_negative_int, metavar="INT",
                        help="random seed, >= 0 (the same seed, the same samples)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, metavar="N",
                        help="most tokens per sample (default: 64)")
    parser.add_argument("--max-seconds", type=seconds, metavar="S", default=argparse.SUPPRESS,
                        help=f"time budget of the search in seconds, 'inf' for none "
                             f"(default: {MAX_SECONDS:g}); past it the command stops with an "
                             "error after printing the finished samples")
    parser.add_argument("--end", choices=END_POLICIES, default="leave",
                        help="where a text the constraint accepts ends: 'leave', where the "
                             "model's next token cannot continue it (EOS or any token the "
                             "constraint rejects); 'eos', only at EOS, the AdapTrack paper's "
                             "target (default: leave)")
    parser.add_argument("--fallback", choices=("cd", "none"), default="cd",
                        help="when a search (asap, adaptrack, exact) runs past a budget: 'cd' "
                             "draws the missing samples by CD, marked 'fallback' (not the "
                             "method's distribution); 'none' stops with an error after "
                             "printing the finished samples (default: cd)")
    parser.add_argument("--no-fast-forward", action="store_true",
                        help="feed bytes the constraint forces token by token instead of as "
                             "their canonical tokens in one model call")
    parser.add_argument("--share-q", action="store_true",
                        help="share AdapTrack's learned valid-mass estimates across samples "
                             "(--method adaptrack only)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: samples, stats, model, method (and "
                             "error, when the run stopped early)")


def run(args: argparse.Namespace) -> int:
    if args.share_q and args.method != "adaptrack":
        raise UsageError("--share-q applies to --method adaptrack only")
    prompt = (args.prompt if args.prompt is not None
              else read_text(args.prompt_file, "prompt file", "--prompt-file"))
    constraint = constraint_from_args(args)
    # Passed only when given, so that the library's defaults apply otherwise.
    budget: dict[str, Any] = {}
    if args.truncate_prompt:
        budget["truncate_prompt"] = True
    if "max_seconds" in vars(args):
        budget["max_seconds"] = args.max_seconds
    lm = load_model(args.model, backend=args.backend, device=args.device, dtype=args.dtype)
    model = str(getattr(lm, "name", None) or args.model or "default")
    on_sample, close = _progress(args.n)
    try:
        with warnings.catch_warnings():  # the result printed says what the fallback drew
            warnings.simplefilter("ignore", SearchFallbackWarning)
            res = generate(lm, prompt, constraint, method=args.method, n=args.n,
                           temperature=args.temperature, top_p=args.top_p,
                           max_new_tokens=args.max_new_tokens, seed=args.seed,
                           share_q=args.share_q, on_sample=on_sample,
                           fast_forward=not args.no_fast_forward, end=args.end,
                           fallback=None if args.fallback == "none" else args.fallback,
                           **budget)
    except AdaptrackError as err:
        message = one_line(err) + _options_hint(err)
        partial = getattr(err, "partial", None)
        if not (isinstance(partial, GenerationResult) and partial.samples):
            raise UsageError(message) from None
        close()
        error = f"{type(err).__name__}: {message}"
        print_result(partial, model, args.method, args.json, sys.stdout, error=error)
        raise UsageError(f"{message} ({len(partial.samples)} of {args.n} samples "
                         "finished, printed on stdout)") from None
    finally:
        close()
    print_result(res, model, args.method, args.json, sys.stdout)
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
