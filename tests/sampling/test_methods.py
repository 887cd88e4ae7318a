"""Unit tests of the shared mechanics: vocabulary, choice masks, the Q table, top-p, seeds."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2

import adaptrack as at
from adaptrack.sampling.qtable import QTable
from adaptrack.sampling.topp import nucleus
from adaptrack.sampling.tree import PrefixTree
from adaptrack.testing import PROBLEMS, hashed_weights


def random_vocab(rng: random.Random, alphabet: bytes = b"abc(") -> list[bytes]:
    vocab = {bytes([b]) for b in alphabet}
    while len(vocab) < 30:
        vocab.add(bytes(rng.choice(alphabet) for _ in range(rng.randint(2, 4))))
    return [*sorted(vocab), b"<eos>"]


def brute_force_allowed(text: bytes, vocab: list[bytes], strings: set[bytes], term: bytes,
                        eos: int) -> tuple[set[int], set[int]]:
    """Valid and finishing tokens after ``text``, straight from the definition."""
    valid, finishing = set(), set()
    for t, data in enumerate(vocab):
        if t == eos:
            if text in strings and not term:
                valid.add(t)
                finishing.add(t)
            continue
        full = text + data
        if any(s.startswith(full) for s in strings):
            valid.add(t)
        for k in range(len(data)):
            if data[k] in term and text + data[:k] in strings:
                valid.add(t)
                finishing.add(t)
                break
            if data[k] in term:
                break
    return valid, finishing


@pytest.mark.parametrize("case", range(60))
def test_choice_masks_match_brute_force(case):
    rng = random.Random(case)
    vocab = random_vocab(rng)
    eos = len(vocab) - 1
    term = b"(" if case % 2 else b""
    letters = b"abc"
    strings = {bytes(rng.choice(letters) for _ in range(rng.randint(0, 5)))
               for _ in range(rng.randint(1, 6))}
    lm = at.TableLM(vocab, lambda p: [1] * len(vocab), eos=eos)
    vocab_ok = vocab
    matcher = at.constraints.choice(strings, terminators=term or None).bind(lm.vocab)
    # Walk random valid paths and compare at every state reached.
    for _ in range(10):
        state, text = matcher.start(), b""
        for _ in range(6):
            want_valid, want_fin = brute_force_allowed(text, vocab_ok, strings, term, eos)
            assert set(matcher.allowed(state).tolist()) == want_valid, (strings, text)
            assert set(matcher.finishing(state).tolist()) == want_fin, (strings, text)
            steps = [t for t in want_valid if t not in want_fin]
            if not steps:
                break
            tok = rng.choice(steps)
            state, text = matcher.advance(state, tok), text + vocab[tok]
            assert state is not None


def test_choice_rejects_a_terminator_inside_a_string():
    with pytest.raises(ValueError, match="terminator"):
        at.constraints.choice(["f(x)"], terminators="(")


def test_vocabulary_trie_subtree_is_every_token_with_that_prefix():
    vocab = at.Vocabulary([b"a", b"ab", b"abc", b"b", None, b"ac"], eos_ids=[4], size=8)
    trie = vocab.trie
    node = trie.children[0][ord("a")]
    assert sorted(trie.subtree(node).tolist()) == [0, 1, 2, 5]
    assert vocab.text_ids.tolist() == [0, 1, 2, 3, 5]
    with pytest.raises(ValueError, match="outside"):
        at.Vocabulary([b"a"], eos_ids=[3])


def test_nucleus_is_plain_top_p_without_a_constraint_and_validity_aware_with_one():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    everything = np.arange(4)
    assert nucleus(probs, everything, 0.7).tolist() == [0, 1]
    assert nucleus(probs, everything, 0.85).tolist() == [0, 1, 2]
    # Token 0 invalid: after checking 0, 1 the known-valid share is .3/(.3+.2) = .6;
    # after 2 it is .45/(.45+.05) = .9 > .8, so token 3 counts as invalid.
    assert nucleus(probs, np.array([1, 2, 3]), 0.8).tolist() == [1, 2]
    assert nucleus(probs, np.array([1, 2, 3]), 0.5).tolist() == [1]


def test_q_table_satisfies_formula_2_after_random_openings():
    lm, constraint, max_new = PROBLEMS["api_names"]()
    tree = PrefixTree(lm, [], constraint.bind(lm.vocab), max_new_tokens=max_new)
    Q = QTable(tree)
    rng = random.Random(0)
    for _ in range(200):  # random root-to-leaf walks, opening as we go
        node = tree.root
        while not node.complete:
            tree.expand(node)  # the test is the driver: it asks the model
            Q.open(node)
            if Q.q(node) == 0:
                break
            ids = node.expansion.ids.tolist()
            node = tree.child(node, rng.choice(ids))

    def recomputed(node) -> float:
        if node.complete or not Q.is_open(node):
            return 1.0
        exp = node.expansion
        return sum(exp.p[i] * (recomputed(node.children[t]) if t in node.children else 1.0)
                   for i, t in enumerate(exp.ids.tolist()))

    opened = 0
    stack = [tree.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if Q.is_open(node):
            opened += 1
            assert Q.q(node) == pytest.approx(recomputed(node), abs=1e-12)
    assert opened > 10


def test_fully_opened_q_root_is_the_total_valid_probability():
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    tree = PrefixTree(lm, [], constraint.bind(lm.vocab), max_new_tokens=max_new)
    Q = QTable(tree)
    stack, total = [tree.root], 0.0
    while stack:
        node = stack.pop()
        if node.complete:
            total += np.exp(node.logprob)
            continue
        tree.expand(node)  # the test is the driver: it asks the model
        Q.open(node)
        stack.extend(tree.child(node, int(t)) for t in node.expansion.ids)
    assert Q.q(tree.root) == pytest.approx(total, rel=1e-9)


@pytest.mark.parametrize("method", sorted(at.METHODS))
def test_same_seed_same_samples(method):
    lm, constraint, max_new = PROBLEMS["api_names"]()

    def tokens(seed):
        res = at.generate(lm, [], constraint, method=method, n=20, seed=seed,
                          max_new_tokens=max_new)
        return [s.tokens for s in res.samples]

    assert tokens(5) == tokens(5)
    assert tokens(5) != tokens(6)


def test_greedy_methods():
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    dist = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    best = max(dist, key=dist.get)
    for method in at.METHODS:
        res = at.generate(lm, [], constraint, method=method, n=3, temperature=0,
                          max_new_tokens=max_new)
        again = at.generate(lm, [], constraint, method=method, n=3, temperature=0,
                            max_new_tokens=max_new)
        assert [s.tokens for s in res.samples] == [s.tokens for s in again.samples]
        if method != "asap":  # ASAp's argmax moves as its shared Q learns
            assert len({s.tokens for s in res.samples}) == 1, method
        if method == "exact":
            assert res.samples[0].tokens == best
        if method == "cd":  # argmax of the masked distribution at every step
            tree = PrefixTree(lm, [], constraint.bind(lm.vocab), max_new_tokens=max_new)
            node = tree.root
            for tok in res.samples[0].tokens:
                exp = tree.expand(node)
                assert tok == exp.ids[np.argmax(exp.p)]
                node = tree.child(node, tok)


@pytest.mark.parametrize("seed", range(6))
def test_exact_greedy_is_the_most_probable_valid_sequence_with_batched_calls(seed):
    """The best-first search expands the prefixes it would visit next together (one model
    call for several rows); the answer stays the argmax of the enumerated target."""
    rng = random.Random(seed)
    vocab = [b"a", b"b", b"c", b"ab", b"bc", b"<eos>"]
    lm = at.TableLM(vocab, hashed_weights(len(vocab), bytes([seed])), eos=5)
    strings = sorted({"".join(rng.choice("abc") for _ in range(rng.randint(1, 5)))
                      for _ in range(12)})
    c = at.constraints.choice(strings)
    dist = at.exact_distribution(lm, [], c, max_new_tokens=6)
    best = max(dist.values())
    calls = []
    ask = lm.next_logprobs
    lm.next_logprobs = lambda prefixes: calls.append(len(prefixes)) or ask(prefixes)  # type: ignore[method-assign]
    res = at.generate(lm, [], c, method="exact", n=1, temperature=0, max_new_tokens=6)
    assert dist[res.samples[0].tokens] == pytest.approx(best)
    assert max(calls) > 1  # several prefixes in one call


def test_terminator_ends_the_sequence_inside_a_token_and_text_is_cut():
    vocab = [b"tf", b".", b"nn", b"relu", b"relu(x", b"(", b"<eos>"]
    lm = at.TableLM(vocab, lambda p: [1, 1, 1, 1, 30, 1, 1], eos=6)
    c = at.constraints.choice([".nn.relu", ".nn"], terminators="(")
    res = at.generate(lm, "tf", c, method="exact", n=50, seed=0, max_new_tokens=6)
    texts = Counter(s.text for s in res.samples)
    assert set(texts) <= {".nn.relu(", ".nn("}
    assert texts[".nn.relu("] > 0
    assert any(s.tokens[-1] == 4 for s in res.samples)  # "relu(x" ended it; "x" was cut


def test_unconstrained_ignores_the_constraint_and_reports_validity():
    lm, bits, _ = PROBLEMS["binary"]()
    res = at.generate(lm, [], bits, method="unconstrained", n=300, seed=0, max_new_tokens=6)
    assert any(not s.valid for s in res.samples)
    for s in res.samples:
        assert s.valid == (s.complete and s.text in {"00000"} | {f"1{i:04b}" for i in range(16)})
        assert s.complete == (s.tokens[-1] == 2)
        assert len(s.tokens) <= 6
    assert any(not s.complete for s in res.samples)  # ran out of tokens


def test_lm_calls_count_distinct_prefixes_shared_by_all_samples():
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    before = lm.calls
    res = at.generate(lm, [], constraint, method="cd", n=500, seed=0, max_new_tokens=max_new,
                      fast_forward=False)
    assert res.stats["lm_calls"] == lm.calls - before
    distinct_prefixes = {s.tokens[:k] for s in res.samples for k in range(len(s.tokens))}
    assert res.stats["lm_calls"] == len(distinct_prefixes)
    assert all(s.lm_requests == len(s.tokens) for s in res.samples)
    # Fast-forward: a forced chain is one call however many prefixes it evaluates.
    before = lm.calls
    ff = at.generate(lm, [], constraint, method="cd", n=500, seed=0, max_new_tokens=max_new)
    chain_prefixes = lm.calls - before - (ff.stats["lm_calls"] - ff.stats["ff_sequences"])
    assert ff.stats["ff_sequences"] > 0
    assert chain_prefixes == ff.stats["ff_sequences"] + ff.stats["forced_tokens"]
    assert ff.stats["lm_calls"] < res.stats["lm_calls"]


def test_backtrack_limits():
    lm, constraint, max_new = PROBLEMS["api_names"]()
    runs = {}
    for opts in ({}, {"max_backtrack": 0}, {"max_backtrack": 1}, {"min_backtrack_prob": 0.9}):
        res = at.generate(lm, [], constraint, method="adaptrack", n=300, seed=0,
                          max_new_tokens=max_new, **opts)
        assert all(s.valid for s in res.samples)
        runs[tuple(opts.items())] = res.stats["backtracks"]
    assert runs[()] > runs[(("max_backtrack", 1),)] >= runs[(("max_backtrack", 0),)]
    assert runs[(("min_backtrack_prob", 0.9),)] < runs[()]


def test_exact_with_top_p_samples_the_truncated_target():
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    target = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new, top_p=0.7)
    full = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    assert len(target) < len(full)
    n = 5000
    res = at.generate(lm, [], constraint, method="exact", n=n, seed=1, top_p=0.7,
                      max_new_tokens=max_new)
    seen = Counter(s.tokens for s in res.samples)
    assert set(seen) <= set(target)
    stat = sum((seen.get(s, 0) - p * n) ** 2 / (p * n) for s, p in target.items())
    assert chi2.sf(stat, len(target) - 1) > 1e-3


def test_temperature_sharpens_the_target():
    lm = at.TableLM([b"a", b"b", b"<eos>"], hashed_weights(3, b"t"), eos=2)
    c = at.constraints.choice(["a", "b", "ab", "ba"])
    cold = at.exact_distribution(lm, [], c, max_new_tokens=3, temperature=0.3)
    warm = at.exact_distribution(lm, [], c, max_new_tokens=3)
    assert max(cold.values()) > max(warm.values())
