"""The matcher contract (adaptrack.testing.assert_contract): every built-in constraint keeps
it, and constraints that break a rule are caught with that rule's name."""

from __future__ import annotations

import re

import numpy as np
import pytest

import adaptrack as at
from adaptrack import constraints as C
from adaptrack.testing import assert_contract

TOKENS = [b"a", b"b", b"ab", b"ba", b"1", b"12", b"{", b"}", b'"', b'{"', b'":', b":", b" ",
          b"(", b"a(", b"x", b"<eos>"]
VOCAB = at.Vocabulary(TOKENS, eos_ids=[len(TOKENS) - 1])
SCHEMA = {"type": "object", "properties": {"ab": {"type": "integer"}}, "required": ["ab"],
          "additionalProperties": False}

BUILT_IN = {
    "choice": lambda: C.choice(["ab", "aab", "ba12"]),
    "choice_terminators": lambda: C.choice(["a", "ab"], terminators="("),
    "api_names": lambda: C.api_names(["a", "ab.ba"], prefix=""),
    "regex": lambda: C.regex(r"(ab|ba)+1?2*"),
    "json_schema": lambda: C.json_schema(SCHEMA),
    "lark": lambda: C.lark('start: "{" ITEM ("," ITEM)* "}"\nITEM: /[ab]+/'),
    "gbnf": lambda: C.gbnf('root ::= "a" [b1]*'),
    "predicate": lambda: C.predicate(lambda t: "bb" not in t, lambda t: t.endswith("1")),
    "all_of": lambda: C.all_of(C.regex("[ab1]+"), C.predicate(lambda t: True,
                                                              lambda t: len(t) > 2)),
    "anything": lambda: C.anything(),
    "anything_stop": lambda: C.anything(stop=["ab1", "}"]),
}


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_built_in_constraints_keep_the_contract(name):
    assert_contract(BUILT_IN[name](), VOCAB, walks=6, seed=1)


