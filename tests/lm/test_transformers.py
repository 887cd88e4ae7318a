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


STATE = 2 * 2 * 2 * 16 * 4  # bytes per token of a state: K and V, 2 layers, 2 heads of 16, fp32


@pytest.mark.parametrize(("max_states", "kv_bytes", "share"),
                         [(1, 1 << 30, 64), (3, 1 << 30, 64), (64, 1 << 30, 64),
                          (64, 40 * STATE, 64), (64, 0, 64),
                          (3, 1 << 30, 2), (64, 1 << 30, 2), (64, 40 * STATE, 2)])
def test_cached_logprobs_equal_a_fresh_forward_along_random_tree_walks(tiny, max_states,
                                                                       kv_bytes, share):
    """Random walks that extend, branch and re-ask prefixes; ``share=2`` makes nearly every
    kept state share its source's leading positions instead of copying them."""
    model, tok = tiny
    lm = TransformersLM(model, tok, max_states=max_states, max_batch=4, kv_cache_bytes=kv_bytes,
                        share_tokens=share)
    rng = random.Random(max_states + kv_bytes + share)
    width = lm.vocab.size
    seen = [tuple(rng.randrange(width) for _ in range(5))]
    worst, shared = 0.0, 0
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
        assert pinned_bytes(lm) == lm.kv_cache_bytes_used <= kv_bytes  # bases counted once
        shared += sum(st.base is not None for _, st in lm._states.items())
    assert worst < 1e-4
    assert (shared > 0) == (share == 2 and max_states > 1 and kv_bytes > 0)
    if kv_bytes:
        assert lm.fed_tokens < sum(len(p) for p in seen)  # the states were reused
    else:
        assert lm.fed_tokens == sum(len(p) for p in seen[1:]) and not lm.reuse


def pinned_bytes(lm):
    """Bytes of every storage the kept states hold on to (a view pins all of its storage)."""
    storages = {}
    for _, state in lm._states.items():
        for pair in state.own + (state.base.own if state.base is not None else []):
            for t in pair:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def test_kept_states_own_their_storage_and_are_bounded_in_bytes(tiny):
    """A kept state of one row of a batch must not keep the whole batch's cache alive, and
    the states together stay within kv_cache_bytes."""
    model, tok = tiny
    lm = TransformersLM(model, tok, kv_cache_bytes=100 * STATE)
    prompt = tuple(range(10, 30))
    lm.next_logprobs([prompt + (i,) * (1 + 3 * i) for i in range(4)])  # 21..30 tokens
    assert pinned_bytes(lm) == lm.kv_cache_bytes_used <= 100 * STATE
    assert sorted(len(p) for p, _ in lm._states.items()) == [24, 27, 30]  # 21 did not fit
    lm.next_logprobs([prompt + (3,) * 10 + (5,)])  # reuses the 30-token state
    assert lm.fed_tokens == 21 + 24 + 27 + 30 + 1
    assert pinned_bytes(lm) == lm.kv_cache_bytes_used <= 100 * STATE


def test_walks_that_share_a_long_prompt_keep_it_once(tiny):
    model, tok = tiny
    prompt = tuple(range(10, 110))
    walks = [(*prompt, t) for t in range(1, 9)]
    lm = TransformersLM(model, tok)
    lm.next_logprobs([prompt])
    one = lm.kv_cache_bytes_used
    for step in range(3):
        walks = [(*w, 7 + step) for w in walks]
        got = lm.next_logprobs(walks)
    # The prompt once and each walk's 4 own tokens, against 8 copies of 104 tokens.
    assert lm.kv_cache_bytes_used == pytest.approx(one * (1 + 8 * 4 / 100))
    assert pinned_bytes(lm) == lm.kv_cache_bytes_used
    for prefix, row in zip(walks, got, strict=True):
        assert np.abs(row - fresh(model, list(prefix))).max() < 1e-4
    copies = TransformersLM(model, tok, share_tokens=1000)
    copies.next_logprobs([prompt])
    copies.next_logprobs([(*w[:-3], w[-3]) for w in walks])
    assert copies.kv_cache_bytes_used > 8 * one


