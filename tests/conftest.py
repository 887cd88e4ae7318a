"""Fixtures shared by several test files."""

from __future__ import annotations

import pytest

from adaptrack.tokenization.vocab import Vocabulary


@pytest.fixture(scope="session")
def default_vocab() -> Vocabulary:
    """The default model's vocabulary (49 152 ids), from its tokenizer alone.

    Fetches the model on first use (as tests/lm/test_default_model.py does) and converts it
    once, so that CI runs these tests on a fresh machine instead of skipping them.
    """
    transformers = pytest.importorskip("transformers", reason="the default model's tokenizer")
    from adaptrack.lm.default import default_gguf
    from adaptrack.lm.load import converted_gguf
    from adaptrack.tokenization.hf import vocabulary

    path = str(converted_gguf(default_gguf()))
    config = transformers.AutoConfig.from_pretrained(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return vocabulary(tokenizer, config.vocab_size, config)
