"""Property tests: every method, on random small problems, obeys the contract of ``generate``.

Each example draws a byte-level vocabulary over ``b"abc"`` (single bytes, multi-byte tokens
that may cross string boundaries, tokens holding the terminator ``b"("``), a random
``TableLM`` (weights from a hash of the prefix, some of them 0), a ``choice`` constraint
(possibly with the empty string or strings that are prefixes of each other; ``choice([])``
is refused when built),
``max_new_tokens``, ``temperature`` and ``top_p``. Everything is checked against a reference
written here from the definitions (not from the library's matcher): which token sequences
are valid, their text, their probability.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import adaptrack as at
from adaptrack import METHODS, NoValidSequenceError, TableLM, exact_distribution, generate
from adaptrack.constraints import choice

# The reference below is the paper's target, where only EOS ends a text (docs/design.md §2);
# tests/sampling/test_end_policy.py checks end="leave" against its own definition.
exact_distribution = functools.partial(exact_distribution, end="eos")
generate = functools.partial(generate, end="eos")

ALPHABET = "abc"
TERM = b"("
EOS_BYTES = b"<eos>"
MAX_NODES = 50_000
TIME_BOUND_S = 10.0  # per call; a generous bound, the calls take milliseconds
CONSTRAINED = ("cd", "asap", "adaptrack", "exact")
FORCE = at.FastForward(force=True)  # forced tokens only valid: the conditioned target

DONE = "DONE"  # the reference state of a finished sequence


# ----------------------------------------------------------------------------- the problem


class Problem:
    """One random problem and a reference implementation of what it means."""

    def __init__(
        self,
        vocab: list[bytes],
        eos: int,
        salt: int,
        zero_frac: float,
        strings: list[str],
        terminators: str | None,
        prompt: list[int],
    ) -> None:
        self.vocab, self.eos, self.salt, self.zero_frac = vocab, eos, salt, zero_frac
        self.strings = {s.encode() for s in strings}
        self.prefixes = {s[:k] for s in self.strings for k in range(len(s) + 1)}
        self.terminators = terminators
        self.term = terminators.encode() if terminators else b""
        self.prompt = tuple(prompt)
        self._cache: dict[tuple[int, ...], np.ndarray] = {}
        self.lm = TableLM(vocab, self.next_probs, eos=eos)
        self.constraint = choice(sorted(strings), terminators=terminators)

    def __repr__(self) -> str:
        return (
            f"Problem(vocab={self.vocab!r}, eos={self.eos}, salt={self.salt}, "
            f"zero_frac={self.zero_frac}, strings={sorted(self.strings)!r}, "
            f"terminators={self.terminators!r}, prompt={list(self.prompt)})"
        )

    # The model: deterministic weights from a hash of (salt, prefix); some are exactly 0.
    def weights(self, prefix: tuple[int, ...]) -> np.ndarray:
        w = self._cache.get(prefix)
        if w is None:
            rng = np.random.default_rng([self.salt, len(prefix), *prefix])
            u = rng.random(len(self.vocab))
            w = rng.random(len(self.vocab)) + 0.05
            w[u < self.zero_frac] = 0.0
            if not w.any():
                w[self.eos] = 1.0
            self._cache[prefix] = w
        return w

    def next_probs(self, prefix: tuple[int, ...]) -> list[float]:
        return self.weights(tuple(prefix)).tolist()

    def probs(self, tokens: tuple[int, ...], temperature: float) -> np.ndarray:
        """P_T(· | prompt + tokens), T = 1 for temperature 0 (what ``logprob`` reports)."""
        w = self.weights(self.prompt + tuple(tokens))
        p = w / w.sum()
        t = temperature if temperature > 0 else 1.0
        with np.errstate(divide="ignore"):
            z = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)) / t, -np.inf)
        q = np.exp(z - z.max())
        return q / q.sum()

    def logprob(self, tokens: tuple[int, ...], temperature: float) -> float:
        total = 0.0
        for i, tok in enumerate(tokens):
            p = self.probs(tokens[:i], temperature)[tok]
            total += math.log(p) if p > 0 else -math.inf
        return total

    # The constraint, from its definition: text in strings, then EOS (no terminators) or
    # a terminator byte (the rest of that token is cut off).
    def step(self, data: bytes | str | None, tok: int) -> bytes | str | None:
        """Lazy per-token check: bytes so far, DONE, or None (invalid)."""
        if data is None or data == DONE:
            return None
        if tok == self.eos:
            return DONE if data in self.strings and not self.term else None
        for b in self.vocab[tok]:
            if data + bytes([b]) in self.prefixes:
                data = data + bytes([b])
            elif b in self.term and data in self.strings:
                return DONE
            else:
                return None
        return data

    def accepts(self, tokens: tuple[int, ...]) -> bool:
        data: bytes | str | None = b""
        for tok in tokens:
            data = self.step(data, tok)
        return data == DONE

    def ends(self, tok: int) -> bool:
        """Whether the token ends a sequence whatever the constraint (EOS or a terminator)."""
        return tok == self.eos or any(b in self.term for b in self.vocab[tok])

    def text(self, tokens: tuple[int, ...], complete: bool) -> bytes:
        data = b"".join(b"" if t == self.eos else self.vocab[t] for t in tokens)
        if complete and self.term and tokens and tokens[-1] != self.eos:
            last = self.vocab[tokens[-1]]
            cut = min(i for i, b in enumerate(last) if b in self.term)
            data = data[: len(data) - len(last) + cut + 1]
        return data

    def can_continue(self, tokens: tuple[int, ...], max_new_tokens: int) -> bool:
        """Whether some positive-probability token is valid after ``tokens`` (CD's test)."""
        data: bytes | str | None = b""
        for tok in tokens:
            data = self.step(data, tok)
        if len(tokens) >= max_new_tokens:
            return False
        p = self.probs(tokens, 1.0)
        for tok in range(len(self.vocab)):
            nxt = self.step(data, tok)
            if p[tok] > 0 and nxt is not None:
                if len(tokens) < max_new_tokens - 1 or nxt == DONE:
                    return True
        return False

    def language(self, max_new_tokens: int, temperature: float) -> dict[tuple[int, ...], float]:
        """Every valid complete sequence with positive probability (top_p = 1), normalized."""
        found: dict[tuple[int, ...], float] = {}
        stack: list[tuple[tuple[int, ...], bytes | str, float]] = [((), b"", 0.0)]
        while stack:
            tokens, data, lp = stack.pop()
            if data == DONE:
                found[tokens] = lp
                continue
            if len(tokens) >= max_new_tokens:
                continue
            p = self.probs(tokens, temperature)
            for tok in range(len(self.vocab)):
                nxt = self.step(data, tok)
                if p[tok] > 0 and nxt is not None:
                    stack.append(((*tokens, tok), nxt, lp + math.log(p[tok])))
        if not found:
            return {}
        top = max(found.values())
        z = math.fsum(math.exp(v - top) for v in found.values())
        return {s: math.exp(v - top) / z for s, v in found.items()}


MULTI = st.text(alphabet=ALPHABET, min_size=2, max_size=3).map(str.encode)
WITH_TERM = st.sampled_from([b"(", b"a(", b"(b", b"ab(", b"c(a", b"(("])


def _random_text(rnd: random.Random, lo: int, hi: int) -> str:
    return "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(lo, hi)))


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    # Usually every single byte is a token (most languages are spellable); sometimes not.
    singles = draw(st.one_of(
        st.just([b"a", b"b", b"c"]),
        st.lists(st.sampled_from([b"a", b"b", b"c"]), unique=True, max_size=3),
    ))
    # Hypothesis favours small values; a seeded branch adds fuller, more ambiguous problems.
    rnd = random.Random(draw(st.integers(0, 2**32 - 1))) if draw(st.booleans()) else None
    if rnd is None:
        multi = draw(st.lists(MULTI, max_size=4))
    else:
        multi = [_random_text(rnd, 2, 3).encode() for _ in range(rnd.randint(2, 5))]
    terminators = draw(st.sampled_from([None, None, "("]))
    # Terminator-holding tokens: usually with terminators, sometimes as plain bytes without.
    term_tokens = []
    if terminators:
        term_tokens = draw(st.one_of(st.just([b"("]), st.lists(WITH_TERM, max_size=3)))
    elif draw(st.booleans()):
        term_tokens = draw(st.lists(WITH_TERM, max_size=2))
    vocab = list(dict.fromkeys([*singles, *multi, *term_tokens]))
    vocab = list(draw(st.permutations(vocab))) if vocab else []
    eos = draw(st.integers(0, len(vocab)))
    vocab.insert(eos, EOS_BYTES)
    if rnd is not None:
        strings = [_random_text(rnd, 1, 5) for _ in range(rnd.randint(2, 8))]
    else:
        strings = draw(st.one_of(
            st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), min_size=1,
                     max_size=4),
            st.lists(st.text(alphabet=ALPHABET, min_size=2, max_size=5), min_size=2,
                     max_size=8),
            st.lists(st.text(alphabet=ALPHABET, max_size=5), min_size=1, max_size=6),
        ))
    if draw(st.integers(0, 4)) == 0:
        strings.append("")
    if strings and draw(st.booleans()):  # a string that is a prefix of another
        s = strings[0]
        strings.append(s[: draw(st.integers(0, len(s)))])
    salt = draw(st.integers(0, 2**32 - 1))
    zero_frac = draw(st.sampled_from([0.0, 0.2, 0.5]))
    prompt = draw(st.lists(st.integers(0, len(vocab) - 1), max_size=2))
    return Problem(vocab, eos, salt, zero_frac, strings, terminators, prompt)


