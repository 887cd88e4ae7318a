"""``allow_truncated``: a valid prefix that reaches ``max_new_tokens`` ends its sample, and
the target is the model's text cut there, conditioned on every prefix being valid
(docs/design.md §2). Statistical thresholds as in test_distribution.py: chi-square
p > 0.001 for a fit, p < 1e-9 for a misfit, fixed seeds.
"""

from __future__ import annotations

import itertools
import math

import pytest
from stats import chi_square_p

import adaptrack as at
from adaptrack.testing import hashed_weights

VOCAB = [b"a", b"b", b"c", b"<eos>"]
MAX_NEW = 4
N = 8000


def _lm() -> at.TableLM:
    return at.TableLM(VOCAB, hashed_weights(4, b"cut"), eos=3)


def _words() -> at.constraints.Constraint:
    """Words over {a, b} without "bb", then "c": some end within MAX_NEW tokens (EOS
    included), the longer ones can only be cut, and "bb" is a dead end."""
    words = ["".join(w) + "c" for k in range(7) for w in itertools.product("ab", repeat=k)]
    return at.constraints.choice([w for w in words if "bb" not in w])


def _model_prob(lm: at.TableLM, tokens: tuple[int, ...]) -> float:
    p, prefix = 1.0, []
    for t in tokens:
        w = [float(x) for x in lm.next_probs(prefix)]
        p *= w[t] / sum(w)
        prefix.append(t)
    return p


def _counts(result: at.GenerationResult) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    for s in result.samples:
        out[s.tokens] = out.get(s.tokens, 0) + 1
    return out


def test_without_a_constraint_the_target_is_the_models_cut_text():
    lm = _lm()
    target = at.exact_distribution(lm, [], at.constraints.anything(), max_new_tokens=3,
                                   allow_truncated=True)
    # Nothing is conditioned away: each sequence weighs its model probability, unnormalized.
    assert math.isclose(sum(_model_prob(lm, s) for s in target), 1.0, rel_tol=1e-9)
    for s, p in target.items():
        assert math.isclose(p, _model_prob(lm, s), rel_tol=1e-9)
        assert len(s) == 3 or s[-1] == 3  # cut at the limit, or ended by EOS


def test_the_target_holds_ended_and_cut_sequences():
    target = at.exact_distribution(_lm(), [], _words(), max_new_tokens=MAX_NEW,
                                   allow_truncated=True)
    ended = [s for s in target if s[-1] == 3]
    cut = [s for s in target if s[-1] != 3]
    assert ended and cut
    assert all(len(s) == MAX_NEW for s in cut)
    assert not any(s[i] == s[i + 1] == 1 for s in target for i in range(len(s) - 1))
    # Without the option only the ended ones are targets.
    plain = at.exact_distribution(_lm(), [], _words(), max_new_tokens=MAX_NEW)
    assert set(plain) == set(ended)


@pytest.mark.parametrize(("method", "options"),
                         [("exact", {}), ("adaptrack", {"share_q": True}),
                          ("unconstrained", {})])
def test_exact_methods_sample_the_cut_target(method, options):
    lm = _lm()
    constraint = at.constraints.anything() if method == "unconstrained" else _words()
    target = at.exact_distribution(lm, [], constraint, max_new_tokens=MAX_NEW,
                                   allow_truncated=True)
    res = at.generate(lm, [], constraint, method=method, n=N, seed=3, max_new_tokens=MAX_NEW,
                      allow_truncated=True, **options)
    p = chi_square_p(_counts(res), target)
    assert p > 1e-3, f"{method} {options}: chi-square p = {p:.2e}"


def test_cd_does_not_sample_the_cut_target():
    lm = _lm()
    target = at.exact_distribution(lm, [], _words(), max_new_tokens=MAX_NEW,
                                   allow_truncated=True)
    res = at.generate(lm, [], _words(), method="cd", n=N, seed=3, max_new_tokens=MAX_NEW,
                      allow_truncated=True)
    assert chi_square_p(_counts(res), target) < 1e-9


def test_cut_samples_are_marked_incomplete_and_keep_their_text():
    res = at.generate(_lm(), [], _words(), method="adaptrack", n=200, seed=0,
                      max_new_tokens=MAX_NEW, allow_truncated=True)
    cut = [s for s in res.samples if s.tokens[-1] != 3]
    assert cut, "expected some samples cut at the limit"
    for s in cut:
        assert (s.complete, s.valid, len(s.tokens)) == (False, False, MAX_NEW)
        assert s.text == "".join(VOCAB[t].decode() for t in s.tokens)
    assert all(s.complete and s.valid for s in res.samples if s.tokens[-1] == 3)
    assert res.stats["incomplete"] == len(cut)


def test_a_language_too_long_for_the_limit_is_cut_instead_of_refused():
    lm = _lm()
    long_word = at.constraints.choice(["aaaaaaa"])
    with pytest.raises(at.NoValidSequenceError):
        at.generate(lm, [], long_word, method="adaptrack", max_new_tokens=3)
    res = at.generate(lm, [], long_word, method="adaptrack", n=2, seed=0, max_new_tokens=3,
                      allow_truncated=True)
    assert res.texts == ["aaa", "aaa"]


def test_allow_truncated_must_be_a_flag():
    with pytest.raises(TypeError, match="allow_truncated"):
        at.generate(_lm(), [], _words(), allow_truncated="yes")


# ---- anything(stop=...): free text that ends at a stop string ---------------------------

LINES = at.TableLM([b"a", b"\n", b"\nd", b"ef", b"<eos>"], hashed_weights(5, b"lines"), eos=4)


def _cut(text: str, stop: str) -> str:
    i = text.find(stop)
    return text if i < 0 else text[:i]


def test_unconstrained_with_stop_strings_ends_where_the_cut_text_ends():
    # Each sample draws from its own stream, one number per token: with a stop string a
    # walk is the same walk ended early, so its text is the free text cut at the stop.
    kw = dict(method="unconstrained", n=200, seed=5, max_new_tokens=40)
    free = at.generate(LINES, [], None, **kw)
    stopped = at.generate(LINES, [], at.constraints.anything(stop=["\ndef"]), **kw)
    cut = 0
    for f, s in zip(free.samples, stopped.samples, strict=True):
        assert s.text == _cut(f.text, "\ndef")
        assert f.tokens[:len(s.tokens)] == s.tokens
        if "\ndef" in f.text:
            cut += 1
            assert s.complete and len(s.tokens) < len(f.tokens)
    assert cut > 20, "expected many samples to reach the stop string"
    assert sum(len(s.tokens) for s in stopped.samples) < sum(len(s.tokens) for s in free.samples)


def test_exact_with_stop_strings_samples_the_target():
    stop = at.constraints.anything(stop=["\ndef"])
    target = at.exact_distribution(LINES, [], stop, max_new_tokens=5)
    assert any("\ndef" in LINES.vocab.decode(s).decode() for s in target)  # the stop's token
    with pytest.warns(at.FreeTextWarning):
        res = at.generate(LINES, [], stop, method="exact", n=N, seed=1, max_new_tokens=5)
    assert all(s.complete and "\ndef" not in s.text for s in res.samples)
    p = chi_square_p(_counts(res), target)
    assert p > 1e-3, f"chi-square p = {p:.2e}"
