"""Fast-forward: feeding the bytes a constraint forces as canonical tokens (docs/design.md
§2, fast-forward; llguidance's documentation of fast-forward tokens).

:class:`FastForward` holds the options ``generate`` takes; :func:`forced_tokens` is the
mechanism: the constraint's forced bytes, tokenized as the model's tokenizer would
(:meth:`~adaptrack.tokenization.tokenizer.Tokenizer.tokenize_partial_with`), holding back
final tokens that a longer token the constraint allows could span. A chain of such tokens
is fed in one model call either way; ``force`` says whether its tokens are then the only
valid ones (the target conditioned on canonical tokenization) or only prefilled (every
valid token stays valid: the target is unchanged and the chain's distributions are ready
for the walks that follow it).
"""

from __future__ import annotations

import inspect
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from ..constraints.base import Matcher, State
from ..tokenization.tokenizer import Tokenizer


@dataclass(frozen=True)
class FastForward:
    """Fast-forward options. Forced bytes become the canonical tokens of ``tokenizer``
    (default: the model's), holding back final tokens while an allowed longer token starting
    within the last ``max_tokens`` of them could span their end (``conservative``: any
    longer token, allowed or not; ``max_tokens=0``: never hold back). The tokenizer sees its
    ``context_tokens`` last tokens before the forced bytes.

    ``force``: ``True`` makes a forced token the only valid one at its position, so the
    target is conditioned on forced bytes being tokenized canonically (llguidance's
    behaviour); ``False`` only prefills the chain, so the target is the one without
    fast-forward and a walk that follows the canonical tokens finds their distributions
    computed; ``None`` lets the method choose (``generate``: ``cd`` forces, ``asap``,
    ``adaptrack`` and ``exact`` prefill; a :class:`~adaptrack.sampling.tree.PrefixTree`
    built directly forces).

    Where the tokenizer cannot encode the forced bytes (a
    :class:`~adaptrack.errors.TokenizerError`: a tokenizer that does not reproduce its
    text, such as a SentencePiece one that prepends a space, or bytes no token starts)
    they have no canonical tokenization, so that prefix gets no chain and every valid token
    stays valid there, forced or not; ``stats["ff_unencodable"]`` counts such prefixes. An
    error of the constraint is never taken for this: it reaches the caller.

    >>> FastForward(max_tokens=2).conservative, FastForward().force
    (False, None)
    """

    max_tokens: int = 4
    conservative: bool = False
    tokenizer: Tokenizer | None = None
    force: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise TypeError(f"FastForward needs an int max_tokens, got {self.max_tokens!r}")
        if self.max_tokens < 0:
            raise ValueError(f"FastForward needs max_tokens >= 0, got {self.max_tokens}")
        if self.force is not None and not isinstance(self.force, bool):
            raise TypeError(f"FastForward needs force True, False or None, got {self.force!r}")


def forced_bytes(matcher: Matcher, state: State, limit: int | None) -> bytes:
    """``matcher.forced_bytes(state, limit)``, for matchers that take the limit; a matcher
    without it gives every forced byte, cut here to ``limit``."""
    if limit is None:
        return bytes(matcher.forced_bytes(state))
    if _takes_limit(type(matcher)):
        return bytes(matcher.forced_bytes(state, limit=limit))[:limit]
    return bytes(matcher.forced_bytes(state))[:limit]


@cache
def _takes_limit(kind: type[Matcher]) -> bool:
    try:
        params = inspect.signature(kind.forced_bytes).parameters
    except (TypeError, ValueError):
        return False
    return "limit" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _intersects(allowed: np.ndarray, ids: np.ndarray) -> bool:
    """Whether ``ids`` (any order) and the sorted ``allowed`` share an element."""
    if not len(allowed) or not len(ids):
        return False
    pos = np.searchsorted(allowed, ids)
    pos[pos == len(allowed)] = len(allowed) - 1
    return bool(np.any(allowed[pos] == ids))