# ----------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def hang_guard(seconds: float) -> Iterator[None]:
    """Turn a hang into a failure (SIGALRM, main thread only) and bound the call's time."""
    use_alarm = hasattr(signal, "setitimer")
    if use_alarm:
        def on_alarm(signum, frame):
            raise TimeoutError(f"call did not finish within {3 * seconds} s")

        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 3 * seconds)
    started = time.perf_counter()
    try:
        yield
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    elapsed = time.perf_counter() - started
    assert elapsed < seconds, f"call took {elapsed:.1f} s"


def run_generate(problem: Problem, method: str, **kwargs) -> at.GenerationResult | Exception:
    """``generate`` once; NoValidSequenceError is returned, anything else propagates."""
    with hang_guard(TIME_BOUND_S):
        try:
            kwargs.setdefault("fast_forward", False)  # the unconditioned target
            return generate(problem.lm, list(problem.prompt), problem.constraint,
                            method=method, max_nodes=MAX_NODES, **kwargs)
        except NoValidSequenceError as err:
            return err


def check_sample(problem: Problem, method: str, sample: at.Sample, max_new_tokens: int,
                 temperature: float, dist: dict | None) -> None:
    tokens = sample.tokens
    assert isinstance(tokens, tuple)
    assert all(isinstance(t, int) and 0 <= t < len(problem.vocab) for t in tokens)
    assert len(tokens) <= max_new_tokens
    # Nothing ends the sequence before its last token.
    assert not any(problem.ends(t) for t in tokens[:-1]), tokens
    assert sample.text.encode() == problem.text(tokens, sample.complete)
    expected_lp = problem.logprob(tokens, temperature)
    assert math.isclose(sample.logprob, expected_lp, rel_tol=1e-9, abs_tol=1e-9), (
        sample.logprob, expected_lp)
    # Each prefix's next-token distribution was needed to produce the sequence (exact at
    # temperature 0 is exempt here: see test_exact_greedy_counts_lm_requests_of_every_sample).
    if not (method == "exact" and temperature == 0):
        assert sample.lm_requests >= 1
        if sample.complete:
            assert sample.lm_requests >= len(tokens), (sample.lm_requests, tokens)
    if sample.complete:
        assert tokens and problem.ends(tokens[-1])
        if not problem.term:
            assert tokens[-1] == problem.eos
    if method == "unconstrained":
        assert sample.valid == (sample.complete and problem.accepts(tokens))
        if not sample.complete:
            assert len(tokens) == max_new_tokens
        return
    # Constrained methods.
    if sample.complete:
        assert sample.valid
        assert problem.accepts(tokens), tokens
        if problem.term:
            assert tokens[-1] != problem.eos
            assert sample.text.encode()[-1:] == problem.term
            assert sample.text.encode()[:-1] in problem.strings
        else:
            assert tokens[-1] == problem.eos
            assert sample.text.encode() in problem.strings
        assert dist is not None and tokens in dist, (tokens, dist)
        return
    assert method == "cd", f"{method} returned an incomplete sample {tokens}"
    assert not sample.valid
    assert len(tokens) < max_new_tokens
    data: bytes | str | None = b""
    for tok in tokens:  # every token CD took was valid...
        data = problem.step(data, tok)
        assert data is not None and data != DONE, tokens
    # ...and it stopped only because nothing valid with positive probability follows.
    assert not problem.can_continue(tokens, max_new_tokens), tokens


