"""What the fuzz tests share (``test_fuzz.py``: the Python API; ``cli/test_cli_fuzz.py``: the
command line): a watchdog against hangs, the error contract's verdict on an exception, the
list of distinct findings, random text, and the defects still open.

The error contract (``adaptrack/errors.py``, docs/design.md §6): bad arguments raise
``TypeError``/``ValueError`` on purpose (a ``raise`` in adaptrack's own code), every other
failure a named ``AdaptrackError``, each with a non-empty one-line message; the command line
exits 0, or 2 with ``adaptrack: error: ...`` as the last line of stderr and no traceback.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import adaptrack
from adaptrack import AdaptrackError

SRC = os.path.dirname(os.path.abspath(adaptrack.__file__))
CASE_SECONDS = 20.0  # per case; the cases take milliseconds, a few take a second

#: Defects the fuzz found that are not fixed yet: the regression case that pins each one
#: (``test_regression``, xfail strict) and the fuzz signatures it shows up as. The fuzz
#: tolerates these signatures so that it keeps looking for new defects; delete an entry when
#: its fix lands (its case then passes, and the xfail marker comes off with it).
OPEN_DEFECTS: dict[str, tuple[str, ...]] = {
}
KNOWN = {sig: name for name, sigs in OPEN_DEFECTS.items() for sig in sigs}


# ------------------------------------------------------------------------------ watchdog


class Hang(BaseException):
    """A case ran past its time bound (a BaseException: library code cannot swallow it)."""


@contextlib.contextmanager
def watchdog(seconds: float = CASE_SECONDS) -> Iterator[None]:
    """Raise :class:`Hang` in the main thread after ``seconds``.

    A timer thread sends SIGUSR1 to the main thread (``pthread_kill``): a real signal, so it
    also interrupts ``time.sleep``, and it is independent of the SIGALRM timer that
    ``predicate`` uses for its own check timeouts.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "pthread_kill"
    ):
        yield
        return
    fired = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if fired.is_set():
            raise Hang(f"the case ran past {seconds} s")

    main = threading.main_thread().ident
    assert main is not None

    def fire() -> None:
        fired.set()
        signal.pthread_kill(main, signal.SIGUSR1)

    old = signal.signal(signal.SIGUSR1, on_signal)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, old)


# ------------------------------------------------------------------------- verdicts


class UserBoom(Exception):
    """Raised by the fuzz's own callbacks (a predicate that raises): passing it through
    unchanged is the expected behavior for an exception from user code."""


def _frames(err: BaseException) -> list[traceback.FrameSummary]:
    return traceback.extract_tb(err.__traceback__)


def _where(err: BaseException) -> str:
    """The deepest adaptrack frame of the traceback, ``module.py:function``."""
    ours = [f for f in _frames(err) if f.filename.startswith(SRC)]
    if not ours:
        return "outside adaptrack"
    f = ours[-1]
    return f"{os.path.relpath(f.filename, SRC)}:{f.name}"


def verdict(err: BaseException) -> str | None:
    """None when ``err`` obeys the error contract, else what is wrong with it."""
    if isinstance(err, Hang):
        return "hang"
    if isinstance(err, UserBoom):
        return None
    if not isinstance(err, TypeError | ValueError | AdaptrackError):
        return f"{type(err).__name__} is not TypeError/ValueError/AdaptrackError"
    message = str(err)
    if not message.strip():
        return f"{type(err).__name__} with an empty message"
    if "\n" in message or "\r" in message:
        return f"{type(err).__name__} with a multi-line message"
    if not isinstance(err, AdaptrackError):
        last = _frames(err)[-1] if _frames(err) else None
        if last is None or not last.filename.startswith(SRC):
            where = last.filename if last else "?"
            return f"{type(err).__name__} raised outside adaptrack ({os.path.basename(where)})"
        if not (last.line or "").lstrip().startswith("raise"):
            # Raised by Python or a library inside adaptrack's code, not on purpose: the
            # message does not name the argument (errors.py).
            return f"accidental {type(err).__name__}"
    return None


def signature(err: BaseException, why: str) -> str:
    return f"{why} at {_where(err)}"


def tail(err: BaseException, lines: int = 6) -> str:
    text = "".join(traceback.format_exception(err)).rstrip().splitlines()
    return "\n".join(text[-lines:])


@dataclass
class Findings:
    """Distinct contract violations, each with its first reproducing input."""

    seen: dict[str, str] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def outcome(self, what: str) -> None:
        self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def add(self, sig: str, detail: str) -> None:
        self.count[sig] = self.count.get(sig, 0) + 1
        self.seen.setdefault(sig, detail)

    def new(self) -> dict[str, str]:
        return {s: d for s, d in self.seen.items() if s not in KNOWN}

    def report(self) -> str:
        return "\n\n".join(f"[{self.count[s]}x] {s}\n{d}" for s, d in self.new().items())

# ------------------------------------------------------------------ random text

BYTES = [b"a", b"b", b"(", b"1", b'"', b"{", b"}", b" ", b".", b"_", b"\n", b"\x00",
         b"\xff", b"\xc3", b"\xa9", b"\xe2\x82", b"\xac", b"\xc3\xa9"]
CHARS = 'ab(1"{} ._\n\x00é€\\[]*+?|^$-,'
SURROGATE = "\ud800"


def rand_bytes(rng: random.Random, lo: int = 1, hi: int = 3) -> bytes:
    return b"".join(rng.choice(BYTES) for _ in range(rng.randint(lo, hi)))


def rand_text(rng: random.Random, hi: int = 6, alphabet: str = CHARS,
              surrogates: bool = True) -> str:
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, hi)))
    if surrogates and rng.random() < 0.05:
        i = rng.randint(0, len(text))
        text = text[:i] + SURROGATE + text[i:]
    return text


REGEXES = ["a+b", "(ab|b)*", "[ab]{2,3}", "a?", "", ".", "\\d+", "a{1000}", "(", "[", "a**",
           "[b-a]", "\\", "é+", "a|", "(?i)ab", "\\p{L}", "x{2,1}", "(a)\\1", "[^\\x00-\\xff]"]


# ------------------------------------------------------------------ pinned regressions


def pinned(name: str) -> Any:
    """A regression case's parameter: xfail (strict) while its defect is open."""
    if name in OPEN_DEFECTS:
        return pytest.param(name, marks=pytest.mark.xfail(
            strict=True, reason=f"open defect found by the fuzz: {OPEN_DEFECTS[name][0]}"))
    return name


def check_regression(case: Callable[[], Any]) -> None:
    """Run one defect the fuzz found, as one small input: the call returns, or raises an
    error that obeys the contract."""
    with watchdog(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            case()
        except (Exception, Hang) as err:
            why = verdict(err)
            assert why is None, f"{why}: {type(err).__name__}: {err}"
