"""``all_of``: text valid under every one of several constraints."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import reduce

import numpy as np

from ..tokenization.vocab import Vocabulary
from .base import DONE, Constraint, Matcher, State


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
