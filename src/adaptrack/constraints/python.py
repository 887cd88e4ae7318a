"""``python``: the generated text must keep ``prefix + text`` a valid prefix of a Python program.

A lazy matcher built on :mod:`adaptrack.constraints.predicate`: the prefix tree asks about
tokens one by one in probability order with the validity-aware top-p cutoff
(docs/design.md §2), and each check looks at the text so far.

- **Syntax.** CPython's own parser decides, as :mod:`codeop` does: ``compile`` with the
  incomplete-input flag accepts a text that more input could complete. Outside brackets it
  takes the end of the input as the end of the statement, so for a text it rejects, the
  text followed by a backslash-newline (the line goes on) is tried, after completing the
  token the text may have cut short (a keyword ``el`` or soft keyword ``cas``, ``!`` of
  ``!=``, ``-`` of ``->``, ``..`` of ``...``, ``*`` of ``**``, a number ``1e``, a
  string's closing quote or its quotes after a prefix letter ``b``). A ``nonlocal`` name
  that nothing binds yet is fine where a line that binds it can follow. A text that some
  continuation makes a valid prefix is one, so these tries never accept an invalid text;
  the one approximation is an unfinished f-string, whose fields are taken as they come.
  Measured: 0 wrong rejections over the 103 724 character cuts of
  HumanEval's 164 canonical programs and over a seeded sample of 30 000 cuts, at any byte
  offset, of the standard library's files up to 32 KB (tests/test_python_constraint.py;
  costs in docs/benchmarks.md).
- **Names** (``names=True``). Every ``module.attr`` chain whose root is an imported module
  in the allowlist must exist, the last, unfinished name as a prefix of an existing one
  (exactly once the program is complete). Module-level code runs in order: once a simple
  statement at column 0 ends a line, the module-level code so far may read only names the
  program binds and builtins. A name a function reads is checked when the program is
  complete (a later definition may bind it until then). ``from m import *`` turns the
  undefined-name check off.
- **Completion.** EOS where ``prefix + text`` is a complete program, or the first stop
  string in the generated text where the text before it is one; the sample's text is then
  cut before the stop string (:meth:`Matcher.final_text`). Stop strings are the whole
  completion rule: a line back at column 0 is module-level code, valid or not like any
  other (HumanEval's stop strings cut the usual ones: ``def``, ``class``, ``if``, ``print``).
"""

from __future__ import annotations

import keyword
import re
import warnings
from collections.abc import Iterable

import numpy as np

from ..cache import LRU
from ..tokenization.vocab import Vocabulary
from .base import DONE, Matcher, State, show, utf8
from .predicate import Predicate, PredicateMatcher, _decode
from .pynames import SCAN, Names, open_end
from .stop import StopStrings, stop_strings

#: HumanEval's stop strings (the completion is a function body; these start the next
#: top-level statement).
HUMANEVAL_STOP = ("\ndef", "\nclass", "\nif", "\nprint")

_FLAGS = 0x4000 | 0x200  # PyCF_ALLOW_INCOMPLETE_INPUT | PyCF_DONT_IMPLY_DEDENT, as codeop
_KEYWORDS = ("False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
             "continue", "def", "del", "elif", "else", "except", "finally", "for", "from",
             "global", "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass",
             "raise", "return", "try", "while", "with", "yield")
# Endings of a token the text may have cut short, each tried before a line continuation
# where the text's end can take it: "=" of "==" / "!=" / ":=" (and of any augmented
# operator), ">" of "->" / ">>", "." of the Ellipsis "..." ("type(.." is a prefix of
# "type(...)"), "*" of "**" ("f(*a, *" of "f(*a, **k)"), "0" of a number ("1e", "0x",
# ".5e-", "."; the match may start inside a longer number or name, which costs a parse,
# never a verdict) or of a name that is a keyword so far ("in" of "int"), a closing quote.
_TOKEN_ENDS = (
    ("=", re.compile(r"[-!:=<>*/+%&|^@]\Z")),
    (">", re.compile(r"[->]\Z")),
    (".", re.compile(r"(?<!\.)\.\.\Z")),
    ("*", re.compile(r"(?<!\*)\*\Z")),
    ("0", re.compile(r"(?:\d[\w.]*(?:[eE][+-])?|\.|(?<!\w)(?:"
                     + "|".join([*keyword.kwlist, *keyword.softkwlist]) + r"))\Z")),
)
#: Words an unfinished word at the end may become: keywords and soft keywords ("cas" of a
#: match statement's "case").
_WORDS = (*_KEYWORDS, *(w for w in keyword.softkwlist if w.isalpha()))
_QUOTE_ENDS = ('"', "'", '}"', "}'")
_STRING_PREFIX = re.compile(r"[rRbBuUfF]|[rR][bBfF]|[bBfF][rR]")
#: The compiler's message for a ``nonlocal`` name no enclosing function binds (yet).
_NO_BINDING = re.compile(r"no binding for nonlocal '(\w+)' found")
_WORD_END = re.compile(r"[A-Za-z]+\Z")
_WORD_CHAR = re.compile(r"\w")



