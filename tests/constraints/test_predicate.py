"""Python predicates (the paper's oracle constrainer), lazy checking, timeouts, and all_of."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

import adaptrack as at
from adaptrack.constraints import all_of, anything, choice, predicate
from adaptrack.errors import SearchTimeoutError
from adaptrack.sampling.topp import checked_nucleus, nucleus
from adaptrack.testing import PROBLEMS, api_names, hashed_weights

METHODS = ["cd", "asap", "adaptrack", "exact"]


def as_predicate(strings: list[bytes], terminators: bytes = b"", **kw) -> at.constraints.Predicate:
    """The choice language as an oracle: the same strings, asked about as text."""
    texts = [s.decode() for s in strings]
    if terminators:
        ends = [t + chr(b) for t in texts for b in terminators]
        return predicate(lambda t: any(e.startswith(t) for e in ends),
                         lambda t: t in ends, terminators=terminators, **kw)
    return predicate(lambda t: any(s.startswith(t) for s in texts), lambda t: t in texts, **kw)


@pytest.mark.parametrize("name", sorted(PROBLEMS))
@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_predicate_matches_choice_distribution(name: str, top_p: float) -> None:
    lm, c, max_new = PROBLEMS[name]()
    oracle = as_predicate(c.strings, c.terminators)
    # A predicate reports no forced bytes: compare without fast-forward's conditioning; and
    # only EOS ends its texts (a lazy matcher has no mask to tell which tokens leave them).
    want = at.exact_distribution(lm, [], c, max_new_tokens=max_new, top_p=top_p,
                                 fast_forward=False, end="eos")
    got = at.exact_distribution(lm, [], oracle, max_new_tokens=max_new, top_p=top_p,
                                fast_forward=False, end="eos")
    assert got.keys() == want.keys()
    for seq, p in want.items():
        assert got[seq] == pytest.approx(p, abs=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_predicate_samples_like_choice(method: str) -> None:
    """Same tree facts, same random streams: identical samples to the eager constraint."""
    lm, c, max_new = api_names()
    oracle = as_predicate(c.strings, c.terminators)
    kw = dict(method=method, n=30, seed=3, max_new_tokens=max_new, fast_forward=False,
              end="eos")
    want = at.generate(lm, [], c, **kw)
    got = at.generate(lm, [], oracle, **kw)
    assert got.texts == want.texts
    assert all(s.valid for s in got.samples if s.complete)
    assert got.stats["checks"] > 0 and got.stats["check_timeouts"] == 0


def test_checked_nucleus_equals_nucleus() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        size = int(rng.integers(1, 60))
        probs = rng.dirichlet(np.full(size, 0.3))
        probs[rng.random(size) < 0.1] = 0.0
        probs[0] += 1e-3
        probs /= probs.sum()
        valid = np.flatnonzero(rng.random(size) < rng.random())
        candidates = np.flatnonzero(rng.random(size) < 0.8)
        truth = set(valid.tolist())
        top_p = float(rng.choice([1.0, 0.95, 0.5, 0.1]))
        eager = nucleus(probs, np.intersect1d(valid, candidates), top_p)
        lazy = checked_nucleus(probs, candidates, lambda t, truth=truth: t in truth, top_p)
        assert lazy.tolist() == [t for t in eager.tolist() if probs[t] > 0]


def _checked_nucleus_by_full_sort(probs, candidates, check, top_p):
    order = np.argsort(-probs, kind="stable")
    order = order[probs[order] > 0]
    unchecked = np.clip(1.0 - np.cumsum(probs[order]), 0.0, None)
    valid, known = [], 0.0
    for i, tok in enumerate(order.tolist()):
        if tok in candidates and check(tok):
            valid.append(tok)
            known += probs[tok]
        if known > 0 and known / (known + unchecked[i]) > top_p:
            break
    return sorted(valid)


def test_checked_nucleus_asks_in_the_full_rankings_order() -> None:
    # Vocabularies past the ranked head (HEAD ids), with ties and zeros: the same tokens
    # asked in the same order, and the same result, as ranking the whole vocabulary.
    rng = np.random.default_rng(1)
    for trial in range(200):
        size = int(rng.integers(300, 6000))
        probs = rng.dirichlet(np.full(size, float(rng.choice([0.05, 0.5, 5.0]))))
        if trial % 2:
            probs = np.round(probs, 4)  # many ties, some zeros
            probs[0] += 1e-3
        probs[rng.random(size) < 0.05] = 0.0
        probs /= probs.sum()
        share = float(rng.choice([0.001, 0.05, 0.5, 0.95]))
        truth = set(np.flatnonzero(rng.random(size) < share).tolist())
        candidates = np.flatnonzero(rng.random(size) < 0.9)
        top_p = float(rng.choice([1.0, 0.99, 0.95, 0.5]))
        asked, expected_asks = [], []
        got = checked_nucleus(probs, candidates,
                              lambda t, truth=truth, log=asked: log.append(t) or t in truth,
                              top_p)
        want = _checked_nucleus_by_full_sort(
            probs, set(candidates.tolist()),
            lambda t, truth=truth, log=expected_asks: log.append(t) or t in truth, top_p)
        assert got.tolist() == want and asked == expected_asks


def test_top_p_bounds_the_checks() -> None:
    """With a peaked model and top_p < 1 only the head of the vocabulary is asked about."""
    size = 1000
    weights = [2.0 ** -(i / 10) for i in range(size)]
    lm = at.TableLM([f"<{i}>".encode() for i in range(size)] + [b"<eos>"],
                    lambda p: [*weights, 1e-3], eos=size)
    ok = predicate(lambda t: t.count("<") <= 2, lambda t: t.count("<") == 2, timeout=None)
    full = at.generate(lm, [], ok, method="cd", seed=0, max_new_tokens=3)
    cut = at.generate(lm, [], ok, method="cd", seed=0, max_new_tokens=3, top_p=0.9)
    assert full.stats["checks"] > 2 * size  # every token, at each of the two new prefixes
    assert cut.stats["checks"] < 200
    assert cut.samples[0].valid


def test_timeout_counts_the_token_invalid() -> None:
    """A check that hangs on one text is cut after `timeout`; that token is invalid."""
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda p: [5, 1, 1], eos=2)

    def prefix_ok(text: str) -> bool:
        if text == "a":
            while True:  # a pure-Python hang: the alarm interrupts it
                pass
        return len(text) <= 2

    slow = predicate(prefix_ok, lambda t: len(t) == 2, timeout=0.05)
    before = signal.getsignal(signal.SIGALRM)
    started = time.perf_counter()
    res = at.generate(lm, [], slow, method="adaptrack", n=5, seed=0, max_new_tokens=3)
    assert time.perf_counter() - started < 5
    assert res.stats["check_timeouts"] == 1  # asked once, remembered as invalid
    assert {s.text for s in res.samples} <= {"ba", "bb"}
    assert signal.getsignal(signal.SIGALRM) is before


def test_timeout_outside_the_main_thread_is_judged_afterwards() -> None:
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda p: [1, 1, 1], eos=2)

    def prefix_ok(text: str) -> bool:
        if text == "a":
            time.sleep(0.2)
        return len(text) <= 1

    slow = predicate(prefix_ok, lambda t: len(t) == 1, timeout=0.05)
    out: list[at.GenerationResult] = []
    worker = threading.Thread(
        target=lambda: out.append(at.generate(lm, [], slow, method="exact", n=4, seed=0)))
    worker.start()
    worker.join(30)
    assert out and out[0].stats["check_timeouts"] == 1
    assert set(out[0].texts) == {"b"}


def test_utf8_split_across_tokens() -> None:
    """'é' is two bytes in two tokens: the predicate sees whole characters only."""
    seen: list[str] = []
    lm = at.TableLM([b"\xc3", b"\xa9", b"e", b"<eos>"], lambda p: [1, 1, 1, 1], eos=3)

    def prefix_ok(text: str) -> bool:
        seen.append(text)
        return text in ("", "é")

    c = predicate(prefix_ok, lambda t: t == "é")
    dist = at.exact_distribution(lm, [], c, max_new_tokens=3)
    assert list(dist) == [(0, 1, 3)]
    assert all(isinstance(t, str) for t in seen) and "é" in seen


def test_invalid_utf8_is_never_valid() -> None:
    lm = at.TableLM([b"\xa9", b"a", b"<eos>"], lambda p: [1, 1, 1], eos=2)
    c = predicate(lambda t: True, lambda t: True)
    dist = at.exact_distribution(lm, [], c, max_new_tokens=2)
    assert set(dist) == {(2,), (1, 2)}


def test_predicate_errors() -> None:
    with pytest.raises(TypeError, match="two callables"):
        predicate("x", lambda t: True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        predicate(lambda t: True, lambda t: True, timeout=0)


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(("kw", "error", "message"), [
    ({"timeout": "1"}, TypeError, r"timeout takes a number of seconds > 0 or None .*got '1' "
                                  r"\(str\)"),
    ({"timeout": True}, TypeError, r"timeout takes .*got True \(bool\)"),
    ({"timeout": INF}, ValueError, r"timeout takes a finite number .*got inf"),
    ({"timeout": -INF}, ValueError, r"timeout takes a finite number .*got -inf"),
    ({"timeout": NAN}, ValueError, r"timeout takes a finite number .*got nan"),
    ({"timeout": -1.0}, ValueError, r"timeout takes a finite number .*got -1.0"),
    ({"max_timeouts": 2.0}, TypeError, r"max_timeouts must be an int >= 1 or None, got 2.0 "
                                       r"\(float\)"),
    ({"max_timeouts": "3"}, TypeError, r"max_timeouts must be .*got '3' \(str\)"),
    ({"max_timeouts": True}, TypeError, r"max_timeouts must be .*got True \(bool\)"),
    ({"max_timeouts": -1}, ValueError, r"max_timeouts must be .*got -1"),
])
def test_bad_timeouts_are_refused_up_front(kw, error, message) -> None:
    """A timeout setitimer cannot take (inf) or that is not a number fails at construction,
    not at the first check mid-sampling (the fuzz found both)."""
    with pytest.raises(error, match=message) as caught:
        predicate(lambda t: True, lambda t: True, **kw)
    assert "\n" not in str(caught.value)


def test_numeric_timeouts_of_any_kind_work() -> None:
    """NumPy numbers count; a finite timeout too long for setitimer (1e20 s) is no limit."""
    lm = at.TableLM([b"a", b"<eos>"], lambda p: [1, 1], eos=1)
    for kw in ({"timeout": np.float32(5)}, {"timeout": 1e20}, {"timeout": 7},
               {"max_timeouts": np.int64(4)}):
        c = predicate(lambda t: len(t) <= 1, lambda t: t == "a", **kw)
        assert isinstance(c.timeout, float) and isinstance(c.max_timeouts, int)
        res = at.generate(lm, [], c, method="cd", seed=0, max_new_tokens=3)
        assert res.texts == ["a"] and res.stats["check_timeouts"] == 0


def test_predicate_exceptions_propagate() -> None:
    """A bug in the user's check is reported, never taken as 'invalid'."""
    lm = at.TableLM([b"a", b"<eos>"], lambda p: [1, 1], eos=1)
    broken = predicate(lambda t: 1 / 0, lambda t: True)
    with pytest.raises(ZeroDivisionError):
        at.generate(lm, [], broken, method="cd", seed=0)


