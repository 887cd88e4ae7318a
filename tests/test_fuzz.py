"""Fuzz: random inputs end in a result or a named one-line error, never a traceback or a hang.

The error contract (``adaptrack/errors.py``, docs/design.md §6): bad arguments raise
``TypeError``/``ValueError`` on purpose (a ``raise`` in adaptrack's own code), every other
failure a named ``AdaptrackError``, each with a non-empty one-line message; the command line
exits 0, or 2 with ``adaptrack: error: ...`` as the last line of stderr and no traceback.

Cases come from a seeded ``random.Random`` per case (a fixed range of seeds), so every
failure prints the seed and the full input that reproduces it, and the test lists every
distinct failure at once rather than the first. Problem sizes are small (vocabularies of at
most 6 tokens, ``max_new_tokens`` at most 5 unless a time budget bounds the call), and a
watchdog thread turns a case that runs past ``CASE_SECONDS`` into a failure (a hang).

The command-line cases run ``adaptrack.cli.main`` in this process with the model loader
replaced by a toy byte-level model: nothing loads a real model, and a case that would load
one from disk is skipped.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import adaptrack
from adaptrack import METHODS, AdaptrackError, FastForward, GenerationResult, TableLM, constraints

SRC = os.path.dirname(os.path.abspath(adaptrack.__file__))
CASE_SECONDS = 20.0  # per case; the cases take milliseconds, a few take a second
API_SEEDS = range(1500)
CLI_SEEDS = range(400)

#: Defects the fuzz found that are not fixed yet: the regression case that pins each one
#: (``test_regression``, xfail strict) and the fuzz signatures it shows up as. The fuzz
#: tolerates these signatures so that it keeps looking for new defects; delete an entry when
#: its fix lands (its case then passes, and the xfail marker comes off with it).
OPEN_DEFECTS: dict[str, tuple[str, ...]] = {
}
KNOWN = {sig: name for name, sigs in OPEN_DEFECTS.items() for sig in sigs}


# ------------------------------------------------------------------------------ watchdog


class Hang(BaseException):
    """A case ran past its time bound (a BaseException: library code cannot swallow it)."""


@contextlib.contextmanager
def watchdog(seconds: float = CASE_SECONDS) -> Iterator[None]:
    """Raise :class:`Hang` in the main thread after ``seconds``.

    A timer thread sends SIGUSR1 to the main thread (``pthread_kill``): a real signal, so it
    also interrupts ``time.sleep``, and it is independent of the SIGALRM timer that
    ``predicate`` uses for its own check timeouts.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "pthread_kill"
    ):
        yield
        return
    fired = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if fired.is_set():
            raise Hang(f"the case ran past {seconds} s")

    main = threading.main_thread().ident
    assert main is not None

    def fire() -> None:
        fired.set()
        signal.pthread_kill(main, signal.SIGUSR1)

    old = signal.signal(signal.SIGUSR1, on_signal)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, old)


# ------------------------------------------------------------------------- verdicts


class UserBoom(Exception):
    """Raised by the fuzz's own callbacks (a predicate that raises): passing it through
    unchanged is the expected behavior for an exception from user code."""


def _frames(err: BaseException) -> list[traceback.FrameSummary]:
    return traceback.extract_tb(err.__traceback__)


def _where(err: BaseException) -> str:
    """The deepest adaptrack frame of the traceback, ``module.py:function``."""
    ours = [f for f in _frames(err) if f.filename.startswith(SRC)]
    if not ours:
        return "outside adaptrack"
    f = ours[-1]
    return f"{os.path.relpath(f.filename, SRC)}:{f.name}"


def verdict(err: BaseException) -> str | None:
    """None when ``err`` obeys the error contract, else what is wrong with it."""
    if isinstance(err, Hang):
        return "hang"
    if isinstance(err, UserBoom):
        return None
    if not isinstance(err, TypeError | ValueError | AdaptrackError):
        return f"{type(err).__name__} is not TypeError/ValueError/AdaptrackError"
    message = str(err)
    if not message.strip():
        return f"{type(err).__name__} with an empty message"
    if "\n" in message or "\r" in message:
        return f"{type(err).__name__} with a multi-line message"
    if not isinstance(err, AdaptrackError):
        last = _frames(err)[-1] if _frames(err) else None
        if last is None or not last.filename.startswith(SRC):
            where = last.filename if last else "?"
            return f"{type(err).__name__} raised outside adaptrack ({os.path.basename(where)})"
        if not (last.line or "").lstrip().startswith("raise"):
            # Raised by Python or a library inside adaptrack's code, not on purpose: the
            # message does not name the argument (errors.py).
            return f"accidental {type(err).__name__}"
    return None


def signature(err: BaseException, why: str) -> str:
    return f"{why} at {_where(err)}"


def tail(err: BaseException, lines: int = 6) -> str:
    text = "".join(traceback.format_exception(err)).rstrip().splitlines()
    return "\n".join(text[-lines:])


@dataclass
class Findings:
    """Distinct contract violations, each with its first reproducing input."""

    seen: dict[str, str] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def outcome(self, what: str) -> None:
        self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def add(self, sig: str, detail: str) -> None:
        self.count[sig] = self.count.get(sig, 0) + 1
        self.seen.setdefault(sig, detail)

    def new(self) -> dict[str, str]:
        return {s: d for s, d in self.seen.items() if s not in KNOWN}

    def report(self) -> str:
        return "\n\n".join(f"[{self.count[s]}x] {s}\n{d}" for s, d in self.new().items())


# ------------------------------------------------------------------ random API inputs

