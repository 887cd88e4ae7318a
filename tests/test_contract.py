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
    ({"min_new_tokens": lambda m: lambda: 0}, "min_new_tokens is an int >= 1"),
    ({"min_new_tokens": lambda m: lambda: 9}, "no complete sequence is shorter than"),
])
def test_broken_constraints_fail_with_the_rule_they_break(how, rule):
    with pytest.raises(AssertionError, match="matcher contract, rule '" + re.escape(rule)):
        assert_contract(Broken(**how), VOCAB, walks=4, seed=0)


def test_a_lazy_matcher_may_list_candidates_that_advance_rejects():
    # A predicate's allowed is every token; advance decides. Eager rules would fail.
    assert_contract(C.predicate(lambda t: t in ("", "a"), lambda t: t == "a"), VOCAB)