# --- all_of -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_all_of_is_the_intersection(name: str) -> None:
    lm, c, max_new = PROBLEMS[name]()
    keep = [s for i, s in enumerate(c.strings) if i % 2 == 0]
    half = choice(keep, terminators=c.terminators or None)
    # Forced bytes depend on how a constraint is written, not only on its language, so
    # compare without fast-forward.
    # end="eos": with a predicate part, all_of is lazy, and only EOS ends a lazy text.
    want = at.exact_distribution(lm, [], half, max_new_tokens=max_new, fast_forward=False,
                                 end="eos")
    for both in (all_of(c, half), all_of(half, c), all_of(c, as_predicate(keep, c.terminators))):
        got = at.exact_distribution(lm, [], both, max_new_tokens=max_new, fast_forward=False,
                                    end="eos")
        assert got.keys() == want.keys()
        for seq, p in want.items():
            assert got[seq] == pytest.approx(p, abs=1e-12)


def test_all_of_terminators_must_agree() -> None:
    lm, c, _ = api_names()
    with pytest.raises(ValueError, match="end sequences differently"):
        all_of(c, choice(["ab"], terminators=")")).bind(lm.vocab)
    with pytest.raises(ValueError, match=r"none \(EOS\)"):
        all_of(c, choice([s.decode() + "(" for s in c.strings])).bind(lm.vocab)
    same = all_of(c, anything("("))
    assert at.exact_distribution(lm, [], same, max_new_tokens=8) == pytest.approx(
        at.exact_distribution(lm, [], c, max_new_tokens=8))


