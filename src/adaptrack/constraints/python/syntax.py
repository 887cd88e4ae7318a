"""Python syntax by CPython's own parser: whether a text is a valid prefix of a program
(:func:`prefix_ok`, see :mod:`adaptrack.constraints.python`), whether it is a whole one,
and where comments, strings and name chains lie (:data:`SCAN`)."""

from __future__ import annotations

import keyword
import re
import warnings

INCOMPLETE_FLAGS = 0x4000 | 0x200  # PyCF_ALLOW_INCOMPLETE_INPUT | PyCF_DONT_IMPLY_DEDENT, as codeop
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

# Strings and comments (skipped), numbers (skipped), and dotted name chains at code level.
SCAN = re.compile(
    r"""(?P<skip>\#[^\n]*
        |[rRbBuUfF]{0,2}(?:'''(?:\\.|[^\\])*?(?:'''|\Z)|\"\"\"(?:\\.|[^\\])*?(?:\"\"\"|\Z)
                          |'(?:\\.|[^\\'\n])*(?:'|$)|"(?:\\.|[^\\"\n])*(?:"|$))
        |\d\w*)
      |(?<![\w.])(?P<chain>[^\W\d]\w*(?:[ \t]*\.[ \t]*[^\W\d]\w*)*(?:[ \t]*\.)?)""",
    re.VERBOSE | re.DOTALL | re.MULTILINE)


def compiles(text: str, flags: int) -> str | None:
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


def prefix_ok(text: str) -> bool:
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
    msg = compiles(text, INCOMPLETE_FLAGS)
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
            got = compiles(f"{text}\n{indent}{' = '.join(names)} = None\n", INCOMPLETE_FLAGS)
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
    msg = compiles(text, INCOMPLETE_FLAGS)
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


def open_end(prefix: str) -> int:
    """Where the prefix's last token starts when the generated text may continue it (a
    string, comment, number or name chain reaching the end), else ``len(prefix)``."""
    end = len(prefix)
    for m in SCAN.finditer(prefix):
        if m.end() == end:
            return m.start()
    return end


def ends_in_comment(code: str, start: int) -> bool:
    """Whether ``code`` ends inside a comment; ``start``: where a scan may begin (the
    tokens before it are settled)."""
    found = list(SCAN.finditer(code, start))
    return bool(found) and found[-1].end() == len(code) and found[-1].group().startswith("#")


def top_level_done(code: str) -> bool:
    """Whether ``code`` ends with a line at column 0 that is a whole simple statement: the
    top-level statements before it are complete, and module-level code runs in order."""
    if not code.endswith("\n"):
        return False
    line = code[code.rfind("\n", 0, len(code) - 1) + 1:].rstrip()
    return (bool(line) and not line[0].isspace() and line[0] not in "#@"
            and line[-1] not in ":\\,([{")


def is_program(text: str) -> bool:
    return compiles(text, 0) is None
