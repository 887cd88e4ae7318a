"""The transformers backend on CUDA: the same samples as on a CPU, exact's fit to its target,
and no host-device copy per row or token beyond the log-probs.

Each test runs on every device torch has: the CPU variant runs everywhere (CI), the CUDA one
is skipped without a GPU and runs the same code on one (benchmarks/gpu.py measures speed).
"""

from __future__ import annotations

import copy
import random
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from stats import chi_square_p, counts

torch = pytest.importorskip("torch", reason="the transformers backend needs torch")
transformers = pytest.importorskip("transformers", reason="needs transformers")

import adaptrack as at  # noqa: E402
from adaptrack.lm.hf import TransformersLM  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]
WORDS = ["abc", "ab", "ba", "cab", "a", "bca"]


def byte_tokenizer():
    from test_transformers import byte_tokenizer as make

    return make()


@pytest.fixture(scope="module")
def cpu_model():
    """A tiny randomly initialized Llama in float32 on the CPU and its tokenizer; its
    next-token distributions are far from uniform (weights scaled up), so that samples
    depend on the model."""
    torch.manual_seed(0)
    tok = byte_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=len(tok) - 1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4)
    return model, tok


def on(device: str, cpu_model) -> TransformersLM:
    model, tok = cpu_model
    return TransformersLM(copy.deepcopy(model).to(device), tok, max_batch=8)


@pytest.mark.parametrize("device", DEVICES)
def test_log_probs_and_samples_match_the_cpu_model(cpu_model, device):
    """float32 on the device against float32 on the CPU: log-probs along random tree walks
    within float tolerance, and the same samples for a seed, every method."""
    lm, ref = on(device, cpu_model), on("cpu", cpu_model)
    assert lm.device.type == device
    rng = random.Random(0)
    walks = [tuple(rng.randrange(200) for _ in range(30))] * 6
    for _ in range(6):
        walks = [(*w[:len(w) - rng.choice([0, 0, 2])], *(rng.randrange(200) for _ in
                  range(rng.choice([1, 1, 3])))) for w in walks]
        got, want = lm.next_logprobs(walks), ref.next_logprobs(walks)
        assert np.abs(got - want).max() < 1e-4
    c = at.constraints.choice(WORDS)
    for method in ("unconstrained", "cd", "adaptrack", "exact"):
        a, b = (at.generate(x, "ab ab", None if method == "unconstrained" else c,
                            method=method, n=12, seed=3, max_new_tokens=5) for x in (lm, ref))
        assert [s.tokens for s in a.samples] == [s.tokens for s in b.samples], method


@pytest.mark.parametrize("device", DEVICES)
def test_exact_fits_its_target_on_the_device(cpu_model, device):
    """Chi-square of 4 000 ``exact`` samples against the enumerated target (tests/stats.py,
    p > 1e-3 as in tests/sampling/test_distribution.py); the target equals the CPU model's."""
    lm = on(device, cpu_model)
    c = at.constraints.choice(WORDS)
    target = at.exact_distribution(lm, "ab ab", c, max_new_tokens=4)
    cpu = at.exact_distribution(on("cpu", cpu_model), "ab ab", c, max_new_tokens=4)
    assert target.keys() == cpu.keys()
    assert max(abs(target[k] - cpu[k]) for k in target) < 1e-5
    assert max(target.values()) < 0.9  # a target the sampler can miss
    res = at.generate(lm, "ab ab", c, method="exact", n=4000, seed=7, max_new_tokens=4)
    p = chi_square_p(counts(res), target)
    assert p > 1e-3, f"exact on {device}: chi-square p = {p:.2e}"


# Tensor methods that copy a device tensor to the host (each waits for the device).
TO_HOST = ("cpu", "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")
PACKAGE = str(Path(at.__file__).parent)


@pytest.mark.parametrize("device", DEVICES)
def test_no_host_device_copy_per_row_or_token_beyond_the_log_probs(cpu_model, device,
                                                                   monkeypatch):
    """Counted by wrapping the torch calls that move data between host and device, where
    adaptrack's own code calls them (transformers' internals are not ours to change). The
    same calls run whatever the device, so the CPU variant guards the CUDA path: per
    forward pass one copy to the host (the log-probs, then viewed as numpy) and a fixed
    number of small inputs to the device, however many rows the pass has."""
    lm = on(device, cpu_model)
    calls: Counter[str] = Counter()

    def ours() -> bool:
        return sys._getframe(2).f_code.co_filename.startswith(PACKAGE)

    def wrap(owner, name, label):
        inner = getattr(owner, name)

        def counted(*args, **kwargs):
            if ours():
                calls[label] += 1
            return inner(*args, **kwargs)
        monkeypatch.setattr(owner, name, counted)

    for name in TO_HOST:
        wrap(torch.Tensor, name, name)
    wrap(torch.Tensor, "to", "to device")
    wrap(torch, "tensor", "to device")  # a tensor from a Python list, wherever it is made
    # An index tensor or a row written from the host; on the device arange needs no copy.
    inner_arange = torch.arange

    def arange(*args, **kwargs):
        if "device" not in kwargs and ours():
            calls["to device"] += 1
        return inner_arange(*args, **kwargs)
    monkeypatch.setattr(torch, "arange", arange)

    c = at.constraints.choice(WORDS)
    res = at.generate(lm, "ab ab", None, method="unconstrained", n=8, seed=0,
                      max_new_tokens=6)
    res_cd = at.generate(lm, "ab ba", c, method="cd", n=8, seed=0, max_new_tokens=5)
    passes = lm.forward_calls
    rows = res.stats["lm_calls"] + res_cd.stats["lm_calls"]
    assert rows >= 3 * passes  # several rows per pass: a copy per row would show
    assert calls["cpu"] == passes and calls["numpy"] == passes
    assert sum(calls[name] for name in TO_HOST if name not in ("cpu", "numpy")) == 0, calls
    assert calls["to device"] <= 6 * passes, calls


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_walks_of_a_shared_prompt_on_the_device(cpu_model, device, monkeypatch):
    """The benchmark's setting on a tiny model: bfloat16 on the device, walks of one prompt
    attending to it in place; rows near a fresh bfloat16 forward (bfloat16 rounding depends
    on the path: 0.1 nats, as tests/lm/test_transformers.py allows) and kept states stay in
    bfloat16 on the device."""
    model, tok = cpu_model
    half = copy.deepcopy(model).to(device=device, dtype=torch.bfloat16)
    lm = TransformersLM(half, tok)
    assert lm.shared_attention
    in_place = []
    built = lm._batched_cache
    monkeypatch.setattr(lm, "_batched_cache", lambda s, w, c=None: in_place.append(
        c is not None) or built(s, w, c))
    rng = random.Random(1)
    prompt = tuple(rng.randrange(200) for _ in range(80))
    lm.next_logprobs([prompt])
    walks = [prompt] * 6
    for _ in range(4):
        walks = [(*w, rng.randrange(200)) for w in walks]
        got = lm.next_logprobs(walks)
        for prefix, row in zip(walks, got, strict=True):
            with torch.inference_mode():
                logits = half(torch.tensor([prefix], device=device)).logits[0, -1]
            want = torch.log_softmax(logits.float(), -1).cpu().numpy()
            assert np.abs(row - want).max() < 0.1
        assert np.abs(got[0] - got[1]).max() > 0.5  # walks differ by far more than that
    assert sum(in_place) >= 3
    for _, state in lm._states.items():
        assert all(t.dtype == torch.bfloat16 and t.device.type == device
                   for pair in state.own for t in pair)