def adaptrack_options(data: st.DataObject) -> dict:
    return {
        "share_q": data.draw(st.booleans(), label="share_q"),
        "max_backtrack": data.draw(st.sampled_from([None, 0, 1]), label="max_backtrack"),
        "min_backtrack_prob": data.draw(st.sampled_from([0.0, 0.5]), label="min_bt_prob"),
    }


# ----------------------------------------------------------------------------- the property


@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    problem=problems(),
    max_new_tokens=st.one_of(st.integers(1, 8), st.integers(4, 8)),
    temperature=st.sampled_from([0.0, 0.5, 1.0]),
    top_p=st.sampled_from([1.0, 0.6]),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_every_method_keeps_its_contract(problem: Problem, max_new_tokens: int,
                                         temperature: float, top_p: float, seed: int,
                                         data: st.DataObject) -> None:
    ref_temperature = temperature if temperature > 0 else 1.0
    with hang_guard(TIME_BOUND_S):
        try:
            dist = exact_distribution(problem.lm, list(problem.prompt), problem.constraint,
                                      max_new_tokens=max_new_tokens,
                                      temperature=ref_temperature, top_p=top_p,
                                      max_nodes=MAX_NODES, fast_forward=False)
        except NoValidSequenceError:
            dist = None
    # exact_distribution against the reference language.
    ref = problem.language(max_new_tokens, ref_temperature)
    if top_p == 1.0:
        assert (dist or {}).keys() == ref.keys()
        for s, p in ref.items():
            assert math.isclose(dist[s], p, rel_tol=1e-7, abs_tol=1e-12), (s, dist[s], p)
    else:
        # The nucleus only removes sequences (it may cut every one that can finish).
        assert set(dist or {}) <= set(ref)
    if dist is not None:
        assert math.isclose(math.fsum(dist.values()), 1.0, rel_tol=1e-9)

    size = 0 if dist is None else len(dist)
    event("language: " + ("empty" if not size else "1 sequence" if size == 1
                          else "2-4 sequences" if size < 5 else "5+ sequences"))
    n = 3
    for method in METHODS:
        options = adaptrack_options(data) if method == "adaptrack" else {}
        kwargs = dict(n=n, temperature=temperature, top_p=top_p,
                      max_new_tokens=max_new_tokens, seed=seed, **options)
        calls_before = problem.lm.calls
        result = run_generate(problem, method, **kwargs)
        calls = problem.lm.calls - calls_before
        again = run_generate(problem, method, **kwargs)
        if isinstance(result, NoValidSequenceError):
            assert isinstance(again, NoValidSequenceError), "same seed, different outcome"
            assert method != "unconstrained", "unconstrained raised NoValidSequenceError"
            assert dist is None, f"{method} raised although {len(dist)} sequences are valid"
            if method == "cd":  # up front, as every method, or with no valid first token
                proved = problem.constraint.bind(problem.lm.vocab).min_new_tokens()
                assert proved > max_new_tokens or not problem.can_continue(
                    (), max_new_tokens), "cd raised although a valid first token exists"
                assert proved <= max_new_tokens or calls == 0, "refused after a model call"
            continue
        assert not isinstance(again, NoValidSequenceError), "same seed, different outcome"
        if method in ("asap", "adaptrack", "exact"):
            assert dist is not None, f"{method} returned samples from an empty language"
        if method == "cd" and dist is None:
            assert problem.can_continue((), max_new_tokens)
        samples, stats = result.samples, result.stats
        event(f"{method}: {sum(s.complete for s in samples)} complete, "
              f"{sum(s.valid for s in samples)} valid")
        if stats["backtracks"] or stats["restarts"]:
            event(f"{method}: backtracked or restarted")
        assert len(samples) == n
        assert [s.tokens for s in samples] == [s.tokens for s in again.samples]
        assert stats["incomplete"] == sum(not s.complete for s in samples)
        # The model sees each prefix once per call; every prefix it saw is a tree node.
        assert stats["lm_calls"] == calls
        assert 1 <= stats["lm_calls"] <= stats["tree_nodes"] <= MAX_NODES
        assert all(s.lm_requests <= stats["tree_nodes"] for s in samples)
        assert stats["seconds"] >= 0
        for sample in samples:
            check_sample(problem, method, sample, max_new_tokens, temperature, dist)
        # At temperature 0 samples are identical except where Q is shared and still learning:
        # asap, and adaptrack with share_q and a backtracking limit (tests below).
        learns = method == "asap" or (options.get("share_q") and (
            options["max_backtrack"] is not None or options["min_backtrack_prob"] > 0))
        if temperature == 0 and not learns:
            assert len({s.tokens for s in samples}) == 1, [s.tokens for s in samples]
            if method == "exact":
                best = max(dist.values())
                assert dist[samples[0].tokens] >= best * (1 - 1e-9), (
                    samples[0].tokens, dist[samples[0].tokens], best)


