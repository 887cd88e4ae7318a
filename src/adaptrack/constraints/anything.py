"""No constraint: every token is valid, up to EOS, a terminator byte or a stop string."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..tokenization.vocab import Vocabulary
from .base import DONE, Constraint, Matcher, State, terminator_bytes
from .stop import StopStrings, stop_strings


class Anything(Constraint):
    """No constraint: every token is valid. Sequences end with EOS, a terminator byte, or
    where one of the ``stop`` strings appears in the text (then cut before it:
    :mod:`adaptrack.constraints.stop`)."""

    def __init__(self, terminators: str | bytes | Iterable[str] | None = None,
                 stop: Iterable[str] = ()) -> None:
        self.terminators = terminator_bytes(terminators)
        self._stop_bytes = stop_strings(stop)
        self.stop = tuple(s.decode() for s in self._stop_bytes)

    def bind(self, vocab: Vocabulary) -> Matcher:
        return _AnythingMatcher(vocab, self.terminators, self._stop_bytes)


def anything(terminators: str | bytes | None = None, stop: Iterable[str] = ()) -> Anything:
    """No constraint (what ``method="unconstrained"`` decodes with); with ``stop``, a
    sequence ends where one of these strings appears, and its text is cut before it.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"\\n", b"<eos>"], lambda prefix: [4, 1, 0], eos=2)
    >>> res = at.generate(lm, [], anything(stop=["\\n"]), method="unconstrained", n=3, seed=0)
    >>> [(s.text, s.tokens) for s in res.samples]    # cut before the stop string
    [('', (1,)), ('aaaa', (0, 0, 0, 0, 1)), ('', (1,))]
    """
    return Anything(terminators, stop)


class _AnythingMatcher(Matcher):
    def __init__(self, vocab: Vocabulary, terminators: bytes,
                 stops: tuple[bytes, ...] = ()) -> None:
        self.vocab, self.terminators = vocab, terminators
        ends = vocab.tokens_holding(terminators)
        self._ending = frozenset(ends.tolist())
        allowed = np.zeros(vocab.size, dtype=bool)
        allowed[vocab.text_ids] = True
        allowed[vocab.eos_ids] = True
        self._allowed = np.flatnonzero(allowed)
        finishing = np.zeros(vocab.size, dtype=bool)
        finishing[ends] = True
        finishing[vocab.eos_ids] = True
        self._finishing = np.flatnonzero(finishing)
        # With stop strings a state is the text's last bytes (what decides the next cut).
        self._stops = StopStrings(stops, vocab, self._finishing) if stops else None

    def start(self) -> State:
        return b"" if self._stops else 0

    def allowed(self, state: State) -> np.ndarray:
        return self._allowed

    def finishing(self, state: State) -> np.ndarray:
        if self._stops is None:
            return self._finishing
        return self._stops.finishing(state)  # type: ignore[arg-type]

    def advance(self, state: State, token: int) -> State | None:
        if self.vocab.is_eos(token) or token in self._ending:
            return DONE
        data = self.vocab.bytes_of(token)
        if not data:
            return None
        if self._stops is None:
            return 0
        seen: bytes = state  # type: ignore[assignment]
        text = seen + data
        if self._stops.cut(text, len(seen)) >= 0:
            return DONE
        return self._stops.tail(text)

    def final_text(self, data: bytes) -> bytes:
        return data if self._stops is None else self._stops.final_text(data)
