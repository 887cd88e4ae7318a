"""Helpers for testing samplers and constraints: toy problems small enough to enumerate
(shared by the demo, the tests and the benchmarks), and contract checks that any custom
constraint can run.

Each toy problem returns ``(lm, constraint, max_new_tokens)``.

>>> from adaptrack import exact_distribution
>>> lm, bits, max_new = binary()
>>> len(exact_distribution(lm, [], bits, max_new_tokens=max_new))
17
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import constraints
from .lm.table import TableLM
from .tokenization.vocab import Vocabulary

Problem = tuple[TableLM, constraints.Choice, int]


def hashed_weights(width: int, salt: bytes = b"") -> Callable[[Sequence[int]], list[int]]:
    """Next-token weights in 1..8 that depend on the whole prefix (a context-dependent model)."""

    def next_probs(prefix: Sequence[int]) -> list[int]:
        digest = hashlib.sha256(salt + repr(tuple(prefix)).encode()).digest()
        return [1 + digest[i % len(digest)] % 8 for i in range(width)]

    return next_probs


def binary() -> Problem:
    """Paper RQ4: five random bits, valid iff 00000 or starting with 1, uniform model."""
    lm = TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    bits = constraints.choice(["00000"] + [f"1{i:04b}" for i in range(16)])
    return lm, bits, 6


def no_ab() -> Problem:
    """docs/design.md §3: {a,b,c}^4 without "ab", ending in "c" or equal to "aaaa"."""
    lm = TableLM([b"a", b"b", b"c", b"<eos>"], hashed_weights(4, b"no_ab"), eos=3)
    words = ("".join(t) for t in itertools.product("abc", repeat=4))
    valid = [w for w in words if "ab" not in w and (w.endswith("c") or w == "aaaa")]
    return lm, constraints.choice(valid), 5


API_VOCAB = [b"matrix", b"_", b"rank", b"power", b"exp", b"l", b"inalg", b".", b"(", b"matrix_",
             b"rank(", b"_power", b"linalg.", b"ma", b"trix", b"<eos>"]


def api_names() -> Problem:
    """Figure 1: the model wants ``matrix_rank``, which does not exist; multi-byte tokens
    span the names' branches and a terminator "(" ends the sequence inside a token."""
    base = hashed_weights(len(API_VOCAB), b"api")

    def next_probs(prefix: Sequence[int]) -> list[float]:
        w = [float(x) for x in base(prefix)]
        text = b"".join(API_VOCAB[t] for t in prefix)
        if text == b"":
            w[0] *= 6  # "matrix" first, as in Figure 1
        if text.endswith(b"matrix_") or text.endswith(b"matrix"):
            w[2] *= 40  # "rank": the model's intent
            w[10] *= 40
        return w

    lm = TableLM(API_VOCAB, next_probs, eos=len(API_VOCAB) - 1)
    names = ["linalg.matrix_rank", "matrix_power", "matrix_exp", "linalg.matrix_exp"]
    return lm, constraints.choice(names, terminators="("), 8


def length_bound() -> Problem:
    """max_new_tokens cuts some tokenizations: the target is length-conditioned."""
    lm = TableLM([b"a", b"aa", b"b", b"ab", b"<eos>"], hashed_weights(5, b"len"), eos=4)
    return lm, constraints.choice(["aaaa", "aab", "b", "aaaab", "ba"]), 3


def ends_or_goes_on() -> Problem:
    """Where a text ends (docs/design.md §2): every run of one to three ``a`` may end or go on
    (to more ``a`` or one ``b``); under ``end="leave"`` the token ``c`` leaves an accepted
    text, and ``ba`` crosses its end (``b`` continues it, the ``a`` after it cannot): invalid
    in the whole-token version of the policy."""
    lm = TableLM([b"a", b"b", b"ab", b"ba", b"c", b"<eos>"], hashed_weights(6, b"leave"), eos=5)
    return lm, constraints.choice(["a", "aa", "aaa", "ab", "aab", "aaab"]), 4


PROBLEMS = {"binary": binary, "no_ab": no_ab, "api_names": api_names,
            "length_bound": length_bound, "ends_or_goes_on": ends_or_goes_on}


