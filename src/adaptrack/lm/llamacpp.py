"""llama.cpp backend: full-vocabulary log-probs of a GGUF model, with KV reuse along the tree.

Built on llama-cpp-python's low-level API (not its ``Llama`` class). One context holds one
*unified* KV cache of ``n_ctx`` cells shared by ``max_slots`` llama.cpp sequences (seq ids),
and each slot remembers the tokens its KV holds. A prefix is served from the slot with the
longest common prefix. If that slot's tokens are a prefix of the request, it is extended in
place (``llama_memory_seq_rm`` only drops the last token when the slot already holds the
whole request: its logits must be recomputed). If the slot went down another branch, it is
kept and the shared part is copied into the least recently used slot with
``llama_memory_seq_cp``, which in a unified cache only tags the cells with a second seq id,
so jumping back to the old branch later is free. Only tokens past the shared part are fed.
All prefixes of one call go into one ``llama_decode``: a ``llama_batch`` with one seq id per
token and logits only at each sequence's last token. When the cache is full, the least
recently used slots are dropped; a batch too big to fit as a whole is decoded one prefix at
a time.

Numerics: reuse computes what a fresh evaluation computes, but llama.cpp's CPU kernels
round differently when a sequence's KV cells are not in position order (a new token can
land in a cell another slot freed), for 64+ new tokens at once (a tiled kernel) and once
the cache's used range reaches 512 cells (a split kernel). On the Q4_1 default model that
moves log-probs by up to ~1 nat on unlikely tokens (total variation up to ~0.07), as much
as llama.cpp's flash vs. plain attention differ, or llama.cpp vs. the float32 model.
Appending to branches whose cells stay in order is bitwise equal to a fresh evaluation
(tests/lm/test_llamacpp.py measures both).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendError, ModelLoadError
from ..tokenization.vocab import Vocabulary
from .base import LanguageModel, Prefix, common_prefix

INSTALL_HINT = "pip install 'adaptrack[llamacpp]' (builds llama-cpp-python from source, ~6 min)"


def _free(ll: Any, model: Any, ctx: Any) -> None:
    ll.llama_free(ctx)
    ll.llama_model_free(model)


def _load(ll: Any, path: Path, n_ctx: int, n_threads: int | None,
          max_slots: int) -> tuple[Any, Any]:
    """The model at ``path`` and a context of ``n_ctx`` cells in one unified KV cache for
    ``max_slots`` sequences (``ModelLoadError`` when either cannot be made)."""
    if not path.is_file():
        raise ModelLoadError(f"no model file at {path}")
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(path).encode(), ll.llama_model_default_params())
    if not model:
        raise ModelLoadError(f"llama.cpp could not load {path}: not a GGUF file, or a model "
                             "this llama.cpp build does not support (verbose=True shows why)")
    params = ll.llama_context_default_params()
    params.n_ctx = params.n_batch = n_ctx  # so one llama_decode can take any batch that fits
    params.n_ubatch = min(512, n_ctx)
    params.n_seq_max = max_slots
    params.n_threads = params.n_threads_batch = n_threads or max(1, (os.cpu_count() or 2) // 2)
    params.kv_unified = True  # slots share cells: a branch costs only its own tokens
    params.swa_full = True  # sliding-window layers keep every position, so we can rewind
    ctx = ll.llama_init_from_model(model, params)
    if not ctx:
        ll.llama_model_free(model)
        raise ModelLoadError(f"llama.cpp could not create a context (n_ctx={n_ctx}) for {path}")
    return model, ctx


class LlamaCppLM(LanguageModel):
    """A GGUF model run by llama.cpp on the CPU (or what llama-cpp-python was built for).

    ``n_ctx`` is the number of KV cells, shared by all ``max_slots`` kept prefixes (shared
    prefixes share cells), allocated once: the KV memory is fixed by it. ``context_length``,
    the longest prefix allowed, is ``n_ctx`` or the model's trained context if that is
    shorter. ``n_threads`` defaults to half the cores, like llama-cpp-python.
    ``verbose=False`` silences llama.cpp's log below errors (a process-wide setting of the
    ``llama-cpp-python`` logger). ``vocab.eos_ids`` are llama.cpp's end-of-generation
    tokens (0, 2 and 4 for the default model). Counters:
    ``decode_calls`` and ``fed_tokens``. Not thread-safe.
    """

    probs_dtype = np.float32  # logits in float32 (or coarser): docs/design.md §3
    counters = ("calls", "decode_calls", "fed_tokens")

    def __init__(self, path: str | os.PathLike[str], *, n_ctx: int = 4096,
                 n_threads: int | None = None, max_slots: int = 8,
                 verbose: bool = False) -> None:
        try:
            import llama_cpp as ll
        except ImportError as e:
            raise ModelLoadError(f"the llama.cpp backend needs llama-cpp-python: {INSTALL_HINT}"
                                 ) from e
        if n_ctx < 1 or max_slots < 1:
            raise ValueError(f"n_ctx and max_slots must be >= 1, got {n_ctx}, {max_slots}")
        self._ll, self.n_ctx, self.max_slots = ll, n_ctx, max_slots
        logging.getLogger("llama-cpp-python").setLevel(logging.DEBUG if verbose else logging.ERROR)
        model, ctx = _load(ll, Path(path), n_ctx, n_threads, max_slots)
        self._ctx, self._mem = ctx, ll.llama_get_memory(ctx)
        self._set_context_length(model)
        self._close = weakref.finalize(self, _free, ll, model, ctx)
        # Recurrent state cannot be cut back to a position: such models re-feed every prefix.
        self._rewind = not (ll.llama_model_is_recurrent(model) or ll.llama_model_is_hybrid(model))
        self._vocab_p = ll.llama_model_get_vocab(model)
        self.vocab = self._read_vocab()
        self._bos = ll.llama_vocab_bos(self._vocab_p)
        self._add_bos = bool(ll.llama_vocab_get_add_bos(self._vocab_p)) and self._bos >= 0
        self._slots: list[Prefix] = [()] * max_slots  # the tokens whose KV each seq id holds
        self._used = [0] * max_slots  # last use, for least-recently-used choices
        self._clock = itertools.count(1)
        self.decode_calls = 0  # llama_decode calls that succeeded
        self.fed_tokens = 0  # tokens fed through the model, prompt and re-feeds included
        self._make_batch()

    def _set_context_length(self, model: Any) -> None:
        """``context_length``: ``n_ctx``, or the model's trained context where shorter; and
        what to do about a prompt past it."""
        n_ctx, n_ctx_train = self.n_ctx, getattr(self._ll, "llama_model_n_ctx_train", None)
        trained = int(n_ctx_train(model)) if n_ctx_train is not None else 0
        self.context_length = min(n_ctx, trained) if trained > 0 else n_ctx
        if self.context_length == n_ctx and n_ctx != trained:
            upto = f", up to its trained context of {trained}" if trained > 0 else ""
            self._context_hint = f"load the model with a larger n_ctx (now n_ctx={n_ctx}{upto})"
        else:
            self._context_hint = (f"the model was trained on {trained} tokens (n_ctx={n_ctx}); "
                                  "shorten the prompt or lower max_new_tokens")

    def _make_batch(self) -> None:
        """The ``llama_batch`` every decode fills. It points into numpy arrays, so filling it
        is vectorized; each token's seq id pointer points at one entry of ``_seq_ids`` (one
        sequence per token)."""
        ll, n_ctx = self._ll, self.n_ctx
        self._tok, self._pos, self._n_seq = (np.zeros(n_ctx, np.int32) for _ in range(3))
        self._n_seq[:] = 1
        self._logits = np.zeros(n_ctx, np.int8)
        self._seq_ids = np.arange(self.max_slots, dtype=np.int32)
        self._seq_ptr = np.zeros(n_ctx, np.uintp)

        def ptr(a: np.ndarray, ctype: Any) -> Any:
            return a.ctypes.data_as(ctypes.POINTER(ctype))

        self._batch = ll.llama_batch(
            0, ptr(self._tok, ll.llama_token), None, ptr(self._pos, ll.llama_pos),
            ptr(self._n_seq, ctypes.c_int32), ptr(self._seq_ptr, ctypes.POINTER(ll.llama_seq_id)),
            ptr(self._logits, ctypes.c_int8))

    def _read_vocab(self) -> Vocabulary:
        """Raw bytes of every token from llama.cpp's token-to-piece (special=False gives the
        bytes of byte-level BPE and byte-fallback tokens); control, unknown and unused
        tokens and the end-of-generation tokens are special (``None``)."""
        ll, v = self._ll, self._vocab_p
        n_vocab = ll.llama_vocab_n_tokens(v)
        special = (ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_UNKNOWN
                   | ll.LLAMA_TOKEN_ATTR_UNUSED)
        eos = {t for t in range(n_vocab) if ll.llama_vocab_is_eog(v, t)}
        eos |= {t for t in (ll.llama_vocab_eos(v), ll.llama_vocab_eot(v)) if 0 <= t < n_vocab}
        buf = ctypes.create_string_buffer(256)
        token_bytes: list[bytes | None] = []
        for t in range(n_vocab):
            if t in eos or ll.llama_vocab_get_attr(v, t) & special:
                token_bytes.append(None)
                continue
            n = ll.llama_token_to_piece(v, t, buf, len(buf), 0, False)
            if n < 0:  # the piece is longer than the buffer: -n is its length
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(v, t, buf, len(buf), 0, False)
            token_bytes.append(buf.raw[:n] or None)
        # The logits have one column per token (llama.cpp does not pad them).
        return Vocabulary(token_bytes, sorted(eos), size=n_vocab)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special-token names tokenized as plain text. BOS is prepended
        exactly when the model's metadata asks for it (``add_bos``, as a Hugging Face
        tokenizer would); the default model's does not. BOS has no bytes, so
        ``vocab.decode(encode(text)) == text.encode()`` either way."""
        ll, data = self._ll, text.encode()
        cap = len(data) + 1
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self._vocab_p, data, len(data), buf, cap, False, False)
        if n < 0:  # never more tokens than bytes for BPE; -n is the count needed otherwise
            buf = (ll.llama_token * -n)()
            n = ll.llama_tokenize(self._vocab_p, data, len(data), buf, -n, False, False)
        return [self._bos] * self._add_bos + list(buf[:n])

    def clear_cache(self) -> None:
        """Forget every kept prefix (the next request is evaluated from scratch)."""
        self._ll.llama_memory_clear(self._mem, True)
        self._slots = [()] * self.max_slots

    def close(self) -> None:
        """Free the llama.cpp context and model now rather than at garbage collection."""
        self._close()

    def _next_logprobs(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        rows: dict[Prefix, int] = {}  # repeated prefixes are evaluated once
        for p in prefixes:
            p = tuple(p)
            if not p:
                raise ValueError("the model needs at least one token of context: give a "
                                 "non-empty prompt")
            rows.setdefault(p, len(rows))
        self._check_lengths([len(p) for p in rows])
        unique = list(rows)
        if not unique:
            return np.empty((0, self.vocab.size))
        out = np.concatenate([self._decode(unique[i:i + self.max_slots])
                              for i in range(0, len(unique), self.max_slots)])
        return out if len(unique) == len(prefixes) else out[[rows[tuple(p)] for p in prefixes]]

    def _logprobs_along_many(self, requests: list[tuple[Prefix, Prefix]]) -> list[np.ndarray]:
        for prefix, _ in requests:
            if not prefix:
                raise ValueError("the model needs at least one token of context: give a "
                                 "non-empty prompt")
        self._check_lengths([len(p) + len(toks) for p, toks in requests])
        out: list[np.ndarray] = []
        for start in range(0, len(requests), self.max_slots):
            chunk = requests[start:start + self.max_slots]
            outputs = [len(toks) + 1 for _, toks in chunk]
            rows = self._decode([p + toks for p, toks in chunk], outputs)
            out += np.split(rows, np.cumsum(outputs)[:-1])
        return out

    def _claim(self, p: Prefix, claimed: list[int], outputs: int = 1) -> tuple[int, int]:
        """Pick the seq id for ``p`` and cut its KV to the part shared with ``p``; return
        the seq id and the shared length (≤ len(p) - outputs: the tokens whose outputs we
        want are always fed)."""
        ll, mem = self._ll, self._mem
        best, key = 0, (-1, False)
        for s, toks in enumerate(self._slots):
            n = common_prefix(toks, p) if self._rewind else 0
            # the longest shared prefix first, then a slot that can grow in place
            k = (min(n, len(p) - outputs), s not in claimed and n == len(toks))
            if k > key:
                best, key = s, k
        n, in_place = key
        free = [s for s in range(self.max_slots) if s not in claimed and s != best]
        if in_place or not free:  # extend (or, with no other slot free, cut back) in place
            seq = best
            ll.llama_memory_seq_rm(mem, seq, n, -1)
        else:  # keep best's branch for later: start the least recently used slot from it
            seq = min(free, key=lambda s: (bool(self._slots[s]), self._used[s]))
            ll.llama_memory_seq_rm(mem, seq, -1, -1)
            if n:
                ll.llama_memory_seq_cp(mem, best, seq, 0, n)
        self._slots[seq], self._used[seq] = p[:n], next(self._clock)
        return seq, n

    def _decode(self, chunk: list[Prefix], outputs: list[int] | None = None) -> np.ndarray:
        """Log-probs after each prefix of ``chunk`` (at most ``max_slots``, distinct); with
        ``outputs``, after each of the last ``outputs[r]`` positions of prefix ``r``."""
        ll = self._ll
        outs = outputs or [1] * len(chunk)
        claimed: list[int] = []
        i = 0
        for p, want in zip(chunk, outs, strict=True):
            seq, n = self._claim(p, claimed, want)
            claimed.append(seq)
            k = len(p) - n
            if i + k > self.n_ctx:  # cannot fit in the cache together: one at a time
                return self._one_at_a_time(chunk, outs)
            self._tok[i:i + k] = p[n:]
            self._pos[i:i + k] = np.arange(n, len(p))
            self._seq_ptr[i:i + k] = self._seq_ids.ctypes.data + seq * self._seq_ids.itemsize
            self._logits[i:i + k] = 0
            self._logits[i + k - want:i + k] = 1
            i += k
        fed = self._tok[:i]
        if fed.min() < 0 or fed.max() >= self.vocab.size:
            bad = fed[(fed < 0) | (fed >= self.vocab.size)]
            raise ValueError(f"token ids {bad[:5].tolist()} are outside the vocabulary "
                             f"(0..{self.vocab.size - 1})")
        self._batch.n_tokens = i
        while (ret := ll.llama_decode(self._ctx, self._batch)) == 1:  # no room in the cache
            if not self._evict(claimed):
                if len(chunk) == 1:
                    raise BackendError(f"llama.cpp found no KV room for {len(chunk[0])} tokens "
                                       f"(n_ctx={self.n_ctx}); load the model with a larger "
                                       "n_ctx")
                return self._one_at_a_time(chunk, outs)
        if ret != 0:  # after a fatal error the cache holds an unknown part of the batch
            self.clear_cache()
            raise BackendError(f"llama.cpp: llama_decode failed with status {ret} (its cache "
                               "was cleared; verbose=True shows llama.cpp's log)")
        self.decode_calls += 1
        self.fed_tokens += i
        for seq, p in zip(claimed, chunk, strict=True):
            self._slots[seq] = p
        # Output rows come in batch order, one per prefix. The normalizer is computed in
        # float32 (summed in float64), which is twice as fast and changes results by ~1e-9.
        logits = np.ctypeslib.as_array(ll.llama_get_logits(self._ctx),
                                       shape=(sum(outs), self.vocab.size))
        top = logits.max(axis=1, keepdims=True)
        exp = np.exp(logits - top)
        lse = np.log(exp.sum(axis=1, keepdims=True, dtype=np.float64))
        out = logits.astype(np.float64)
        out -= top + lse
        return out

    def _one_at_a_time(self, chunk: list[Prefix], outs: list[int]) -> np.ndarray:
        return np.concatenate([self._decode([q], [w]) for q, w in zip(chunk, outs, strict=True)])

    def _evict(self, claimed: list[int]) -> bool:
        """Drop the least recently used slot that this batch does not use; False if none."""
        kept = [s for s in range(self.max_slots) if s not in claimed and self._slots[s]]
        if not kept:
            return False
        s = min(kept, key=self._used.__getitem__)
        self._ll.llama_memory_seq_rm(self._mem, s, -1, -1)
        self._slots[s] = ()
        return True
