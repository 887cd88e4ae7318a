"""Q in log space (docs/design.md §3, numerics): a language whose whole mass is far below
float64's range (1e-308) still samples; only an empty one raises ``NoValidSequenceError``."""

from __future__ import annotations

import math

import numpy as np
import pytest

import adaptrack as at
from adaptrack.sampling import Expansion, PrefixTree, QTable, TreeOptions
from adaptrack.sampling.engine import expand

# Tokens a, b, EOS at fixed odds 2 : 97 : 1: "a" * k then EOS has probability .02^k · .01.
ODDS = [2, 97, 1]


def _lm() -> at.TableLM:
    return at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: ODDS, eos=2)


def _log10_mass(k: int) -> float:
    return k * math.log10(0.02) + math.log10(0.01)


@pytest.mark.parametrize(("k", "method", "options"), [
    (200, "exact", {}), (400, "exact", {}),
    (200, "adaptrack", {"share_q": True}), (1000, "adaptrack", {"share_q": True}),
    (400, "asap", {}),
])
def test_a_language_of_tiny_mass_samples(k: int, method: str, options: dict) -> None:
    assert _log10_mass(k) < -340  # far below the smallest float64 (about 1e-308, 5e-324)
    result = at.generate(_lm(), [], at.constraints.choice(["a" * k]), method=method, n=2,
                         max_new_tokens=k + 1, seed=0, end="eos", fallback=None, **options)
    assert [s.tokens for s in result.samples] == [(0,) * k + (2,)] * 2


def test_exact_distribution_of_tiny_mass() -> None:
    c = at.constraints.choice(["a" * 1000, "a" * 999 + "b"])
    dist = at.exact_distribution(_lm(), [], c, max_new_tokens=1001, end="eos")
    # The two strings differ in their last token only: odds 2 : 97 (each probability as
    # the tree stores it, in float32: within 1e-7).
    assert dist[(0,) * 1000 + (2,)] == pytest.approx(2 / 99, rel=1e-6)
    assert dist[(0,) * 999 + (1, 2)] == pytest.approx(97 / 99, rel=1e-6)


def test_exact_weighs_two_branches_of_tiny_mass_in_proportion() -> None:
    """Two strings of mass ~1e-330 that fork at the root: P_Q there, from two weights below
    float64's range, must still be P(a) : P(b) = 1 : 3."""
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [1, 3, 996], eos=2)
    k = 110  # .001^110 · .996 ≈ 1e-330
    c = at.constraints.choice(["a" * k, "b" + "a" * (k - 1)])
    n = 100
    result = at.generate(lm, [], c, method="exact", n=n, max_new_tokens=k + 1, seed=1,
                         end="eos", fallback=None)
    share = sum(s.tokens[0] == 0 for s in result.samples) / n
    expected = 1 / 4
    # A binomial share: within 4 standard deviations (plus one sample) of the target.
    assert abs(share - expected) <= 4 * math.sqrt(expected * (1 - expected) / n) + 1 / n
    assert {s.tokens[1:] for s in result.samples} == {(0,) * (k - 1) + (2,)}


@pytest.mark.parametrize("method", ["exact", "adaptrack", "asap"])
def test_an_empty_language_still_raises_and_says_so(method: str) -> None:
    """Empty only because the model never writes b after a (found by the search, not up
    front), next to a branch of mass 1e-342 that is not empty when asked for."""
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 0, 1] if prefix else ODDS,
                    eos=2)
    with pytest.raises(at.NoValidSequenceError, match="language is empty"):
        at.generate(lm, [], at.constraints.choice(["ab", "b" + "a" * 200]), method=method,
                    n=1, max_new_tokens=200, seed=0, end="eos", fallback=None)
    result = at.generate(lm, [], at.constraints.choice(["ab", "b" + "a" * 200]),
                         method=method, n=1, max_new_tokens=202, seed=0, end="eos",
                         fallback=None)
    assert result.samples[0].tokens == (1,) + (0,) * 200 + (2,)


class _Float32LM(at.TableLM):
    probs_dtype = np.float32  # as the transformers and llama.cpp backends declare


def test_a_float32_model_stores_half_the_bytes_and_samples_its_stored_target() -> None:
    """Expansions of a float32 backend hold float32 probabilities; every reader sees those
    numbers, so ``exact`` still matches ``exact_distribution`` (computed from them)."""
    weights = {(): [3, 2, 1], (0,): [1, 4, 2], (1,): [5, 1, 3]}
    vocab = [b"a", b"b", b"<eos>"]
    lm32 = _Float32LM(vocab, lambda prefix: weights.get(tuple(prefix), [1, 1, 1]), eos=2)
    lm64 = at.TableLM(vocab, lambda prefix: weights.get(tuple(prefix), [1, 1, 1]), eos=2)
    c = at.constraints.choice(["a", "ab", "b", "ba"])
    trees = [PrefixTree([], c.bind(lm.vocab), TreeOptions(end="eos"), dtype=lm.probs_dtype)
             for lm in (lm32, lm64)]
    for lm, tree in zip((lm32, lm64), trees, strict=True):
        expand(lm, tree, tree.root)  # the test is the driver: it asks the model
        QTable(tree).open(tree.root)
    assert trees[0].root.expansion.p.dtype == np.float32
    assert trees[0].opened_bytes < trees[1].opened_bytes
    d32 = at.exact_distribution(lm32, [], c, end="eos")
    d64 = at.exact_distribution(lm64, [], c, end="eos")
    assert d32.keys() == d64.keys()
    assert all(d32[s] == pytest.approx(d64[s], rel=1e-6) for s in d64)
    n = 2000
    result = at.generate(lm32, [], c, method="exact", n=n, seed=0, end="eos", fallback=None)
    for s, p in d32.items():
        share = sum(x.tokens == s for x in result.samples) / n
        assert abs(share - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1 / n


def test_an_expansion_whose_every_token_is_valid_holds_its_probabilities_alone() -> None:
    probs = np.full(1000, 1e-3)
    own = Expansion(probs, np.arange(1000), dtype=np.float32)
    assert own.nbytes == 1000 * 4 and own.shared_ids  # ids: one shared 0..V-1
    assert own.ids is Expansion(probs, np.arange(1000)).ids and own.is_valid(999)
    part = Expansion(probs, np.arange(0, 1000, 2), dtype=np.float32)
    assert part.nbytes == 500 * (4 + 4) and not part.shared_ids
    probs[3] = 0.0  # a token of no mass drops out: the ids are the expansion's own again
    assert not Expansion(probs, np.arange(1000)).shared_ids
