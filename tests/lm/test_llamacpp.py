"""LlamaCppLM on the default model: KV reuse equals fresh evaluation, vocab bytes, errors.

Skipped where llama-cpp-python is not installed (CI) or the default model is not set up.

What "equal" can mean with llama.cpp (0.3.36, CPU, the Q4_1 default model), measured:
- When the computation is the same, reuse is bitwise equal to a fresh evaluation: tokens
  appended to slots whose KV cells stay in position order, prefixes under 64 tokens.
  ``test_growing_branches_match_fresh_exactly`` asserts 1e-3 and sees 0.0.
- Otherwise llama.cpp itself is not reproducible to 1e-3: its CPU flash-attention kernel
  sums KV cells in cell order (into a float16 accumulator), so a token written into a
  cell another slot freed (after rewinds, evictions) is rounded differently; so are 64+
  new tokens (a tiled kernel) and caches used past 512 cells (a split kernel). Through 30
  layers of a Q4_1 model (activations quantized to 8 bits) this grows to up to ~1 nat in
  the log-prob of unlikely tokens, ~0.5 nat where p > 1e-3, total variation up to ~0.07
  (3 random walks, 150 rows). llama.cpp's flash vs. plain attention differ as much on
  plain prompts (0.5-0.6 nat, TV 0.01-0.06), and so do llama.cpp and the float32 model in
  transformers (0.5-0.6 nat, TV 0.02-0.055). Random walks therefore assert TV <= 0.15 and
  max |diff| <= 1 nat where p > 1e-3; a wrong KV state (wrong branch or position) gives
  differences of 10-20 nats.
"""

from __future__ import annotations

import ctypes
import random
import sys
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from adaptrack.errors import BackendError, ModelLoadError, PromptTooLongError
from adaptrack.lm.default import default_gguf
from adaptrack.lm.llamacpp import LlamaCppLM

EXACT = 1e-3
NOISE_TV, NOISE_NATS = 0.15, 1.0
THREADS = 1  # on a busy 2-core machine 2 OpenMP threads are several times slower
PROMPT = "def mean_squared_error(y, p):\n    \"\"\"MSE.\"\"\"\n    return"
TEXTS = [
    "def mean(xs):\n    return sum(xs) / len(xs)\n",
    "The capital of France is Paris.",
    "  leading spaces,\ttabs\r\nand CRLF\n\n\n",
    "naïve café, 中文字符, emoji 🙂🚀, ﬁ ligature",
    "<|im_start|>user<|im_end|> <repo_name> are plain text here",
    "x" * 50 + " " + "0123456789" * 5,
]


@pytest.fixture(scope="module")
def path() -> str:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed "
                        "(pip install 'adaptrack[llamacpp]')")
    try:
        return str(default_gguf(download=False))
    except ModelLoadError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def lm(path: str) -> LlamaCppLM:
    return LlamaCppLM(path, n_ctx=512, n_threads=THREADS, max_slots=4)


@pytest.fixture(scope="module")
def fresh(path: str):
    ref = LlamaCppLM(path, n_ctx=512, n_threads=THREADS, max_slots=1)

    def evaluate(prefix: tuple[int, ...]) -> np.ndarray:
        ref.clear_cache()
        return ref.next_logprobs([prefix])[0]

    return evaluate