def test_sharing_never_costs_a_refeed_that_copies_would_not(tiny):
    """Asking again for a prompt that walks share (a second request, a backtrack), or a
    chain from inside it, keeps the walks' states; and bases do not take max_states slots."""
    model, tok = tiny
    prompt, chain = tuple(range(10, 40)), (5, 6, 7)
    lm = TransformersLM(model, tok, share_tokens=8)
    lm.logprobs_along(prompt, chain)
    walks = [(*prompt, *chain, t) for t in range(1, 5)]
    lm.next_logprobs(walks)
    lm.logprobs_along(prompt, chain)  # the same request again
    lm.next_logprobs([*walks[:1], prompt[:-1]])  # and a backtrack into the prompt
    lm.next_logprobs([prompt])
    lm.logprobs_along(prompt[:3], prompt[3:20])  # a chain branching inside the base
    before = lm.fed_tokens
    lm.next_logprobs([(*w, 9) for w in walks])
    assert lm.fed_tokens - before == 4  # one token per walk: no state was lost
    for max_states, n in ((1, 1), (4, 4)):
        fed = []
        for share in (64, 1000):
            lm = TransformersLM(model, tok, max_states=max_states, share_tokens=share)
            lm.next_logprobs([tuple(range(10, 80))])
            walks = [(*range(10, 80), i) for i in range(n)]
            before = lm.fed_tokens
            for _ in range(10):
                walks = [(*w, 7) for w in walks]
                lm.next_logprobs(walks)
            fed.append(lm.fed_tokens - before)
        assert fed == [n * 11, n * 11]  # shared or copied: one new token per walk per step


def test_freed_kv_memory_goes_back_to_the_system_now_and_then(tiny, monkeypatch):
    from adaptrack.lm import hf

    model, tok = tiny
    hf._trim_heap()  # glibc's malloc_trim here, a no-op elsewhere: never an error
    calls = []
    monkeypatch.setattr(hf, "_trim_heap", lambda: calls.append(1))
    lm = TransformersLM(model, tok, kv_cache_bytes=10 * STATE)
    monkeypatch.setattr(hf, "TRIM_SECONDS", 3600.0)
    lm.next_logprobs([tuple(range(10, 40 + i)) for i in range(4)])  # evicts, frees batches
    monkeypatch.setattr(hf, "TRIM_BYTES", 1)
    lm.next_logprobs([tuple(range(10, 50))])
    assert calls == []  # not within TRIM_SECONDS of the last
    monkeypatch.setattr(hf, "TRIM_SECONDS", 0.0)
    lm.next_logprobs([tuple(range(10, 51))])
    assert calls == [1] and lm._freed == 0


def test_bad_cache_options_are_value_errors(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="kv_cache_bytes must be an int >= 0, got -1"):
        TransformersLM(model, tok, kv_cache_bytes=-1)
    with pytest.raises(ValueError, match="max_batch must be an int >= 1, got 0"):
        TransformersLM(model, tok, max_batch=0)


def test_context_length_comes_from_the_config_and_is_enforced(tiny):
    model, tok = tiny
    lm = TransformersLM(model, tok)
    assert lm.context_length == 512
    assert at.TableLM([b"a", b"b"], lambda p: [1, 1]).context_length is None
    with pytest.raises(at.PromptTooLongError, match=r"513 tokens exceeds .* context of 512"):
        lm.next_logprobs([(5,) * 513])
    with pytest.raises(at.PromptTooLongError, match="513 tokens"):
        lm.logprobs_along((5,) * 510, (6, 7, 8))
    assert lm.forward_calls == 0  # refused before any model work
    assert lm.next_logprobs([(5,) * 512]).shape == (1, lm.vocab.size)


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