# --- the matcher contract ------------------------------------------------------------------


def assert_contract(
    constraint: constraints.Constraint | constraints.Matcher,
    vocab: Vocabulary,
    *,
    walks: int = 8,
    steps: int = 12,
    seed: int = 0,
    sample: int = 512,
) -> None:
    """Check the rules every matcher must keep (docs/design.md §4) along random walks, and
    raise ``AssertionError`` naming the rule, the state and the token that break one.

    The rules: ``allowed`` and ``finishing`` are sorted unique int ids of the vocabulary;
    ``finishing`` ⊆ ``closing`` ⊆ ``allowed``, and ``closing`` lists every token after which a
    finishing token is valid; ``within(state, k)`` is ``finishing`` at 1, ``closing`` at 2,
    and between ``closing`` and ``allowed`` beyond (eager matchers); ``advance`` is not
    ``None`` exactly on ``allowed`` for an eager matcher (only inside it for a lazy one);
    ``advance`` of a finishing token is complete; ``forced_bytes`` is a prefix of every
    valid continuation's bytes (empty where EOS is valid), and with ``limit=k`` its first
    ``k`` bytes; ``min_new_tokens`` is an int >= 1 and no walk completes in fewer tokens.
    On vocabularies larger than ``sample`` ids, ``advance`` is tried on ``sample`` random
    ids plus up to ``sample`` allowed ones per state.

    >>> from adaptrack import constraints
    >>> from adaptrack.tokenization.vocab import Vocabulary
    >>> vocab = Vocabulary([b"a", b"b", b"ab", b"<eos>"], eos_ids=[3])
    >>> assert_contract(constraints.regex("(ab)+"), vocab)
    >>> class Sloppy(constraints.Constraint):   # claims "b" is valid but rejects it
    ...     def bind(self, vocab):
    ...         m = constraints.regex("(ab)+").bind(vocab)
    ...         m.allowed = lambda state: np.array([0, 1, 2])
    ...         return m
    >>> assert_contract(Sloppy(), vocab)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: matcher contract, rule 'advance is not None exactly on allowed' ...
    """
    m = constraint.bind(vocab) if isinstance(constraint, constraints.Constraint) else constraint
    rng = random.Random(seed)
    bound = m.min_new_tokens()
    _rule(isinstance(bound, int | np.integer) and bound >= 1,
          "min_new_tokens is an int >= 1", m.start(), None, f"got {bound!r}")
    ids = np.arange(vocab.size)
    for _ in range(walks):
        state, text, depth = m.start(), b"", 0
        for _ in range(steps):
            allowed, finishing, closing = _checked_ids(m, state, text, vocab)
            fin, closes = set(finishing.tolist()), set(closing.tolist())
            _rule(fin <= set(allowed.tolist()), "finishing is a subset of allowed", state, text,
                  f"finishing {sorted(fin - set(allowed.tolist()))[:5]} not allowed")
            _rule(fin <= closes <= set(allowed.tolist()),
                  "closing lies between finishing and allowed", state, text,
                  f"closing {sorted(closes)[:8]}, finishing {sorted(fin)[:8]}")
            if not m.lazy:
                _checked_within(m, state, text, allowed, finishing, closing)
            tried = ids if vocab.size <= sample else np.union1d(
                rng.sample(range(vocab.size), sample),
                allowed[rng.sample(range(len(allowed)), min(sample, len(allowed)))])
            forced = _checked_forced(m, state, text)
            sets = (set(allowed.tolist()), fin, closes)
            nexts = [(tok, nxt) for tok in tried.tolist()
                     if (nxt := _checked_advance(m, state, text, tok, vocab, sets, forced,
                                                 depth + 1 >= bound)) is not None]
            if not nexts:
                break
            tok, state = rng.choice(nexts)
            text, depth = text + vocab.bytes_of(tok), depth + 1


