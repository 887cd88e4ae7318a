"""Termination and failure modes: empty languages, too few tokens, tree limits, bad arguments.

Every method must end, quickly, on a problem with no valid complete sequence: ``asap``,
``adaptrack`` (whatever its options) and ``exact`` raise ``NoValidSequenceError``; ``cd``
raises before any model call where the constraint's shortest text is proved longer than
``max_new_tokens`` (as every method does), and when no first token is valid, and otherwise
returns the dead end it walked into as an incomplete sample; ``unconstrained`` returns samples
the constraint rejects.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

import adaptrack as at
from adaptrack import (
    METHODS,
    ModelOutputError,
    NoValidSequenceError,
    TableLM,
    TreeLimitError,
    exact_distribution,
    generate,
)
from adaptrack.constraints import choice
from adaptrack.testing import PROBLEMS

QUICK_S = 5.0  # "quickly": the calls below take milliseconds


def make_lm(tokens: list[bytes], eos_weight: float = 1.0) -> TableLM:
    """A TableLM over ``tokens`` plus EOS (the last id), with fixed, unequal weights."""
    vocab = [*tokens, b"<eos>"]
    eos = len(vocab) - 1

    def next_probs(prefix: tuple[int, ...]) -> list[float]:
        w = [1.0 + ((3 * i + 5 * len(prefix) + sum(prefix)) % 7) / 10 for i in range(eos)]
        return [*w, eos_weight]

    return TableLM(vocab, next_probs, eos=eos)


ABC = [b"a", b"b", b"c"]
ABC_PAIRS = [b"a", b"b", b"c", b"ab", b"bc", b"ca"]


# Problems with no valid complete sequence: (id, tokens, constraint, max_new_tokens,
# whether some first token is valid, i.e. what cd does).
def _empty_problems() -> list[tuple[str, list[bytes], at.constraints.Constraint, int, bool]]:
    five = ["".join(p) for p in itertools.product("abc", repeat=5)]
    deep = ["".join(p) + "d" for p in itertools.product("abc", repeat=5)]
    return [
        ("first-byte-unspellable", ABC, choice(["dd", "da"]), 8, False),
        ("last-byte-unspellable", ABC_PAIRS, choice(["abd", "abcd"]), 8, True),
        ("terminator-unspellable", ABC, choice(["ab"], terminators="("), 8, True),
        ("empty-string-needs-terminator", ABC, choice([""], terminators="("), 8, False),
        ("too-short", [b"a", b"b", b"c", b"d", b"e", b"f"], choice(["abcdef"]), 3, True),
        ("one-token-short", [b"a", b"b", b"c", b"d", b"e", b"f"], choice(["abcdef"]), 6, True),
        ("too-short-terminator", [b"a", b"b", b"c", b"("], choice(["abc"], "("), 3, True),
        ("wide-too-short", ABC_PAIRS, choice(five), 3, True),
        ("deep-unspellable", [*ABC_PAIRS, b"ba", b"cb"], choice(deep), 10, True),
        ("one-token-no-eos", ABC, choice(["a"]), 1, False),
    ]


EMPTY = _empty_problems()
EMPTY_IDS = [p[0] for p in EMPTY]

ADAPTRACK_OPTIONS = [
    {"share_q": share_q, "max_backtrack": mb, "min_backtrack_prob": mbp}
    for share_q, mb, mbp in itertools.product([False, True], [None, 0, 1], [0.0, 0.5])
]
# (method, options) for every method that must raise on an empty language.
RAISING = [("asap", {}), ("exact", {})] + [("adaptrack", o) for o in ADAPTRACK_OPTIONS]
RAISING_IDS = [
    m if not o else "adaptrack-" + "-".join(f"{k}={v}" for k, v in o.items()) for m, o in RAISING
]


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        elapsed = time.perf_counter() - started
        assert elapsed < QUICK_S, f"took {elapsed:.1f} s"


# ----------------------------------------------------------------- (a), (b) no valid sequence


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(("method", "options"), RAISING, ids=RAISING_IDS)
@pytest.mark.parametrize(("name", "tokens", "constraint", "max_new_tokens", "_"), EMPTY,
                         ids=EMPTY_IDS)
def test_search_methods_raise_on_an_empty_language(name, tokens, constraint, max_new_tokens, _,
                                                    method, options, temperature) -> None:
    lm = make_lm(tokens)
    with pytest.raises(NoValidSequenceError, match="max_new_tokens"):
        timed(generate, lm, [], constraint, method=method, n=3, temperature=temperature,
              max_new_tokens=max_new_tokens, seed=0, **options)


@pytest.mark.parametrize(("name", "tokens", "constraint", "max_new_tokens", "_"), EMPTY,
                         ids=EMPTY_IDS)
def test_exact_distribution_raises_on_an_empty_language(name, tokens, constraint,
                                                        max_new_tokens, _) -> None:
    with pytest.raises(NoValidSequenceError, match=f"max_new_tokens={max_new_tokens}"):
        timed(exact_distribution, make_lm(tokens), [], constraint, max_new_tokens=max_new_tokens)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(("name", "tokens", "constraint", "max_new_tokens", "has_first"), EMPTY,
                         ids=EMPTY_IDS)
def test_cd_returns_its_dead_end_or_raises_at_the_root(name, tokens, constraint, max_new_tokens,
                                                       has_first, temperature) -> None:
    lm = make_lm(tokens)
    proved = constraint.bind(lm.vocab).min_new_tokens() > max_new_tokens
    if proved or not has_first:
        with pytest.raises(NoValidSequenceError):
            timed(generate, lm, [], constraint, method="cd", n=3, temperature=temperature,
                  max_new_tokens=max_new_tokens, seed=0)
        assert not proved or lm.calls == 0
        return
    result = timed(generate, lm, [], constraint, method="cd", n=3, temperature=temperature,
                   max_new_tokens=max_new_tokens, seed=0)
    matcher = constraint.bind(lm.vocab)
    assert len(result.samples) == 3
    assert result.stats["incomplete"] == 3
    for s in result.samples:
        assert not s.complete and not s.valid
        assert 1 <= len(s.tokens) < max_new_tokens
        assert lm.vocab.eos_ids[0] not in s.tokens
        # The dead end is a valid prefix: every token the matcher accepted on the way.
        state = matcher.start()
        for tok in s.tokens:
            state = matcher.advance(state, tok)
            assert state is not None and not matcher.is_complete(state)
        assert s.text == lm.vocab.decode(s.tokens).decode()


def _rarely(tokens: list[bytes], rare: bytes) -> TableLM:
    """A TableLM over ``tokens`` plus EOS where ``rare`` has almost no weight."""
    vocab = [*tokens, b"<eos>"]
    weights = [1e-9 if t == rare else 1.0 for t in vocab]
    return TableLM(vocab, lambda prefix: weights, eos=len(vocab) - 1)


def test_cd_stops_where_the_string_cannot_finish() -> None:
    """choice(["abcdef", "f"]) with one byte per token and "f" all but never drawn: CD walks
    a, b and stops there when max_new_tokens=3 (the third token would have to end the
    sequence); "abcdef" alone is refused up front, its shortest text being too long."""
    lm = _rarely([b"a", b"b", b"c", b"d", b"e", b"f"], b"f")
    both = choice(["abcdef", "f"])
    result = generate(lm, [], both, method="cd", n=2, max_new_tokens=3, seed=0)
    assert [s.tokens for s in result.samples] == [(0, 1), (0, 1)]
    assert [s.text for s in result.samples] == ["ab", "ab"]
    result = generate(lm, [], both, method="cd", max_new_tokens=6, seed=0)
    assert result.samples[0].tokens == (0, 1, 2, 3, 4)
    with pytest.raises(NoValidSequenceError, match="at least 7 tokens"):
        generate(lm, [], choice(["abcdef"]), method="cd", max_new_tokens=6, seed=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(("name", "tokens", "constraint", "max_new_tokens", "_"), EMPTY,
                         ids=EMPTY_IDS)
def test_unconstrained_samples_are_invalid_on_an_empty_language(
        name, tokens, constraint, max_new_tokens, _, temperature) -> None:
    lm = make_lm(tokens)
    result = timed(generate, lm, [], constraint, method="unconstrained", n=5,
                   temperature=temperature, max_new_tokens=max_new_tokens, seed=0)
    assert len(result.samples) == 5
    for s in result.samples:
        assert not s.valid
        assert s.complete or len(s.tokens) == max_new_tokens
        assert len(s.tokens) <= max_new_tokens


def test_unconstrained_runs_out_of_tokens_as_incomplete() -> None:
    lm = make_lm([b"a", b"b"], eos_weight=0.0)  # never ends by itself
    result = generate(lm, [], choice(["ab"]), method="unconstrained", n=2, max_new_tokens=4,
                      seed=0)
    for s in result.samples:
        assert (s.complete, s.valid, len(s.tokens)) == (False, False, 4)
    assert result.stats["incomplete"] == 2


@pytest.mark.parametrize("method", ["cd", "asap", "adaptrack", "exact"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_more_token_makes_the_language_non_empty(method, temperature) -> None:
    """The counterpart of "one-token-short": with 7 tokens "abcdef" + EOS fits, and every
    constrained method finds it (so the errors above are not spurious)."""
    lm = make_lm([b"a", b"b", b"c", b"d", b"e", b"f"], eos_weight=5.0)
    result = generate(lm, [], choice(["abcdef"]), method=method, n=2, temperature=temperature,
                      max_new_tokens=7, seed=0)
    for s in result.samples:
        assert (s.tokens, s.text, s.complete, s.valid) == ((0, 1, 2, 3, 4, 5, 6), "abcdef",
                                                           True, True)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(("method", "options"), RAISING, ids=RAISING_IDS)
def test_a_dead_end_next_to_a_valid_sequence_is_left(method, options, temperature) -> None:
    """Most of the mass leads into dead ends (long strings that cannot finish); the search
    methods must leave them and return the one short valid string, whatever the options."""
    tokens = [b"a", b"b", b"c", b"ab"]
    weights = {(): [5.0, 5.0, 0.1, 5.0, 1.0]}

    def next_probs(prefix):
        return weights.get(prefix, [1.0, 1.0, 1.0, 1.0, 0.2])

    lm = TableLM([*tokens, b"<eos>"], next_probs, eos=4)
    strings = ["c"] + ["".join(p) for p in itertools.product("ab", repeat=6)]
    result = timed(generate, lm, [], choice(strings), method=method, n=3,
                   temperature=temperature, max_new_tokens=3, seed=1, **options)
    assert [s.tokens for s in result.samples] == [(2, 4)] * 3


# ----------------------------------------------------------------- (c) the tree limit


LONG = choice(["".join(p) for p in itertools.product("ab", repeat=10)])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method", METHODS)
def test_tree_limit_is_raised_with_a_helpful_message(method, temperature) -> None:
    # A complete sample needs 11 tokens (12 nodes); unconstrained runs for 20 (EOS has no mass).
    lm = make_lm([b"a", b"b"], eos_weight=0.0 if method == "unconstrained" else 1.0)
    with pytest.raises(TreeLimitError, match="max_nodes=8"):
        timed(generate, lm, [], LONG, method=method, n=2, temperature=temperature,
              max_new_tokens=20, max_nodes=8, seed=0, fallback=None)


def test_exact_distribution_raises_tree_limit() -> None:
    lm = make_lm([b"a", b"b"])
    with pytest.raises(TreeLimitError, match="max_nodes=100"):
        timed(exact_distribution, lm, [], LONG, max_new_tokens=11, max_nodes=100)
    dist = exact_distribution(lm, [], LONG, max_new_tokens=11, max_nodes=5000)
    assert len(dist) == 2**10


def test_tree_limit_bounds_the_tree_exactly() -> None:
    """Greedy CD on LONG needs exactly 12 nodes: max_nodes=12 is enough, 11 is not."""
    lm = make_lm([b"a", b"b"])
    result = generate(lm, [], LONG, method="cd", temperature=0, max_new_tokens=11,
                      max_nodes=12)
    assert result.samples[0].valid
    assert result.stats["tree_nodes"] == 12
    with pytest.raises(TreeLimitError, match="max_nodes"):
        generate(lm, [], LONG, method="cd", temperature=0, max_new_tokens=11, max_nodes=11)


# ----------------------------------------------------------------- (d) bad arguments


TINY = make_lm([b"a", b"b"])
AB = choice(["a", "ab"])


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"method": "beam"}, r"unknown method 'beam'.*unconstrained.*cd.*asap.*adaptrack.*exact"),
        ({"n": 0}, r"n must be at least 1, got 0"),
        ({"n": -2}, r"n must be at least 1"),
        ({"temperature": -0.5}, r"temperature must be >= 0"),
        ({"temperature": float("nan")}, r"temperature"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_p": -0.1}, r"top_p"),
        ({"top_p": float("nan")}, r"top_p"),
        ({"max_new_tokens": 0}, r"max_new_tokens must be at least 1, got 0"),
        ({"max_nodes": 0}, r"max_nodes must be at least 1"),
        ({"method": "cd", "share_q": True}, r"share_q.*adaptrack"),
        ({"method": "asap", "share_q": True}, r"share_q.*adaptrack"),
        ({"method": "exact", "max_backtrack": 1}, r"max_backtrack.*adaptrack"),
        ({"method": "unconstrained", "min_backtrack_prob": 0.5},
         r"min_backtrack_prob.*adaptrack"),
        ({"max_backtrack": -1}, r"max_backtrack must be >= 0"),
        ({"min_backtrack_prob": 1.5}, r"min_backtrack_prob must be in \[0, 1\]"),
        ({"min_backtrack_prob": -0.1}, r"min_backtrack_prob"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        generate(TINY, [], AB, **kwargs)


@pytest.mark.parametrize("prompt", [[3], [-1], [0, 1, 99]])
def test_prompt_ids_out_of_range(prompt) -> None:
    with pytest.raises(ValueError, match=r"outside the vocabulary \(0\.\.2\)"):
        generate(TINY, prompt, AB)


def test_prompt_text_the_vocabulary_cannot_encode() -> None:
    with pytest.raises(ValueError, match="cannot encode"):
        generate(TINY, "abz", AB)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"temperature": 0.0}, "temperature > 0"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_nodes": 0}, "max_nodes"),
    ],
)
def test_exact_distribution_bad_arguments(kwargs, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        exact_distribution(TINY, [], AB, **kwargs)


def _lm_returning(weights_at_depth_1):
    """A TableLM that behaves for the first token (never EOS), then returns the given
    weights."""

    def next_probs(prefix):
        return [1.0, 1.0, 0.0] if len(prefix) == 0 else weights_at_depth_1

    return TableLM([b"a", b"b", b"<eos>"], next_probs, eos=2)


@pytest.mark.parametrize(
    "bad",
    [
        [1.0, 1.0],  # too short
        [1.0, 1.0, 1.0, 1.0],  # too long
        [0.0, 0.0, 0.0],  # no mass
        [1.0, -1.0, 1.0],  # negative
        [1.0, float("nan"), 1.0],  # not a number
        np.ones((3, 1)),  # wrong shape
    ],
    ids=["short", "long", "zeros", "negative", "nan", "2d"],
)
@pytest.mark.parametrize("method", METHODS)
def test_model_output_errors_are_named(method, bad) -> None:
    lm = _lm_returning(bad)
    with pytest.raises(ModelOutputError, match="next_probs") as info:
        generate(lm, [], choice(["ab", "ba"]), method=method, n=2, max_new_tokens=4, seed=0)
    assert isinstance(info.value, ValueError)
    assert "must return 3 non-negative finite weights" in str(info.value)


@pytest.mark.parametrize("method", ["unconstrained", "cd", "exact"])
def test_infinite_weights_are_a_model_output_error(method) -> None:
    lm = _lm_returning([1.0, float("inf"), 1.0])
    with pytest.raises(ModelOutputError):
        generate(lm, [], choice(["ab", "ba"]), method=method, n=2, max_new_tokens=4, seed=0)


@pytest.mark.parametrize("terminators", ["(", b"(", ["(", " "], "x("])
@pytest.mark.parametrize("strings", [["ab", "a(b"], ["("], ["abc("]])
def test_choice_rejects_a_terminator_inside_a_string(strings, terminators) -> None:
    with pytest.raises(ValueError, match=r"terminator b'\('.*occurs inside"):
        choice(strings, terminators=terminators)


def test_choice_accepts_terminators_outside_its_strings() -> None:
    c = choice(["ab", "a"], terminators=["(", " "])
    assert c.terminators == b" ("


# ------------------------------------------- (e) refused up front, budgets, finished work kept


def _counting(tokens: list[bytes], eos_weight: float = 1.0) -> TableLM:
    lm = make_lm(tokens, eos_weight)
    lm.calls = 0
    return lm


@pytest.mark.parametrize("method", ["asap", "adaptrack", "exact"])
def test_a_language_empty_in_practice_is_refused_before_any_model_call(method) -> None:
    """regex("[ab]{100}") with max_new_tokens=8: every prefix is valid but none can finish.
    The searches used to open every prefix first (hours on a real model at ~15 prefixes/s);
    the constraint's lower bound refuses it before the model is asked."""
    lm = _counting([b"a", b"b"])
    with pytest.raises(NoValidSequenceError, match=r"at least 101 tokens.*max_new_tokens=8"):
        generate(lm, [], at.constraints.regex("[ab]{100}"), method=method, n=2,
                 max_new_tokens=8, seed=0)
    assert lm.calls == 0
    with pytest.raises(NoValidSequenceError, match=r"at least 101 tokens.*max_new_tokens=8"):
        exact_distribution(lm, [], at.constraints.regex("[ab]{100}"), max_new_tokens=8)
    assert lm.calls == 0


