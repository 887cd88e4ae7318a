"""The grammar matcher: a :class:`~.sources.Grammar` on one vocabulary, as the samplers'
:class:`~adaptrack.constraints.base.Matcher` (docs/design.md §2 and §4).

Semantics: a sequence ends with EOS, EOS (every id in ``vocab.eos_ids``) is valid exactly
where the grammar accepts the text, and where the grammar can continue with nothing else
EOS is the only valid token. Special tokens are never valid. States are the token tuples
from the start; masks come from llguidance's matcher moved to them (:mod:`.cursor`).
"""

from __future__ import annotations

import time

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from ...errors import GrammarError
from ...tokenization.vocab import Vocabulary
from ..base import DONE, Matcher, State
from .compiler import MASK_CACHE_BYTES, CompiledGrammar, GrammarSource, compiled, frozen
from .cursor import Spent, Track, dead_end, matcher_failure
from .forced import ForcedBytes

_EMPTY = np.empty(0, dtype=np.int64)


def _text_ids(bits: np.ndarray) -> np.ndarray:
    """The token ids a packed llguidance mask (text tokens only) holds."""
    # flatnonzero is ~5x faster on a bool view than on uint8.
    return np.flatnonzero(np.unpackbits(bits, bitorder="little").view(bool))


class GrammarMatcher(Matcher):
    """A :class:`Grammar` on one vocabulary. States are token tuples (see the module doc).

    Masks are cached per state as llguidance's packed bits (6 KiB at 49k tokens; sorted ids
    would take up to 400 KiB), least recently used first out, up to ``cache_bytes``:
    ``advance`` tests one bit, ``allowed`` unpacks (20-50 µs). Up to ``checkpoints``
    llguidance matchers (~16 KiB each) are kept as checkpoints, as many again for
    :meth:`forced_bytes`.

    ``shared=True`` (what :meth:`Grammar.bind` makes): the compiled grammar, and what is
    found by state (masks, closing tokens, forced bytes), are those every matcher of this
    language and vocabulary shares (:func:`~.compiler.compiled`); else its own. The cursors
    and checkpoints are always the matcher's own, and so are :meth:`stats` (masks found by
    another matcher are not counted here).
    """

    terminators = b""

    def __init__(self, grammar: GrammarSource, vocab: Vocabulary,
                 cache_bytes: int = MASK_CACHE_BYTES, checkpoints: int = 1024, *,
                 shared: bool = False) -> None:
        self.grammar, self.vocab = grammar, vocab
        self.compiled = (compiled(grammar, vocab, cache_bytes) if shared
                         else CompiledGrammar(grammar, vocab, cache_bytes))
        self.ll = self.compiled.ll
        self._tokens = Track(self.compiled.renew, list, checkpoints, grammar.kind,
                              root=self.compiled.root)
        self._forced = ForcedBytes(self.compiled, vocab, checkpoints)
        self._masks = self.compiled.masks
        self._closing = self.compiled.closing
        self.masks_computed, self.mask_seconds = 0, 0.0

    def _new_matcher(self, tokenizer: LLTokenizer | None = None) -> LLMatcher:
        return self.compiled.compile(tokenizer)

    def _goto(self, state: tuple[int, ...]) -> LLMatcher:
        """The token matcher at ``state``."""
        return self._tokens.run(state, lambda matcher: matcher)

    def _compute(self, matcher: LLMatcher) -> tuple[np.ndarray, bool]:
        """``matcher``'s mask: packed bits of the valid text tokens, and whether it accepts."""
        return self._packed(matcher.compute_bitmask(), matcher)

    def _packed(self, raw: bytes, matcher: LLMatcher) -> tuple[np.ndarray, bool]:
        bits = np.frombuffer(raw, dtype=np.uint8)
        if matcher.is_error():
            # A dead end (no token continues the text, which is not accepted): llguidance
            # stops with this error instead of returning an empty mask.
            if dead_end(matcher):
                if matcher is self._tokens.cursor:
                    self._tokens.reset()
                return frozen(np.zeros_like(self.ll.text_bits)), False
            raise matcher_failure(self.grammar.kind, matcher)
        eos = self.ll.eos
        return frozen(bits & self.ll.text_bits), bool(bits[eos >> 3] >> (eos & 7) & 1)

    def _compute_on_cursor(self, matcher: LLMatcher) -> tuple[np.ndarray, bool]:
        """:meth:`_compute` for :meth:`Track.run`: a failure (a lexer error while the
        mask is computed) starts the cursor again."""
        try:
            return self._compute(matcher)
        except GrammarError as err:
            raise Spent(err) from None

    def _mask(self, state: tuple[int, ...]) -> tuple[np.ndarray, bool]:
        cached = self._masks.get(state)
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        found = self._tokens.run(state, self._compute_on_cursor)
        self._masks.put(state, found)
        self.masks_computed += 1
        self.mask_seconds += time.perf_counter() - t0
        return found

    def start(self) -> State:
        return ()

    def allowed(self, state: State) -> np.ndarray:
        if state is DONE:
            return _EMPTY
        bits, accepting = self._mask(state)  # type: ignore[arg-type]
        ids = _text_ids(bits)
        if not accepting or not len(self.vocab.eos_ids):
            return ids
        eos = self.vocab.eos_ids  # special, so never among ids
        return np.insert(ids, np.searchsorted(ids, eos), eos)

    def finishing(self, state: State) -> np.ndarray:
        if state is DONE:
            return _EMPTY
        return self.vocab.eos_ids if self._mask(state)[1] else _EMPTY  # type: ignore[arg-type]

    def _closing_candidates(self) -> np.ndarray | None:
        """See :meth:`CompiledGrammar.closing_candidates`."""
        return self.compiled.closing_candidates()

    def closing(self, state: State) -> np.ndarray:
        """The contract's set exactly: each allowed token is consumed on the cursor, the
        matcher asked whether its text is then accepted, and the token rolled back (~1 µs a
        token, 50 ms for a whole vocabulary: less than a model call, where the prefix tree
        would otherwise open one dead last position per token). Where the grammar knows its
        final bytes (a JSON object's ``}``) only the tokens holding one, or whitespace, are
        tried (~0.5 ms at 49k tokens). Should llguidance fail on the way, every allowed token
        (a superset, as the contract allows)."""
        if state is DONE:
            return _EMPTY
        key: tuple[int, ...] = state  # type: ignore[assignment]
        found = self._closing.get(key)
        if found is not None:
            return found
        bits, accepting = self._mask(key)
        candidates = self._closing_candidates()
        ids = _text_ids(bits if candidates is None else bits & candidates)

        def compute(m: LLMatcher) -> np.ndarray:
            keep = np.zeros(len(ids), dtype=bool)
            for j, token in enumerate(ids.tolist()):
                if not m.consume_token(token):
                    raise Spent(matcher_failure(self.grammar.kind, m))
                keep[j] = m.is_accepting()
                m.rollback(1)
            return ids[keep]

        try:
            found = self._tokens.run(key, compute)
        except GrammarError:
            found = ids
        if accepting and len(self.vocab.eos_ids):
            eos = self.vocab.eos_ids
            found = np.insert(found, np.searchsorted(found, eos), eos)
        self._closing.put(key, frozen(found))
        return found

    def within(self, state: State, tokens: int) -> np.ndarray:
        """The contract's :meth:`~adaptrack.constraints.base.Matcher.within`: at 1 and 2
        tokens :meth:`finishing` and :meth:`closing`; beyond, for a JSON schema, the allowed
        tokens its token bound does not rule out (:class:`~.jsonbound.JsonBound`,
        docs/design.md §2); for other grammars every allowed token.

        >>> from adaptrack.constraints import json_schema
        >>> from adaptrack.tokenization.vocab import Vocabulary
        >>> v = Vocabulary([b'{"a":"', b'x', b'"', b'}', b'<e>'], eos_ids=[4])
        >>> m = json_schema({"type": "object", "properties": {"a": {"type": "string"}},
        ...                  "required": ["a"], "x-guidance": {"whitespace_flexible": False}}
        ...                 ).bind(v)
        >>> s = m.advance(m.start(), 0)
        >>> m.within(s, 4).tolist(), m.within(s, 3).tolist()  # 'x' needs '"', '}', EOS after
        ([1, 2, 3], [2])
        """
        if state is DONE or tokens <= 0:
            return _EMPTY
        if tokens == 1:
            return self.finishing(state)
        if tokens == 2:
            return self.closing(state)
        allowed = self.allowed(state)
        bound = self.compiled.json_bound()
        if bound is None or not len(allowed):
            return allowed
        return bound.within(state, tokens, allowed)  # type: ignore[arg-type]

    def advance(self, state: State, token: int) -> State | None:
        if state is DONE or not 0 <= token < self.vocab.size:
            return None
        bits, accepting = self._mask(state)  # type: ignore[arg-type]
        if self.vocab.is_eos(token):
            return DONE if accepting else None
        if bits[token >> 3] >> (token & 7) & 1:
            return (*state, token)  # type: ignore[misc]
        return None

    def forced_bytes(self, state: State, limit: int | None = None) -> bytes:
        """Bytes every valid continuation of ``state`` starts with, at most ``limit``: while
        the text is not accepted and exactly one next byte is valid (a special token the
        grammar names there counts as another choice: none is ever forced), that byte.

        They are walked on a second llguidance matcher of the grammar, over a tokenizer of
        one token per byte (:func:`byte_tokenizer`), moved to ``state`` by the bytes of its
        tokens as the token matcher is moved by its tokens (see :mod:`.forced`). A byte
        costs a mask over 257 tokens and one token consumed (~3-6 µs; one mask over a 49k
        vocabulary is ~0.4 ms), so a limit bounds the cost. Without a limit, llguidance's
        ``compute_ff_bytes`` on a copy of that matcher finds them: ~0.03 µs a byte through
        lexer states built before, ~6 µs a new one, unbounded (1.5 s for ``a{99999999}``,
        where it stops at the 250 000 lexer states the copies share and spends them; the
        byte matcher is then made anew, and the token matcher's lexer is its own). A state
        one token past a state whose forced bytes are known, inside them, reuses them
        (exactly: the rest of those bytes is still forced, and nothing more is).

        >>> from adaptrack.constraints import regex
        >>> from adaptrack.tokenization.vocab import Vocabulary
        >>> v = Vocabulary([b"a", b"aa", b"b", b"<e>"], eos_ids=[3])
        >>> m = regex("a{99999999}|b").bind(v)
        >>> s = m.advance(m.start(), 0)
        >>> m.forced_bytes(s, limit=5)
        b'aaaaa'
        """
        if state is DONE:
            return b""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        return self._forced.get(state, limit)  # type: ignore[arg-type]

    def min_new_tokens(self) -> int:
        """A lower bound on the tokens (EOS included) of any complete sequence.

        For a :func:`regex`: its shortest match in bytes (Python's regex parser; a pattern
        it reads differently from the Rust syntax, or cannot read, gets the bound 1) over
        the longest vocabulary token made only of bytes the pattern can match, plus EOS.
        Other grammars: 1.

        >>> from adaptrack.constraints import regex
        >>> from adaptrack.tokenization.vocab import Vocabulary
        >>> v = Vocabulary([b"a", b"b", b"ab", b"xxxx", b"<e>"], eos_ids=[4])
        >>> regex("[ab]{10}").bind(v).min_new_tokens()   # 10 bytes, tokens of <= 2: 5 + EOS
        6
        """
        return self.compiled.min_new_tokens()

    def stats(self) -> dict[str, float]:
        """Masks computed over the vocabulary, their seconds, and how often an llguidance
        matcher was made anew after a resource-limit failure (``Track.run``)."""
        restarts = self._tokens.restarts + self._forced.restarts
        return {"grammar_masks": self.masks_computed, "grammar_mask_seconds": self.mask_seconds,
                "grammar_restarts": restarts}
