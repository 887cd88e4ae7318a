"""The cursor: one llguidance matcher moved to any state of a :class:`GrammarMatcher`.

Matcher states (docs/design.md §4) are the token tuples from the start. One llguidance
matcher, the *cursor*, only ever moves forward: a new state is usually the cursor's state
plus one token (1-2 µs a token). To reach any other state the cursor is replaced by a deep
copy (1-20 µs) of the nearest checkpoint, a copy kept every :data:`_CHECKPOINT_EVERY`
tokens along the way, and consumes the rest. llguidance's ``rollback`` is never used: it
keeps the mask cache of its Earley parser (keyed by lexer state and row index), and a
row index reused after a rollback then returns the mask of the text rolled back (llguidance
1.9: after ``"age"`` a JSON-schema matcher allowed digits before the ``:``). A copy shares
its original's lexer, whose resource limits are spent for all of them at once: after a
failure the cursor starts again from a new matcher (see :class:`Track`), so a state fails
here only where a new llguidance matcher fails too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from llguidance import LLMatcher

from ...cache import LRU
from ...errors import GrammarError

#: Tokens between two checkpoints of the cursor's path (see the module doc): a jump to a
#: state replays at most this many tokens after copying the nearest checkpoint.
_CHECKPOINT_EVERY = 16


def matcher_failure(kind: str, matcher: LLMatcher) -> GrammarError:
    """The error of a failed llguidance matcher."""
    err = matcher.get_error().strip().splitlines()
    reason = err[0] if err else "unknown error"
    return GrammarError(f"llguidance failed on this {kind}: {reason} (its resource limits; "
                        "simplify the grammar or shorten max_new_tokens)")


class Spent(Exception):
    """An llguidance matcher failed where a new one may not (see :meth:`Track.run`)."""

    def __init__(self, error: GrammarError) -> None:
        super().__init__(str(error))
        self.error = error


def dead_end(matcher: LLMatcher) -> bool:
    """Whether ``matcher`` stopped because no token continues its text (not a failure)."""
    return matcher.get_error().startswith("NoExtensionBias")


T = TypeVar("T")


class Track:
    """An llguidance matcher, the cursor, moved to token tuples as the module doc says:
    forward from where it is when that is a prefix of the target, else from a copy of the
    nearest checkpoint (or of ``root``, which never consumes; ``new()`` when not given).
    ``new()`` makes a new llguidance matcher of the grammar; ``ids(tokens)`` is what the
    matcher consumes for ``tokens`` (the tokens themselves, or their bytes).

    The copies of a matcher share its lexer, and llguidance's lexer fails for good once
    it runs out of *fuel* (or of states): every copy then fails, the root too. It refills
    the fuel only when it computes a mask, so tokens consumed with no mask in between (a
    jump from a checkpoint) can run it dry where a new matcher, whose first fuel is not a
    step's, consumes them. :meth:`run` therefore restarts from a new matcher, with a lexer
    of its own, and if that fails too, from another one that computes a mask before each
    token it consumes."""

    def __init__(self, new: Callable[[], LLMatcher],
                 ids: Callable[[tuple[int, ...]], list[int]], checkpoints: int,
                 kind: str, root: LLMatcher | None = None) -> None:
        self.new, self.ids, self.kind = new, ids, kind
        self.root = new() if root is None else root
        self.cursor = self.root.deep_copy()
        self.at: tuple[int, ...] = ()
        self.checkpoints: LRU[tuple[int, ...], LLMatcher] = LRU(checkpoints)
        self.restarts = 0

    def reset(self) -> None:
        """Drop the cursor (an llguidance error is permanent; the lexer is still sound)."""
        self.cursor, self.at = self.root.deep_copy(), ()

    def restart(self) -> None:
        """Start again from a new matcher: the checkpoints share the old one's lexer."""
        self.root = self.new()
        self.checkpoints.clear()
        self.reset()
        self.restarts += 1

    def run(self, state: tuple[int, ...], compute: Callable[[LLMatcher], T]) -> T:
        """``compute`` on the cursor moved to ``state`` (states are valid: only
        llguidance's resource limits make a matcher fail on the way, or ``compute`` raise
        :class:`Spent`). After a failure, once more from a new matcher, then from another
        one with a mask before each token; a third failure is a :class:`GrammarError`."""
        for attempt in range(3):
            try:
                return compute(self.goto(state, masks=attempt == 2))
            except Spent as spent:
                self.restart()
                if attempt == 2:
                    raise spent.error from None
        raise AssertionError("unreachable")

    def _jump(self, state: tuple[int, ...]) -> None:
        """Put the cursor at the longest checkpointed prefix of ``state`` (or the start)."""
        at: tuple[int, ...] = ()
        cursor = None
        k = len(state) // _CHECKPOINT_EVERY * _CHECKPOINT_EVERY
        while k > 0:
            found = self.checkpoints.get(state[:k])
            if found is not None:
                at, cursor = state[:k], found.deep_copy()
                break
            k -= _CHECKPOINT_EVERY
        self.cursor = self.root.deep_copy() if cursor is None else cursor
        self.at = at

    def _consume(self, tokens: tuple[int, ...], masks: bool) -> bool:
        """Whether the cursor consumed ``tokens`` (``masks``: one token at a time, each
        after a mask)."""
        cursor = self.cursor
        if not masks:
            return bool(cursor.consume_tokens(self.ids(tokens)))
        for token in tokens:
            cursor.compute_bitmask()
            if cursor.is_error() or not cursor.consume_tokens(self.ids((token,))):
                return False
        return True

    def goto(self, state: tuple[int, ...], masks: bool = False) -> LLMatcher:
        """The cursor, moved to ``state`` (``masks``: a mask computed before each token,
        which refills llguidance's lexer fuel); :class:`Spent` if it fails."""
        every = _CHECKPOINT_EVERY
        if len(self.at) > len(state) or state[: len(self.at)] != self.at:
            self._jump(state)
        k = len(self.at)
        while k < len(state):
            stop = min(len(state), (k // every + 1) * every)
            if not self._consume(state[k:stop], masks):
                err = matcher_failure(self.kind, self.cursor)
                self.reset()
                raise Spent(err)
            k = stop
            self.at = state[:k]
            if k % every == 0 and self.at not in self.checkpoints:
                self.checkpoints.put(self.at, self.cursor.deep_copy())
        return self.cursor
