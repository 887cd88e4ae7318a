"""The KV states a :class:`~adaptrack.lm.hf.TransformersLM` keeps between passes: which kept
state a new prefix starts from, and what a pass leaves kept (the policy the module doc of
:mod:`adaptrack.lm.hf` describes; the states themselves and how a pass assembles them are
:mod:`adaptrack.lm.kv`).
"""

from __future__ import annotations

from typing import Any

from ..cache import LRU
from .base import Prefix, common_prefix
from .kv import KVState, owned

try:
    import torch
except ImportError:  # pragma: no cover - the error is raised by load_model
    torch = None  # type: ignore[assignment]


class StateKeeper:
    """The kept-state half of :class:`~adaptrack.lm.hf.TransformersLM`, which sets the
    attributes below: ``_states`` (kept states by prefix, bounded by bytes), ``reuse``
    (whether states are kept at all), ``max_states`` and ``share_tokens`` (see the model's
    doc), ``_transient`` (prefixes whose states are not kept now) and ``_freed`` (KV bytes
    freed since the heap was last trimmed)."""

    _states: LRU[Prefix, KVState]
    _transient: set[Prefix]
    _freed: int
    reuse: bool
    max_states: int
    share_tokens: int

    def _source(self, prefix: Prefix, outputs: int = 1) -> tuple[int, KVState | None, Prefix]:
        """The kept state sharing the longest prefix with ``prefix``: the shared length
        (at most ``len(prefix) - outputs``: the tokens whose outputs we want must be fed),
        the state, and its tokens."""
        best, best_kv = 0, None
        best_tokens: Prefix = ()
        if self.reuse and outputs == 1:
            # The usual step: a walk extends its own prefix by one token. Its state, or one
            # of the prefix itself, is the longest usable one; no scan of every kept state.
            for tokens in (prefix[:-1], prefix):
                kv = self._states.peek(tuple(tokens))
                if kv is not None and len(tokens):
                    return len(prefix) - 1, kv, tuple(tokens)
        if self.reuse:
            for tokens, kv in self._states.items():
                # Only a state that agrees with the prefix at position ``best`` can share
                # more than ``best`` tokens: one comparison skips most of a scan over
                # hundreds of states, of which the binary search costs ~80 µs each.
                if best and (best >= len(tokens) or best >= len(prefix)
                             or tokens[best] != prefix[best]):
                    continue
                n = common_prefix(tokens, prefix)
                if n > best:
                    best, best_kv, best_tokens = n, kv, tokens
        return min(best, len(prefix) - outputs), best_kv, best_tokens

    def _keep(self, prefixes: list[Prefix], kept: list[int], new: list[Prefix], width: int,
              cache: Any, found: list[tuple[int, KVState | None, Prefix]], skip: int = 0) -> None:
        """Keep each row's state; ``skip``: the shared positions the pass's cache left out
        (its own columns start there)."""
        held = self._states.used
        for r, prefix in enumerate(prefixes):
            lo, hi = width - kept[r], width + len(new[r])
            source = found[r][1]
            if prefix in self._transient:
                continue
            if prefix in self._states:  # kept already, maybe as a base: replacing it would
                self._states.get(prefix)  # drop the states built on it
                continue
            base = None if source is None else source.base or source
            shared = 0 if source is None else min(kept[r], source.shared or kept[r])
            if base is None or shared < self.share_tokens:
                base, shared = None, 0
            lo, hi = lo + shared - skip, hi - skip
            if lo < 0:  # the pass read the source's own positions in place (siblings)
                assert source is not None
                m = skip - source.shared
                kv = [(torch.cat([k[:, :, :m], layer.keys[r:r + 1, :, :hi]], dim=2),
                       torch.cat([v[:, :, :m], layer.values[r:r + 1, :, :hi]], dim=2))
                      for (k, v), layer in zip(source.own, cache.layers, strict=True)]
            else:
                kv = owned([(layer.keys[r:r + 1, :, lo:hi], layer.values[r:r + 1, :, lo:hi])
                            for layer in cache.layers])
            state = KVState(prefix, base, shared, kv)
            held += state.nbytes
            self._states.put(prefix, state, trim=False)
        # A source that the new prefix extends is subsumed by it: cropping gives it back,
        # unless some state shares its positions. One it branched off stays, as recently
        # used (a shared prompt's state is one), and so does the base of one it used.
        bases = {id(st.base) for _, st in self._states.items() if st.base is not None}
        for prefix, (_, source, tokens) in zip(prefixes, found, strict=True):
            if source is None:
                continue
            if (len(tokens) < len(prefix) and prefix[: len(tokens)] == tokens
                    and id(source) not in bases and prefix not in self._transient):
                self._states.pop(tokens)
            else:
                self._states.get(tokens)
            if source.base is not None:
                self._states.get(source.base.key)
        self._states.trim()
        self._drop_orphans()
        # Bases do not count toward max_states (bytes bound them): dropping the oldest walk
        # states before a base that is touched with every use keeps the bound per walk.
        while True:
            bases = {id(st.base) for _, st in self._states.items() if st.base is not None}
            over = len(self._states) - len(bases) - self.max_states
            if over <= 0:
                break
            for key in self._states.keys():
                if over <= 0:
                    break
                if id(self._states.peek(key)) not in bases:
                    self._states.pop(key)
                    over -= 1
        self._freed += held - self._states.used

    def _drop_orphans(self) -> None:
        """Drop the states whose base was dropped: they would keep its memory uncounted."""
        orphans = [key for key, st in self._states.items()
                   if st.base is not None and self._states.peek(st.base.key) is not st.base]
        for key in orphans:
            self._states.pop(key)
