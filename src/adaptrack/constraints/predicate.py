"""``predicate``: validity decided by Python callables on the decoded text.

This is the paper's oracle constrainer (§6.3): nothing is known about the language except
two questions one can ask of a text. Such a matcher is *lazy*: ``allowed`` lists candidates
only, and the prefix tree asks ``advance`` for each candidate in probability order until the
validity-aware top-p cutoff (docs/design.md §2) says the rest count as invalid. A check that runs
past ``timeout`` seconds counts the token invalid (the paper restarts after 60 s) and is
recorded in ``stats()``.
"""

from __future__ import annotations

import math
import numbers
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import numpy as np

from ..errors import CheckTimeoutError
from ..tokenization.vocab import Vocabulary
from .base import DONE, Constraint, Matcher, State, show, terminator_bytes

#: The longest alarm :meth:`PredicateMatcher._ask` sets (about 31.7 years): ``setitimer``
#: overflows past about 9.2e9 s, and a longer finite timeout cannot fire in practice.
_MAX_ALARM = 1e9

Check = Callable[[str], bool]


class CheckTimeout(Exception):
    """Raised inside a predicate when it runs past its timeout (caught by the matcher)."""


class Predicate(Constraint):
    """Text ``t`` is valid when ``is_complete(t)``; a prefix may grow while ``prefix_ok``.

    ``prefix_ok(text)`` answers "can ``text`` still be extended into a valid output?" and
    ``is_complete(text)`` "is ``text`` a valid output?". Both see the decoded text so far (an
    incomplete UTF-8 character at the end is held back until its last byte arrives; invalid
    UTF-8 is never valid). Without terminators the sequence ends with EOS where
    ``is_complete`` holds; with ``terminators``, a token that holds one ends it and
    ``is_complete`` sees the text up to and including that byte.

    ``timeout`` (a finite number of seconds > 0, or ``None`` for no limit) bounds each call.
    In the main thread a check is interrupted when it runs over (SIGALRM, so pure-Python
    checks stop; a C call that does not return to Python cannot be cut short); elsewhere it
    runs to the end and counts as timed out afterwards. A timed-out token is invalid for the
    rest of the run. After ``max_timeouts`` timed-out checks (default 10; ``None``: no limit)
    the matcher raises :class:`~adaptrack.errors.CheckTimeoutError` (a
    ``SearchTimeoutError``; no fallback draws past it): a check that always times out
    would otherwise be asked about every token at every prefix.

    ``is_complete`` is asked only of whole texts, so CD cannot steer towards it and walks
    into dead ends a search learns to avoid: a search over a predicate (a lazy matcher)
    keeps its whole budget, with no early hand-over to CD, whose samples here are often
    incomplete.

    A ``timeout`` that is not a number (``"1"``, ``True``) is a TypeError; zero, negative,
    NaN or infinite a ValueError (pass ``None`` for no limit). ``max_timeouts`` takes an int
    >= 1 or ``None``, checked the same way.

    Both callables must return a ``bool`` (a NumPy bool too); any other value raises
    ``TypeError`` naming the callable, so that ``"no"`` or ``None`` is never taken as an
    answer.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"1", b"2", b"+", b"<eos>"], lambda p: [1, 1, 1, 1], eos=3)
    >>> sums = predicate(lambda t: "++" not in t and not t.startswith("+"),
    ...                  lambda t: t[-1:].isdigit() and eval(t) == 4)
    >>> res = at.generate(lm, [], sums, method="exact", n=20, seed=2, max_new_tokens=8)
    >>> sorted(set(res.texts)), res.stats["check_timeouts"], res.stats["fallback_samples"]
    (['1+1+2', '2+1+1', '2+2'], 0, 0)
    """

    def __init__(
        self,
        prefix_ok: Check,
        is_complete: Check,
        *,
        terminators: str | bytes | Iterable[str] | None = None,
        timeout: float | None = 60.0,
        max_timeouts: int | None = 10,
    ) -> None:
        for role, check in (("prefix_ok", prefix_ok), ("is_complete", is_complete)):
            if not callable(check):
                raise TypeError("predicate needs two callables: prefix_ok(text) and "
                                f"is_complete(text); {role} is {show(check)} "
                                f"({type(check).__name__})")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
                raise TypeError("timeout takes a number of seconds > 0 or None (no limit), got "
                                f"{show(timeout)} ({type(timeout).__name__})")
            if not (math.isfinite(timeout) and timeout > 0):
                raise ValueError("timeout takes a finite number of seconds > 0 or None (no "
                                 f"limit), got {timeout!r}")
            timeout = float(timeout)
        if max_timeouts is not None:
            if isinstance(max_timeouts, bool) or not isinstance(max_timeouts, numbers.Integral):
                raise TypeError("max_timeouts must be an int >= 1 or None, got "
                                f"{show(max_timeouts)} ({type(max_timeouts).__name__})")
            if max_timeouts < 1:
                raise ValueError(f"max_timeouts must be an int >= 1 or None, got {max_timeouts!r}")
            max_timeouts = int(max_timeouts)
        self.prefix_ok, self.is_complete = prefix_ok, is_complete
        self.terminators = terminator_bytes(terminators)
        self.timeout: float | None = timeout
        self.max_timeouts: int | None = max_timeouts

    def bind(self, vocab: Vocabulary) -> Matcher:
        return PredicateMatcher(self, vocab)


def predicate(
    prefix_ok: Check,
    is_complete: Check,
    *,
    terminators: str | bytes | Iterable[str] | None = None,
    timeout: float | None = 60.0,
    max_timeouts: int | None = 10,
) -> Predicate:
    """The constraint decided by two Python callables on the text (see :class:`Predicate`)."""
    return Predicate(prefix_ok, is_complete, terminators=terminators, timeout=timeout,
                     max_timeouts=max_timeouts)