BYTES = [b"a", b"b", b"(", b"1", b'"', b"{", b"}", b" ", b".", b"_", b"\n", b"\x00",
         b"\xff", b"\xc3", b"\xa9", b"\xe2\x82", b"\xac", b"\xc3\xa9"]
CHARS = 'ab(1"{} ._\n\x00é€\\[]*+?|^$-,'
SURROGATE = "\ud800"


def rand_bytes(rng: random.Random, lo: int = 1, hi: int = 3) -> bytes:
    return b"".join(rng.choice(BYTES) for _ in range(rng.randint(lo, hi)))


def rand_text(rng: random.Random, hi: int = 6, alphabet: str = CHARS,
              surrogates: bool = True) -> str:
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, hi)))
    if surrogates and rng.random() < 0.05:
        i = rng.randint(0, len(text))
        text = text[:i] + SURROGATE + text[i:]
    return text


def rand_json(rng: random.Random, depth: int = 2) -> Any:
    kind = rng.randrange(8 if depth > 0 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2**70, 3])
    if kind == 3:
        return rng.choice([0.5, -1.5, 1e308, float("nan"), float("inf")])
    if kind in (4, 5):
        return rng.choice(["type", "string", "integer", "object", "array", "enum", "const",
                           "properties", "items", "maxLength", "pattern", "a", "", "$ref",
                           "#/x", "anyOf", "required", "minItems", "number", "boolean"])
    if kind == 6:
        return [rand_json(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(
        ["type", "properties", "items", "enum", "const", "maxLength", "minLength", "pattern",
         "required", "additionalProperties", "anyOf", "$ref", "format", "minimum", "a"]):
            rand_json(rng, depth - 1) for _ in range(rng.randint(0, 3))}


REGEXES = ["a+b", "(ab|b)*", "[ab]{2,3}", "a?", "", ".", "\\d+", "a{1000}", "(", "[", "a**",
           "[b-a]", "\\", "é+", "a|", "(?i)ab", "\\p{L}", "x{2,1}", "(a)\\1", "[^\\x00-\\xff]"]
LARKS = ['start: "a" "b"', 'start: A*\nA: "a"', "start: start", 'start: "a"\nstart: "b"', "",
         "start:", "x: y", 'start: /[ab]+/ "("', "start: %json {}", 'start: "é"+',
         "start: %json {\"type\": \"string\"}", "start: B\nB: /(/", 'start: "a" | start "a"']
GBNFS = ['root ::= "a" [ab]*', "root ::=", 'root ::= x\nx ::= "b"', "", "root", 'root ::= "(',
         'root ::= [^a]', 'root ::= "a"{2,3}', 'r ::= "a"', 'root ::= root "a"']
SCHEMAS: list[Any] = [{"type": "string", "maxLength": 2}, {"enum": ["a", "b"]},
                      {"type": "integer"}, True, False, {"const": "ab"}, {},
                      {"type": "array", "items": {"type": "boolean"}, "maxItems": 1},
                      '{"type": "string"}', "{", "null", "[]", {"$ref": "#/nope"},
                      {"type": "string", "pattern": "("}, {"type": "nope"}]


class Check:
    """A predicate callback with a named behavior (reproducible in a failure report)."""

    def __init__(self, behavior: str, salt: int) -> None:
        self.behavior, self.salt = behavior, salt

    def __repr__(self) -> str:
        return f"Check({self.behavior!r}, {self.salt})"

    def _hash(self, text: str) -> bool:
        return zlib.crc32(f"{self.salt}:{text}".encode("utf-8", "surrogatepass")) % 3 != 0

    def __call__(self, text: str) -> Any:
        b = self.behavior
        if b == "true":
            return True
        if b == "false":
            return False
        if b == "hash":
            return self._hash(text)
        if b == "none":
            return None
        if b == "text":
            return text
        if b == "raise":
            raise UserBoom(f"check of {text!r}")
        if b == "raise_sometimes":
            if len(text) >= 2:
                raise UserBoom(f"check of {text!r}")
            return True
        if b == "bad_bool":
            return _BadBool()
        if b == "sleep":
            time.sleep(0.03)
            return self._hash(text)
        if b == "busy":
            end = time.perf_counter() + 0.03
            while time.perf_counter() < end:
                pass
            return self._hash(text)
        raise AssertionError(b)


class _BadBool:
    def __bool__(self) -> bool:
        raise UserBoom("__bool__")

    def __repr__(self) -> str:
        return "_BadBool()"


SLOW = ("sleep", "busy")
RAISING = ("raise", "raise_sometimes", "bad_bool")


def rand_constraint(rng: random.Random, junk: bool = False, depth: int = 1) -> Any:
    """A constraint spec, a tuple ``(kind, *args)`` that :func:`build` turns into one;
    with ``junk``, one argument is a wrong type or value."""
    kinds = ["none", "choice", "choice", "api_names", "regex", "regex", "lark", "gbnf",
             "json_schema", "json_schema", "predicate", "predicate"]
    kind = rng.choice(kinds + (["all_of"] if depth > 0 else []) + (["junk"] if junk else []))
    if kind == "choice":
        strings: Any = [rand_text(rng, 4, "aab(1é", False) if rng.random() < 0.8 else
                        rand_bytes(rng, 0, 3) for _ in range(rng.randint(1, 4))]
        term: Any = rng.choice([None, None, None, "(", b"(", ["(", ")"], ""])
        if junk and rng.random() < 0.5:
            strings = rng.choice(["ab", b"ab", None, 3, [1, 2], [None], [], ["a" + SURROGATE]])
        elif junk:
            term = rng.choice(["a", SURROGATE, 5, [5], "((", "é"])
        return ("choice", strings, term)
    if kind == "api_names":
        names: Any = [rng.choice(["a", "b", "a.b", "ab", "_a1", "b.a.b"])
                      for _ in range(rng.randint(1, 3))]
        prefix: Any = rng.choice([".", ".", "", "a."])
        term = rng.choice(["default", "default", None, "("])
        if junk:
            which = rng.randrange(3)
            if which == 0:
                names = rng.choice(["ab", None, [3], [], ["a b"], ["a" + SURROGATE]])
            elif which == 1:
                prefix = rng.choice([None, 3, SURROGATE, "a"])
            else:
                term = rng.choice(["a", "", 5, SURROGATE])
        return ("api_names", names, prefix, term)
    if kind in ("regex", "lark", "gbnf"):
        pool = {"regex": REGEXES, "lark": LARKS, "gbnf": GBNFS}[kind]
        text: Any = rng.choice(pool)
        if junk:
            text = rng.choice([rand_text(rng, 10), rand_text(rng, 10), None, 3, b"a",
                               text + SURROGATE])
        return (kind, text)
    if kind == "json_schema":
        schema = rng.choice(SCHEMAS)
        if junk:
            schema = rand_json(rng) if rng.random() < 0.8 else rng.choice(
                [None, 3, b"{}", "{" + SURROGATE, {"type": "string", "pattern": SURROGATE}])
        return ("json_schema", schema)
    if kind == "predicate":
        fine = ["true", "hash", "hash", "hash", "hash", "false", "none", "text"]
        odd = ["raise", "raise_sometimes", "bad_bool", "sleep", "busy"]
        prefix_ok = Check(rng.choice(fine + odd if junk else fine), rng.randrange(100))
        is_complete = Check(rng.choice(fine + odd if junk else fine), rng.randrange(100))
        term = rng.choice([None, None, "(", "\n"])
        timeout: Any = rng.choice([60.0, 0.01, None])
        if junk and rng.random() < 0.3:
            timeout = rng.choice([0, -1.0, NAN, INF, "1", True, 1e-300])
        if {prefix_ok.behavior, is_complete.behavior} & set(SLOW) and timeout in (None, 60.0):
            timeout = 0.01
        return ("predicate", prefix_ok, is_complete, term, timeout)
    if kind == "all_of":
        count = rng.randint(1, 3) if not junk or rng.random() < 0.7 else 0
        bad = rng.randrange(count) if junk and count else -1
        parts = [rand_constraint(rng, i == bad, depth - 1) for i in range(count)]
        return ("all_of", [p for i, p in enumerate(parts) if p[0] != "none" or i == bad])
    if kind == "junk":
        return ("junk", rng.choice(["a", 3, b"x", [1], True]))
    return ("none",)


def build(spec: tuple[Any, ...]) -> Any:
    kind = spec[0]
    if kind == "none":
        return None
    if kind == "choice":
        return constraints.choice(spec[1], terminators=spec[2])
    if kind == "api_names":
        kw: dict[str, Any] = {"prefix": spec[2]}
        if spec[3] != "default":
            kw["terminators"] = spec[3]
        return constraints.api_names(spec[1], **kw)
    if kind in ("regex", "lark", "gbnf", "json_schema"):
        return getattr(constraints, kind)(spec[1])
    if kind == "predicate":
        return constraints.predicate(spec[1], spec[2], terminators=spec[3], timeout=spec[4])
    if kind == "all_of":
        return constraints.all_of(*[build(s) for s in spec[1]])
    if kind == "junk":
        return spec[1]
    raise AssertionError(spec)


def _behaviors(spec: tuple[Any, ...]) -> set[str]:
    if spec[0] == "predicate":
        return {spec[1].behavior, spec[2].behavior}
    if spec[0] == "all_of":
        return set().union(*[_behaviors(s) for s in spec[1]])
    return set()


class Weights:
    """A TableLM's ``next_probs``: hashed weights (some 0), or a broken model."""

    def __init__(self, width: int, mode: str, salt: int) -> None:
        self.width, self.mode, self.salt = width, mode, salt

    def __repr__(self) -> str:
        return f"Weights({self.width}, {self.mode!r}, {self.salt})"

    def __call__(self, prefix: tuple[int, ...]) -> Any:
        rng = np.random.default_rng([self.salt, len(prefix), *[t % 1000 for t in prefix]])
        w = rng.integers(0, 9, self.width).astype(float)
        if self.mode == "positive":
            w += 1
        elif self.mode == "peaked":
            w = np.exp(rng.normal(0, 30, self.width))
        elif self.mode == "bad" and len(prefix) >= 1:
            bad = [[1.0] * (self.width + 1), [float("nan")] * self.width, [-1.0] * self.width,
                   [0.0] * self.width, "x"]
            return bad[int(rng.integers(len(bad)))]
        return w


@dataclass
class ApiCase:
    seed: int
    vocab: list[Any]
    eos: Any
    weights: Weights
    spec: tuple[Any, ...]
    function: str
    prompt: Any
    options: dict[str, Any]
    junk: str = ""

    def __repr__(self) -> str:
        return (f"ApiCase(seed={self.seed}, junk={self.junk!r}, vocab={self.vocab!r}, "
                f"eos={self.eos!r}, weights={self.weights!r}, constraint={self.spec!r}, "
                f"function={self.function!r}, prompt={self.prompt!r}, "
                f"options={self.options!r})")


NAN, INF = float("nan"), float("inf")
VALUES: dict[str, tuple[list[Any], list[Any]]] = {  # option: (valid values, junk values)
    "n": ([1, 2, 3], [0, -1, 2.0, True, "3", None, 10**30]),
    "temperature": ([0, 0.5, 1, 2.0, 1e-300, 1e300, -0.0],
                    [INF, NAN, -1, "1", None, True, -INF]),
    "top_p": ([1, 0.5, 0.01, 1e-300, 0.999999], [0, -0.5, 1.5, NAN, INF, "0.5", None]),
    "max_new_tokens": ([1, 2, 3, 4, 5], [0, -1, 1.5, None, True, "4"]),
    "seed": ([0, 1, 12345, 2**64, 2**70], [-1, 1.5, "s", True]),
    "batch_size": ([1, 2, 32], [0, -3, 1.0, None]),
    "max_nodes": ([1, 2, 10, 200, 2000], [0, -1, 1.5, None, NAN]),
    "max_cache_bytes": ([0, 1, 100, 1 << 20], [-1, 1.5, None]),
    "max_opened_bytes": ([0, 1, 500, 1 << 20], [-1, 1.5, None]),
    "fast_forward": ([True, False, FastForward(), FastForward(max_tokens=0),
                      FastForward(conservative=True)], ["yes", 1, None]),
    "share_q": ([True, False], [1, "x", None]),
    "max_backtrack": ([None, 0, 1, 5], [-1, 1.5, "2"]),
    "min_backtrack_prob": ([0.0, 0.1, 1.0], [-0.1, 2, NAN, "x", None]),
    "max_seconds": ([None, 0.5, 2.0, INF], [0, -1, NAN, "1", True, 1e-9]),
    "truncate_prompt": ([False, True], ["x", 1]),
    "on_sample": ([None, lambda sample: None], ["x", 3]),
}
GENERATE_ONLY = ("n", "seed", "batch_size", "max_cache_bytes", "max_opened_bytes", "share_q",
                 "max_backtrack", "min_backtrack_prob", "truncate_prompt", "on_sample")
ADAPTRACK_ONLY = ("share_q", "max_backtrack", "min_backtrack_prob")


def rand_api_case(seed: int) -> ApiCase:
    """A case: 55% with valid arguments only, else exactly one wrong thing (an option, the
    constraint, the prompt, the vocabulary or a broken model)."""
    rng = random.Random(seed)
    junk = "" if rng.random() < 0.55 else rng.choice(
        ["option"] * 4 + ["constraint"] * 4 + ["prompt", "vocab", "model"])
    size = rng.randint(2, 6)
    vocab: list[Any] = [rand_bytes(rng) for _ in range(size)]
    if rng.random() < 0.7:  # single bytes that spell most of the constraints' texts
        vocab[:3] = [b"a", b"b", rand_bytes(rng, 1, 1)]
        vocab = vocab[:size]
        rng.shuffle(vocab)
    eos: Any = rng.randrange(size)
    vocab[eos] = b"<eos>"
    if rng.random() < 0.1:  # an empty token, a str token: both legal
        vocab[rng.choice([i for i in range(size) if i != eos])] = rng.choice([b"", "é", "a"])
    if junk == "vocab":
        if rng.random() < 0.5:
            vocab[rng.randrange(size)] = rng.choice([SURROGATE, None, 3, [1]])
        else:
            eos = rng.choice([None, [0, size - 1], size, -1, "0", [size + 3], True])
    mode = "bad" if junk == "model" else rng.choice(["hashed"] * 5 + ["positive"] * 3 +
                                                   ["peaked"])
    weights = Weights(size, mode, rng.randrange(1000))
    spec = rand_constraint(rng, junk == "constraint")
    function = "generate" if rng.random() < 0.8 else "exact_distribution"
    prompt: Any = [rng.randrange(size) for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.3:
        prompt = "".join(rng.choice([t for t in vocab if isinstance(t, bytes) and t and
                                     t != b"<eos>"] or [b""]).decode("latin-1")
                         for _ in range(rng.randint(0, 2)))
    if junk == "prompt":
        prompt = rng.choice([[rng.choice([-1, size, 10**20, True, 1.0, "a", None])],
                             "a" + SURROGATE, b"ab", None, 5, (0,), np.array([0]), range(1),
                             "\x00\xff", [np.int64(0)]])
    options: dict[str, Any] = {}
    names = [k for k in VALUES if function == "generate" or k not in GENERATE_ONLY]
    for name in names:
        if rng.random() < 0.4:
            options[name] = rng.choice(VALUES[name][0])
    if function == "generate":
        options["method"] = rng.choice(list(METHODS))
        if options["method"] != "adaptrack":
            for name in ADAPTRACK_ONLY:
                options.pop(name, None)
    if "max_new_tokens" not in options or rng.random() < 0.5:
        options["max_new_tokens"] = rng.randint(1, 5)
    if rng.random() < 0.05:  # long outputs, bounded by the time budget
        options["max_new_tokens"] = rng.choice([50, 10**6, 2**63])
        options["max_seconds"] = rng.choice([0.2, 1.0])
    if junk == "option":
        name = rng.choice(names + ["method"] * 2 if function == "generate" else names)
        options[name] = (rng.choice(["", "ADAPTRACK", "greedy", None, 3]) if name == "method"
                         else rng.choice(VALUES[name][1]))
        if name in ADAPTRACK_ONLY and function == "generate":
            options["method"] = rng.choice(list(METHODS))
    if _behaviors(spec) & set(SLOW):
        options["max_nodes"] = rng.choice([1, 5, 30])
        if _is_int(options["max_new_tokens"]):
            options["max_new_tokens"] = min(options["max_new_tokens"], 3)
    return ApiCase(seed, vocab, eos, weights, spec, function, prompt, options, junk)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_result(case: ApiCase, lm: TableLM, constraint: Any, out: Any) -> str | None:
    """What is wrong with a result, or None."""
    opts = case.options
    max_new = opts["max_new_tokens"]
    recheck = not (_behaviors(case.spec) & (set(SLOW) | set(RAISING)))
    fresh = constraint if constraint is not None else constraints.anything()
    if case.function == "exact_distribution":
        if not isinstance(out, dict) or not out:
            return f"exact_distribution returned {type(out).__name__} {out!r:.80}"
        total = sum(out.values())
        if not math.isclose(total, 1.0, rel_tol=1e-6) or min(out.values()) < 0:
            return f"exact_distribution's probabilities sum to {total}"
        for tokens in out:
            if len(tokens) > max_new:
                return f"sequence {tokens} longer than max_new_tokens={max_new}"
            if recheck and not fresh.bind(lm.vocab).accepts(tokens):
                return f"sequence {tokens} not accepted by the constraint"
        return None
    if isinstance(out, list) and out and all(isinstance(r, GenerationResult) for r in out):
        # a list of prompts (strings or token-id lists): one result per prompt, each checked
        for one in out:
            wrong = check_result(case, lm, constraint, one)
            if wrong:
                return wrong
        return None
    if not isinstance(out, GenerationResult):
        return f"generate returned {type(out).__name__}"
    n = opts.get("n", 1)
    if len(out.samples) != n:
        return f"{len(out.samples)} samples, n={n}"
    method = opts.get("method", "adaptrack")
    for s in out.samples:
        if not all(_is_int(t) and 0 <= t < lm.vocab.size for t in s.tokens):
            return f"sample tokens {s.tokens} outside the vocabulary"
        if len(s.tokens) > max_new:
            return f"sample of {len(s.tokens)} tokens, max_new_tokens={max_new}"
        if s.valid and not s.complete:
            return f"sample {s} valid but not complete"
        if not isinstance(s.text, str):
            return f"sample text {s.text!r} is not a str"
        if math.isnan(s.logprob) or s.logprob > 1e-9:
            return f"sample logprob {s.logprob}"
        if method != "unconstrained" and s.complete:
            if not s.valid:
                return f"complete sample {s} of method {method} not valid"
            if recheck and not fresh.bind(lm.vocab).accepts(s.tokens):
                return f"complete sample {s} not accepted by the constraint"
    if out.stats.get("incomplete") != sum(not s.complete for s in out.samples):
        return f"stats['incomplete']={out.stats.get('incomplete')} disagrees with the samples"
    return None


def run_api_case(case: ApiCase, findings: Findings) -> None:
    detail = f"input: {case!r}"
    lm = constraint = None
    try:
        with watchdog(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lm = TableLM(case.vocab, case.weights, eos=case.eos)
            constraint = build(case.spec)
            opts = dict(case.options)
            if case.function == "generate":
                out = adaptrack.generate(lm, case.prompt, constraint, **opts)
            else:
                out = adaptrack.exact_distribution(lm, case.prompt, constraint, **opts)
            problem = check_result(case, lm, constraint, out)
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        findings.outcome(type(err).__name__)
        why = verdict(err)
        if why is not None:
            findings.add(signature(err, why),
                         f"{detail}\n{type(err).__name__}: {str(err)[:300]!r}\n{tail(err)}")
        return
    findings.outcome("result")
    if problem is not None:
        findings.add(f"bad result: {problem.split(' ')[0]} ... ({case.function})",
                     f"{detail}\n{problem}")


def test_api_fuzz() -> None:
    """Random models, constraints, prompts and options through ``generate`` and
    ``exact_distribution``: a valid result or a named one-line error (see the module doc)."""
    findings = Findings()
    for seed in API_SEEDS:
        run_api_case(rand_api_case(seed), findings)
    assert not findings.new(), "contract violations:\n\n" + findings.report()


# ------------------------------------------------------------------ the command line


def _toy_model() -> TableLM:
    """Bytes 0..255 and EOS (P(EOS) ~ 0.3 everywhere): every prompt encodes, outputs end."""
    weights = np.ones(257)
    weights[256] = 110.0
    lm = TableLM([bytes([b]) for b in range(256)] + [b"<eos>"], lambda prefix: weights,
                 eos=256)
    lm.name = "toy"  # type: ignore[attr-defined]
    return lm


class Refused(BaseException):
    """The case would load a real model from disk: skipped, not a failure."""


@contextlib.contextmanager
def fake_loader() -> Iterator[None]:
    """Replace ``load_model`` wherever the command line and the harness look it up: the
    default model becomes the toy model; a path that does not exist goes to the real loader
    (which refuses it before loading anything); anything else is refused (:class:`Refused`)."""
    from adaptrack.lm import load as load_module

    real = load_module.load_model

    def fake(spec: Any = None, backend: str = "auto", device: str = "auto", **kw: Any) -> Any:
        if spec is None and backend in ("auto", "transformers") and device != "cuda":
            return _toy_model()
        path = Path(str(spec)).expanduser() if spec is not None else None
        if spec is None or ((str(spec).startswith("/") or str(spec).endswith(".gguf")) and (
                not path.exists())):
            return real(spec, backend=backend, device=device, **kw)
        raise Refused(f"would load {spec!r}")

    import adaptrack.cli  # noqa: F401 (so that its submodules are in sys.modules)

    targets = [load_module] + [m for name, m in list(sys.modules.items())
                               if (name == "adaptrack.cli" or name.startswith("adaptrack.cli.")
                                   or name == "adaptrack.demo")
                               and m is not None and hasattr(m, "load_model")]
    saved = [(m, m.load_model) for m in targets]
    for m in targets:
        m.load_model = fake
    try:
        yield
    finally:
        for m, f in saved:
            m.load_model = f


@dataclass
class Files:
    """Paths the command-line cases name: files of every kind, a directory, missing ones."""

    root: Path
    paths: dict[str, str] = field(default_factory=dict)

    def make(self) -> Files:
        r = self.root
        rng = random.Random(7)

        def put(name: str, data: bytes) -> str:
            p = r / name
            p.write_bytes(data)
            return str(p)

        self.paths = {
            "empty": put("empty.txt", b""),
            "random": put("random.bin", bytes(rng.randrange(256) for _ in range(300))),
            "latin1": put("latin1.txt", "caf\xe9\nna\xefve\n".encode("latin-1")),
            "choices": put("choices.txt", b"ab\nb\n\n(a\n"),
            "names": put("names.txt", b"a.b\nab\n_x\n"),
            "bad_names": put("bad_names.txt", b"2d\n.a\n"),
            "schema": put("schema.json", b'{"type": "string", "maxLength": 3}'),
            "bad_schema": put("bad_schema.json", b'{"type": "nope"'),
            "lark": put("g.lark", b'start: "a" "b"?\n'),
            "gbnf": put("g.gbnf", b'root ::= "a" [ab]?\n'),
            "jsonl": put("r.jsonl", b'{"a": 1}\n[1, 2]\nnot json\n'),
            "header": put("h.jsonl", b'{"task": "binary", "options": {}}\n'),
            "gz": put("r.jsonl.gz", b"\x1f\x8b\x08\x00garbage"),
            "tokenizer": put("tokenizer.json", b'{"model": {"type": "BPE"}}'),
            "dir": str(r),
            "missing": str(r / "missing" / "x.txt"),
            "missing_gguf": str(r / "missing.gguf"),
            "new": str(r / "new.jsonl"),
            "surrogate": os.fsdecode(bytes(r / "x") + b"\xff\xfe.txt"),
            "devnull": os.devnull,
            "stdin": "-",
        }
        return self

    def pick(self, rng: random.Random) -> str:
        return self.paths[rng.choice(sorted(self.paths))]


def rand_arg(rng: random.Random) -> str:
    """A random command-line word: numbers, flags, text, surrogate-escaped bytes."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice(["0", "1", "-1", "2.5", "nan", "inf", "-inf", "1e400", "", "0x10",
                           "99999999999999999999999", " 3", "٣"])
    if kind == 1:
        return rng.choice(["--", "-", "-n", "--json", "--bogus", "--prompt", "-h", "--seed",
                           "--method=cd", "--top-p=0"])
    if kind == 2:
        return os.fsdecode(bytes(rng.randrange(256) for _ in range(rng.randint(1, 4))))
    return rand_text(rng, 6)


NUMBERS = {
    "-n": (["1", "2", "3"], ["0", "-1", "x", "1.5", "", "1e3"]),
    "--temperature": (["0", "1", "0.5", "1e-300"], ["nan", "inf", "-1", "x", ""]),
    "--top-p": (["1", "0.5", "0.001"], ["0", "1.5", "nan", "-0.1", "x"]),
    "--seed": (["0", "7", "99999999999999999999999"], ["-1", "1.5", "x"]),
    "--max-new-tokens": (["1", "3", "5"], ["0", "-2", "x", "2.0"]),
    "--max-seconds": (["2", "0.5"], ["0", "-1", "nan", "x"]),
}


def _value(rng: random.Random, name: str, junk: bool = False) -> str:
    valid, bad = NUMBERS[name]
    return rng.choice(bad if junk else valid)


def rand_generate_argv(rng: random.Random, files: Files) -> list[str]:
    """``generate`` with valid arguments (half the cases), else with one wrong part."""
    junk = "" if rng.random() < 0.5 else rng.choice(
        ["prompt", "constraint", "constraint", "number", "number", "flag", "model"])
    p = files.paths
    argv = ["generate"]
    if junk == "prompt":
        argv += rng.choice([[], ["--prompt", "a", "--prompt-file", p["choices"]],
                            ["--prompt-file", files.pick(rng)], ["--prompt", rand_arg(rng)],
                            ["--prompt"]])
    elif rng.random() < 0.7:
        argv.append("--prompt=" + rand_text(rng, 8, surrogates=False))
    else:
        argv += ["--prompt-file", rng.choice([p["choices"], p["empty"], p["names"]])]
    good = {
        "--constraint": [p["choices"], p["names"]],
        "--api-names": [p["names"]],
        "--api-module": ["json"],
        "--regex": [r for r in REGEXES[:8] if r != "a{1000}"],
        "--json-schema": [p["schema"]],
        "--lark": [p["lark"]],
        "--gbnf": [p["gbnf"]],
    }
    if junk == "constraint":
        kinds = rng.sample(sorted(good), rng.choice([1, 1, 2]))
        for name in kinds:
            value = (rng.choice(["zz_fuzz_missing", "", ".", "os..path", rand_text(rng, 4)])
                     if name == "--api-module" else
                     rng.choice(REGEXES) if name == "--regex" and rng.random() < 0.5 else
                     rand_text(rng, 6) if name == "--regex" else files.pick(rng))
            argv += [name, value]
    elif rng.random() < 0.8:
        name = rng.choice(sorted(good))
        argv += [name, rng.choice(good[name])]
    if argv[-2] in ("--constraint", "--prompt-file") or (argv[-1].startswith("--prompt=") and (
            rng.random() < 0.3)):
        argv += ["--terminators", rng.choice(["(", "\n", "b("])]
    argv += ["--method", rng.choice(list(METHODS))]
    numbers = ["--max-new-tokens"] + [k for k in ("-n", "--temperature", "--top-p", "--seed",
                                                  "--max-seconds") if rng.random() < 0.5]
    bad = rng.choice(numbers) if junk == "number" else ""
    for name in numbers:
        argv += [name, _value(rng, name, name == bad)]
    for flag in ("--no-fast-forward", "--json", "--truncate-prompt"):
        if rng.random() < 0.2:
            argv.append(flag)
    if junk == "flag":
        argv += rng.choice([["--share-q"], ["--bogus"], ["--json=1"], ["-n"], ["extra"],
                            ["--backend", "x"], ["--device", "tpu"]])
    elif "--method" in argv and argv[argv.index("--method") + 1] == "adaptrack" and (
            rng.random() < 0.3):
        argv.append("--share-q")
    if junk == "model":
        argv += ["--model", rng.choice([p["missing_gguf"], p["missing"], "/nonexistent/m"])]
        if rng.random() < 0.5:
            argv += ["--backend", rng.choice(["auto", "llamacpp", "transformers"])]
    return argv


def rand_cli_argv(rng: random.Random, files: Files) -> list[str]:
    kind = rng.choices(["generate", "demo", "eval", "report", "bench", "junk"],
                       weights=[50, 12, 12, 12, 8, 6])[0]
    if kind == "generate":
        argv = rand_generate_argv(rng, files)
    elif kind == "demo":
        argv = ["demo"]
        if rng.random() < 0.9:
            argv += ["--problem", rng.choice(["binary", "no_ab", "api_names", "length_bound",
                                              "x", ""])]
        else:  # the model demo, only with a model that does not exist
            argv += ["--model", files.paths["missing_gguf"]]
        argv += ["-n", rng.choice(["1", "5", "30", "0", "-3", "x"])]
        if rng.random() < 0.3:
            argv += ["--seed", rng.choice(["0", "3", "-1", "x", "99999999999999999999999"])]
        if rng.random() < 0.1:
            argv += ["--model", files.paths["missing_gguf"]]
    elif kind == "eval":
        argv = ["eval", rng.choice(["tfv1", "binary", "x"])]
        if rng.random() < 0.9:
            argv += ["-o", files.pick(rng)]
        argv += ["--model", rng.choice(["/nonexistent/m", files.paths["missing_gguf"]])]
        for name, values in (("--methods", ["cd", "cd,exact", "x", "", ",", "cd,,cd"]),
                             ("--settings", ["v1", "v3", ""]), ("-n", ["1", "0", "x"]),
                             ("--limit", ["1", "0"]), ("--temperature", ["1", "nan"]),
                             ("--seed", ["0", "x"]), ("--workers", ["1", "0", "x"])):
            if rng.random() < 0.3:
                argv += [name, rng.choice(values)]
        if rng.random() < 0.5:
            argv.append("--no-report")
    elif kind == "report":
        argv = ["report"]
        if rng.random() < 0.95:
            argv.append(files.pick(rng))
        if rng.random() < 0.2:
            argv += ["--plots", files.pick(rng)]
    elif kind == "bench":
        argv = ["bench", rng.choice(["ff", "ff", "x"])]
        if rng.random() < 0.9:
            argv += ["--data", files.pick(rng)]
        if rng.random() < 0.9:
            argv += ["--tokenizer", rng.choice([files.pick(rng), files.paths["tokenizer"]])]
        if rng.random() < 0.3:
            argv += ["--max-tokens", rng.choice(["0", "4", "-1", "x"])]
        if rng.random() < 0.3:
            argv += ["--limit", rng.choice(["1", "0"])]
    else:
        argv = [rand_arg(rng) for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.3:
            argv.insert(0, rng.choice(["setup", "--version", "-h", "help"]))
            if argv[0] == "setup":
                argv.insert(1, "--bogus")
    # missing or extra words
    if len(argv) > 1 and rng.random() < 0.1:
        del argv[rng.randrange(1, len(argv))]
    if rng.random() < 0.1:
        argv.insert(rng.randint(min(1, len(argv)), len(argv)), rand_arg(rng))
    return argv


def cli_verdict(code: Any, err: str) -> str | None:
    """None when an exit obeys the command line's contract, else what is wrong."""
    if "Traceback" in err:
        return "traceback on stderr"
    if code == 0:
        return None
    if code != 2:
        return f"exit status {code!r}"
    lines = [line for line in err.splitlines() if line.strip()]
    if not lines or (" error: " not in lines[-1] and not lines[-1].startswith("adaptrack: error:")):
        return "exit 2 without a final 'error:' line"
    if not lines[-1].split("error:", 1)[1].strip():
        return "exit 2 with an empty error message"
    return None


def run_cli_case(argv: list[str], stdin: str, findings: Findings, seed: int) -> None:
    from adaptrack.cli import main

    out, err = io.StringIO(), io.StringIO()
    detail = f"seed {seed}: argv = {argv!r}"
    code: Any = None
    try:
        with watchdog(), fake_loader(), warnings.catch_warnings(), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("ignore")
            old_stdin, sys.stdin = sys.stdin, io.StringIO(stdin)
            try:
                code = main(argv)
            finally:
                sys.stdin = old_stdin
    except Refused:
        findings.skipped += 1
        return
    except SystemExit as done:  # main should return a status, not exit
        findings.add(f"SystemExit({done.code!r}) escaped main", detail)
        return
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        why = "hang" if isinstance(exc, Hang) else f"{type(exc).__name__} escaped main"
        findings.add(signature(exc, why), f"{detail}\n{tail(exc)}")
        return
    findings.outcome(f"exit {code}")
    why = cli_verdict(code, err.getvalue())
    if why is not None:
        text = err.getvalue()
        findings.add(f"{why} ({argv[0] if argv else 'no args'})",
                     f"{detail}\nexit {code}; stderr tail:\n{text[-1500:]}")


def test_cli_fuzz(tmp_path: Path) -> None:
    """Random argv through ``adaptrack.cli.main``: exit 0, or 2 with one ``error:`` line."""
    files = Files(tmp_path).make()
    findings = Findings()
    for seed in CLI_SEEDS:
        rng = random.Random(seed)
        argv = rand_cli_argv(rng, files)
        run_cli_case(argv, rand_text(rng, 20), findings, seed)
    assert findings.skipped < len(CLI_SEEDS) // 4
    assert not findings.new(), "contract violations:\n\n" + findings.report()


SUBPROCESS_CASES = [
    ["generate", "--prompt-file", "{latin1}", "--model", "{missing_gguf}"],
    ["report", "{random}"],
    ["demo", "--problem", "binary", "-n", "5"],
    ["generate", "--prompt", "\udcff\udcfe", "--regex", "\udcc3(", "--max-new-tokens", "x"],
]


@pytest.mark.parametrize("template", SUBPROCESS_CASES, ids=lambda a: " ".join(a[:2]))
def test_cli_subprocess(template: list[str], tmp_path: Path) -> None:
    """``python -m adaptrack`` as a user runs it (non-UTF-8 argv and files included): exit 0,
    or 2 with ``adaptrack: error: ...`` last and no traceback. These fail before any model
    load (or run a toy problem)."""
    files = Files(tmp_path).make()
    argv = [a.format(**files.paths) for a in template]
    env = dict(os.environ, HF_HUB_OFFLINE="1", ADAPTRACK_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "adaptrack", *argv], capture_output=True,
                          env=env, timeout=120)
    err = done.stderr.decode("utf-8", "backslashreplace")
    assert cli_verdict(done.returncode, err) is None, (argv, done.returncode, err[-2000:])


# ------------------------------------------------------------------ pinned regressions


def _lm() -> TableLM:
    return TableLM([b"a", b"b", b"(", b"<eos>"], lambda prefix: [1, 1, 1, 1], eos=3)


def _generate(**kw: Any) -> Callable[[], Any]:
    def call() -> Any:
        args = {"prompt": [], "constraint": None, "method": "unconstrained",
                "max_new_tokens": 3, **kw}
        return adaptrack.generate(_lm(), args.pop("prompt"), args.pop("constraint"), **args)

    return call


def _cli(*argv: str) -> Callable[[], Any]:
    def call() -> Any:
        from adaptrack.cli import main

        err = io.StringIO()
        with fake_loader(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(err):
            code = main(list(argv))
        why = cli_verdict(code, err.getvalue())
        assert why is None, f"{why}: {err.getvalue()[-800:]}"

    return call


def _non_numeric(prefix: Any) -> Any:
    return "x"


REGRESSIONS: dict[str, Callable[[], Any]] = {
    "constraint_not_a_constraint": _generate(constraint="a|b"),
    "prompt_not_a_sequence": _generate(prompt=None),
    "n_too_large": _generate(n=10**30),
    "grammar_error_multiline": lambda: constraints.lark("."),
    "grammar_text_not_str": lambda: constraints.lark(3),  # type: ignore[arg-type]
    "grammar_surrogate": lambda: constraints.regex("a" + SURROGATE),
    "choice_surrogate": lambda: constraints.choice(["a" + SURROGATE]),
    "terminators_bad": lambda: constraints.choice(["a"], terminators=5),  # type: ignore
    "api_names_bad_args": lambda: constraints.api_names(["a"], prefix=None),  # type: ignore
    "tablelm_bad_vocab": lambda: TableLM([b"a", None, b"<eos>"], lambda p: [1, 1, 1], eos=2),
    "tablelm_non_numeric_weights": lambda: adaptrack.generate(
        TableLM([b"a", b"<eos>"], _non_numeric, eos=1), [], None, method="unconstrained"),
    "predicate_timeout_not_a_number": lambda: constraints.predicate(
        bool, bool, timeout="1"),  # type: ignore[arg-type]
    "predicate_timeout_inf": lambda: _generate(
        constraint=constraints.predicate(bool, bool, timeout=INF), method="cd")(),
    "cli_api_module_relative": _cli("generate", "--prompt=a", "--api-module", ".",
                                    "--max-new-tokens", "1"),
}


def _pinned(name: str) -> Any:
    if name in OPEN_DEFECTS:
        return pytest.param(name, marks=pytest.mark.xfail(
            strict=True, reason=f"open defect found by the fuzz: {OPEN_DEFECTS[name][0]}"))
    return name


@pytest.mark.parametrize("name", [_pinned(n) for n in REGRESSIONS])
def test_regression(name: str) -> None:
    """Each defect the fuzz found, as one small input: the call returns, or raises an error
    that obeys the contract."""
    with watchdog(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            REGRESSIONS[name]()
        except (Exception, Hang) as err:
            why = verdict(err)
            assert why is None, f"{why}: {type(err).__name__}: {err}"
