"""Stop strings through the one implementation of the constraints layer
(``adaptrack.constraints.stop``, ``with_stop``): the matcher contract, the target the
searches then sample, and one rule for where the text is cut, the same in the Python API,
the server and the code tasks' completions."""

from __future__ import annotations

import pytest
from stats import chi_square_p

import adaptrack as at
from adaptrack.constraints import Stopped, with_stop
from adaptrack.constraints.stop import cut_text, first_stop
from adaptrack.eval.codetask import cut_at_stop
from adaptrack.testing import assert_contract
from adaptrack.tokenization.vocab import Vocabulary

# The tricky case: "abcd" spans the boundary of the tokens "xa" and "bcd", and "bc" overlaps
# it, ending first; the text is cut where the earliest-starting stop string begins.
TRICKY_VOCAB = ["xa", "bcd", "e", "<eos>"]
TRICKY_STOPS = ["bc", "abcd"]


def tricky_lm() -> at.TableLM:
    """After "e" (the prompt) writes "xa", "bcd", "e", "xa", … almost surely."""
    def weights(prefix: tuple[int, ...]) -> list[float]:
        w = [1e-3] * 4
        w[(prefix[-1] + 1) % 3] = 1.0
        return w
    return at.TableLM(TRICKY_VOCAB, weights, eos=3)


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


#: A regex whose texts go on after the stop string "b" (STOP_PROMPT is "a").
STOP_REGEX, STOP_PROMPT = "a{0,3}b[ab]{0,2}", [0]


def stop_toy() -> at.TableLM:
    """EOS is likely right after "b" only when no "a" came before it (after the prompt):
    ending at "b" and ending at EOS after it are different targets."""
    def weights(prefix: tuple[int, ...]) -> list[float]:
        if prefix[-1] == 1:  # after "b"
            return [1, 1, 9 if len(prefix) == 2 else 0.1]
        return [1, 1, 0.1]
    return at.TableLM(["a", "b", "<eos>"], weights, eos=2)


def stop_targets(lm: at.TableLM) -> tuple[dict[str, float], dict[str, float]]:
    """The texts' distribution (end="eos", max_new_tokens=8) when the stop string "b" ends
    the sequence, and when the constraint is sampled and its text cut after (the rule the
    server had); every sequence of the first ends at "b"."""
    regex = at.constraints.regex(STOP_REGEX)
    new: dict[str, float] = {}
    for s, p in at.exact_distribution(lm, STOP_PROMPT, with_stop(regex, ["b"]),
                                      max_new_tokens=8, end="eos").items():
        assert s[-1] == 1
        new[lm.vocab.decode(s[:-1]).decode()] = new.get(lm.vocab.decode(s[:-1]).decode(),
                                                        0) + p
    old: dict[str, float] = {}
    for s, p in at.exact_distribution(lm, STOP_PROMPT, regex, max_new_tokens=8,
                                      end="eos").items():
        text = cut_text(lm.vocab.decode(s).decode(), ["b"])
        old[text] = old.get(text, 0) + p
    return new, old


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