def test_all_of_forced_bytes_and_errors() -> None:
    lm = at.TableLM([b"a", b"b", b"<eos>"], hashed_weights(3), eos=2)
    m = all_of(choice(["abab"]), choice(["aba", "abab"])).bind(lm.vocab)
    assert m.forced_bytes(m.start()) == b"abab"
    m = all_of(choice(["ab"]), choice(["ba"])).bind(lm.vocab)
    assert m.forced_bytes(m.start()) == b""
    assert len(m.allowed(m.start())) == 0
    with pytest.raises(ValueError, match="at least one"):
        all_of()
    with pytest.raises(TypeError, match="takes constraints"):
        all_of("abc")  # type: ignore[arg-type]


@pytest.mark.parametrize("answer", ["no", None, 1, [], np.array([True])])
def test_a_check_must_return_a_bool(answer) -> None:
    lm = at.TableLM([b"a", b"<eos>"], lambda p: [1, 1], eos=1)
    for c in (predicate(lambda t: answer, lambda t: True),
              predicate(lambda t: True, lambda t: answer)):
        with pytest.raises(TypeError, match=r"must return a bool, got .*\(\w+\) for '"):
            at.generate(lm, [], c, method="exact", max_new_tokens=2)
    with pytest.raises(TypeError, match=r"prefix_ok \(.*<lambda>\) must return a bool"):
        at.generate(lm, [], predicate(lambda t: "no", lambda t: True), method="cd", seed=0)


def test_numpy_bools_are_answers() -> None:
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda p: [1, 1, 1], eos=2)
    c = predicate(lambda t: np.bool_("b" not in t), lambda t: np.bool_(t == "aa"))
    assert list(at.exact_distribution(lm, [], c, max_new_tokens=3)) == [(0, 0, 2)]


def test_a_check_that_always_times_out_stops_after_max_timeouts() -> None:
    lm = at.TableLM([bytes([c]) for c in b"abcdefgh"] + [b"<eos>"], lambda p: [1] * 9, eos=8)

    def hang(text: str) -> bool:
        while True:
            pass

    started = time.perf_counter()
    with pytest.raises(SearchTimeoutError, match=r"timed out 3 times at timeout=0.01 s.*"
                                                  r"max_timeouts=None"):
        at.generate(lm, [], predicate(hang, hang, timeout=0.01, max_timeouts=3),
                    method="adaptrack", seed=0, max_new_tokens=4)
    assert time.perf_counter() - started < 20
    with pytest.raises(ValueError, match="max_timeouts must be an int >= 1 or None, got 0"):
        predicate(hang, hang, max_timeouts=0)