@pytest.mark.parametrize("method", CONSTRAINED)
def test_property_problems_exercise_both_outcomes(method: str) -> None:
    """Sanity check of the strategy: a fixed small problem has both a valid language and an
    empty one depending on max_new_tokens, so the property above tests both branches."""
    problem = Problem([b"a", b"b", b"ab", EOS_BYTES], 3, 7, 0.0, ["ab", "abb"], None, [])
    # With one token nothing valid can even start (EOS needs "" in the language).
    assert isinstance(run_generate(problem, method, max_new_tokens=1, seed=0),
                      NoValidSequenceError)
    result = run_generate(problem, method, max_new_tokens=3, seed=0, n=4)
    assert isinstance(result, at.GenerationResult)
    for sample in result.samples:
        check_sample(problem, method, sample, 3, 1.0,
                     exact_distribution(problem.lm, [], problem.constraint, max_new_tokens=3,
                                        fast_forward=False))


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problem=problems(), max_new_tokens=st.integers(1, 8),
       temperature=st.sampled_from([0.0, 1.0]), seed=st.integers(0, 2**31 - 1),
       data=st.data())
def test_fast_forward_conditions_the_target(problem: Problem, max_new_tokens: int,
                                            temperature: float, seed: int,
                                            data: st.DataObject) -> None:
    """design.md §2: with forced fast-forward the target is P restricted to the sequences
    whose forced bytes are canonically tokenized (P_ff ∝ P on a subset of the support), and
    every method samples inside it; a forced chain is one model call."""
    ref = problem.language(max_new_tokens, 1.0)
    with hang_guard(TIME_BOUND_S):
        try:
            ff = exact_distribution(problem.lm, list(problem.prompt), problem.constraint,
                                    max_new_tokens=max_new_tokens, max_nodes=MAX_NODES,
                                    fast_forward=FORCE)
        except NoValidSequenceError:
            ff = {}
    assert set(ff) <= set(ref)
    if ff:
        mass = math.fsum(ref[s] for s in ff)
        for s, p in ff.items():
            assert math.isclose(p, ref[s] / mass, rel_tol=1e-7, abs_tol=1e-12), (s, p)
    for method in METHODS:
        options = adaptrack_options(data) if method == "adaptrack" else {}
        calls_before = problem.lm.calls
        result = run_generate(problem, method, n=3, temperature=temperature,
                              max_new_tokens=max_new_tokens, seed=seed, fast_forward=FORCE,
                              **options)
        if isinstance(result, NoValidSequenceError):
            assert method != "unconstrained" and (not ff or method == "cd")
            continue
        stats = result.stats
        assert stats["lm_calls"] <= problem.lm.calls - calls_before
        assert stats["forced_tokens"] >= stats["ff_sequences"] >= 0
        for sample in result.samples:
            if method != "unconstrained" and sample.complete:
                assert sample.valid and sample.tokens in ff, (method, sample.tokens, ff)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problem=problems(), max_new_tokens=st.integers(1, 8),
       temperature=st.sampled_from([0.0, 1.0]), seed=st.integers(0, 2**31 - 1),
       data=st.data())