def _name(pred: Predicate, check: Check) -> str:
    """``check``'s role and name for messages: ``prefix_ok (my_check)``."""
    role = "prefix_ok" if check is pred.prefix_ok else "is_complete"
    name = getattr(check, "__qualname__", None) or repr(check)
    return f"{role} ({name})"


def decode_utf8(data: bytes) -> tuple[str, bool] | None:
    """``data`` as text, and whether it ends on a whole character; ``None``: invalid UTF-8."""
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError as err:
        # Only a truncated character at the very end may wait for more bytes.
        if err.reason != "unexpected end of data":
            return None
        try:
            return data[: err.start].decode("utf-8"), False
        except UnicodeDecodeError:
            return None


class PredicateMatcher(Matcher):
    """States are the generated bytes so far; every check goes through :meth:`_ask`."""

    lazy = True

    def __init__(self, pred: Predicate, vocab: Vocabulary) -> None:
        self.p, self.vocab, self.terminators = pred, vocab, pred.terminators
        candidates = np.zeros(vocab.size, dtype=bool)
        candidates[vocab.text_ids] = True
        ending = np.zeros(vocab.size, dtype=bool)
        if self.terminators:
            ending[vocab.tokens_holding(self.terminators)] = True
        else:
            candidates[vocab.eos_ids] = True
            ending[vocab.eos_ids] = True
        self._candidates = np.flatnonzero(candidates)
        self._ending = np.flatnonzero(ending)
        self._timed_out: set[tuple[bytes, int]] = set()
        self._armed = False
        self._handler_installed = False
        self.checks = 0
        self.timeouts = 0
        self.check_seconds = 0.0

    def start(self) -> State:
        return b""

    def allowed(self, state: State) -> np.ndarray:
        return self._candidates

    def finishing(self, state: State) -> np.ndarray:
        return self._ending

    def advance(self, state: State, token: int) -> State | None:
        if not isinstance(state, bytes):  # DONE: nothing follows a finished sequence
            return None
        if (state, token) in self._timed_out:
            return None
        if self.vocab.is_eos(token):
            if self.terminators:
                return None
            return DONE if self._complete(state, token) else None
        data = self.vocab.bytes_of(token)
        if not data:
            return None
        for k, b in enumerate(data):
            if b in self.terminators:
                return DONE if self._complete(state + data[: k + 1], token, state) else None
        text = state + data
        decoded = decode_utf8(text)
        if decoded is None or not self._ask(self.p.prefix_ok, decoded[0], state, token):
            return None
        return text

    def _complete(self, data: bytes, token: int, state: bytes | None = None) -> bool:
        decoded = decode_utf8(data)
        if decoded is None or not decoded[1]:
            return False
        return self._ask(self.p.is_complete, decoded[0], data if state is None else state, token)

    def stats(self) -> dict[str, float]:
        return {"checks": self.checks, "check_timeouts": self.timeouts,
                "check_seconds": self.check_seconds}

    # --- timeouts -------------------------------------------------------------------------

    def _on_alarm(self, signum: int, frame: object) -> None:
        # Runs between bytecodes of the main thread: once the check has returned (disarmed),
        # a late alarm does nothing, so it can never land outside the check.
        if self._armed:
            raise CheckTimeout

    @contextmanager
    def checking(self) -> Iterator[None]:
        """Keep the alarm handler installed across a scan of many checks (saves ~4 µs each)."""
        if self._handler_installed or not self._can_interrupt():
            yield
            return
        previous = signal.signal(signal.SIGALRM, self._on_alarm)
        self._handler_installed = True
        try:
            yield
        finally:
            self._handler_installed = False
            signal.signal(signal.SIGALRM, previous)

    def _can_interrupt(self) -> bool:
        return (self.p.timeout is not None and hasattr(signal, "setitimer")
                and threading.current_thread() is threading.main_thread())

    def _ask(self, check: Check, text: str, state: bytes, token: int) -> bool:
        self.checks += 1
        started = time.perf_counter()
        timeout = self.p.timeout
        try:
            if timeout is not None and self._can_interrupt():
                with self.checking():
                    signal.setitimer(signal.ITIMER_REAL, min(timeout, _MAX_ALARM))
                    self._armed = True
                    try:
                        verdict = check(text)
                    finally:
                        self._armed = False
                        signal.setitimer(signal.ITIMER_REAL, 0)
            else:
                verdict = check(text)
                if timeout is not None and time.perf_counter() - started > timeout:
                    raise CheckTimeout
        except CheckTimeout:
            self.timeouts += 1
            self._timed_out.add((state, token))
            self.check_seconds += time.perf_counter() - started
            limit = self.p.max_timeouts
            if limit is not None and self.timeouts >= limit:
                raise CheckTimeoutError(
                    f"the predicate's checks timed out {self.timeouts} times at "
                    f"timeout={timeout:g} s (last: {_name(self.p, check)} on "
                    f"{text[-40:]!r}); make the check faster, raise timeout=, or pass "
                    "max_timeouts=None to count "
                    "timed-out tokens invalid without a limit") from None
            return False
        self.check_seconds += time.perf_counter() - started
        if not isinstance(verdict, bool | np.bool_):
            raise TypeError(f"the predicate's {_name(self.p, check)} must return a bool, got "
                            f"{verdict!r} ({type(verdict).__name__}) for {text[-40:]!r}")
        return bool(verdict)
