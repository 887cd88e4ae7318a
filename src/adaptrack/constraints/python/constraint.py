"""The ``python`` constraint and its matcher (see :mod:`adaptrack.constraints.python`)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ...cache import LRU
from ...tokenization.vocab import Vocabulary
from ..base import DONE, Matcher, State, show, utf8
from ..predicate import Predicate, PredicateMatcher, decode_utf8
from ..stop import StopStrings, stop_strings
from .names import Names
from .syntax import (
    INCOMPLETE_FLAGS,
    compiles,
    ends_in_comment,
    is_program,
    open_end,
    prefix_ok,
    top_level_done,
)

#: HumanEval's stop strings (the completion is a function body; these start the next
#: top-level statement).
HUMANEVAL_STOP = ("\ndef", "\nclass", "\nif", "\nprint")


class Python(Predicate):
    """The constraint built by :func:`python`."""

    def __init__(self, prefix: str = "", *, names: bool = True,
                 modules: Iterable[str] | None = None,
                 stop: Iterable[str] = (), timeout: float | None = 60.0,
                 max_timeouts: int | None = 10) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix takes the program text before the generated code (a str), "
                            f"got {show(prefix)} ({type(prefix).__name__})")
        stop_bytes = stop_strings(stop)
        if modules is not None:
            names_ = [] if isinstance(modules, str) else list(modules)
            if isinstance(modules, str) or not all(isinstance(m, str) for m in names_):
                raise TypeError("modules takes a list of module names or None (the standard "
                                f"library and what prefix imports), got {show(modules)}")
            modules = names_
        utf8(prefix, "prefix")
        if not prefix_ok(prefix):
            raise ValueError(f"prefix is not the start of a valid Python program: "
                             f"{show(prefix[-60:])} ({compiles(prefix, INCOMPLETE_FLAGS)})")
        self.prefix, self.names = prefix, bool(names)
        self.stop_bytes, self.stop = stop_bytes, tuple(s.decode() for s in stop_bytes)
        self._names = Names(prefix, modules) if names else None
        super().__init__(self._text_ok, self._program_ok, timeout=timeout,
                         max_timeouts=max_timeouts)

    def _valid(self, text: str) -> bool:
        """The syntax and name checks of ``prefix + text`` as a prefix."""
        code = self.prefix + text
        if not prefix_ok(code):
            return False
        n = self._names
        if n is None:
            return True
        if not n.chains_ok(code, final=False):
            return False
        if top_level_done(code) and is_program(code):
            return not n.undefined(code, functions=False)
        return True

    def _text_ok(self, text: str) -> bool:
        if self._valid(text):
            return True
        # A text ending in the start of a stop string is fine where the stop could end it.
        for s in self.stop:
            for k in range(1, len(s)):
                if text.endswith(s[:k]) and self._program_ok(text[:len(text) - k]):
                    return True
        return False

    def _program_ok(self, text: str) -> bool:
        """Whether ``prefix + text`` is a complete, valid program."""
        code = self.prefix + text
        if not is_program(code):
            return False
        n = self._names
        return n is None or (n.chains_ok(code, final=True)
                             and not n.undefined(code, functions=True))

    def bind(self, vocab: Vocabulary) -> Matcher:
        return PythonMatcher(self, vocab)


def python(prefix: str = "", *, names: bool = True, modules: Iterable[str] | None = None,
           stop: Iterable[str] = (), timeout: float | None = 60.0,
           max_timeouts: int | None = 10) -> Python:
    """Generated text that keeps ``prefix + text`` a valid prefix of a Python program.

    ``prefix`` is the program before the generated text (for HumanEval, the prompt: imports
    and a function's signature and docstring; the completion is its body). ``names=True``
    also checks names (see :mod:`adaptrack.constraints.python`): chains of the modules in
    ``modules`` (default: the standard library and what ``prefix`` imports, less a few
    standard modules whose import acts, such as ``antigravity`` and ``this``). **Checking a
    chain imports its module, which runs that module's code**: only allowlisted modules are
    ever imported. A sequence ends with EOS where the program is complete, or at the first
    of the ``stop`` strings in the generated text where the program before it is complete
    (the whole stop string in the generated text, as the Codex paper's sampling stops:
    after a prompt that ends with a newline, a completion that starts with ``def`` goes
    on); ``Sample.text`` is then cut before the stop string. The body of a function ends
    only there: a line back at column 0 that no stop string starts continues the program
    at module level. ``timeout`` and
    ``max_timeouts`` bound each check as in :func:`~adaptrack.constraints.predicate`.

    Bad arguments are a TypeError; a ``prefix`` that no text could complete into a valid
    program a ValueError.

    >>> import adaptrack as at
    >>> pre = "import math\\ndef f(x):\\n"
    >>> lm = at.TableLM([b"    return ", b"math.sqrt(x)", b"math.sqrtt(x)", b"x", b"y",
    ...                  b"<eos>"], lambda p: [1, 1, 1, 1, 1, 1], eos=5)
    >>> c = python(pre, stop=HUMANEVAL_STOP)
    >>> res = at.generate(lm, [], c, method="exact", n=30, seed=0, max_new_tokens=3)
    >>> sorted(set(res.texts))  # no math.sqrtt, no undefined y
    ['    return ', '    return math.sqrt(x)', '    return x']
    >>> c.bind(lm.vocab).final_text(b"    return x\\ndef g():")
    b'    return x'
    """
    return Python(prefix, names=names, modules=modules, stop=stop, timeout=timeout,
                  max_timeouts=max_timeouts)


class PythonMatcher(PredicateMatcher):
    """A :class:`PredicateMatcher` whose sequences also end at a stop string."""

    p: Python

    def __init__(self, pred: Python, vocab: Vocabulary) -> None:
        super().__init__(pred, vocab)
        self._stops = StopStrings(pred.stop_bytes, vocab, self._ending)
        self._ending = self._stops.ending
        self._scan_from = open_end(pred.prefix)
        self._in_comment: LRU[bytes, bool] = LRU(limit=4096)

    def finishing(self, state: State) -> np.ndarray:
        """EOS, the tokens holding a stop string, and those that finish one the text's end
        started."""
        if not isinstance(state, bytes) or not self.p.stop_bytes:
            return self._ending
        return self._stops.finishing(state)

    def advance(self, state: State, token: int) -> State | None:
        if not isinstance(state, bytes) or self.vocab.is_eos(token):
            return super().advance(state, token)
        if (state, token) in self._timed_out:
            return None
        data = state + self.vocab.bytes_of(token)
        cut = self._stops.cut(data, len(state)) if self.p.stop_bytes else -1
        if cut >= 0:
            return DONE if self._complete(data[:cut], token, state) else None
        if self._extends_comment(state, data):
            return data
        return super().advance(state, token)

    def _extends_comment(self, state: bytes, data: bytes) -> bool:
        """Whether ``data`` (the valid ``state`` and a token) only lengthens the comment
        ``state`` ends in. The parser skips a comment up to the line break and the name
        checks skip it too, so every check of ``data`` answers as it did for ``state``:
        no need to ask. At temperature 1 this model writes long comments, where the
        nucleus holds hundreds of tokens to check at each step."""
        token = data[len(state):]
        if not token or b"\n" in token or b"\r" in token or b"\0" in token:
            return False
        found = self._in_comment.get(state)
        if found is None:
            text = decode_utf8(state)
            found = text is not None and ends_in_comment(self.p.prefix + text[0],
                                                           self._scan_from)
            self._in_comment.put(state, found)
        return found and decode_utf8(data) is not None

    def final_text(self, data: bytes) -> bytes:
        """``data`` cut before its first stop string."""
        return self._stops.final_text(data)