def test_a_pass_out_of_device_memory_drops_the_kept_states_and_runs_again(tiny, monkeypatch):
    """Processes that share a GPU each keep KV states there: the one whose allocation fails
    frees its states and goes on (the states are a cache, so the log-probs are a fresh
    forward's); a pass that fails with none kept is a BackendError that says what to lower."""
    model, tok = tiny
    lm = TransformersLM(model, tok)
    prompt = tuple(range(10, 30))
    lm.next_logprobs([prompt])
    real, kept_when_failing = lm._forward, []

    def forward(prefixes, outputs=None):
        if not kept_when_failing:
            kept_when_failing.append(lm.kv_cache_bytes_used)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
        return real(prefixes, outputs)

    monkeypatch.setattr(lm, "_forward", forward)
    row = lm.next_logprobs([(*prompt, 5)])[0]
    assert kept_when_failing[0] > 0
    assert lm.fed_tokens == 20 + 21  # the retry found no state to start from
    assert float(np.abs(row - fresh(model, [*prompt, 5])).max()) < 1e-4
    assert lm.next_logprobs([(*prompt, 5, 6)]) is not None and lm.fed_tokens == 20 + 21 + 1

    def out_of_memory(prefixes, outputs=None):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB.\nmore")

    monkeypatch.setattr(lm, "_forward", out_of_memory)
    with pytest.raises(at.BackendError, match=r"ran out of cpu memory in a pass of 2 rows with "
                       r"no KV state kept \(CUDA out of memory\. Tried to allocate 9\.00 GiB\.\); "
                       r"load the model with a smaller max_batch"):
        lm.next_logprobs([prompt, (*prompt, 7)])
    assert lm.kv_cache_bytes_used == 0


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


def test_a_prefill_and_decode_steps_go_in_separate_passes(tiny):
    """A new prompt batched with one-token steps would pad every row to the prompt's length:
    the rows are split by the tokens they feed, and each equals a fresh forward."""
    model, tok = tiny
    lm = TransformersLM(model, tok)
    old = tuple(range(10, 30))
    lm.next_logprobs([old])
    prompt = tuple(range(60, 100))
    batch = [(*old, 1), prompt, (*old, 2), (*old, 3)]
    before = lm.forward_calls
    got = lm.next_logprobs(batch)
    assert lm.forward_calls - before == 2  # three one-token rows, then the prompt alone
    assert lm.fed_tokens == 20 + 3 + 40  # no padding counted, none fed twice
    for prefix, row in zip(batch, got, strict=True):
        assert np.abs(row - fresh(model, list(prefix))).max() < 1e-4
    chains = lm.logprobs_along_many([(prompt, (5, 6)), ((*old, 1, 9), ()), (old[:3], (4,))])
    assert [len(r) for r in chains] == [3, 1, 2]
    assert np.abs(chains[0][2] - fresh(model, [*prompt, 5, 6])).max() < 1e-4
    assert np.abs(chains[2][1] - fresh(model, [*old[:3], 4])).max() < 1e-4


def test_pass_kv_bytes_bounds_the_states_a_pass_assembles(tiny):
    """Rows that reuse a long shared prompt go to as many passes as the byte bound asks,
    widest first, and each row still equals a fresh forward."""
    model, tok = tiny
    prompt = tuple(range(10, 90))
    rows = [(*prompt, t) for t in range(1, 7)]
    lm = TransformersLM(model, tok)
    lm.next_logprobs([prompt])
    per_token = lm.kv_cache_bytes_used / len(prompt)
    before = lm.forward_calls
    lm.next_logprobs(rows)
    assert lm.forward_calls - before == 1  # 6 rows of 80 tokens: far below 1 GiB
    bound = int(2.5 * len(prompt) * per_token)
    # Rows that copy the prompt (no sharing below 1 000 tokens) go two to a pass; rows that
    # attend to it in place hold none of it, and all go in one.
    for share, passes in ((1000, 3), (64, 1)):
        tight = TransformersLM(model, tok, pass_kv_bytes=bound, share_tokens=share)
        tight.next_logprobs([prompt])
        before = tight.forward_calls
        got = tight.next_logprobs(rows)
        assert tight.forward_calls - before == passes
        for prefix, row in zip(rows, got, strict=True):
            assert np.abs(row - fresh(model, list(prefix))).max() < 1e-4
    with pytest.raises(ValueError, match="pass_kv_bytes must be an int >= 0, got -1"):
        TransformersLM(model, tok, pass_kv_bytes=-1)
    with pytest.raises(ValueError, match="share_tokens must be an int >= 1, got 0"):
        TransformersLM(model, tok, share_tokens=0)


