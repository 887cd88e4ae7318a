"""Hugging Face transformers backend: batched log-probs with a KV cache that follows the tree.

Samplers ask for prefixes that mostly extend, or branch off, prefixes asked for before. The
backend keeps the key/value tensors of recent prefixes (at most ``max_states`` of them and
``kv_cache_bytes`` in all, least recently used dropped first; each kept state owns its own
storage, so dropping it frees its memory); a new prefix starts from the kept state with the
longest common prefix, cropped to it, and only the remaining tokens are fed. A new state
refers to the leading positions it shares with its source's first state (``share_tokens``
or more: a prompt the walks share) instead of copying them, so the prompt is kept once; a
state whose base is dropped is dropped with it. Sharing is one level deep: a prompt whose own
state shares a longer prompt's positions (a system prompt) is not shared again, and its
walks copy the part it owns. Several
prefixes go in one forward pass: the kept states are left-padded to a common length and the
new tokens right-padded, with an attention mask and explicit positions, so each row computes
exactly what a lone forward over its prefix would (within float rounding, tested to 1e-4
in float32; in bfloat16 the rounding depends on how a state was built, up to 0.9 nats on
the default model). Where every row of a pass starts with one base's positions, the pass
holds them once and attends to them in place (:mod:`adaptrack.lm.shared_attention`), the
padding between them and each row's own positions.

Models with sliding-window layers (whose caches cannot be cropped) are run without reuse.
The kept states and how a pass assembles them are :mod:`adaptrack.lm.kv`; which
states are kept and which one a prefix starts from, :mod:`adaptrack.lm.kvkeep`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..cache import LRU
from ..errors import BackendError
from ..tokenization.vocab import Vocabulary
from .base import LanguageModel, Prefix
from .kv import KVState, batched_cache, pad_groups
from .kv import trim_heap as _trim_heap
from .kvkeep import StateKeeper

try:
    import torch

    from . import shared_attention as _shared
except ImportError:  # pragma: no cover - the error is raised by load_model
    torch = None  # type: ignore[assignment]

#: The default bounds of the kept KV states. The engine keeps many walks in flight (a
#: code benchmark's group: 8 prompts x 21 walks) and each step needs every walk's state:
#: a bound below the walks in flight drops states that the next step re-feeds in full
#: (measured: 8 HumanEval prompts x 20 samples went from past 300 s to 118 s).
KV_CACHE_BYTES = 4 << 30
#: The KV states one forward pass assembles (kept rows, left-padded to the pass's widest):
#: a pass holds them, their extension by the new tokens and the rows it keeps, so about
#: three times this at its peak.
PASS_KV_BYTES = 1 << 30
#: Bytes of KV tensors freed (states dropped, passes' batches) and seconds after which the C
#: heap's free pages go back to the system: tensors of a few MB come from the heap, and freed
#: ones kept there let a long run's resident memory grow past what it holds (measured: 12.8
#: GB resident for 7.1 GB in use after 13 minutes of TFv1Real). Each trim costs re-faulting
#: the pages the next passes need (trimming every pass made a benchmark 25 % slower), so
#: at most one per TRIM_SECONDS.
TRIM_BYTES = 2 << 30
TRIM_SECONDS = 5.0
#: New positions per row past which a pass copies a shared base into its rows rather than
#: attending to it in place (lm/shared_attention.py materializes every row's scores).
SHARED_MAX_STEPS = 16
#: A new state keeps a reference to its source's leading positions rather than a copy where
#: they are at least this many tokens (a shared prompt), and copies everything otherwise.
SHARE_TOKENS = 64
MAX_STATES = 1024
# Config fields that name the longest sequence a model was built for, in the order tried.
_CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length",
                   "seq_length", "n_ctx")


def context_length(config: Any) -> int | None:
    """The longest sequence a transformers config declares, or ``None`` if it names none.

    >>> from types import SimpleNamespace
    >>> context_length(SimpleNamespace(max_position_embeddings=8192))
    8192
    >>> context_length(SimpleNamespace()) is None
    True
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for field in _CONTEXT_FIELDS:
        value = getattr(text, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class TransformersLM(StateKeeper, LanguageModel):
    """A causal LM from ``transformers`` as an adaptrack model.

    ``model`` and ``tokenizer`` are already loaded (``load_model`` does that);
    ``max_batch`` bounds the rows of one forward pass; ``max_states`` and
    ``kv_cache_bytes`` (defaults 1024 and 4 GiB, on the model's device) bound the kept KV
    states, by count (a state other walks' states share is not counted) and by bytes
    (``kv_cache_bytes_used``, every byte; 0 turns reuse off). A state costs its
    prefix length times 2 x layers x KV heads x head size x bytes per number: 46 KB per
    token for SmolLM2-135M in float32, 128 KB for an 8B Llama 3 in float16.
    ``share_tokens`` (default 64): a new state shares, rather than copies, the positions it
    has in common with its source's base state where they are at least this many.
    ``pass_kv_bytes`` (default 1 GiB) bounds the kept states one forward pass assembles:
    rows beyond it go to further passes, which bounds a pass's memory (about three times
    this at its peak) when many rows reuse a long prompt.
    ``shared_attention`` (default True; models that use transformers' ``sdpa`` attention):
    rows of one pass whose states share one base's positions attend to them in place
    (``lm/shared_attention.py``) instead of each row carrying a copy; the log-probs agree
    with the copies' within float rounding (tested to 1e-5 in float32).
    ``context_length`` comes from the config (``max_position_embeddings`` or the like).
    ``vocab`` overrides the token bytes read from the tokenizer.
    Use :func:`adaptrack.load_model` rather than building one by hand.
    """

    probs_dtype = np.float32  # logits in float32 (or coarser): docs/design.md §3
    counters = ("calls", "forward_calls", "fed_tokens")

    def __init__(self, model: Any, tokenizer: Any, *, max_batch: int = 32,
                 max_states: int = MAX_STATES, kv_cache_bytes: int = KV_CACHE_BYTES,
                 pass_kv_bytes: int = PASS_KV_BYTES, share_tokens: int = SHARE_TOKENS,
                 shared_attention: bool = True, name: str | None = None,
                 vocab: Vocabulary | None = None) -> None:
        for arg, value, least in (("max_batch", max_batch, 1), ("max_states", max_states, 1),
                                  ("kv_cache_bytes", kv_cache_bytes, 0),
                                  ("pass_kv_bytes", pass_kv_bytes, 0),
                                  ("share_tokens", share_tokens, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{arg} must be an int >= {least}, got {value!r}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.name = str(name or getattr(model.config, "_name_or_path", None)
                        or type(model).__name__)
        if vocab is None:
            from ..tokenization.hf import vocabulary

            width = model.get_output_embeddings().weight.shape[0]
            vocab = vocabulary(tokenizer, logits_width=width, config=model.config,
                               generation_config=getattr(model, "generation_config", None))
        self.vocab = vocab
        self.device = next(model.parameters()).device
        self.max_batch, self.max_states = max_batch, max_states
        self.pass_kv_bytes, self.share_tokens = pass_kv_bytes, share_tokens
        self.context_length = context_length(model.config)
        types = getattr(model.config, "layer_types", None) or ()
        self.reuse = not any("sliding" in str(t) for t in types) and not getattr(
            model.config, "use_sliding_window", False) and kv_cache_bytes > 0
        self._states: LRU[Prefix, KVState] = LRU(kv_cache_bytes, size=lambda st: st.nbytes)
        # A batch whose rows all start with one base state's positions attends to them in
        # place (lm/shared_attention.py) instead of copying them into every row.
        self.shared_attention = (bool(shared_attention) and self.reuse
                                 and _shared.enable(model))
        # transformers 5 names the KV cache ``cache`` (argument and output) and drops
        # ``past_key_values``, which older releases take.
        forward = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"
        self._freed = 0  # KV bytes freed since the heap was last trimmed
        self._trimmed = time.monotonic()
        self.forward_calls = 0  # forward passes (a pass may serve several prefixes)
        self.fed_tokens = 0  # tokens fed through the model, prompt and re-feeds included
        self._transient: set[Prefix] = set()  # rows whose states are not kept (``transient``)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, with the BOS token exactly when the tokenizer adds one."""
        return list(self.tokenizer.encode(text))

    @property
    def kv_cache_bytes_used(self) -> int:
        """Bytes of the KV states kept now (at most ``kv_cache_bytes``)."""
        return self._states.used

    def clear_cache(self) -> None:
        """Forget every kept KV state (frees their memory)."""
        self._freed += self._states.used
        self._states.clear()
        self._trim()

    @contextmanager
    def transient(self, prefixes: Collection[Prefix]) -> Iterator[None]:
        """Within the block the states of ``prefixes`` are not kept, and their sources stay
        as they are: a row fetched only to fill a cache would otherwise copy its source's
        positions into a state of its own (7 ms for 160 positions of the default model on
        a CPU) and push out states that walks extend."""
        self._transient = {tuple(p) for p in prefixes}
        try:
            yield
        finally:
            self._transient = set()

    def _next_logprobs(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        out = np.empty((len(prefixes), self.vocab.size), dtype=np.float64)
        for prefix in prefixes:
            if not prefix:
                raise ValueError("the model needs at least one token of context: give a "
                                 "non-empty prompt")
        # Long re-feeds go alone so that short rows are not padded to their length.
        order = sorted(range(len(prefixes)), key=lambda i: len(prefixes[i]))
        for start in range(0, len(order), self.max_batch):
            rows = order[start:start + self.max_batch]
            out[rows] = self._within_memory([tuple(prefixes[i]) for i in rows])
        self._trim()
        return out

    def _logprobs_along_many(self, requests: list[tuple[Prefix, Prefix]]) -> list[np.ndarray]:
        if any(not p for p, _ in requests):
            raise ValueError("the model needs at least one token of context: give a "
                             "non-empty prompt")
        out: list[np.ndarray] = []
        for start in range(0, len(requests), self.max_batch):
            chunk = requests[start:start + self.max_batch]
            outputs = [len(toks) + 1 for _, toks in chunk]
            rows = self._within_memory([p + toks for p, toks in chunk], outputs)
            out += np.split(rows, np.cumsum(outputs)[:-1])
        self._trim()
        return out

    def _within_memory(self, prefixes: list[Prefix], outputs: list[int] | None = None
                       ) -> np.ndarray:
        """:meth:`_forward`; where the device runs out of memory, once more with no KV state
        kept (the states are a cache: dropping them changes no log-prob beyond float
        rounding), then a :class:`BackendError` that says what to lower. Processes that
        share a GPU (evaluation workers) each keep up to ``kv_cache_bytes`` there, so the
        one whose allocation fails frees its states and goes on."""
        for _ in range(2):
            try:
                with torch.inference_mode():
                    return self._forward(prefixes, outputs)
            except torch.cuda.OutOfMemoryError as err:
                message = str(err).splitlines()[0] if str(err) else "out of memory"
                # Out of the handler first: its traceback holds the failed pass's tensors.
            self.clear_cache()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        raise BackendError(
            f"transformers ran out of {self.device} memory in a pass of {len(prefixes)} "
            f"rows with no KV state kept ({message}); load the model with a smaller "
            "max_batch or pass_kv_bytes, share the device among fewer processes (adaptrack "
            "eval --workers), or use a smaller dtype")

    def _trim(self) -> None:
        """Once ``TRIM_BYTES`` of KV tensors were freed and ``TRIM_SECONDS`` passed, hand the
        heap's free pages back. KV tensors on a GPU are not on the C heap: no trim there."""
        if (self._freed >= TRIM_BYTES and self.device.type == "cpu"
                and time.monotonic() - self._trimmed >= TRIM_SECONDS):
            self._freed, self._trimmed = 0, time.monotonic()
            _trim_heap()

    def _forward(self, prefixes: list[Prefix], outputs: list[int] | None = None) -> np.ndarray:
        """Log-probs after each prefix; with ``outputs``, after each of the last
        ``outputs[r]`` positions of prefix ``r``, rows in order. One forward pass for rows
        of similar lengths to feed, one per group otherwise (:func:`pad_groups`)."""
        outs = outputs or [1] * len(prefixes)
        found = [self._source(p, k) for p, k in zip(prefixes, outs, strict=True)]
        groups = pad_groups([len(p) - n for p, (n, _, _) in zip(prefixes, found, strict=True)])
        groups = [part for group in groups for part in self._split_by_kv(group, found)]
        if len(groups) > 1:
            parts: list[np.ndarray] = [np.empty(0)] * len(prefixes)
            for group in groups:
                rows = self._forward_pass([prefixes[i] for i in group],
                                          [outs[i] for i in group])
                for i, part in zip(group, np.split(rows, np.cumsum([outs[i] for i in group])[:-1]),
                                   strict=True):
                    parts[i] = part
            return np.concatenate(parts)
        return self._forward_pass(prefixes, outs, found)

    def _split_by_kv(self, group: list[int], found: list[tuple[int, KVState | None, Prefix]]
                     ) -> list[list[int]]:
        """``group`` in passes whose assembled KV states stay within ``pass_kv_bytes``: rows
        that each reuse a long shared prompt would otherwise copy it once per row into one
        batch (20 rows of a 3 000-token prompt: 2.8 GB for the default model in float32).
        Longest kept states first, so rows of similar widths share a pass."""
        per_token = next((st.nbytes / st.own[0][0].shape[2] for _, st, _ in found
                          if st is not None and st.own[0][0].shape[2]), 0.0)
        if not per_token or len(group) == 1:
            return [group]
        # Rows that attend to one base's positions in place hold their own positions only.
        common = self._common_base([(found[i][0], found[i][1]) for i in group])
        skip = common[1] if common is not None else 0
        parts: list[list[int]] = []
        for i in sorted(group, key=lambda i: -found[i][0]):  # a part's first row is its widest
            if parts and (len(parts[-1]) + 1) * (found[parts[-1][0]][0] - skip) * per_token \
                    <= self.pass_kv_bytes:
                parts[-1].append(i)
            else:
                parts.append([i])
        return parts

    def _forward_pass(self, prefixes: list[Prefix], outs: list[int],
                      found: list[tuple[int, KVState | None, Prefix]] | None = None
                      ) -> np.ndarray:
        """:meth:`_forward` in one pass; ``found``: each prefix's :meth:`_source`."""
        if found is None:  # an earlier pass may have kept a better source
            found = [self._source(p, k) for p, k in zip(prefixes, outs, strict=True)]
        sources = [(n, st) for n, st, _ in found]
        kept = [n for n, _ in sources]
        new = [p[n:] for p, n in zip(prefixes, kept, strict=True)]
        width, steps = max(kept), max(len(t) for t in new)
        rows = len(prefixes)
        dev = self.device
        # Many new positions per row (a prefill, a long chain) amortize the copy, and their
        # scores would be materialized: those passes copy.
        common = self._common_base(sources) if width and steps <= SHARED_MAX_STEPS else None
        skip = common[1] if common is not None else 0  # the padding follows the shared part
        # Inputs are built on the host and moved once each: writing rows into device tensors
        # would be a host-to-device copy per row.
        ids = np.zeros((rows, steps), dtype=np.int64)
        mask = np.ones((rows, width + steps), dtype=np.int64)
        for r, (n, toks) in enumerate(zip(kept, new, strict=True)):
            ids[r, : len(toks)] = toks
            mask[r, skip: skip + width - n] = 0  # left padding of the kept state
        pos = np.asarray(kept, dtype=np.int64)[:, None] + np.arange(steps, dtype=np.int64)
        cache = self._batched_cache(sources, width, common) if width else None
        kwargs: dict[str, Any] = {"input_ids": torch.from_numpy(ids).to(dev),
                                  "position_ids": torch.from_numpy(pos).to(dev),
                                  "use_cache": self.reuse}
        if cache is not None:
            kwargs[self._cache_arg] = cache
        if rows > 1:  # one row has no padding, so no mask
            kwargs["attention_mask"] = torch.from_numpy(mask).to(dev)
        if rows == 1:
            out = self.model(**kwargs, logits_to_keep=outs[0])
            logits = out.logits[0, -outs[0]:]
        else:  # right padding: row r's outputs end at its last real token, len(new[r]) - 1
            row_ids = [r for r, k in enumerate(outs) for _ in range(k)]
            col_ids = [len(new[r]) - k + j for r, k in enumerate(outs) for j in range(k)]
            # The vocabulary projection only at the columns some row needs.
            cols = sorted(set(col_ids))
            out = self.model(**kwargs, logits_to_keep=torch.tensor(cols, device=dev))
            if len(cols) == 1 and len(row_ids) == rows:  # a decode step: one output per row
                logits = out.logits[:, 0]  # a view; the gather would copy rows x vocabulary
            else:
                at = {c: j for j, c in enumerate(cols)}
                logits = out.logits[torch.tensor(row_ids, device=dev),
                                    torch.tensor([at[c] for c in col_ids], device=dev)]
        self.forward_calls += 1
        self.fed_tokens += sum(len(t) for t in new)
        if common is not None and not _shared.all_attended(cache):
            # The model rebuilt its keys from the cache (latent attention) and never saw the
            # shared part: this pass is wrong; copies from now on.
            self.shared_attention = False
            return self._forward_pass(prefixes, outs, found)
        logprobs = torch.log_softmax(logits.float(), dim=-1).cpu().numpy()
        if self.reuse:
            passed = getattr(out, self._cache_arg)
            self._keep(prefixes, kept, new, width, passed, found, skip)
            self._freed += sum(2 * layer.keys.numel() * layer.keys.element_size()
                               for layer in passed.layers)
        return logprobs

    def _common_base(self, sources: list[tuple[int, KVState | None]]
                     ) -> tuple[KVState, int] | None:
        """The base state whose first P positions every row starts with, and P, where the
        pass can attend to them in place (P at least ``share_tokens``); else None."""
        if not self.shared_attention:
            return None
        n, st = sources[0]
        if (len(sources) > 1 and st is not None and st.base is not None
                and all(other is st and m == n for m, other in sources)
                and (len(sources) - 1) * (n - st.shared) >= st.shared):
            # Siblings (every row one state's first n positions): those once, its base's
            # and its own joined (one copy a pass), rather than its own copied per row.
            return st, n
        common: tuple[KVState, int] | None = None
        for n, st in sources:
            if st is None or not n:
                return None
            here = (st.base, min(n, st.shared)) if st.base is not None else (st, n)
            if common is None:
                common = here
            elif here[0] is not common[0] or here[1] != common[1]:
                return None
        return common if common is not None and common[1] >= self.share_tokens else None

    def _batched_cache(self, sources: list[tuple[int, KVState | None]], width: int,
                       common: tuple[KVState, int] | None = None) -> Any:
        """:func:`adaptrack.lm.kv.batched_cache` (a method: tests watch the passes)."""
        return batched_cache(sources, width, common)