def _checked_within(m: constraints.Matcher, state: Any, text: bytes, allowed: np.ndarray,
                    finishing: np.ndarray, closing: np.ndarray) -> None:
    """``m.within(state, k)`` against the state's other masks."""
    for k, low, high in ((1, finishing, finishing), (2, closing, closing), (3, closing, allowed),
                         (6, closing, allowed)):
        got = m.within(state, k)
        rule = "within(state, k) is finishing at 1, closing at 2, between closing and allowed"
        _rule(isinstance(got, np.ndarray) and bool((np.diff(got) > 0).all()),
              "within is sorted unique int ids", state, text, f"got {got!r}"[:200])
        ids = set(got.tolist())
        _rule(set(low.tolist()) <= ids <= set(high.tolist()), rule, state, text,
              f"k={k}: within {sorted(ids)[:8]}")


def _checked_forced(m: constraints.Matcher, state: Any, text: bytes) -> bytes:
    """``m.forced_bytes(state)``, checked against its ``limit`` versions."""
    forced = bytes(m.forced_bytes(state))
    for k in (0, 1, 3):
        cut = bytes(m.forced_bytes(state, limit=k))
        _rule(cut == forced[:k], "forced_bytes(limit=k) is the first k forced bytes",
              state, text, f"limit={k}: {cut!r}, forced {forced!r}")
    return forced


def _checked_advance(m: constraints.Matcher, state: Any, text: bytes, tok: int,
                     vocab: Vocabulary, sets: tuple[set[int], set[int], set[int]],
                     forced: bytes, long_enough: bool) -> Any:
    """``m.advance(state, tok)`` checked against the state's ``sets`` (allowed, finishing,
    closing) and ``forced`` bytes; ``long_enough``: a sequence may complete here
    (``min_new_tokens``). The next state where the walk may go on, else None."""
    allowed, fin, closes = sets
    nxt = m.advance(state, tok)
    where = (state, text, tok, vocab)
    if m.lazy:
        _rule(nxt is None or tok in allowed, "advance is None outside allowed", *where)
    else:
        _rule((nxt is not None) == (tok in allowed), "advance is not None exactly on allowed",
              *where)
    if nxt is None:
        return None
    if tok in fin:
        _rule(m.is_complete(nxt), "advance of a finishing token is complete", *where)
        _rule(long_enough, "no complete sequence is shorter than min_new_tokens "
              f"({m.min_new_tokens()})", *where)
    if m.is_complete(nxt) or len(m.finishing(nxt)):
        _rule(tok in closes, "closing lists every token after which one finishes", *where)
    if vocab.is_eos(tok):
        _rule(not forced, "forced_bytes is empty where EOS is valid", *where,
              f"forced {forced!r}")
        return None
    if m.is_complete(nxt):
        return None
    data = vocab.bytes_of(tok)
    _rule(data[:len(forced)] == forced[:len(data)],
          "forced_bytes is a prefix of every valid continuation", *where, f"forced {forced!r}")
    return nxt


def _checked_ids(m: constraints.Matcher, state: Any, text: bytes,
                 vocab: Vocabulary) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out = []
    for name in ("allowed", "finishing", "closing"):
        got = getattr(m, name)(state)
        rule = f"{name} is sorted unique int ids"
        _rule(isinstance(got, np.ndarray) and got.ndim == 1
              and np.issubdtype(got.dtype, np.integer), rule, state, text, f"got {got!r}"[:200])
        _rule(bool((np.diff(got) > 0).all()), rule, state, text, f"got {got[:20].tolist()}")
        _rule(not len(got) or (got[0] >= 0 and got[-1] < vocab.size), rule, state, text,
              f"ids outside 0..{vocab.size - 1}")
        out.append(got)
    return out[0], out[1], out[2]


def _rule(ok: bool, rule: str, state: Any, text: bytes | None, token: Any = None,
          vocab: Vocabulary | None = None, detail: str = "") -> None:
    if ok:
        return
    if isinstance(token, str) and vocab is None:
        token, detail = None, token
    where = f"state {state!r}" + (f" (text {text!r})" if text is not None else "")
    if token is not None:
        data = vocab.bytes_of(token) if vocab is not None else None
        where += f", token {token} ({data!r})"
    raise AssertionError(f"matcher contract, rule {rule!r} broken at {where}"
                         + (f": {detail}" if detail else ""))