@pytest.mark.parametrize("q", [1, 3])
@pytest.mark.parametrize("groups", [1, 2, 3])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
def test_attention_to_a_shared_prefix_equals_sdpa_over_the_copies(q, groups, mask):
    """The attention function of lm/shared_attention.py against torch's SDPA over every row's
    shared and own keys laid end to end: GQA, one or more new positions, each mask kind."""
    from adaptrack.lm import shared_attention as sa

    gen = torch.Generator().manual_seed(q * 10 + groups)
    rows, kv_heads, p, own, d = 3, 2, 7, 4, 8
    heads = kv_heads * groups
    query = torch.randn(rows, heads, q, d, generator=gen)
    shared = (torch.randn(1, kv_heads, p, d, generator=gen),
              torch.randn(1, kv_heads, p, d, generator=gen))
    keys = torch.randn(rows, kv_heads, own + q, d, generator=gen)
    values = torch.randn(rows, kv_heads, own + q, d, generator=gen)
    length = p + own + q
    allowed = torch.ones(rows, 1, q, length, dtype=torch.bool).tril(length - q)
    allowed[1, :, :, p:p + 2] = False  # row 1's own part is left-padded by two
    given = {"none": None, "bool": allowed,
             "float": torch.zeros(rows, 1, q, length).masked_fill(~allowed, -1e30)}[mask]
    if mask == "none":
        allowed = torch.ones(rows, 1, q, length, dtype=torch.bool).tril(length - q)
    full_k = torch.cat([shared[0].expand(rows, -1, -1, -1), keys], dim=2)
    full_v = torch.cat([shared[1].expand(rows, -1, -1, -1), values], dim=2)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, full_k.repeat_interleave(groups, 1), full_v.repeat_interleave(groups, 1),
        attn_mask=allowed).transpose(1, 2)
    layer = sa.shared_layer(shared, keys[:, :, :own], values[:, :, :own])
    assert layer.get_seq_length() == p + own
    tagged_k, tagged_v = layer.update(keys[:, :, own:], values[:, :, own:])
    module = type("Attention", (), {"num_key_value_groups": groups, "is_causal": True})()
    got, _ = sa.attention(module, query, tagged_k, tagged_v, given, scaling=d ** -0.5)
    assert got.shape == (rows, q, heads, d)
    assert torch.allclose(got, expected, atol=1e-5)
    # Untagged keys go to transformers' own sdpa, unchanged.
    plain, _ = sa.attention(module, query, full_k, full_v, allowed, scaling=d ** -0.5)
    assert torch.allclose(plain, expected, atol=1e-5)


def test_rows_of_one_prompt_attend_to_it_in_place(tiny, monkeypatch):
    """Walks of one prompt (of different lengths, fed one or several tokens, one row or
    many) are batched with the prompt's positions once, not once per row, and equal a
    fresh forward; the same walks without it give the same log-probs."""
    model, tok = tiny
    prompt = tuple(range(10, 90))
    lm = TransformersLM(model, tok, share_tokens=16)
    copies = TransformersLM(model, tok, share_tokens=16, shared_attention=False)
    assert not copies.shared_attention
    assert lm.shared_attention and model.config._attn_implementation != "sdpa"
    used = []
    built = lm._batched_cache
    monkeypatch.setattr(lm, "_batched_cache", lambda s, w, c=None: used.append(
        c is not None) or built(s, w, c))
    rng = random.Random(3)
    walks = [prompt] * 5
    lm.next_logprobs([prompt])  # as generate starts: the prompt's state, the walks' base
    copies.next_logprobs([prompt])
    for step in range(8):
        walks = [(*w, *(rng.randrange(200) for _ in range(rng.choice([1, 1, 3]))))
                 for w in walks]
        if step == 4:
            walks[0] = walks[0][:len(prompt) + 2]  # a backtrack
        asked = walks if step % 3 else walks[:1]  # one row alone too
        got, same = lm.next_logprobs(asked), copies.next_logprobs(asked)
        for prefix, row in zip(asked, got, strict=True):
            assert np.abs(row - fresh(model, list(prefix))).max() < 1e-4
        assert np.abs(got - same).max() < 1e-5
    assert sum(used) >= 6 and lm.fed_tokens == copies.fed_tokens


