"""The transformers backend: KV states that follow the prefix tree give the log-probs of a
fresh forward pass, batched or not, on a tiny randomly initialized Llama (no download)."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the transformers backend needs torch")
transformers = pytest.importorskip("transformers", reason="needs transformers")

import adaptrack as at  # noqa: E402
from adaptrack.lm.base import common_prefix  # noqa: E402
from adaptrack.lm.hf import TransformersLM  # noqa: E402


def byte_tokenizer():
    """A byte-level BPE tokenizer with the 256 byte tokens, a few merges and an EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(table))}
    merges = [("a", "b"), ("ab", "c"), ("Ġ", "a")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    vocab["<eos>"] = len(vocab)
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(["<eos>"])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    tok = byte_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok) + 3,  # logits wider than the tokenizer, as padded models have
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=len(tok) - 1,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    return model, tok


def fresh(model, prefix):
    with torch.inference_mode():
        logits = model(torch.tensor([prefix])).logits[0, -1]
    return torch.log_softmax(logits.float(), -1).numpy()


def test_vocabulary_from_the_tokenizer_and_the_model(tiny):
    model, tok = tiny
    lm = TransformersLM(model, tok)
    assert lm.vocab.size == len(tok) + 3
    assert lm.vocab.eos_ids.tolist() == [len(tok) - 1]
    assert [lm.vocab.bytes_of(i) for i in range(len(tok) - 1, len(tok) + 3)] == [b""] * 4
    text = "abc ab\n\u00e9!"
    assert lm.vocab.decode(lm.encode(text)) == text.encode()


@pytest.mark.parametrize("max_states", [1, 3, 64])
def test_cached_logprobs_equal_a_fresh_forward_along_random_tree_walks(tiny, max_states):
    model, tok = tiny
    lm = TransformersLM(model, tok, max_states=max_states, max_batch=4)
    rng = random.Random(max_states)
    width = lm.vocab.size
    seen = [tuple(rng.randrange(width) for _ in range(5))]
    worst = 0.0
    for _ in range(60):
        batch = []
        for _ in range(rng.choice([1, 1, 2, 3, 6])):
            base = rng.choice(seen)
            base = base[: rng.randrange(1, len(base) + 1)]  # back up: another branch
            grow = rng.choice([0, 1, 1, 1, 2, 5])  # 0: a prefix asked for before
            prefix = (base + tuple(rng.randrange(width) for _ in range(grow)))[:80]
            batch.append(prefix)
            seen.append(prefix)
        got = lm.next_logprobs(batch)
        for prefix, row in zip(batch, got, strict=True):
            worst = max(worst, float(np.abs(row - fresh(model, list(prefix))).max()))
    assert worst < 1e-4
    assert lm.fed_tokens < sum(len(p) for p in seen)  # the states were reused


def test_reuse_feeds_only_new_tokens(tiny):
    model, tok = tiny
    lm = TransformersLM(model, tok)
    prompt = tuple(range(10, 30))
    lm.next_logprobs([prompt])
    assert lm.fed_tokens == 20
    lm.next_logprobs([(*prompt, 5)])
    assert lm.fed_tokens == 21
    lm.next_logprobs([(*prompt, 6), (*prompt, 7, 8)])  # siblings: crop, then feed 1 and 2
    assert lm.fed_tokens == 24
    assert lm.forward_calls == 3


def test_common_prefix():
    assert common_prefix((1, 2, 3), (1, 2, 4)) == 2
    assert common_prefix((1, 2), (1, 2, 4)) == 2
    assert common_prefix((5,), (1,)) == 0
    assert common_prefix(tuple(range(100)), (*range(37), -1)) == 37


@pytest.mark.parametrize("method", ["unconstrained", "cd", "asap", "adaptrack", "exact"])
def test_every_method_runs_on_the_model(tiny, method):
    model, tok = tiny
    lm = TransformersLM(model, tok)
    c = at.constraints.choice(["abc", "ab", "ba", "cab"])
    res = at.generate(lm, "abc", c, method=method, n=6, seed=0, max_new_tokens=6)
    assert len(res.samples) == 6
    if method != "unconstrained":
        assert all(s.valid and s.text in {"abc", "ab", "ba", "cab"} for s in res.samples)
    one_by_one = at.generate(lm, "abc", c, method=method, n=6, seed=0, max_new_tokens=6,
                             batch_size=1)
    assert [s.tokens for s in one_by_one.samples] == [s.tokens for s in res.samples]


def test_lockstep_batches_reach_the_model(tiny):
    model, tok = tiny
    lm = TransformersLM(model, tok)
    res = at.generate(lm, "ab", None, method="unconstrained", n=8, seed=1, max_new_tokens=5)
    assert res.stats["lm_calls"] > lm.forward_calls  # several prefixes per forward pass


def test_empty_prompt_is_an_error(tiny):
    model, tok = tiny
    lm = TransformersLM(model, tok)
    with pytest.raises(ValueError, match="non-empty prompt"):
        lm.next_logprobs([()])


def test_logprobs_along_is_one_forward_with_every_position(tiny):
    """Fast-forward's short prefill: the rows equal fresh forwards, one pass, fed once."""
    model, tok = tiny
    lm = TransformersLM(model, tok)
    prompt = tuple(range(10, 30))
    lm.next_logprobs([prompt])
    forced = (40, 41, 42, 43)
    rows = lm.logprobs_along(prompt, forced)
    assert rows.shape == (5, lm.vocab.size)
    for i in range(5):
        assert np.abs(rows[i] - fresh(model, list(prompt + forced[:i]))).max() < 1e-4
    assert lm.forward_calls == 2
    assert lm.fed_tokens == 20 + 1 + 4  # the prompt's last token again, for its output
    after = lm.next_logprobs([(*prompt, *forced, 7)])  # the chain's state was kept
    assert lm.fed_tokens == 26
    assert np.abs(after[0] - fresh(model, [*prompt, *forced, 7])).max() < 1e-4


def test_logprobs_along_many_batches_chains_of_different_lengths(tiny):
    model, tok = tiny
    lm = TransformersLM(model, tok)
    prompt = tuple(range(10, 30))
    lm.next_logprobs([prompt])
    requests = [(prompt, (40, 41, 42)), ((*prompt, 7), ()), ((*prompt, 8, 9), (50,))]
    got = lm.logprobs_along_many(requests)
    assert lm.forward_calls == 2  # one pass for the three chains
    for (prefix, chain), rows in zip(requests, got, strict=True):
        assert rows.shape == (len(chain) + 1, lm.vocab.size)
        for i in range(len(chain) + 1):
            assert np.abs(rows[i] - fresh(model, list(prefix + chain[:i]))).max() < 1e-4
