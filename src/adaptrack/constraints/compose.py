"""Constraints made of others: ``all_of`` (text valid under every one of several) and
``with_stop`` (a constraint whose sequences also end at stop strings)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from functools import reduce

import numpy as np

from ..tokenization.vocab import Vocabulary
from .anything import Anything
from .base import DONE, Constraint, Matcher, State
from .stop import StopStrings, stop_strings


def _parts(state: State) -> tuple[State, ...]:
    """The parts' states of an intersection state (a tuple, one per part)."""
    return state  # type: ignore[return-value]


class AllOf(Constraint):
    """The intersection of ``parts``: a token is valid when every part allows it, and the
    sequence is complete when every part completes at the same token: every part must end
    sequences the same way (EOS, or the same terminator bytes), else ``bind`` raises.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda p: [1, 1, 1], eos=2)
    >>> names = at.constraints.choice(["ab", "ba", "bb"])
    >>> no_a_first = at.constraints.predicate(lambda t: not t.startswith("a"), lambda t: True)
    >>> dist = at.exact_distribution(lm, [], all_of(names, no_a_first), max_new_tokens=3)
    >>> sorted(lm.vocab.decode(s).decode() for s in dist)
    ['ba', 'bb']
    """

    def __init__(self, *parts: Constraint) -> None:
        if not parts:
            raise ValueError("all_of needs at least one constraint")
        for part in parts:
            if not isinstance(part, Constraint):
                raise TypeError(f"all_of takes constraints, got {type(part).__name__}")
            if getattr(part, "stop", ()):
                # Another part would reject the stop string that ends this one's text.
                raise ValueError(f"all_of cannot combine a constraint with stop strings "
                                 f"({type(part).__name__}, stop={list(part.stop)!r}); "  # type: ignore[attr-defined]
                                 "give the stop strings to a single constraint instead")
        self.parts = parts

    def bind(self, vocab: Vocabulary) -> Matcher:
        return AllOfMatcher([part.bind(vocab) for part in self.parts], vocab)


def _forced(m: Matcher, state: State, limit: int | None) -> bytes:
    """``m.forced_bytes(state, limit)``, also for a matcher written without ``limit``."""
    if limit is None:
        return bytes(m.forced_bytes(state))
    try:
        params = inspect.signature(m.forced_bytes).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "limit" in params:
        return bytes(m.forced_bytes(state, limit=limit))[:limit]
    return bytes(m.forced_bytes(state))[:limit]


def all_of(*parts: Constraint) -> AllOf:
    """The constraint "valid under every one of ``parts``" (see :class:`AllOf`)."""
    return AllOf(*parts)