class _Bounded(at.constraints.Constraint):
    """``inner`` with a given ``min_new_tokens`` (any constraint may declare one)."""

    def __init__(self, inner: at.constraints.Constraint, bound: int) -> None:
        self.inner, self.bound = inner, bound

    def bind(self, vocab):
        matcher = self.inner.bind(vocab)
        matcher.min_new_tokens = lambda: self.bound
        return matcher


@pytest.mark.parametrize("method", METHODS)
def test_the_lower_bound_is_asked_of_any_constraint(method) -> None:
    lm = _counting([b"a", b"b"])
    c = _Bounded(choice(["ab", "ba"]), 5)
    if method == "unconstrained":  # free text: no constraint to refuse
        assert len(generate(lm, [], c, method=method, n=2, max_new_tokens=4).samples) == 2
        return
    with pytest.raises(NoValidSequenceError, match=r"at least 5 tokens.*max_new_tokens=4"):
        generate(lm, [], c, method=method, n=2, max_new_tokens=4)
    assert lm.calls == 0
    assert generate(lm, [], c, method=method, n=2, max_new_tokens=5, seed=0).samples[0].valid


class _LimitRecorder(at.constraints.Constraint):
    """``inner`` whose matcher records the ``limit`` each ``forced_bytes`` call gets (and,
    with ``honour=False``, gives every forced byte whatever the limit)."""

    def __init__(self, inner: at.constraints.Constraint, honour: bool = True) -> None:
        self.inner, self.honour, self.limits = inner, honour, []

    def bind(self, vocab):
        matcher = self.inner.bind(vocab)
        plain = matcher.forced_bytes

        def forced_bytes(state, limit=None):
            self.limits.append(limit)
            data = plain(state)
            return data[:limit] if self.honour and limit is not None else data

        matcher.forced_bytes = forced_bytes
        return matcher


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_forced_bytes_are_asked_only_as_far_as_the_length_limit_reaches(temperature) -> None:
    """A forced string far longer than max_new_tokens (500 "a"s after the first, 8 tokens of
    at most 2 bytes; the other text, "b", all but never drawn) is asked for at most
    (8 + 4 held back) · 2 + 3 bytes, and the cut changes no sample."""
    lm = _rarely([b"a", b"aa", b"b"], b"b")
    limited, full = (_LimitRecorder(choice(["a" * 500, "b"])),
                     _LimitRecorder(choice(["a" * 500, "b"]), honour=False))
    runs = [generate(lm, [], c, method="cd", n=3, max_new_tokens=8, seed=0,
                     temperature=temperature) for c in (limited, full)]
    assert limited.limits and all(x is not None and x <= 27 for x in limited.limits)
    assert [s.tokens for s in runs[0].samples] == [s.tokens for s in runs[1].samples]
    assert runs[0].stats["lm_calls"] == runs[1].stats["lm_calls"]
    assert all(not s.complete for s in runs[0].samples)


