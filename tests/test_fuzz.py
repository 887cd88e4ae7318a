"""Fuzz of the Python API: random inputs end in a result or a named one-line error, never a
traceback or a hang (the error contract, docs/design.md §6; the shared machinery is in
``fuzzing.py``, the command line's fuzz in ``cli/test_cli_fuzz.py``).

Cases come from a seeded ``random.Random`` per case (a fixed range of seeds), so every
failure prints the seed and the full input that reproduces it, and the test lists every
distinct failure at once rather than the first. Problem sizes are small (vocabularies of at
most 6 tokens, ``max_new_tokens`` at most 5 unless a time budget bounds the call), and a
watchdog thread turns a case that runs past ``CASE_SECONDS`` into a failure (a hang).
"""

from __future__ import annotations

import math
import random
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fuzzing import (
    REGEXES,
    SURROGATE,
    Findings,
    UserBoom,
    check_regression,
    pinned,
    rand_bytes,
    rand_text,
    signature,
    tail,
    verdict,
    watchdog,
)

import adaptrack
from adaptrack import METHODS, FastForward, GenerationResult, TableLM, constraints

API_SEEDS = range(1500)


# ------------------------------------------------------------------ random API inputs


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


# ------------------------------------------------------------------ pinned regressions


def _lm() -> TableLM:
    return TableLM([b"a", b"b", b"(", b"<eos>"], lambda prefix: [1, 1, 1, 1], eos=3)


def _generate(**kw: Any) -> Callable[[], Any]:
    def call() -> Any:
        args = {"prompt": [], "constraint": None, "method": "unconstrained",
                "max_new_tokens": 3, **kw}
        return adaptrack.generate(_lm(), args.pop("prompt"), args.pop("constraint"), **args)

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
    # issue 47: hostile input
    "lm_none": lambda: adaptrack.generate(None, "The capital of France is"),  # type: ignore
    "lm_a_model_id": lambda: adaptrack.generate(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "The capital of France is"),  # type: ignore
    "load_model_int": lambda: adaptrack.load_model(123),  # type: ignore[arg-type]
    "prompt_surrogate": _generate(prompt="a" + SURROGATE),
    "json_schema_deep": lambda: constraints.json_schema("[" * 5000 + "]" * 5000),
    "json_schema_deep_object": lambda: constraints.json_schema(_deep_schema(5000)),
    "gbnf_deep": lambda: constraints.gbnf("root ::= " + "(" * 5000 + '"a"' + ")" * 5000),
    "from_module_missing": lambda: constraints.from_module("no_such_module_fuzz"),
}


def _deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema



@pytest.mark.parametrize("name", [pinned(n) for n in REGRESSIONS])
def test_regression(name: str) -> None:
    """Each defect the fuzz found, as one small input: the call returns, or raises an error
    that obeys the contract."""
    check_regression(REGRESSIONS[name])