def test_a_model_that_rebuilds_its_keys_from_the_cache_falls_back_to_copies():
    """DeepSeek-V3's latent attention keeps compressed latents in the cache and expands them
    (keys and values of different widths): the shared part never reaches the attention
    function, which the pass detects; it runs again with copies, and so do later passes."""
    torch.manual_seed(0)
    tok = byte_tokenizer()
    cfg = transformers.DeepseekV3Config(
        vocab_size=len(tok) + 3, hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=2, kv_lora_rank=16, q_lora_rank=None,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=512,
        eos_token_id=len(tok) - 1)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    prompt = tuple(range(10, 90))
    lm = TransformersLM(model, tok, share_tokens=16)
    assert lm.shared_attention
    lm.next_logprobs([prompt])
    rows = [(*prompt, t) for t in (5, 6, 7)]
    for asked in (rows[:1], rows, [(*r, 9) for r in rows]):
        for prefix, row in zip(asked, lm.next_logprobs(asked), strict=True):
            assert np.abs(row - fresh(model, list(prefix))).max() < 1e-4
    assert not lm.shared_attention


def test_cache_layers_start_across_transformers_releases():
    """Before 4.57 ``lazy_initialization`` takes the keys only."""
    from adaptrack.lm.shared_attention import start_layer

    class Old:
        def lazy_initialization(self, keys):
            self.started = keys

    layer, keys, values = Old(), torch.zeros(1), torch.ones(1)
    start_layer(layer, keys, values)
    assert layer.started is keys and layer.keys is keys and layer.values is values


def test_pad_groups_bound_the_padding():
    from adaptrack.lm.hf import pad_groups
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.choice([1, 1, 2, 5, 40, 300]) for _ in range(rng.randrange(1, 12))]
        groups = pad_groups(lengths, slack=16)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            real = sum(lengths[i] for i in g)
            assert len(g) * max(lengths[i] for i in g) - real <= max(16, real)


