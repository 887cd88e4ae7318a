"""transformers-CFG's EBNF, read into a Lark grammar llguidance runs (a :class:`Grammar`).

The dialect (Geng et al.'s transformers-CFG, which the ASAp and AdapTrack papers' DSL
benchmarks are written in): ``name ::= rhs`` rules, alternatives ``|``, concatenation,
quoted literals (``"..."`` with ``\\"``, ``\\\\``, ``\\n``, ``\\t``, ``\\r``, ``\\xHH``,
``\\uHHHH`` escapes), character classes ``[...]``, groups ``( )``, ``*``, ``+``, ``?`` and
``#`` comments; names are case-sensitive. A rule ends where the next ``name ::=`` begins.

Two things differ from reading the text as llguidance's GBNF (docs/design.md §5):

- every nonterminal becomes a Lark *rule* with a fresh lower-case name, so names that
  differ only in case (``Start`` beside ``root``, which the GBNF reader renames ``start``)
  never clash, and upper-case names never turn into Lark terminals (which cannot recurse);
- a nonterminal that no rule defines is a dead branch, as in transformers-CFG's parser:
  alternatives that need one are deleted, to a fixpoint (a rule left with none is itself
  dead). The language is unchanged; a start symbol left dead is a :class:`GrammarError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import GrammarError
from .grammar.sources import Grammar, check_source, source_text

KIND = "transformers-CFG EBNF"

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<define>::=)
  | (?P<name>[A-Za-z_][A-Za-z0-9_.-]*)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<cls>\[(?:[^\]\\]|\\.)*\])
  | (?P<op>[|()*+?])
""", re.VERBOSE | re.DOTALL)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "]": "]", "[": "[",
            "-": "-", "^": "^", "0": "\0"}


@dataclass(frozen=True)
class _Sym:
    """A nonterminal reference."""
    name: str


@dataclass(frozen=True)
class _Lit:
    """A terminal: a literal string, or a character class in Lark regex syntax."""
    lark: str


@dataclass(frozen=True)
class _Rep:
    """``item`` with ``*``, ``+`` or ``?``."""
    item: _Expr
    op: str


# A tuple is a group: its alternatives, each a tuple of items.
_Expr = _Sym | _Lit | _Rep | tuple[Any, ...]
#: A rule's alternatives, each a sequence of items.
_Alts = tuple[tuple[_Expr, ...], ...]


