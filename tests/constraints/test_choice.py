"""``choice`` masks against brute force over the definition (docs/design.md §2), on random
vocabularies and string sets; ``test_choice_scale.py`` holds the large ones."""

from __future__ import annotations

import random

import pytest

import adaptrack as at


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