def test_prefilled_chains_change_no_sample(problem: Problem, max_new_tokens: int,
                                           temperature: float, seed: int,
                                           data: st.DataObject) -> None:
    """design.md §2: the searching methods only prefill forced chains by default, so with
    an exact model they draw the very samples of ``fast_forward=False``, and the target
    (``exact_distribution``'s default) is the unconditioned one."""
    with hang_guard(TIME_BOUND_S):
        try:
            dist = exact_distribution(problem.lm, list(problem.prompt), problem.constraint,
                                      max_new_tokens=max_new_tokens, max_nodes=MAX_NODES)
        except NoValidSequenceError:
            dist = {}
    ref = problem.language(max_new_tokens, 1.0)
    assert set(dist) == set(ref)
    for s, p in dist.items():
        assert math.isclose(p, ref[s], rel_tol=1e-7, abs_tol=1e-12), (s, p)
    for method in ("asap", "adaptrack", "exact"):
        options = adaptrack_options(data) if method == "adaptrack" else {}
        kw = dict(n=3, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                  **options)
        off = run_generate(problem, method, fast_forward=False, **kw)
        on = run_generate(problem, method, fast_forward=True, **kw)
        if isinstance(off, NoValidSequenceError):
            assert isinstance(on, NoValidSequenceError), method
            continue
        assert isinstance(on, at.GenerationResult), (method, on)
        assert [s.tokens for s in on.samples] == [s.tokens for s in off.samples], method
        assert on.stats["lm_calls"] <= off.stats["lm_calls"], method