def _compiles(text: str, flags: int) -> str | None:
    """``None`` when ``text`` compiles (with ``flags``), else the parser's message."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<python>", "exec", flags, dont_inherit=True)
    except SyntaxError as err:
        return str(err.msg)
    except ValueError as err:  # null bytes
        return str(err)
    return None


def _prefix_ok(text: str) -> bool:
    """Whether ``text`` can be extended into a valid Python program (see the module doc).

    Outside brackets the parser takes the end of the input as the end of the statement, so
    ``x = 1 +`` is an error where ``x = (1 +`` is incomplete input. A backslash-newline
    continues the line: ``x = 1 +\\`` + newline is incomplete input too. Before it, the
    unfinished token at the end may need its last characters (a keyword's, an operator's,
    a number's digits, a string's closing quote).
    """
    # The continued text first: it accepts most valid prefixes, mid-line ones included, in
    # one parse; the plain text's parse is needed only when it fails. The verdict is the
    # same in any order: any successful try proves some continuation exists.
    if _valid_or_incomplete(_continued(text)):
        return True
    msg = _compiles(text, _FLAGS)
    if msg is None or msg == "incomplete input":
        return True
    if _NO_BINDING.fullmatch(msg):
        return _bound_later(text, msg)
    heads = []
    word = _WORD_END.search(text, max(0, len(text) - 9))  # keywords are 2-8 letters
    if word and not (word.start() and _WORD_CHAR.match(text, word.start() - 1)):
        w = word.group()  # an unfinished keyword: "el" of "else"
        heads += [text + kw[len(w):] for kw in _WORDS if kw.startswith(w) and kw != w]
        if _STRING_PREFIX.fullmatch(w):  # the prefix of a string: b of b'...'
            heads.append(text + '""')
    heads += [text + end for end, after in _TOKEN_ENDS if after.search(text[-64:])]
    unterminated = "unterminated" in msg or "f-string" in msg
    if unterminated:
        heads += [text + end for end in _QUOTE_ENDS]
    if any(_valid_or_incomplete(_continued(head)) for head in heads):
        return True
    return unterminated and _unfinished_string_ok(text)


def _bound_later(text: str, msg: str) -> bool:
    """Whether the names of ``nonlocal`` statements that nothing binds yet (the compiler's
    message ``msg`` names one) can be bound by what follows: a line that assigns them, at
    the indentation of one of the text's lines, leaves a text that compiles. The text ends
    at a statement's end here (the parser went on to the compiler's symbol table)."""
    indents = sorted({line[:len(line) - len(line.lstrip(" \t"))]
                      for line in text.split("\n")}, key=len, reverse=True)
    names: list[str] = []
    while len(names) < 8:
        found = _NO_BINDING.fullmatch(msg)
        if found is None or found.group(1) in names:
            return False
        names.append(found.group(1))
        for indent in indents:
            got = _compiles(f"{text}\n{indent}{' = '.join(names)} = None\n", _FLAGS)
            if got is None or got == "incomplete input":
                return True
            other = _NO_BINDING.fullmatch(got or "")
            if other is not None and other.group(1) not in names:
                msg = got  # another name to bind as well
                break
        else:
            return False
    return False


def _continued(text: str) -> str:
    """``text`` with its line continued: a backslash-newline, or a newline after a
    backslash at the end (outside a string it continues the line; inside one, where a
    repair closed the string after it, the closing quote follows it)."""
    return text + ("\n" if text.endswith("\\") else "\\\n")


def _valid_or_incomplete(text: str) -> bool:
    msg = _compiles(text, _FLAGS)
    return msg is None or msg == "incomplete input"


def _unfinished_string_ok(text: str) -> bool:
    """An unfinished one-line string at the end (an f-string's fields taken as they come):
    valid when the text with that string replaced by ``""`` is."""
    line_start = text.rfind("\n") + 1
    for m in re.finditer(r"[rRbBuUfF]{0,2}['\"]", text[line_start:]):
        start = line_start + m.start()
        found = SCAN.match(text, start)
        if found is not None and found.end() == len(text):
            head = text[:start] + '""'
            return _valid_or_incomplete(head) or _valid_or_incomplete(_continued(head))
    return False


def _ends_in_comment(code: str, start: int) -> bool:
    """Whether ``code`` ends inside a comment; ``start``: where a scan may begin (the
    tokens before it are settled)."""
    found = list(SCAN.finditer(code, start))
    return bool(found) and found[-1].end() == len(code) and found[-1].group().startswith("#")


def _top_level_done(code: str) -> bool:
    """Whether ``code`` ends with a line at column 0 that is a whole simple statement: the
    top-level statements before it are complete, and module-level code runs in order."""
    if not code.endswith("\n"):
        return False
    line = code[code.rfind("\n", 0, len(code) - 1) + 1:].rstrip()
    return (bool(line) and not line[0].isspace() and line[0] not in "#@"
            and line[-1] not in ":\\,([{")


def _is_program(text: str) -> bool:
    return _compiles(text, 0) is None


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
        if not _prefix_ok(prefix):
            raise ValueError(f"prefix is not the start of a valid Python program: "
                             f"{show(prefix[-60:])} ({_compiles(prefix, _FLAGS)})")
        self.prefix, self.names = prefix, bool(names)
        self.stop_bytes, self.stop = stop_bytes, tuple(s.decode() for s in stop_bytes)
        self._names = Names(prefix, modules) if names else None
        super().__init__(self._text_ok, self._program_ok, timeout=timeout,
                         max_timeouts=max_timeouts)

    def _valid(self, text: str) -> bool:
        """The syntax and name checks of ``prefix + text`` as a prefix."""
        code = self.prefix + text
        if not _prefix_ok(code):
            return False
        n = self._names
        if n is None:
            return True
        if not n.chains_ok(code, final=False):
            return False
        if _top_level_done(code) and _is_program(code):
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
        if not _is_program(code):
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
            text = _decode(state)
            found = text is not None and _ends_in_comment(self.p.prefix + text[0],
                                                           self._scan_from)
            self._in_comment.put(state, found)
        return found and _decode(data) is not None

    def final_text(self, data: bytes) -> bytes:
        """``data`` cut before its first stop string."""
        return self._stops.final_text(data)


__all__ = ["HUMANEVAL_STOP", "Python", "PythonMatcher", "python"]