def test_a_forced_string_of_a_hundred_million_bytes() -> None:
    """regex("a{99999999}"): refused before any model call (its shortest text needs 50 million
    tokens); behind a rare "b" the grammar walks at most the limit (llguidance's own forcing
    would compute all 99 999 999 bytes, then the tokenizer would split them)."""
    lm = _rarely([b"a", b"aa", b"b"], b"b")
    with pytest.raises(NoValidSequenceError, match="at least 50000001 tokens"):
        generate(lm, [], at.constraints.regex("a{99999999}"), method="cd", max_new_tokens=8)
    assert lm.calls == 0
    res = generate(lm, [], at.constraints.regex("b|a{99999999}"), method="cd",
                   max_new_tokens=8, seed=0)
    assert not res.samples[0].complete and set(res.samples[0].text) == {"a"}
    assert res.stats["lm_calls"] <= 8


class _SlowLM(TableLM):
    """A TableLM whose every model call takes ``seconds``."""

    def __init__(self, seconds: float, eos_weight: float = 1.0) -> None:
        base = make_lm([b"a", b"b"], eos_weight)
        super().__init__([b"a", b"b", b"<eos>"], base.next_probs, eos=2)
        self.seconds = seconds

    def _next_logprobs(self, prefixes):
        time.sleep(self.seconds)
        return super()._next_logprobs(prefixes)