def close(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal within llama.cpp's own numerical noise (see the module docstring)."""
    tv = 0.5 * np.abs(np.exp(got) - np.exp(want)).sum()
    likely = want > np.log(1e-3)
    return bool(tv <= NOISE_TV and np.abs(got - want)[likely].max() <= NOISE_NATS)


def test_growing_branches_match_fresh_exactly(path: str, fresh) -> None:
    lm = LlamaCppLM(path, n_ctx=512, n_threads=THREADS, max_slots=4)
    rng = random.Random(2)
    leaves = [tuple(lm.encode(PROMPT))]
    worst = float(np.abs(lm.next_logprobs(leaves)[0] - fresh(leaves[0])).max())
    for _ in range(8):  # extend every leaf, splitting while there are free slots
        per_leaf = 2 if 2 * len(leaves) <= lm.max_slots else 1
        batch = [(*leaf, rng.randrange(17, lm.vocab.size)) for leaf in leaves
                 for _ in range(per_leaf)]
        for p, row in zip(batch, lm.next_logprobs(batch), strict=True):
            worst = max(worst, float(np.abs(row - fresh(p)).max()))
        leaves = batch
    assert worst <= EXACT
    tree_tokens = len(leaves[0]) - 8 + 2 + 4 + 4 * 6  # the prompt, then 1, 2, 4, 4, ... leaves
    assert lm.fed_tokens == tree_tokens  # every token of the tree was fed exactly once


def test_kv_reuse_along_random_walks(lm: LlamaCppLM, fresh) -> None:
    rng = random.Random(0)
    prompt = tuple(lm.encode(PROMPT))
    visited = [prompt]
    fed_before, rows, exact = lm.fed_tokens, 0, 0

    def step(p: tuple[int, ...]) -> tuple[int, ...]:
        return (*p, rng.randrange(17, lm.vocab.size))

    for _ in range(16):
        kind = rng.choice(["extend", "extend", "back", "sibling", "batch"])
        last = visited[-1]
        if kind == "extend":
            batch = [step(last)]
        elif kind == "back":  # jump to a shorter prefix of some visited node, then extend
            node = rng.choice(visited)
            batch = [step(node[: rng.randint(len(prompt), len(node))])]
        elif kind == "sibling":
            node = rng.choice(visited)
            batch = [step(node[:-1]) if len(node) > len(prompt) else step(node)]
        else:  # several prefixes at once: extensions, siblings, a repeat and an old node
            batch = [step(last), step(last), step(rng.choice(visited)), last, rng.choice(visited)]
            batch += [step(batch[0]), batch[0]]
        got = lm.next_logprobs(batch)
        assert got.shape == (len(batch), lm.vocab.size)
        for p, row in zip(batch, got, strict=True):
            want = fresh(p)
            assert close(row, want), (kind, len(p), np.abs(row - want).max())
            rows, exact = rows + 1, exact + int(np.array_equal(row, want))
        visited += batch
    assert exact >= rows // 4  # most rows are bitwise equal, the rest within the noise
    # Reuse happened: far fewer tokens fed than the prefixes hold.
    assert lm.fed_tokens - fed_before < sum(map(len, visited)) / 4


def test_extension_feeds_one_token(lm: LlamaCppLM) -> None:
    p = tuple(lm.encode("Once upon a time"))
    lm.next_logprobs([p])
    before = lm.fed_tokens, lm.decode_calls
    lm.next_logprobs([(*p, 1000)])
    lm.next_logprobs([(*p, 1000, 2000), (*p, 1000, 3000), (*p, 1001)])
    assert (lm.fed_tokens - before[0], lm.decode_calls - before[1]) == (4, 2)


def test_full_cache_falls_back_and_evicts(path: str, fresh) -> None:
    small = LlamaCppLM(path, n_ctx=64, n_threads=THREADS, max_slots=4)
    rng = random.Random(1)
    prefixes = [tuple(rng.randrange(17, 49152) for _ in range(30)) for _ in range(4)]
    got = small.next_logprobs(prefixes)  # 120 new tokens > 64 cells: one at a time
    later = [prefixes[1], (*prefixes[2], 5000)]
    got2 = small.next_logprobs(later)  # needs room: evicts the least recently used slots
    for p, row in [*zip(prefixes, got, strict=True), *zip(later, got2, strict=True)]:
        assert close(row, fresh(p))


def test_vocab_bytes_match_text(lm: LlamaCppLM) -> None:
    v = lm.vocab
    assert v.size == len(v.token_bytes) == 49152
    assert all(v.token_bytes[i] is None for i in range(17))
    assert 2 in v.eos_ids.tolist()
    assert v.token_bytes[198] == b"\n" and v.token_bytes[17] == b"!"
    for text in TEXTS:
        ids = lm.encode(text)
        assert v.decode(ids) == text.encode(), text
        assert all(v.token_bytes[t] is not None for t in ids)  # no BOS, no specials parsed
    assert lm.encode("") == []


def test_shapes_and_normalization(lm: LlamaCppLM) -> None:
    p = tuple(lm.encode("Hello"))
    out = lm.next_logprobs([p, (*p, 11), p])
    assert out.shape == (3, lm.vocab.size) and out.dtype == np.float64
    assert np.allclose(np.exp(out).sum(axis=1), 1.0)
    assert np.array_equal(out[0], out[2])
    assert lm.next_logprobs([]).shape == (0, lm.vocab.size)


def test_errors(lm: LlamaCppLM, tmp_path, monkeypatch) -> None:
    with pytest.raises(PromptTooLongError, match=r"513 tokens exceeds .* larger n_ctx .*n_ctx=512"):
        lm.next_logprobs([(100,) * 513])
    assert lm.context_length == 512
    with pytest.raises(ValueError, match="non-empty"):
        lm.next_logprobs([()])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        lm.next_logprobs([(100, 49152)])
    assert lm.next_logprobs([(100, 101)]).shape == (1, lm.vocab.size)  # still usable
    with pytest.raises(ModelLoadError, match="no model file"):
        LlamaCppLM(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file" * 10)
    with pytest.raises(ModelLoadError, match="could not load"):
        LlamaCppLM(junk)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    with pytest.raises(ModelLoadError, match=r"pip install 'adaptrack\[llamacpp\]'"):
        LlamaCppLM(junk)


def test_logprobs_along_matches_fresh(path: str, fresh) -> None:
    """Fast-forward's short prefill: one llama_decode with outputs at every forced position."""
    lm = LlamaCppLM(path, n_ctx=512, n_threads=THREADS, max_slots=2)
    prompt = tuple(lm.encode(PROMPT))
    lm.next_logprobs([prompt])
    forced = tuple(lm.encode(".reduce_sum("))
    calls = lm.decode_calls
    rows = lm.logprobs_along(prompt, forced)
    assert lm.decode_calls == calls + 1
    assert rows.shape == (len(forced) + 1, lm.vocab.size)
    for i in range(len(forced) + 1):
        assert close(rows[i], fresh(prompt + forced[:i]))


def test_logprobs_along_many_in_one_decode(path: str, fresh) -> None:
    lm = LlamaCppLM(path, n_ctx=512, n_threads=THREADS, max_slots=4)
    prompt = tuple(lm.encode(PROMPT))
    lm.next_logprobs([prompt])
    requests = [(prompt, tuple(lm.encode(".math"))), ((*prompt, 30), ()),
                ((*prompt, 30, 1500), (1501, 1502))]
    calls = lm.decode_calls
    got = lm.logprobs_along_many(requests)
    assert lm.decode_calls == calls + 1
    for (prefix, chain), rows in zip(requests, got, strict=True):
        assert rows.shape == (len(chain) + 1, lm.vocab.size)
        for i in range(len(chain) + 1):
            assert close(rows[i], fresh(prefix + chain[:i]))


def fake_llama_cpp(n_ctx_train: int, decode_status: int) -> mock.MagicMock:
    """A stand-in for llama-cpp-python's low-level API: a 4-token vocabulary (``a``, ``b``,
    ``c``, EOS 3) whose ``llama_decode`` returns ``decode_status``. It runs the backend's
    own checks where llama-cpp-python is not installed."""
    ll = mock.MagicMock()
    ll.llama_token = ll.llama_pos = ll.llama_seq_id = ctypes.c_int32
    ll.llama_batch = lambda *args: SimpleNamespace(n_tokens=0)
    ll.LLAMA_TOKEN_ATTR_CONTROL, ll.LLAMA_TOKEN_ATTR_UNKNOWN, ll.LLAMA_TOKEN_ATTR_UNUSED = 1, 2, 4
    ll.llama_vocab_n_tokens.return_value = 4
    ll.llama_vocab_is_eog.side_effect = lambda v, t: t == 3
    ll.llama_vocab_eos.return_value, ll.llama_vocab_eot.return_value = 3, -1
    ll.llama_vocab_get_attr.return_value = 0
    ll.llama_vocab_bos.return_value, ll.llama_vocab_get_add_bos.return_value = -1, 0
    ll.llama_model_is_recurrent.return_value = ll.llama_model_is_hybrid.return_value = False
    ll.llama_model_n_ctx_train.return_value = n_ctx_train

    def piece(vocab, token, buf, size, lstrip, special):
        buf[0] = b"abc"[token : token + 1]
        return 1

    ll.llama_token_to_piece.side_effect = piece
    ll.llama_decode.return_value = decode_status
    return ll


@pytest.mark.parametrize(("n_ctx_train", "want", "hint"),
                         [(8192, 16, "larger n_ctx .now n_ctx=16, up to its trained context of "
                           "8192"), (8, 8, "trained on 8 tokens .n_ctx=16.")])
def test_context_length_without_llama_cpp(tmp_path, monkeypatch, n_ctx_train, want, hint):
    monkeypatch.setitem(sys.modules, "llama_cpp", fake_llama_cpp(n_ctx_train, 0))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    lm = LlamaCppLM(tmp_path / "m.gguf", n_ctx=16)
    assert lm.context_length == want and lm.vocab.size == 4
    with pytest.raises(PromptTooLongError, match=f"{want + 1} tokens exceeds .*{hint}"):
        lm.next_logprobs([(0,) * (want + 1)])
    with pytest.raises(PromptTooLongError):
        lm.logprobs_along((0,) * want, (1,))


@pytest.mark.parametrize(("status", "message"),
                         [(-1, r"^llama.cpp: llama_decode failed with status -1 \(its cache was "
                           r"cleared; verbose=True shows llama.cpp's log\)$"),
                          (1, r"^llama.cpp found no KV room for 2 tokens \(n_ctx=16\); load "
                           r"the model with a larger n_ctx$")])
def test_llama_decode_failures_are_backend_errors(tmp_path, monkeypatch, status, message):
    ll = fake_llama_cpp(8192, status)
    monkeypatch.setitem(sys.modules, "llama_cpp", ll)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    lm = LlamaCppLM(tmp_path / "m.gguf", n_ctx=16)
    with pytest.raises(BackendError, match=message):
        lm.next_logprobs([(0, 1)])
    assert ll.llama_memory_clear.called == (status == -1)
