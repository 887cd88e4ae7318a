"""Attention over a prefix that every row of a batch shares, without copying it per row.

The transformers backend's walks continue one prompt (docs/design.md §4, KV states): a
batch of 32 walks of a 700-token prompt would copy that prompt's keys and values into every
row twice per step (once to assemble the batch, once when the layer appends the new
tokens), about 2 GB per step for the default model in float32. Here the batch's cache
holds each row's own positions only, and the shared positions once: queries of all rows
meet the shared keys in one matrix product (the KV heads are the batch), then the row's
own keys, under one softmax over both (the additive mask included), as
``softmax(q·[K_shared, K_own]ᵀ · scale) · [V_shared, V_own]``: the same attention, in
another order of float operations.

Failure cases, each handled: a model whose attention rebuilds its keys from the cache
(latent attention) loses the tag on the way, which :func:`all_attended` detects after the
pass (the backend then runs it again with copies and stops using this path); attention
options this path does not implement (soft-capping, sliding windows, sinks) copy the
shared part in front and leave the call to sdpa.

:func:`enable` registers the attention function with transformers
(``AttentionInterface``) in place of ``sdpa`` for one model (its config then names it); it
falls back to transformers' own ``sdpa`` for every call whose keys carry no shared part, so
the model computes bit for bit as before wherever a shared layer is not used.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import torch

NAME = "adaptrack_shared_sdpa"
#: The attribute of a layer's returned key tensor that holds its :class:`Shared` part.
_TAG = "_adaptrack_shared"
#: Keyword arguments of transformers' attention contract that the in-place path does not
#: implement: with any of them set, the shared part is copied in front and sdpa decides.
_UNSUPPORTED = ("softcap", "sliding_window", "position_bias", "s_aux")


class Shared:
    """Keys and values ``[1, kv_heads, P, head_dim]`` that every row of a pass starts with;
    ``attended`` records that an attention call read them (a model that rebuilt its keys
    from the cache, as latent-attention models do, would drop the tag: see
    :func:`all_attended`)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values, self.attended = keys, values, False


def start_layer(layer: Any, keys: torch.Tensor, values: torch.Tensor) -> None:
    """``layer.lazy_initialization`` across transformers releases (before 4.57 it takes the
    keys only), then ``keys`` and ``values`` as the layer's tensors."""
    if _takes_values(layer.__class__):
        layer.lazy_initialization(keys, values)
    else:
        layer.lazy_initialization(keys)
    layer.keys, layer.values = keys, values


@cache
def _takes_values(layer_type: Any) -> bool:
    """Whether ``layer_type.lazy_initialization`` takes the values too (asked once per type:
    every layer of every pass starts here)."""
    import inspect

    return len(inspect.signature(layer_type.lazy_initialization).parameters) >= 3  # self too


@cache
def _layer_class() -> Any:
    from transformers.cache_utils import DynamicLayer

    class SharedPrefixLayer(DynamicLayer):
        """See :func:`shared_layer`."""

        shared: Shared

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
                   *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            assert self.keys is not None and self.values is not None
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            keys = self.keys.view_as(self.keys)  # a tensor object of its own carries the tag
            setattr(keys, _TAG, self.shared)
            return keys, self.values

        def get_seq_length(self) -> int:
            own = 0 if self.keys is None else self.keys.shape[-2]
            return int(self.shared.keys.shape[-2] + own)

    return SharedPrefixLayer


def shared_layer(shared: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor,
                 values: torch.Tensor) -> Any:
    """A cache layer of ``shared`` (keys and values ``[1, kv_heads, P, head_dim]``, every
    row's first P positions) and ``keys``/``values`` (``[rows, kv_heads, W, head_dim]``,
    each row's own positions after them, left-padded to W). It reports P + W cached
    positions, so the model's mask and cache positions span both; the attention mask's
    columns are the shared positions, then the own ones."""
    layer = _layer_class()()
    start_layer(layer, keys, values)
    layer.shared = Shared(*shared)
    return layer


@cache
def _sdpa() -> Callable[..., tuple[torch.Tensor, None]]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def all_attended(cache: Any) -> bool:
    """Whether every shared layer of ``cache`` reached :func:`attention` with its tag; if
    not, the pass attended to the rows' own positions only and must be run again with
    copies."""
    return all(layer.shared.attended for layer in cache.layers if hasattr(layer, "shared"))


def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0,
              scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract (``query [B, H, q, D]``, keys and values
    ``[B, KV, L, D]``, output ``[B, q, H, D]``); keys tagged by :func:`shared_layer` also
    attend to the shared positions in front of ``key``. Scores and their softmax are
    computed in float32 whatever the model's precision."""
    sdpa_attention_forward = _sdpa()
    shared: Shared | None = getattr(key, _TAG, None)
    if shared is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    shared.attended = True
    rows = query.shape[0]
    if any(kwargs.get(name) is not None for name in _UNSUPPORTED) or dropout:
        full_k = torch.cat([shared.keys.expand(rows, -1, -1, -1), key], dim=2)
        full_v = torch.cat([shared.values.expand(rows, -1, -1, -1), value], dim=2)
        return sdpa_attention_forward(module, query, full_k, full_v, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    _, heads, q, d = query.shape
    kv_heads, p = key.shape[1], shared.keys.shape[2]
    groups = heads // kv_heads
    scale = scaling if scaling is not None else d ** -0.5
    # Query heads that read one KV head side by side ([B, KV, g*q, D]), and all rows' of one
    # KV head together ([KV, B*g*q, D]): the shared keys then serve every row in one product.
    grouped = (query.float() * scale).reshape(rows, kv_heads, groups * q, d)
    stacked = grouped.transpose(0, 1).reshape(kv_heads, rows * groups * q, d)
    to_shared = torch.matmul(stacked, shared.keys[0].float().transpose(1, 2))
    to_shared = to_shared.view(kv_heads, rows, groups * q, p).transpose(0, 1)
    to_own = torch.matmul(grouped, key.float().transpose(2, 3))
    scores = torch.cat([to_shared, to_own], dim=-1).view(rows, heads, q, -1)
    length = scores.shape[-1]
    if attention_mask is None:  # causal among the new positions, the last q
        if q > 1:
            cols = torch.arange(length, device=scores.device)
            rows_at = torch.arange(length - q, length, device=scores.device)[:, None]
            scores = scores.masked_fill(cols > rows_at, float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask[..., :length], float("-inf"))
    else:
        scores = scores + attention_mask[..., :length].float()
    probs = torch.softmax(scores, dim=-1).view(rows, kv_heads, groups * q, length)
    from_shared = probs[..., :p].transpose(0, 1).reshape(kv_heads, rows * groups * q, p)
    out = torch.matmul(from_shared, shared.values[0].float())
    out = out.view(kv_heads, rows, groups * q, -1).transpose(0, 1)
    out = out + torch.matmul(probs[..., p:], value.float())
    out = out.to(query.dtype).reshape(rows, heads, q, -1)
    return out.transpose(1, 2).contiguous(), None


def enable(model: Any) -> bool:
    """Route ``model``'s attention through :func:`attention` (where it uses ``sdpa``; any
    other implementation is left alone). Whether :func:`shared_layer` may be used."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        model.set_attn_implementation(NAME)
    except (ImportError, AttributeError, ValueError, TypeError):
        return False
    return bool(config._attn_implementation == NAME)  # type: ignore[union-attr]


__all__ = ["NAME", "Shared", "all_attended", "attention", "enable", "shared_layer",
           "start_layer"]