class AllOfMatcher(Matcher):
    """States are tuples of the parts' states; masks are the intersection of their masks."""

    def __init__(self, parts: list[Matcher], vocab: Vocabulary) -> None:
        # With one way to end, a token valid for every part ends the sequence for every part
        # or for none, so intersecting the masks is exact.
        ends = {m.terminators for m in parts}
        if len(ends) > 1:
            raise ValueError(
                "all_of: the parts end sequences differently (terminators "
                f"{', '.join(repr(t) if t else 'none (EOS)' for t in sorted(ends))}); "
                "give every part the same terminators"
            )
        # Eager parts first: they reject most tokens before a predicate is asked.
        self.parts, self.vocab = sorted(parts, key=lambda m: m.lazy), vocab
        self.terminators = ends.pop()
        self.lazy = any(m.lazy for m in parts)

    def start(self) -> State:
        return tuple(m.start() for m in self.parts)

    def allowed(self, state: State) -> np.ndarray:
        masks = [m.allowed(s) for m, s in zip(self.parts, _parts(state), strict=True)]
        return reduce(lambda a, b: np.intersect1d(a, b, assume_unique=True), masks)

    def finishing(self, state: State) -> np.ndarray:
        masks = [m.finishing(s) for m, s in zip(self.parts, _parts(state), strict=True)]
        return reduce(lambda a, b: np.intersect1d(a, b, assume_unique=True), masks)

    def closing(self, state: State) -> np.ndarray:
        # A superset (each part can finish one token later, perhaps each by another token),
        # which the contract allows.
        masks = [m.closing(s) for m, s in zip(self.parts, _parts(state), strict=True)]
        return reduce(lambda a, b: np.intersect1d(a, b, assume_unique=True), masks)

    def within(self, state: State, tokens: int) -> np.ndarray:
        # A superset, as for closing: a text complete for every part is complete for each.
        masks = [m.within(s, tokens) for m, s in zip(self.parts, _parts(state), strict=True)]
        return reduce(lambda a, b: np.intersect1d(a, b, assume_unique=True), masks)

    def advance(self, state: State, token: int) -> State | None:
        after = []
        for m, s in zip(self.parts, _parts(state), strict=True):
            nxt = m.advance(s, token)
            if nxt is None:
                return None
            after.append(nxt)
        done = [nxt is DONE for nxt in after]
        if all(done):
            return DONE
        return None if any(done) else tuple(after)

    def forced_bytes(self, state: State, limit: int | None = None) -> bytes:
        # Each part forces its bytes, so together they force the longer one when the two
        # agree; when they disagree no text is valid and the masks show it.
        forced = b""
        for m, s in zip(self.parts, _parts(state), strict=True):
            f = _forced(m, s, limit)
            if f.startswith(forced):
                forced = f
            elif not forced.startswith(f):
                return b""
        return forced

    def min_new_tokens(self) -> int:
        # A complete sequence is complete for every part: at least as long as each needs.
        return max(m.min_new_tokens() for m in self.parts)

    def stats(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for m in self.parts:
            for key, value in m.stats().items():
                total[key] = total.get(key, 0) + value
        return total

    @contextmanager
    def checking(self) -> Iterator[None]:
        with ExitStack() as stack:
            for m in self.parts:
                stack.enter_context(m.checking())
            yield


class Stopped(Constraint):
    """``inner`` whose sequences also end at the token that puts one of the ``stop`` strings
    into the text, which is then cut before it (:mod:`adaptrack.constraints.stop`). The
    token carrying the stop string is a token ``inner`` allows, as every other one: the
    sequences are ``inner``'s complete ones and its valid prefixes that end at a stop
    string, and a search targets those (docs/design.md §2). Build it with :func:`with_stop`.
    """

    def __init__(self, inner: Constraint, stop: Iterable[str]) -> None:
        if not isinstance(inner, Constraint):
            raise TypeError(f"with_stop takes a constraint, got {type(inner).__name__}")
        self.inner = inner
        self._stop_bytes = stop_strings(stop)
        self.stop = tuple(s.decode() for s in self._stop_bytes)

    def bind(self, vocab: Vocabulary) -> Matcher:
        return StopMatcher(self.inner.bind(vocab), self._stop_bytes)


def with_stop(constraint: Constraint | None, stop: Iterable[str]) -> Constraint | None:
    """``constraint`` (None: no constraint) whose sequences also end where one of the
    ``stop`` strings appears, their text cut before it: :func:`anything` with ``stop`` for
    no constraint, else a :class:`Stopped`; ``constraint`` itself when ``stop`` is empty.
    The server's ``stop`` is this (OpenAI's ``stop``: the stop string is not returned).

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"ab", b"<eos>"], lambda p: [1, 1, 1, 1], eos=3)
    >>> c = with_stop(at.constraints.regex("a*b(ab)*"), ["b"])
    >>> dist = at.exact_distribution(lm, [], c, max_new_tokens=2)
    >>> sorted(lm.vocab.decode(s).decode() for s in dist)  # every sequence ends at "b"
    ['aab', 'ab', 'ab', 'b']
    >>> at.generate(lm, [], c, method="exact", n=4, seed=0).texts  # cut before it
    ['a', 'aa', 'a', '']
    """
    stops = stop_strings(stop)
    if not stops:
        return constraint
    if constraint is None:
        return Anything(stop=[s.decode() for s in stops])
    if isinstance(constraint, Anything):
        return Anything(constraint.terminators, stop=list(dict.fromkeys(
            constraint.stop + tuple(s.decode() for s in stops))))
    return Stopped(constraint, [s.decode() for s in stops])


def _stopped(state: State) -> tuple[State, bytes]:
    """The inner matcher's state and the text's last bytes of a :class:`StopMatcher` state."""
    return state  # type: ignore[return-value]


class StopMatcher(Matcher):
    """``inner`` with stop strings: a state is ``inner``'s and the text's last bytes (what
    decides the next cut); the masks are ``inner``'s, and a token it allows that finishes a
    stop string finishes the sequence."""

    def __init__(self, inner: Matcher, stops: tuple[bytes, ...]) -> None:
        self.inner, self.vocab = inner, inner.vocab
        self.terminators, self.lazy = inner.terminators, inner.lazy
        self.stops = StopStrings(stops, inner.vocab)

    def start(self) -> State:
        return (self.inner.start(), b"")

    def allowed(self, state: State) -> np.ndarray:
        return self.inner.allowed(_stopped(state)[0])

    def finishing(self, state: State) -> np.ndarray:
        inner, tail = _stopped(state)
        by_stop = np.intersect1d(self.inner.allowed(inner), self.stops.finishing(tail),
                                 assume_unique=True)
        return np.union1d(self.inner.finishing(inner), by_stop)

    def advance(self, state: State, token: int) -> State | None:
        inner, tail = _stopped(state)
        nxt = self.inner.advance(inner, token)
        if nxt is None or self.inner.is_complete(nxt):
            return None if nxt is None else DONE
        text = tail + self.vocab.bytes_of(token)
        if self.stops.cut(text, len(tail)) >= 0:
            return DONE
        return (nxt, self.stops.tail(text))

    def leaving(self, state: State) -> np.ndarray:
        return self.inner.leaving(_stopped(state)[0])

    def forced_bytes(self, state: State, limit: int | None = None) -> bytes:
        # Only the bytes before a stop string they would complete: the sequence ends there.
        inner, tail = _stopped(state)
        data = _forced(self.inner, inner, limit)
        at = self.stops.cut(tail + data, len(tail))
        return data if at < 0 else data[:max(0, at - len(tail))]

    def final_text(self, data: bytes) -> bytes:
        return self.stops.final_text(self.inner.final_text(data))

    def stats(self) -> dict[str, float]:
        return self.inner.stats()

    @contextmanager
    def checking(self) -> Iterator[None]:
        with self.inner.checking():
            yield