class _ConstraintCheck:
    """``allows(idx, ids)`` for :func:`forced_tokens`: may ``data[:idx] + bytes(t)`` follow
    ``state`` for some ``t`` in ``ids``?

    The state after ``data[:idx]`` is reached through the tokenization of ``data`` up to its
    last token boundary at or before ``idx`` (those states are cached and shared by all
    ``idx``), then greedy longest-match tokens for the rest: constraints are byte-level, so
    any tokenization of the bytes gives the same answer. Where the check cannot be made (a
    token on the way refused) it answers yes: holding back is always safe."""

    def __init__(self, tokenizer: Tokenizer, matcher: Matcher, state: State, data: bytes,
                 tokens: list[int], offsets: list[int]) -> None:
        self.tokenizer, self.matcher, self.data = tokenizer, matcher, data
        self.tokens, self.offsets = tokens, offsets
        self.states: list[State | None] = [state]

    def _advance(self, state: State | None, token: int) -> State | None:
        if state is None or self.matcher.is_complete(state):  # complete: DONE
            return state
        return self.matcher.advance(state, token)

    def state_at(self, idx: int) -> State | None:
        k = bisect_right(self.offsets, idx) - 1
        while len(self.states) <= k:  # states along the tokenization, computed once each
            self.states.append(self._advance(self.states[-1], self.tokens[len(self.states) - 1]))
        state = self.states[k]
        rest = self.data[self.offsets[k]:idx]
        if rest:
            try:
                tokens = self.tokenizer.vocab.longest_match(rest)
            except ValueError:  # no token starts at some byte: cannot tell
                return None
            for tok in tokens:
                state = self._advance(state, tok)
        return state

    def __call__(self, idx: int, ids: np.ndarray) -> bool:
        state = self.state_at(idx)
        if state is None:
            return True  # cannot tell: hold back
        if self.matcher.is_complete(state):
            return False  # the text ended inside the forced bytes: nothing can follow
        m = self.matcher
        allowed = m.allowed(state)
        if not m.lazy:
            return _intersects(allowed, ids)
        # Lazy: allowed lists candidates; each must still pass advance (DONE counts).
        ids = ids[np.isin(ids, allowed, assume_unique=True)]
        with m.checking():
            return any(m.advance(state, int(t)) is not None for t in ids)


def forced_tokens(tokenizer: Tokenizer, matcher: Matcher, state: State,
                  recent_tokens: Sequence[int], *, max_tokens: int = 4,
                  conservative: bool = False,
                  limit: int | None = None) -> tuple[list[int], bytes]:
    """The fast-forward tokens at ``state`` and the forced bytes they leave over.

    ``data = matcher.forced_bytes(state, limit)`` (at most ``limit`` bytes: a caller that can
    use only so many tokens need not have the constraint walk further) is tokenized as in
    :meth:`Tokenizer.tokenize_partial`, but a token ``t`` that starts at byte ``idx`` of
    ``data`` and spans past its end makes the tokens from ``idx`` on be held back only if
    the constraint allows it: ``data[:idx] + bytes(t)`` is a valid continuation from
    ``state``. Eager matchers answer with one ``allowed`` mask per ``idx`` tried (the
    spanning ids looked up in it by binary search), lazy ones with ``advance`` per spanning
    token until one is not ``None`` (``DONE`` counts as allowed).

    ``conservative=True`` skips the constraint: any spanning vocabulary token holds back
    (exactly ``tokenize_partial``). The test is then one lookup in a precomputed set, the
    token trie's inner nodes, which are the byte strings that are proper prefixes of a
    longer token; it forces a little less (12.6 % instead of 13.1 % of MaskBench's tokens
    with Llama 3) and needs no grammar mask.

    Returns ``([], b"")`` when nothing is forced. The tokens' bytes plus the leftover are
    ``data``, and the tokens are the canonical tokenization's (given ``recent_tokens``) of
    every valid continuation, as far as the recipe's test can tell: it looks only for tokens
    that span the end. BPE merges inside one pre-token can still change when the pre-token
    grows (``":`` ``[]`` but ``":[`` ``],"``); docs/benchmarks/fastforward.md counts how often.

    A :class:`~adaptrack.errors.TokenizerError` says the tokenizer cannot encode the forced
    bytes; every other error is the matcher's, passed on as it is.

    >>> from adaptrack.constraints import regex
    >>> from adaptrack.tokenization.vocab import Vocabulary
    >>> v = Vocabulary([b"order", b"orderId", b"Id", b"Name", b'"', b'":', b"_x", b"{", b"<e>"],
    ...                eos_ids=[8])
    >>> tok = Tokenizer.longest_match(v)
    >>> m = regex('order(Id|Name)').bind(v)
    >>> s = m.start()
    >>> m.forced_bytes(s), forced_tokens(tok, m, s, [])     # orderId is allowed: hold back
    (b'order', ([], b'order'))
    >>> m = regex('order(Name|_x)').bind(v)
    >>> forced_tokens(tok, m, m.start(), [])                # orderId is not: force "order"
    ([0], b'')
    >>> forced_tokens(tok, m, m.start(), [], conservative=True)
    ([], b'order')
    """
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    if matcher.is_complete(state):  # DONE
        return [], b""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    data = forced_bytes(matcher, state, limit)
    if not data:
        return [], b""
    if conservative:
        return tokenizer.tokenize_partial(data, recent_tokens, max_tokens=max_tokens)
    kept, leftover = tokenizer.tokenize_partial_with(
        data, recent_tokens, max_tokens,
        lambda tokens, offsets: _ConstraintCheck(tokenizer, matcher, state, data, tokens,
                                                 offsets))
    return kept, leftover