def _unescape(body: str, line: int) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1:i + 2]
        if nxt in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = body[i + 2:i + 2 + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise GrammarError(f"invalid {KIND}: line {line}: bad escape "
                                   f"{body[i:i + 2 + width]!r}")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            raise GrammarError(f"invalid {KIND}: line {line}: unknown escape \\{nxt}")
    return "".join(out)


def _class(text: str, line: int) -> str:
    """A ``[...]`` class as a Lark regex: its characters unescaped, then escaped for Rust."""
    body, negate = text[1:-1], False
    if body.startswith("^"):
        body, negate = body[1:], True
    chars, i = [], 0
    while i < len(body):  # split into characters and ranges, unescaping
        if body[i] == "\\":
            end = i + 2
            if body[i + 1:i + 2] in ("x", "u", "U"):
                end += {"x": 2, "u": 4, "U": 8}[body[i + 1]]
            chars.append(_unescape(body[i:end], line))
            i = end
        elif body[i] == "-" and chars and i + 1 < len(body):
            chars.append("-range")
            i += 1
        else:
            chars.append(body[i])
            i += 1
    parts = []
    for c in chars:
        if c == "-range":
            parts.append("-")
        else:
            parts.append("".join(f"\\u{{{ord(ch):x}}}" if not ch.isalnum() else ch for ch in c))
    if not parts:
        raise GrammarError(f"invalid {KIND}: line {line}: empty character class {text}")
    return "/[" + ("^" if negate else "") + "".join(parts) + "]/"


def _lex(text: str) -> list[tuple[str, str, int]]:
    """The tokens of ``text`` (kind, text, line), spaces and comments left out."""
    tokens: list[tuple[str, str, int]] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise GrammarError(f"invalid {KIND}: line {line}: unexpected "
                               f"{text[pos:pos + 20]!r}")
        kind = m.lastgroup or ""
        if kind != "space":
            tokens.append((kind, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    return tokens


def _parse(text: str) -> tuple[dict[str, _Alts], list[str]]:
    """The rules (name → alternatives, each a tuple of items) in order of definition."""
    tokens = _lex(text)
    rules: dict[str, _Alts] = {}
    order: list[str] = []
    i = 0

    def alternatives(stop: str | None) -> _Alts:
        nonlocal i
        alts: list[tuple[_Expr, ...]] = []
        seq: list[_Expr] = []
        while i < len(tokens):
            kind, value, at = tokens[i]
            if kind == "name" and i + 1 < len(tokens) and tokens[i + 1][0] == "define":
                break  # the next rule
            i += 1
            if kind == "op" and value == "|":
                alts.append(tuple(seq))
                seq = []
            elif kind == "op" and value == ")":
                if stop != ")":
                    raise GrammarError(f"invalid {KIND}: line {at}: unbalanced ')'")
                alts.append(tuple(seq))
                return tuple(alts)
            elif kind == "op" and value == "(":
                seq.append(alternatives(")"))
            elif kind == "op":  # * + ?
                if not seq:
                    raise GrammarError(f"invalid {KIND}: line {at}: {value!r} follows nothing")
                seq[-1] = _Rep(seq[-1], value)
            elif kind == "name":
                seq.append(_Sym(value))
            elif kind == "string":
                seq.append(_Lit(json.dumps(_unescape(value[1:-1], at), ensure_ascii=False)))
            elif kind == "cls":
                seq.append(_Lit(_class(value, at)))
            else:
                raise GrammarError(f"invalid {KIND}: line {at}: unexpected {value!r}")
        if stop == ")":
            raise GrammarError(f"invalid {KIND}: unbalanced '(' (the text ends inside it)")
        alts.append(tuple(seq))
        return tuple(alts)

    while i < len(tokens):
        kind, value, at = tokens[i]
        if not (kind == "name" and i + 1 < len(tokens) and tokens[i + 1][0] == "define"):
            raise GrammarError(f"invalid {KIND}: line {at}: expected 'name ::=', got {value!r}")
        i += 2
        if value in rules:
            raise GrammarError(f"invalid {KIND}: line {at}: rule {value!r} defined twice")
        rules[value] = alternatives(None)
        order.append(value)
    return rules, order


def _prune(rules: dict[str, _Alts]) -> dict[str, _Alts]:
    """The rules with every alternative that needs an undefined (dead) nonterminal deleted,
    to a fixpoint; rules left without alternatives are dropped."""

    def live(item: _Expr, alive: dict[str, _Alts]) -> _Expr | None:
        if isinstance(item, _Sym):
            return item if item.name in alive else None
        if isinstance(item, _Lit):
            return item
        if isinstance(item, _Rep):
            inner = live(item.item, alive)
            if inner is None:  # zero repetitions remain
                return None if item.op == "+" else ()
            return _Rep(inner, item.op)
        kept = tuple(a for a in (seq(alt, alive) for alt in item) if a is not None)
        return kept or None

    def seq(alt: tuple[_Expr, ...], alive: dict[str, _Alts]) -> tuple[_Expr, ...] | None:
        out = []
        for item in alt:
            found = live(item, alive)
            if found is None:
                return None
            if found != ():
                out.append(found)
        return tuple(out)

    while True:
        pruned = {}
        for name, alts in rules.items():
            kept = tuple(a for a in (seq(alt, rules) for alt in alts) if a is not None)
            if kept:
                pruned[name] = kept
        if pruned == rules:
            return pruned
        rules = pruned


def _lark(rules: dict[str, _Alts], order: list[str], start: str) -> str:
    names: dict[str, str] = {}
    for k, name in enumerate(order):
        if name in rules:
            clean = re.sub(r"[^a-z0-9_]", "_", name.lower())
            names[name] = f"r{k}_{clean}"

    def expr(item: _Expr) -> str:
        if isinstance(item, _Sym):
            return names[item.name]
        if isinstance(item, _Lit):
            return item.lark
        if isinstance(item, _Rep):
            return expr(item.item) + item.op
        return "(" + " | ".join(alt(a) for a in item) + ")"

    def alt(items: tuple[_Expr, ...]) -> str:
        return " ".join(expr(x) for x in items) if items else '""'

    lines = [f"start: {names[start]}"]
    for name in order:
        if name in rules:
            body = "\n    | ".join(alt(a) for a in rules[name])
            lines.append(f"{names[name]}: {body}")
    return "\n".join(lines) + "\n"


def ebnf_to_lark(text: str, start: str = "root") -> str:
    """The Lark grammar (llguidance's dialect) of a transformers-CFG EBNF grammar; see the
    module doc. Rules are renamed ``r<k>_<name>`` (``k``: the rule's place in the text).

    >>> print(ebnf_to_lark('root ::= "(" Start ")"\\nStart ::= "a" | Gone "b" | "(" Start ")"'))
    start: r0_root
    r0_root: "(" r1_start ")"
    r1_start: "a"
        | "(" r1_start ")"
    <BLANKLINE>
    """
    source_text(KIND, text)
    if not isinstance(start, str):
        raise TypeError(f"start must be a str, got {type(start).__name__}")
    rules, order = _parse(text)
    if start not in rules:
        raise GrammarError(f"invalid {KIND}: no rule defines the start symbol {start!r}")
    rules = _prune(rules)
    if start not in rules:
        raise GrammarError(f"invalid {KIND}: the start symbol {start!r} derives nothing "
                           "(every alternative needs a nonterminal no rule defines)")
    return _lark(rules, order, start)


def ebnf(text: str, start: str = "root") -> Grammar:
    """The text must be derived from ``start`` in ``text``, a grammar in transformers-CFG's
    EBNF (the dialect of the ASAp/AdapTrack DSL benchmarks; see the module doc): read into
    Lark by :func:`ebnf_to_lark`, run by llguidance. Nonterminals no rule defines are dead
    branches.

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b"0", b"1", b"<eos>"], lambda p: [1] * 3, eos=2)
    >>> g = ebnf('root ::= Start\\nStart ::= "00" | "1" Start | "1" Undefined')
    >>> m = g.bind(lm.vocab)
    >>> m.accepts([1, 0, 0, 2]), m.accepts([1, 2])
    (True, False)
    """
    converted = ebnf_to_lark(text, start)
    check_source(KIND, converted)
    return Grammar(KIND, converted)
