"""Termination and failure modes: empty languages, too few tokens, tree limits, bad arguments.

Every method must end, quickly, on a problem with no valid complete sequence: ``asap``,
``adaptrack`` (whatever its options) and ``exact`` raise ``NoValidSequenceError``; ``cd``
raises only when no first token is valid and otherwise returns the dead end it walked into as
an incomplete sample; ``unconstrained`` returns samples the constraint rejects.
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
        ("choice-of-nothing", ABC, choice([]), 8, False),
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
    if not has_first:
        with pytest.raises(NoValidSequenceError):
            timed(generate, lm, [], constraint, method="cd", n=3, temperature=temperature,
                  max_new_tokens=max_new_tokens, seed=0)
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


def test_cd_stops_where_the_string_cannot_finish() -> None:
    """choice(["abcdef"]) with one byte per token: CD walks a, b and stops there when
    max_new_tokens=3 (the third token would have to end the sequence)."""
    lm = make_lm([b"a", b"b", b"c", b"d", b"e", b"f"])
    result = generate(lm, [], choice(["abcdef"]), method="cd", n=2, max_new_tokens=3, seed=0)
    assert [s.tokens for s in result.samples] == [(0, 1), (0, 1)]
    assert [s.text for s in result.samples] == ["ab", "ab"]
    result = generate(lm, [], choice(["abcdef"]), method="cd", max_new_tokens=6, seed=0)
    assert result.samples[0].tokens == (0, 1, 2, 3, 4)


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
              max_new_tokens=20, max_nodes=8, seed=0)


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