def test_a_large_vocabulary_is_sampled():
    big = at.Vocabulary([bytes([97 + i % 3]) * (1 + i // 3) for i in range(3000)] + [None],
                        eos_ids=[3000])
    assert_contract(C.regex("[ab]{2,40}c?"), big, walks=2, steps=6, sample=64)


class Broken(C.Constraint):
    """``choice(["ab", "ba"])`` with one method replaced by ``how(matcher)``."""

    def __init__(self, **how):
        self.how = how

    def bind(self, vocab):
        m = C.choice(["ab", "ba"]).bind(vocab)
        for name, make in self.how.items():
            setattr(m, name, make(m))
        return m


@pytest.mark.parametrize(("how", "rule"), [
    ({"allowed": lambda m: lambda s: type(m).allowed(m, s)[::-1].copy()},
     "allowed is sorted unique int ids"),
    ({"allowed": lambda m: lambda s: np.array([0.0, 1.0])}, "allowed is sorted unique int ids"),
    ({"finishing": lambda m: lambda s: np.array([15])}, "finishing is a subset of allowed"),
    ({"advance": lambda m: lambda s, t: 0 if t == 15 else type(m).advance(m, s, t)},
     "advance is not None exactly on allowed"),
    ({"advance": lambda m: lambda s, t: None if t == 2 else type(m).advance(m, s, t)},
     "advance is not None exactly on allowed"),
    ({"advance": lambda m: lambda s, t: 99 if type(m).advance(m, s, t) is C.DONE
      else type(m).advance(m, s, t)},
     "advance of a finishing token is complete"),
    ({"forced_bytes": lambda m: lambda s, limit=None: b"b"[:limit]},
     "forced_bytes is a prefix of every valid continuation"),
    ({"forced_bytes": lambda m: lambda s, limit=None: b""
      if limit is None else b"a"[:limit]},
     "forced_bytes(limit=k) is the first k forced bytes"),
    ({"closing": lambda m: lambda s: type(m).finishing(m, s)},
     "closing lists every token after which one finishes"),
    ({"closing": lambda m: lambda s: np.array([15])}, "closing lies between finishing and allowed"),
    ({"min_new_tokens": lambda m: lambda: 0}, "min_new_tokens is an int >= 1"),
    ({"min_new_tokens": lambda m: lambda: 9}, "no complete sequence is shorter than"),
])
def test_broken_constraints_fail_with_the_rule_they_break(how, rule):
    with pytest.raises(AssertionError, match="matcher contract, rule '" + re.escape(rule)):
        assert_contract(Broken(**how), VOCAB, walks=4, seed=0)


def test_a_lazy_matcher_may_list_candidates_that_advance_rejects():
    # A predicate's allowed is every token; advance decides. Eager rules would fail.
    assert_contract(C.predicate(lambda t: t in ("", "a"), lambda t: t == "a"), VOCAB)


SURROGATE = "\ud800"  # a lone surrogate: a str that UTF-8 cannot encode

BAD_ARGUMENTS = {
    "choice_surrogate": (lambda: C.choice(["ok", "a" + SURROGATE]), ValueError,
                         r"choice takes text encodable as UTF-8, got 'a\\ud800' \(a lone "
                         r"surrogate at index 1\)"),
    "choice_bytes_of_int": (lambda: C.choice(["a", 3]), TypeError,  # type: ignore[list-item]
                            r"choice takes strings \(str or bytes\), got 3 \(int\)"),
    "terminators_int": (lambda: C.choice(["a"], terminators=5), TypeError,  # type: ignore
                        r"terminators takes a string, bytes, a list of them or None, got 5 "
                        r"\(int\)"),
    "terminators_surrogate": (lambda: C.choice(["a"], terminators=SURROGATE), ValueError,
                              r"terminators takes text encodable as UTF-8, got '\\ud800'"),
    "terminators_list_of_ints": (lambda: C.anything(terminators=[40]), TypeError,  # type: ignore
                                 r"terminators takes strings or bytes, got 40 \(int\)"),
    "stop_string": (lambda: C.anything(stop="ab"), TypeError,
                    r"stop takes a list of non-empty strings, got 'ab'"),
    "stop_empty": (lambda: C.anything(stop=["a", ""]), TypeError,
                   r"stop takes a list of non-empty strings"),
    "stop_none": (lambda: C.anything(stop=None), TypeError,  # type: ignore[arg-type]
                  r"stop takes a list of non-empty strings, got None"),
    "stop_surrogate": (lambda: C.anything(stop=[SURROGATE]), ValueError,
                       r"stop takes text encodable as UTF-8"),
    "all_of_stop": (lambda: C.all_of(C.anything(stop=["b"]), C.regex("[ab]*")), ValueError,
                    r"all_of cannot combine a constraint with stop strings"),
    "terminators_predicate": (lambda: C.predicate(bool, bool, terminators=1.5),  # type: ignore
                              TypeError, r"terminators takes .*got 1.5 \(float\)"),
    "api_names_none": (lambda: C.api_names(None), TypeError,  # type: ignore[arg-type]
                       r"api_names takes a list of names \(strings\), got None \(NoneType\)"),
    "api_names_prefix_none": (lambda: C.api_names(["a"], prefix=None),  # type: ignore
                              TypeError, r"prefix takes a string .*got None \(NoneType\)"),
    "api_names_prefix_surrogate": (lambda: C.api_names(["a"], prefix=SURROGATE), ValueError,
                                   r"prefix takes text encodable as UTF-8, got '\\ud800'"),
    "api_names_terminators": (lambda: C.api_names(["a"], terminators=5),  # type: ignore
                              TypeError, r"terminators takes .*got 5 \(int\)"),
    "from_module_relative": (lambda: C.from_module("."), ValueError,
                             r"from_module takes an absolute module name .*got '\.'"),
    "from_module_relative_dotted": (lambda: C.from_module(".json"), ValueError,
                                    r"absolute module name .*got '\.json'"),
    "from_module_empty": (lambda: C.from_module(""), ValueError,
                          r"absolute module name .*got ''"),
    "from_module_not_a_name": (lambda: C.from_module(3), TypeError,  # type: ignore[arg-type]
                               r"from_module takes a module or a module name, got 3 \(int\)"),
    "from_module_max_depth": (lambda: C.from_module("json", max_depth="1"),  # type: ignore
                              TypeError, r"max_depth takes an int >= 0, got '1' \(str\)"),
    "from_module_time_limit": (lambda: C.from_module("json", time_limit=float("nan")),
                               ValueError, r"time_limit takes seconds > 0 .*got nan"),
    "from_module_prefix": (lambda: C.from_module("json", prefix=1),  # type: ignore[arg-type]
                           TypeError, r"prefix takes a string .*got 1 \(int\)"),
}


@pytest.mark.parametrize("name", sorted(BAD_ARGUMENTS))
def test_bad_constraint_arguments_name_the_argument(name):
    """errors.py: a bad argument is a TypeError/ValueError raised on purpose, one line, naming
    the argument and what it got (never an accidental UnicodeEncodeError or a TypeError from
    inside Python, which the fuzz in test_fuzz.py found)."""
    build, error, message = BAD_ARGUMENTS[name]
    with pytest.raises(error, match=message) as caught:
        build()
    assert "\n" not in str(caught.value)
    assert type(caught.value) is error  # not a UnicodeEncodeError (a ValueError subclass)


def test_terminators_take_strings_bytes_and_lists_of_both():
    assert C.choice(["a"], terminators=["(", b")", bytearray(b" ")]).terminators == b" ()"
    assert C.choice(["a"], terminators=bytearray(b"((")).terminators == b"("
    assert C.anything(terminators="").terminators == b""