@pytest.mark.parametrize("method", METHODS)
def test_every_search_has_a_time_budget(method) -> None:
    lm = _SlowLM(0.02, eos_weight=0.0 if method == "unconstrained" else 1.0)
    with pytest.raises(at.SearchTimeoutError, match=r"max_seconds=0\.05 .*raise max_seconds"):
        generate(lm, [], LONG, method=method, n=4, max_new_tokens=20, max_seconds=0.05, seed=0,
                 fallback=None)
    with pytest.raises(at.SearchTimeoutError, match=r"max_seconds=0\.05"):
        exact_distribution(lm, [], LONG, max_new_tokens=11, max_seconds=0.05)


def test_the_time_budget_defaults_to_ten_minutes_and_none_lifts_it() -> None:
    assert at.SamplingOptions().max_seconds == at.MAX_SECONDS
    assert at.MAX_SECONDS == 600
    res = generate(make_lm([b"a", b"b"]), [], LONG, method="exact", max_new_tokens=11,
                   max_seconds=None, seed=0)
    assert res.samples[0].valid


def test_opened_prefixes_are_bounded_in_bytes() -> None:
    """AdapTrack with no constraint opens prefixes whose expansion spans the vocabulary
    (49 152 × 8 bytes each on the default model); past max_opened_bytes it stops."""
    width = 2000
    lm = TableLM([f"t{i}".encode() for i in range(width)] + [b"<eos>"],
                 lambda prefix: [1.0] * width + [0.01], eos=width)
    with pytest.warns(at.FreeTextWarning):
        with pytest.raises(TreeLimitError, match=r"max_opened_bytes=100000.*raise "
                                                  r"max_opened_bytes"):
            generate(lm, [], None, method="adaptrack", n=4, max_new_tokens=16, seed=0,
                     max_opened_bytes=100_000, fallback=None)


