"""Regex bounds: the fewest bytes, and so tokens, any full match of a regex needs.

Python's own regex parser reads the pattern where it reads it as the Rust ``regex`` crate
does (llguidance's syntax); anything else gets no bound, which is always sound.
"""

from __future__ import annotations

import math
import re
import re._constants as _sre
import re._parser as _sre_parse
import warnings
from typing import Any

from .tokenizer import _LLVocab

#: ``min_new_tokens`` of a language no token sequence reaches (larger than any budget).
_UNREACHABLE = 1 << 62

# Rust regex syntax that Python's parser reads differently (nested classes and set
# operations, POSIX classes, some flags, spaces in counted repetitions); a pattern holding
# any of these gets no bound.
_RUST_ONLY = re.compile(r"\[\[|\[:|&&|--|~~|\(\?[a-zA-Z]*[xuRU]|\{[\d\s,]*\s[\d\s,]*\}")


def _nested_class(pattern: str) -> bool:
    """Whether a ``[`` occurs inside a character class (a nested class in Rust, a literal
    in Python)."""
    depth, i = 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            if depth:
                return True
            depth = 1
            i += 1
            if pattern[i:i + 1] == "^":
                i += 1
            if pattern[i:i + 1] == "]":  # a leading "]" is a literal
                i += 1
            continue
        if c == "]":
            depth = 0
        i += 1
    return False


class _Width:
    """The walk of :func:`regex_min_bytes` over a parsed pattern: the fewest bytes of a
    match, and the bytes a match can hold (``alphabet``; None: any)."""

    def __init__(self, ignore_case: bool) -> None:
        self.ignore_case = ignore_case
        self.alphabet: set[int] | None = set()

    def char(self, c: int) -> None:
        if self.alphabet is None:
            return
        if c >= 0x80 or self.ignore_case:  # other encodings and case folds: any byte
            self.alphabet = None
        else:
            self.alphabet.add(c)

    def char_class(self, items: Any) -> None:
        for op, av in items:
            if op is _sre.LITERAL:
                self.char(av)
            elif op is _sre.RANGE and av[1] < 0x80 and not self.ignore_case:
                if self.alphabet is not None:
                    self.alphabet.update(range(av[0], av[1] + 1))
            else:  # NEGATE, CATEGORY, non-ASCII ranges
                self.alphabet = None

    def width(self, items: Any) -> int | None:
        """The fewest bytes of a match of ``items`` (a parsed sequence), None if unknown."""
        total = 0
        for op, av in items:
            found = self.item(op, av)
            if found is None:
                return None
            total += found
        return total

    def item(self, op: Any, av: Any) -> int | None:
        """The fewest bytes of one parsed item, None if unknown."""
        if op is _sre.LITERAL:
            self.char(av)
            return 1 if self.ignore_case else len(chr(av).encode("utf-8", "surrogatepass"))
        if op is _sre.IN:
            self.char_class(av)
            return 1
        if op in (_sre.ANY, _sre.NOT_LITERAL):
            self.alphabet = None
            return 1
        if op is _sre.BRANCH:
            widths = [self.width(b) for b in av[1]]
            known = [w for w in widths if w is not None]
            return min(known) if len(known) == len(widths) else None
        if op is _sre.SUBPATTERN:
            return self.width(av[-1])
        if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
            inner = self.width(av[2])
            return None if inner is None else av[0] * inner
        return None  # anchors, lookarounds, backreferences, …: not in the Rust syntax


def regex_min_bytes(pattern: str) -> tuple[int, frozenset[int] | None] | None:
    """The fewest bytes a full match of ``pattern`` has, and the bytes a match can hold
    (None: any), where Python's parser reads the pattern as the Rust ``regex`` crate does;
    None where it cannot tell (then no bound is sound).

    >>> width, alphabet = regex_min_bytes("[ab]{3}x?")
    >>> width, bytes(sorted(alphabet))
    (3, b'abx')
    >>> regex_min_bytes(r"é+|\\d"), regex_min_bytes("[[:alpha:]]")
    ((1, None), None)
    """
    if _RUST_ONLY.search(pattern) or _nested_class(pattern):
        return None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parsed = _sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None
    if caught:  # "possible nested set", "possible set difference": Rust reads it otherwise
        return None
    walk = _Width(bool(parsed.state.flags & re.IGNORECASE) or "(?" in pattern)
    found = walk.width(parsed)
    if found is None:
        return None
    return found, None if walk.alphabet is None else frozenset(walk.alphabet)


def regex_min_tokens(pattern: str, ll: _LLVocab) -> int:
    """A lower bound on the tokens (EOS included) of any complete sequence matching
    ``pattern`` over the vocabulary ``ll``: its shortest match in bytes over the longest
    token made only of bytes the pattern can match, plus EOS; 1 where unknown, and
    :data:`_UNREACHABLE` where no token is made of those bytes.

    >>> from adaptrack.tokenization.vocab import Vocabulary
    >>> from .tokenizer import ll_vocab
    >>> regex_min_tokens("[ab]{10}", ll_vocab(Vocabulary([b"ab", b"xxxx", b"<e>"],
    ...                                                  eos_ids=[2])))
    6
    """
    found = regex_min_bytes(pattern)
    if found is None or found[0] <= 0:
        return 1
    width, alphabet = found
    longest = ll.longest if alphabet is None else ll.longest_over(alphabet)
    if longest == 0:
        return _UNREACHABLE
    return min(_UNREACHABLE, math.ceil(width / longest) + 1)
