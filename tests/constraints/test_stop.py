"""Stop strings through the one implementation of the constraints layer
(``adaptrack.constraints.stop``, ``with_stop``): the matcher contract, the target the
searches then sample, and one rule for where the text is cut, the same in the Python API,
the server and the code tasks' completions."""

from __future__ import annotations

import pytest
from stats import chi_square_p
from stops import STOP_PROMPT, STOP_REGEX, TRICKY_STOPS, stop_targets, stop_toy, tricky_lm

import adaptrack as at
from adaptrack.constraints import Stopped, with_stop
from adaptrack.constraints.stop import cut_text, first_stop
from adaptrack.eval.codetask import cut_at_stop
from adaptrack.testing import assert_contract
from adaptrack.tokenization.vocab import Vocabulary


def test_the_rule_cuts_at_the_earliest_starting_stop_string():
    assert first_stop("xabcde", TRICKY_STOPS) == 1 and cut_text("xabcde", TRICKY_STOPS) == "x"
    assert first_stop(b"xabcde", [b"bc", b"abcd"]) == 1
    assert first_stop("xabcde", ["abcd"], since=5) == -1  # it ended before byte 5
    assert cut_text("no stop", ["x"]) == "no stop"


@pytest.mark.parametrize("inner", [
    at.constraints.regex("(ab|b)+c?"),
    at.constraints.choice(["ab", "abcb", "cc"]),
    at.constraints.choice(["a", "bb", "ab"], terminators="("),
])
def test_a_stopped_constraint_keeps_the_matcher_contract(inner):
    vocab = Vocabulary([b"a", b"b", b"c", b"ab", b"bc", b"cb(", b"(", b"<eos>"], eos_ids=[7])
    c = with_stop(inner, ["bc", "b("])
    assert isinstance(c, Stopped) and c.stop == ("bc", "b(")
    assert_contract(c, vocab, walks=16)


def test_with_stop_without_a_constraint_is_anything_and_refuses_bad_stops():
    assert with_stop(None, []) is None
    c = with_stop(at.constraints.anything(stop=["x"]), ["y", "x"])
    assert isinstance(c, at.constraints.Anything) and c.stop == ("x", "y")
    with pytest.raises(TypeError, match="stop takes a list of non-empty strings"):
        with_stop(at.constraints.regex("a"), [""])
    with pytest.raises(ValueError, match="all_of cannot combine"):
        at.constraints.all_of(with_stop(at.constraints.regex("a+"), ["b"]))


def test_a_search_targets_the_stop_string():
    """Under with_stop exact samples the target that ends at the stop string (enumerated),
    not the constraint's target cut after sampling."""
    lm = stop_toy()
    new, old = stop_targets(lm)
    res = at.generate(lm, STOP_PROMPT, with_stop(at.constraints.regex(STOP_REGEX), ["b"]),
                      method="exact", n=300, seed=1, max_new_tokens=8, end="eos")
    assert all(s.complete and "b" not in s.text for s in res.samples)
    texts = {t: res.texts.count(t) for t in set(res.texts)}
    assert chi_square_p(texts, new) > 1e-3
    assert chi_square_p(texts, old) < 1e-6


@pytest.mark.filterwarnings("ignore:method='exact' with no constraint")
@pytest.mark.parametrize(("method", "inner"), [
    ("unconstrained", None), ("unconstrained", "regex"), ("cd", "regex"), ("exact", "regex"),
    ("exact", None)])
def test_the_python_api_and_the_code_tasks_cut_the_tricky_case_alike(method, inner):
    """Unconstrained sampling keeps with_stop's stop strings too."""
    lm = tricky_lm()
    regex = at.constraints.regex("(xa|bcd|e)+") if inner else None
    constraint = with_stop(regex, TRICKY_STOPS)
    s = at.generate(lm, "e", constraint, method=method, temperature=0,
                    max_new_tokens=4).samples[0]
    assert s.tokens == (0, 1) and s.complete  # ended at the token that finished a stop
    full = lm.vocab.decode(s.tokens).decode()
    assert s.text == cut_at_stop(full, tuple(TRICKY_STOPS)) == cut_text(full, TRICKY_STOPS)
    assert s.text == "x"
