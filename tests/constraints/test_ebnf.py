"""transformers-CFG EBNF (constraints/ebnf.py, docs/design.md §5): the dialect's features on a
byte vocabulary, and the DSL benchmarks' grammars against their reference solutions (the data
README of ../shared/data/dsl says which lie inside their grammar)."""

from __future__ import annotations

import json

import pytest
from paths import SHARED

pytest.importorskip("llguidance", reason="grammar constraints run on llguidance")

from adaptrack.constraints import ebnf
from adaptrack.constraints.ebnf import ebnf_to_lark
from adaptrack.errors import GrammarError
from adaptrack.tokenization.vocab import Vocabulary

DSL_DIR = SHARED / "data" / "dsl"
BYTES = Vocabulary([bytes([b]) for b in range(256)] + [b"<eos>"], eos_ids=[256])


def accepts(grammar: str, text: str) -> bool:
    m = ebnf(grammar).bind(BYTES)
    return m.accepts([*text.encode(), 256])


def test_dialect_features() -> None:
    g = ('# a comment\nroot ::= Start ( "," Start )* "!"?\n'
         'Start ::= [a-c]+ | "\\"q\\"" | "\\x41" | "(" Start ")"')
    for text in ("a", "abc,b", '"q"!', "A", "((c)),a!"):
        assert accepts(g, text), text
    for text in ("", "d", "a,", "q", "(a", "a!!", "start"):
        assert not accepts(g, text), text


def test_empty_alternatives_negated_classes_and_unicode() -> None:
    assert accepts('root ::= ( "x" | ) "y"', "y") and accepts('root ::= ( "x" | ) "y"', "xy")
    assert accepts('root ::= [^"/] [/]', "a/") and not accepts('root ::= [^"/] [/]', '"/')
    assert accepts('root ::= "é\\u00e9" ""', "éé")


def test_names_differing_in_case_do_not_clash() -> None:
    # llguidance's GBNF reader renames root to start and then clashes with Start; upper-case
    # names also become Lark terminals there, which cannot recurse.
    g = 'root ::= "<" Start ">"\nStart ::= "s" | START\nSTART ::= "S" | "(" Start ")"'
    assert accepts(g, "<(s)>") and accepts(g, "<((S))>") and not accepts(g, "<start>")


def test_undefined_nonterminals_are_dead_branches() -> None:
    g = 'root ::= A | "x" Gone\nA ::= "a" B | "b"\nB ::= Missing "c" | Also'
    assert accepts(g, "b")
    assert not accepts(g, "a") and not accepts(g, "x") and not accepts(g, "ac")
    assert "Missing" not in ebnf_to_lark(g) and "r2_b" not in ebnf_to_lark(g)
    # Zero repetitions of a dead item remain; one or more do not.
    assert accepts('root ::= "a" Gone* "b"', "ab")
    assert not accepts('root ::= "a" Gone+ "b" | "c"', "ab")


@pytest.mark.parametrize("text, message", [
    ('Start ::= "a"', "no rule defines the start symbol 'root'"),
    ('root ::= Gone', "derives nothing"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"),
    ('root ::= ("a"', r"unbalanced '\('"),
    ('root ::= "a\\q"', "unknown escape"),
    ('"a" ::= "b"', "expected 'name ::='"),
])
def test_bad_grammars_say_why(text: str, message: str) -> None:
    with pytest.raises(GrammarError, match=message):
        ebnf(text)


def _records(name: str) -> list[dict]:
    path = DSL_DIR / f"{name}.jsonl"
    if not path.exists():
        pytest.skip(f"the shared DSL data ({path}) is not in this checkout")
    return [json.loads(line) for line in path.read_text().splitlines()]


# The stored solutions the data README lists as outside their own grammar.
OUTSIDE = {"phone-3-long", "find_inv_bvsge_bvlshr1_4bit", "find_inv_bvsge_bvnot_4bit",
           "find_inv_bvsgt_bvor_4bit", "find_inv_bvugt_bvashr0_4bit",
           "find_inv_ne_bvudiv1_4bit", "CP_re_ptb_460", "CP_re_ptb_605"}


@pytest.mark.parametrize("dataset", ["slia", "invbv", "cp"])
def test_reference_solutions(dataset: str) -> None:
    records = _records(dataset)
    inside = 0
    for r in records:
        m = ebnf(r["grammar"], start=r["start_symbol"]).bind(BYTES)
        ref = r["reference_solution"]
        text = f"[ {ref} ]" if dataset == "cp" else ref
        ok = m.accepts([*text.encode(), 256])
        assert ok == (r["id"] not in OUTSIDE), r["id"]
        inside += ok
        # Near misses: cut short, one byte more, the wrapper's spacing changed.
        for near in (text[:-1], text + ")", text.replace(" ", "  ", 1)):
            assert not m.accepts([*near.encode(), 256]), (r["id"], near)
    assert inside == len(records) - len({r["id"] for r in records} & OUTSIDE) > 0


def test_binary_grammar_is_the_seventeen_strings() -> None:
    (r,) = _records("binary")
    m = ebnf(r["grammar"]).bind(BYTES)
    valid = {f"{i:05b}" for i in range(32) if i == 0 or i >= 16}
    for i in range(32):
        assert m.accepts([*f"{i:05b}".encode(), 256]) == (f"{i:05b}" in valid)
    assert not m.accepts([*b"1000", 256]) and not m.accepts([*b"100000", 256])