def test_a_directory_that_is_not_a_model_is_named_as_such(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(at.ModelLoadError, match=r"is not a model directory: it has no "
                       r"config\.json; pass a Hugging Face model directory"):
        at.load_model(tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"")
    with pytest.raises(at.ModelLoadError, match=r"no config\.json; it holds m\.gguf: pass"):
        at.load_model(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(at.ModelLoadError, match="has no tokenizer"):
        at.load_model(tmp_path)


def test_an_unknown_model_id_fails_fast_when_the_hub_is_unreachable(monkeypatch):
    """Without this check transformers retries the download for about 50 s."""
    import huggingface_hub

    def unreachable(*args, **kwargs):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    with pytest.raises(at.ModelLoadError, match=r"'nobody/nothing' is not a local directory "
                       r"and not in the Hugging Face cache .* hub is unreachable .* "
                       r"HF_HUB_OFFLINE=1"):
        at.load_model("nobody/nothing", device="cpu")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(at.ModelLoadError, match="HF_HUB_OFFLINE is set"):
        at.load_model("nobody/nothing", device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_one_line_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(at.ModelLoadError, match=r"^device='cuda' but torch sees no CUDA device; "
                       r"use device='cpu'$"):
        at.load_model(tmp_path, device="cuda")


def test_the_default_bounds_keep_a_state_per_walk_in_flight(tiny):
    # 100 walks in flight: each step extends every walk's state by one token. Were fewer
    # states kept than walks, each step would re-feed whole prefixes.
    model, tok = tiny
    lm = TransformersLM(model, tok, max_batch=128)
    res = at.generate(lm, "abc", None, method="unconstrained", n=100, seed=0,
                      max_new_tokens=6, batch_size=128)
    new = sum(len(s.tokens) for s in res.samples)
    assert lm.fed_tokens <= 3 + new  # the prompt once, then one token per prefix


def test_dtype_chooses_the_weights_precision(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lm = at.load_model(tmp_path, device="cpu", dtype="bfloat16")
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    prefix = [5, 7, 9]
    with torch.inference_mode():
        logits = lm.model(torch.tensor([prefix])).logits[0, -1]
    want = torch.log_softmax(logits.float(), -1).numpy()[: lm.vocab.size]
    np.testing.assert_allclose(lm.next_logprobs([tuple(prefix)])[0], want, atol=1e-5)
    assert at.generate(lm, prefix, method="unconstrained", max_new_tokens=4, seed=0).samples
    assert next(at.load_model(tmp_path, device="cpu").model.parameters()).dtype == torch.float32


def test_bfloat16_rows_stay_near_a_fresh_forward_on_every_path():
    """Cached, batched and chain rows in bfloat16: near a fresh bfloat16 forward (its
    rounding depends on the path, so not within float32's 1e-4), never another row's."""
    torch.manual_seed(1)
    tok = byte_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=len(tok) - 1, initializer_range=0.2)  # peaked logits, not near-uniform
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    lm = TransformersLM(model, tok)
    old = tuple(range(10, 40))
    lm.next_logprobs([old])
    batch = [(*old, 1), (*old, 2), (*old, 3, 4), tuple(range(50, 70))]
    got = list(lm.next_logprobs(batch)) + list(lm.logprobs_along_many([(old, (5, 6))])[0])
    want = [*batch, old, (*old, 5), (*old, 5, 6)]
    for prefix, row in zip(want, got, strict=True):
        err = np.abs(row - fresh(model, list(prefix))).max()
        assert err < 0.1, (prefix, err)
    spread = np.abs(fresh(model, list(batch[0])) - fresh(model, list(batch[1]))).max()
    assert spread > 0.5  # the rows differ by far more than the tolerance


def test_bad_dtypes_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown dtype 'int8'; choose one of auto, float32"):
        at.load_model(tmp_path, dtype="int8")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="dtype 'bfloat16' is for the transformers backend"):
        at.load_model(tmp_path / "m.gguf", backend="llamacpp", dtype="bfloat16")


def test_a_dtype_sends_a_gguf_to_transformers_under_auto(tmp_path, monkeypatch):
    import importlib.util

    from adaptrack.lm import load

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",  # as if llama-cpp-python were installed
                        lambda name, *a: object() if name == "llama_cpp" else real(name, *a))
    calls = []
    monkeypatch.setattr(load, "_load_transformers", lambda *args: calls.append(args))
    monkeypatch.setattr(load, "LlamaCppLM", None, raising=False)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    at.load_model(tmp_path / "m.gguf", dtype="bfloat16")
    assert calls and calls[0][3] == "bfloat16"


class _Saved:
    """Stands in for a converted tokenizer or model: save_pretrained writes one file."""

    def __init__(self, name):
        self.name = name
        self.config = transformers.LlamaConfig()

    def save_pretrained(self, where):
        where.mkdir(parents=True, exist_ok=True)
        (where / self.name).write_text("{}")


@pytest.mark.parametrize("other_finished", [True, False])
def test_a_conversion_that_another_worker_finished_first_is_used(tmp_path, monkeypatch,
                                                                 other_finished):
    """Eval workers load the default model together: on a fresh cache each converts the
    GGUF, and the later renames find the directory taken. A finished one is used; a
    directory that is no conversion is an error. No temporary copy is left either way."""
    from adaptrack.lm import load

    monkeypatch.setenv("ADAPTRACK_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: _Saved("tokenizer.json"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: _Saved("config.json"))
    real_publish = load._publish

    def another_worker_first(tmp, out):
        out.mkdir()
        (out / ("config.json" if other_finished else "partial")).write_text("{}")
        real_publish(tmp, out)

    monkeypatch.setattr(load, "_publish", another_worker_first)
    if other_finished:
        out = load.converted_gguf(gguf)
        assert (out / "config.json").exists() and not (out / "tokenizer.json").exists()
    else:
        with pytest.raises(OSError, match="not empty"):
            load.converted_gguf(gguf)
    converted = tmp_path / "cache" / "converted"
    assert [p.name for p in converted.iterdir() if ".tmp" in p.name] == []


def test_siblings_attend_to_their_parent_in_place_and_transient_rows_keep_no_state(tiny):
    """Rows that each add one token to the same kept state (siblings of a walk's prefix, a
    state with a base of its own) read that state's positions once per pass; each row
    equals a fresh forward; a transient row keeps no state and leaves its source kept, and
    the row kept extends as a fresh forward does."""
    model, tok = tiny
    lm = TransformersLM(model, tok, share_tokens=16)
    prompt = tuple(range(10, 40))
    lm.next_logprobs([prompt])
    parent = (*prompt, *range(50, 90))  # its own 40 positions on the prompt's base
    lm.next_logprobs([parent])
    assert lm._states.peek(parent).base is not None
    rows = [(*parent, t) for t in (3, 4, 5, 6)]
    before = lm.forward_calls
    with lm.transient(rows[1:]):
        got = lm.next_logprobs(rows)
    assert lm.forward_calls - before == 1
    for prefix, row in zip(rows, got, strict=True):
        assert np.abs(row - fresh(model, list(prefix))).max() < 1e-4
    assert rows[0] in lm._states and not any(r in lm._states for r in rows[1:])
    assert lm._transient == set()
    # The kept row's state: the parent's positions and its own token, extended once more.
    state = lm._states.peek(rows[0])
    assert state.shared == len(prompt) and state.own[0][0].shape[2] == len(parent) + 1 - 30
    fed = lm.fed_tokens
    nxt = lm.next_logprobs([(*rows[0], 7)])[0]
    assert lm.fed_tokens - fed == 1
    assert np.abs(nxt - fresh(model, [*rows[0], 7])).max() < 1e-4
    # Without the hint every sibling keeps a state of its own, which extends as a fresh
    # forward does.
    lm.next_logprobs([parent])
    kept = [(*parent, 8), (*parent, 9)]
    lm.next_logprobs(kept)
    assert all(k in lm._states for k in kept)
    fed = lm.fed_tokens
    for prefix, row in zip(kept, lm.next_logprobs([(*k, 1) for k in kept]), strict=True):
        assert np.abs(row - fresh(model, [*prefix, 1])).max() < 1e-4
    assert lm.fed_tokens - fed == 2


def test_the_row_cost_is_timed_once_outside_the_counters(tiny):
    """The cost model (lm/cost.py) times a few passes of this model at the first search
    that needs a width: the passes are not a request's, so no counter moves, and the
    width the request ran at is the one the cost gives."""
    model, tok = tiny
    lm = TransformersLM(model, tok)
    assert lm.row_cost is None
    c = at.constraints.choice(["abc", "ab", "ba", "cab"])
    res = at.generate(lm, "abc", c, method="exact", n=3, seed=0, max_new_tokens=6)
    assert lm.row_cost is not None and lm.row_cost >= 0
    assert res.stats["width"] == at.lm.cost.width_for(lm.row_cost)
    declared = TransformersLM(model, tok)
    declared.row_cost = lm.row_cost  # nothing timed
    again = at.generate(declared, "abc", c, method="exact", n=3, seed=0, max_new_tokens=6)
    assert again.samples == res.samples
    for counter in ("calls", "forward_calls", "fed_tokens"):
        assert getattr(lm, counter) == getattr(declared, counter) > 0, counter