@pytest.mark.parametrize("method", ["asap", "adaptrack", "exact"])
def test_searches_for_free_text_warn_before_they_start(method) -> None:
    lm = make_lm([b"a", b"b"])
    with pytest.warns(at.FreeTextWarning, match=r"ends \(EOS\) within max_new_tokens=6.*"
                                                r"method='unconstrained'"):
        generate(lm, [], None, method=method, n=2, max_new_tokens=6, seed=0)


@pytest.mark.parametrize("method", METHODS)
def test_no_warning_with_a_constraint_or_for_free_text_methods(method) -> None:
    import warnings

    lm = make_lm([b"a", b"b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.FreeTextWarning)
        generate(lm, [], AB, method=method, n=2, max_new_tokens=6, seed=0)
        if method in ("cd", "unconstrained"):
            generate(lm, [], None, method=method, n=2, max_new_tokens=6, seed=0)


class _ShortContextLM(TableLM):
    def __init__(self, context: int) -> None:
        base = make_lm([b"a", b"b"])
        super().__init__([b"a", b"b", b"<eos>"], base.next_probs, eos=2)
        self.context_length = context
        self.calls = 0


def test_a_prompt_longer_than_the_context_is_refused_before_any_model_call() -> None:
    lm = _ShortContextLM(10)
    with pytest.raises(at.PromptTooLongError,
                       match=r"8 tokens and max_new_tokens=4: 12 > _ShortContextLM's context "
                             r"of 10 tokens.*truncate_prompt=True \(keeps the last 6"):
        generate(lm, "ab" * 4, AB, max_new_tokens=4)
    with pytest.raises(ValueError, match="context of 10"):
        exact_distribution(lm, "ab" * 4, AB, max_new_tokens=4)
    with pytest.raises(at.PromptTooLongError, match="lower max_new_tokens"):
        generate(lm, [], AB, max_new_tokens=11, truncate_prompt=True)
    assert lm.calls == 0
    assert generate(lm, "ab" * 3, AB, max_new_tokens=4).samples  # 6 + 4 fits


@pytest.mark.parametrize("method", METHODS)
def test_truncate_prompt_keeps_the_end_of_the_prompt(method) -> None:
    lm = _ShortContextLM(10)
    prompt = [0, 1, 1, 0, 0, 1, 0, 1, 1]
    cut = generate(lm, prompt, AB, method=method, n=5, max_new_tokens=4, seed=2,
                   truncate_prompt=True)
    assert cut.stats["prompt_tokens"] == 6
    same = generate(lm, prompt[-6:], AB, method=method, n=5, max_new_tokens=4, seed=2)
    assert [s.tokens for s in cut.samples] == [s.tokens for s in same.samples]


def _subsequence(part: list, whole: list) -> bool:
    rest = iter(whole)
    return all(any(x == y for y in rest) for x in part)


@pytest.mark.parametrize("parallel", [False, True])
def test_a_budget_that_runs_out_midway_keeps_the_finished_samples(parallel: bool) -> None:
    lm, constraint, max_new = PROBLEMS["api_names"]()
    full = generate(lm, [], constraint, method="exact", n=30, seed=1, max_new_tokens=max_new,
                    parallel=parallel)
    nodes = int(full.stats["tree_nodes"])
    partials = []
    for max_nodes in range(2, nodes, max(1, nodes // 10)):
        with pytest.raises(TreeLimitError) as info:
            generate(lm, [], constraint, method="exact", n=30, seed=1, max_new_tokens=max_new,
                     max_nodes=max_nodes, parallel=parallel, fallback=None)
        partial = info.value.partial
        if parallel:  # samples finish out of order: the finished ones, in sample order
            assert _subsequence(partial.samples, full.samples)
        else:
            assert partial.samples == full.samples[:len(partial.samples)]
        assert partial.stats["tree_nodes"] == max_nodes
        partials.append(len(partial.samples))
    assert partials[0] == 0 and max(partials) > 0


@pytest.mark.parametrize("method", METHODS)
def test_a_model_failing_midway_keeps_the_finished_samples(method) -> None:
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    calls_when_done: list[int] = []
    full = generate(lm, [], constraint, method=method, n=20, seed=4, max_new_tokens=max_new,
                    batch_size=1, on_sample=lambda s: calls_when_done.append(lm.calls))
    # Fail on the first model call after some sample finished and before the last did.
    fail_after = next(c for c in calls_when_done if 0 < c < calls_when_done[-1])
    good, asked = lm.next_probs, []

    def failing(prefix):
        asked.append(prefix)
        return good(prefix) if len(asked) <= fail_after else [0.0] * len(lm.vocab.token_bytes)

    broken = TableLM(lm.vocab.token_bytes, failing, eos=lm.vocab.eos_ids.tolist())
    with pytest.raises(ModelOutputError) as info:
        generate(broken, [], constraint, method=method, n=20, seed=4, max_new_tokens=max_new,
                 batch_size=1)
    partial = info.value.partial
    assert 0 < len(partial.samples) < 20
    if method == "exact":  # parallel rounds: samples finish out of order
        assert _subsequence(partial.samples, full.samples)
    else:
        assert partial.samples == full.samples[:len(partial.samples)]


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"temperature": float("inf")}, ValueError, r"temperature must be >= 0 and finite"),
        ({"temperature": float("nan")}, ValueError, r"temperature.*nan"),
        ({"temperature": "1"}, TypeError, r"temperature must be a number, got '1'"),
        ({"temperature": True}, TypeError, r"temperature must be a number, got True"),
        ({"top_p": float("inf")}, ValueError, r"top_p must be in \(0, 1\], got inf"),
        ({"top_p": float("nan")}, ValueError, r"top_p must be in \(0, 1\], got nan"),
        ({"top_p": True}, TypeError, r"top_p must be a number"),
        ({"n": True}, TypeError, r"n must be an int, got True"),
        ({"n": 2.0}, TypeError, r"n must be an int, got 2\.0"),
        ({"max_new_tokens": True}, TypeError, r"max_new_tokens must be an int, got True"),
        ({"max_new_tokens": 4.5}, TypeError, r"max_new_tokens must be an int"),
        ({"max_nodes": True}, TypeError, r"max_nodes must be an int"),
        ({"max_nodes": float("inf")}, TypeError, r"max_nodes must be an int"),
        ({"seed": True}, TypeError, r"seed must be an int, got True"),
        ({"seed": -1}, ValueError, r"seed must be >= 0, got -1"),
        ({"seed": 1.5}, TypeError, r"seed must be an int"),
        ({"batch_size": True}, TypeError, r"batch_size must be an int"),
        ({"batch_size": 0}, ValueError, r"batch_size must be at least 1, got 0"),
        ({"max_cache_bytes": True}, TypeError, r"max_cache_bytes must be an int"),
        ({"max_opened_bytes": -1}, ValueError, r"max_opened_bytes must be >= 0, got -1"),
        ({"max_opened_bytes": 1e9}, TypeError, r"max_opened_bytes must be an int"),
        ({"max_backtrack": True}, TypeError, r"max_backtrack must be an int"),
        ({"min_backtrack_prob": float("nan")}, ValueError, r"min_backtrack_prob"),
        ({"min_backtrack_prob": True}, TypeError, r"min_backtrack_prob must be a number"),
        ({"share_q": 1}, TypeError, r"share_q must be True or False, got 1"),
        ({"truncate_prompt": "yes"}, TypeError, r"truncate_prompt must be True or False"),
        ({"max_seconds": 0}, ValueError, r"max_seconds must be > 0 or None"),
        ({"max_seconds": float("nan")}, ValueError, r"max_seconds must be > 0 or None"),
        ({"max_seconds": True}, TypeError, r"max_seconds must be a number"),
        ({"max_seconds": "10"}, TypeError, r"max_seconds must be a number"),
        ({"fast_forward": 1}, TypeError, r"fast_forward must be True, False or FastForward"),
        ({"method": None}, ValueError, r"unknown method None"),
        ({"on_sample": 3}, TypeError, r"on_sample must be callable"),
    ],
)
def test_numeric_keywords_are_checked_by_name(kwargs, error, pattern) -> None:
    lm = _counting([b"a", b"b"])
    with pytest.raises(error, match=pattern):
        generate(lm, [], AB, **kwargs)
    assert lm.calls == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"temperature": float("inf")}, ValueError, "temperature"),
        ({"top_p": float("nan")}, ValueError, "top_p"),
        ({"max_new_tokens": True}, TypeError, "max_new_tokens must be an int"),
        ({"max_nodes": True}, TypeError, "max_nodes must be an int"),
        ({"max_seconds": -1.0}, ValueError, "max_seconds"),
    ],
)
def test_exact_distribution_checks_its_numbers_by_name(kwargs, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        exact_distribution(TINY, [], AB, **kwargs)


def test_prompt_ids_must_be_ints() -> None:
    with pytest.raises(TypeError, match="prompt token ids must be ints, got True"):
        generate(TINY, [True, 0], AB)
    with pytest.raises(TypeError, match="prompt must be a str or a sequence"):
        generate(TINY, b"ab", AB)


def test_parallel_shared_q_leaves_a_link_another_walk_killed() -> None:
    """With ``share_q`` and walks in parallel, a walk may come back along N to a prefix
    another walk found dead while it waited (P_Q 0 before and after its own update); it
    must leave it, not loop without yielding (where no budget can stop it). Run in a
    subprocess: the old behaviour never returns."""
    import subprocess
    import sys

    code = (
        "import adaptrack as at, warnings\n"
        "from adaptrack.testing import length_bound\n"
        "warnings.simplefilter('ignore')\n"
        "lm, c, k = length_bound()\n"
        "for seed in (69, 97, 125):\n"
        "    res = at.generate(lm, [], c, method='adaptrack', n=3, seed=seed, end='eos',\n"
        "                      max_new_tokens=k, share_q=True, parallel=True)\n"
        "    assert all(s.complete for s in res.samples), res.samples\n"
        "print('ok')\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("adaptrack with share_q and parallel=True did not return within 120 s")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
