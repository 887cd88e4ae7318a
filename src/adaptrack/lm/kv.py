"""The KV states the transformers backend keeps (:mod:`adaptrack.lm.hf`), and how a
forward pass assembles them: a kept state and the base positions it shares
(docs/design.md §4, KV states follow the tree), its bytes, storage of its own, the batch's
cache built from kept states, passes of similar lengths, and freed memory handed back.

>>> pad_groups([1, 45, 1, 1])                  # three decode steps and a prefill
[[0, 2, 3], [1]]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

try:
    import torch

    from . import shared_attention as _shared
except ImportError:  # pragma: no cover - the error is raised by load_model
    torch = None  # type: ignore[assignment]

KV = list[tuple[Any, Any]]  # per layer (keys, values), each (1, heads, length, head_dim)


@dataclass(eq=False)
class KVState:
    """A kept KV state of ``key``: its first ``shared`` positions are those of ``base`` (a
    kept state of a prefix of ``key`` that has no base of its own), the rest are ``own``.
    Walks that share a long prompt then keep it once, not once per walk."""

    key: tuple[int, ...]
    base: KVState | None
    shared: int
    own: KV

    @property
    def nbytes(self) -> int:
        return kv_bytes(self.own)

    def layer(self, i: int, n: int) -> list[tuple[Any, Any]]:
        """Layer ``i``'s (keys, values) of the first ``n`` positions, as one or two pieces
        in order (views, no copy)."""
        if self.base is None:
            return [(self.own[i][0][:, :, :n], self.own[i][1][:, :, :n])]
        head = min(n, self.shared)
        pieces = [(self.base.own[i][0][:, :, :head], self.base.own[i][1][:, :, :head])]
        if n > head:
            rest = n - head
            pieces.append((self.own[i][0][:, :, :rest], self.own[i][1][:, :, :rest]))
        return pieces


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; a no-op
    elsewhere)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        _MALLOC_TRIM = False
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim
            except (OSError, AttributeError):  # not glibc
                pass
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM: Any = None


def kv_bytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def owned(kv: KV) -> KV:
    """``kv`` in storage of its own: a slice of a batch's cache would keep the whole batch's
    tensors alive for as long as the state is kept. A state that already fills its storage
    (a lone row) is kept as is; otherwise all layers go into one new tensor (one copy)."""
    k0 = kv[0][0]
    if all(t.untyped_storage().nbytes() == t.numel() * t.element_size()
           for pair in kv for t in pair):
        return kv
    if all(t.shape == k0.shape and t.dtype == k0.dtype for pair in kv for t in pair):
        both = torch.stack([t for pair in kv for t in pair])
        return [(both[2 * i], both[2 * i + 1]) for i in range(len(kv))]
    return [(k.clone(), v.clone()) for k, v in kv]


#: Padding a forward pass may add before its rows are split into passes of similar lengths:
#: tokens fed for padding at most this many, or at most as many as the real tokens.
PAD_SLACK = 16


def pad_groups(lengths: Sequence[int], slack: int = PAD_SLACK) -> list[list[int]]:
    """Rows (indices into ``lengths``, the tokens each row feeds) split into forward passes
    of similar lengths, shortest first: a pass pads every row to its longest, so a prompt's
    prefill batched with one-token decode steps would feed the prompt's length in every
    row. A row joins the current pass while the padding stays within ``slack`` tokens or
    the real tokens fed; the cost a pass saves is then larger than one pass's overhead.

    >>> pad_groups([1, 45, 1, 1])                  # three decode steps and a prefill
    [[0, 2, 3], [1]]
    >>> pad_groups([3, 4, 5, 1])
    [[3, 0, 1, 2]]
    """
    groups: list[list[int]] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        n = lengths[i]
        if groups:
            rows = len(groups[-1]) + 1
            padding = rows * n - (real + n)
            if padding <= max(slack, real + n):
                groups[-1].append(i)
                real += n
                continue
        groups.append([i])
        real = n
    return groups


def batched_cache(sources: list[tuple[int, KVState | None]], width: int,
                  common: tuple[KVState, int] | None = None) -> Any:
    """The kept states of ``sources`` (each row's kept length and state) as one batch's
    cache, left-padded to ``width``; with ``common`` (the base state every row starts with,
    and how many of its positions), its shared part once and each row's own positions after
    it (lm/shared_attention.py); ``common`` may be a state with a base of its own (rows
    that are all one state's first positions: siblings), whose two parts are then joined
    once."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    ref = next(st for _, st in sources if st is not None)
    cache = DynamicCache()
    if common is not None:
        base, p = common
        for layer in range(len(ref.own)):
            k0, v0 = ref.own[layer]
            keys = k0.new_zeros((len(sources), k0.shape[1], width - p, k0.shape[3]))
            values = v0.new_zeros((len(sources), v0.shape[1], width - p, v0.shape[3]))
            for r, (n, state) in enumerate(sources):
                if n > p:  # a base state used as is has no own positions past p
                    own_k, own_v = state.own[layer]  # type: ignore[union-attr]
                    keys[r, :, width - n:] = own_k[0, :, :n - p]
                    values[r, :, width - n:] = own_v[0, :, :n - p]
            pieces = base.layer(layer, p)  # two when a state with a base of its own
            shared = pieces[0] if len(pieces) == 1 else (
                torch.cat([k for k, _ in pieces], dim=2), torch.cat([v for _, v in pieces], dim=2))
            cache.layers.append(_shared.shared_layer(shared, keys, values))
        return cache
    for layer in range(len(ref.own)):
        k0, v0 = ref.own[layer]
        n, state = sources[0]
        pieces = state.layer(layer, n) if state is not None else []
        if len(sources) == 1 and len(pieces) == 1:  # one row fills the width: a view
            keys, values = pieces[0]
        elif len(sources) == 1:  # a shared part and the row's own: one copy, no padding
            keys = torch.cat([k for k, _ in pieces], dim=2)
            values = torch.cat([v for _, v in pieces], dim=2)
        else:  # each row copied once into place, left-padded; the mask hides the padding
            keys = k0.new_zeros((len(sources), k0.shape[1], width, k0.shape[3]))
            values = v0.new_zeros((len(sources), v0.shape[1], width, v0.shape[3]))
            for r, (n, state) in enumerate(sources):
                if state is None or not n:
                    continue
                at = width - n
                for k, v in state.layer(layer, n):
                    keys[r, :, at:at + k.shape[2]] = k[0]
                    values[r, :, at:at + k.shape[2]] = v[0]
                    at += k.shape[2]
        # Set the tensors directly: building the cache through ``update`` would copy
        # every kept state once more.
        kept = DynamicLayer()
        _shared.start_layer(kept, keys, values)
        cache.layers.append(kept)
    return cache