# ------------------------------------------------------------------- greedy with shared Q
# Minimal cases of what the property above found about temperature 0.


def _two_step_lm() -> TableLM:
    """choice(["", "a"]): P(EOS) = 0.4 beats P(a, EOS) = 0.6 * 0.5 = 0.3, but P(a) = 0.6
    beats P(EOS) at the first step, so Q learned while sampling changes the greedy choice."""
    return TableLM([b"a", b"<eos>"], lambda prefix: [0.6, 0.4] if not prefix else [0.5, 0.5],
                   eos=1)


def test_asap_greedy_follows_its_learned_q() -> None:
    """Documented: greedy ASAp takes the argmax of P_Q, and its Q is shared, so the second
    sample already knows that "a" leaves only 0.3 of mass and picks EOS."""
    result = generate(_two_step_lm(), [], choice(["", "a"]), method="asap", n=2,
                      temperature=0, max_new_tokens=2, seed=0)
    assert [s.tokens for s in result.samples] == [(0, 1), (1,)]


@pytest.mark.parametrize("limits", [{"max_backtrack": 0}, {"min_backtrack_prob": 0.9}])
def test_adaptrack_shared_q_greedy_with_limits_follows_its_learned_q(limits: dict) -> None:
    """The limit keeps the first sample's non-argmax choice; with share_q the next sample
    starts from the learned Q and takes its argmax (documented, like ASAp)."""
    result = generate(_two_step_lm(), [], choice(["", "a"]), method="adaptrack", n=2,
                      temperature=0, max_new_tokens=2, seed=0, share_q=True, **limits)
    assert [s.tokens for s in result.samples] == [(0, 1), (1,)]


def test_adaptrack_shared_q_greedy_without_limits_agrees() -> None:
    """The same problem without a limit: the first sample already backtracks to EOS."""
    result = generate(_two_step_lm(), [], choice(["", "a"]), method="adaptrack", n=3,
                      temperature=0, max_new_tokens=2, seed=0, share_q=True)
    assert [s.tokens for s in result.samples] == [(1,)] * 3


def test_exact_greedy_counts_lm_requests_of_every_sample() -> None:
    result = generate(_two_step_lm(), [], choice(["", "a"]), method="exact", n=2,
                      temperature=0, max_new_tokens=2, seed=0)
    assert [s.tokens for s in result.samples] == [(1,), (1,)]
    assert all(s.lm_requests >= len(s.tokens) for s in result.samples)
