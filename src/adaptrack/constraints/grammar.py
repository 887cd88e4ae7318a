"""Grammar constraints through llguidance: ``regex``, ``json_schema``, ``lark``, ``gbnf``.

Semantics are those of design.md §2: a sequence ends with EOS, EOS (every id in
``vocab.eos_ids``) is valid exactly where the grammar accepts the text, and where the grammar
can continue with nothing else EOS is the only valid token. Special tokens are never valid.

llguidance knows nothing of our EOS ids: its tokenizer is built from our token bytes plus
one placeholder EOS token appended after the model's ids; that placeholder's bit in a mask
says "the grammar accepts here", and we put our own EOS ids in its place.

Matcher states (design.md §4) are the token tuples from the start. One llguidance matcher,
the *cursor*, is moved to a state by rolling back to the common prefix and consuming the
rest (1-2 µs a token; a new prefix is usually its parent plus one token). Keeping an
LLMatcher deep copy per prefix instead is as fast but holds ~16 KiB more per prefix
(benchmarks/grammar_masks.py); either way llguidance's mask computation dominates.
"""

from __future__ import annotations

import json
import time
import warnings
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
from llguidance import LLMatcher, LLTokenizer, regex_to_lark
from llguidance.gbnf_to_lark import any_to_lark

from ..tokenization.vocab import Vocabulary
from .base import DONE, Constraint, Matcher, State

# llguidance normally turns forced bytes into one forced token and returns a singleton mask;
# the samplers need every valid token (the model decides the tokenization), so turn it off.
# Appended (not prepended) so that line numbers in error messages match the user's text.
_NO_FORCING = '\n%llguidance {"no_forcing": true}\n'

_EMPTY = np.empty(0, dtype=np.int64)


class Grammar(Constraint):
    """A language given by an llguidance grammar (build it with :func:`regex`,
    :func:`json_schema`, :func:`lark` or :func:`gbnf`). ``kind`` names the source format and
    ``lark_text`` is the Lark grammar llguidance runs."""

    def __init__(self, kind: str, lark_text: str) -> None:
        self.kind = kind
        self.lark_text = lark_text + _NO_FORCING

    def bind(self, vocab: Vocabulary) -> GrammarMatcher:
        return GrammarMatcher(self, vocab)

    def __repr__(self) -> str:
        return f"Grammar({self.kind}, {self.lark_text[:60]!r}…)"


def _check(kind: str, grammar: str) -> None:
    """Compile ``grammar`` (no vocabulary needed) and raise ``ValueError`` with llguidance's
    message if it is invalid; pass its warnings on."""
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"invalid {kind}: {messages[0].strip()}")
    for msg in messages:
        warnings.warn(f"{kind}: {msg}", stacklevel=3)


def regex(pattern: str) -> Grammar:
    """The text must match ``pattern`` entirely (Rust ``regex`` crate syntax, Unicode).

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b"a", b"b", b"ab", b"<eos>"], lambda p: [1] * 4, eos=3)
    >>> m = regex("a+b").bind(lm.vocab)
    >>> m.allowed(m.start()).tolist()                 # "a" or "ab"
    [0, 2]
    >>> m.accepts([0, 2, 3]), m.accepts([2, 2, 3])
    (True, False)
    """
    _check("regex", LLMatcher.grammar_from_regex(pattern))
    return Grammar("regex", f"start: /{regex_to_lark(pattern, '')}/")


def json_schema(schema: str | dict[str, Any]) -> Grammar:
    """The text must be JSON valid under ``schema``. llguidance's defaults apply (flexible
    whitespace between tokens, ``","`` and ``":"`` separators); an ``"x-guidance"`` key in the
    schema changes them, e.g. ``{"whitespace_flexible": false}``.

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b'{"', b'a', b'":', b'1', b'}', b' ', b'<eos>'], lambda p: [1] * 7, eos=6)
    >>> m = json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
    ...                  "required": ["a"], "additionalProperties": False}).bind(lm.vocab)
    >>> m.accepts(lm.vocab.eos_ids.tolist()), m.accepts([0, 1, 2, 3, 4, 6])
    (False, True)
    >>> m.forced_bytes(m.start())
    b'{'
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as err:
            raise ValueError(f"invalid JSON schema: not JSON: {err}") from None
    if not isinstance(schema, dict | bool):
        raise ValueError(f"invalid JSON schema: expected an object, got {type(schema).__name__}")
    _check("JSON schema", LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    return Grammar("JSON schema", f"start: %json {json.dumps(schema)}")


def lark(grammar: str) -> Grammar:
    """The text must be derived from ``grammar``'s ``start`` rule (llguidance's Lark dialect:
    https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md).

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b"1", b"+", b"1+", b"<eos>"], lambda p: [1] * 4, eos=3)
    >>> m = lark('start: NUM ("+" NUM)*\\nNUM: /[0-9]+/').bind(lm.vocab)
    >>> m.accepts([2, 0, 3]), m.accepts([2, 3])
    (True, False)
    """
    _check("Lark grammar", LLMatcher.grammar_from_lark(grammar))
    return Grammar("Lark grammar", grammar)


def gbnf(grammar: str) -> Grammar:
    """The text must be derived from ``grammar``'s ``root`` rule (llama.cpp's GBNF, converted
    to Lark by llguidance).

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b"0", b"1", b"<eos>"], lambda p: [1] * 3, eos=2)
    >>> m = gbnf('root ::= "1" [01]*').bind(lm.vocab)
    >>> m.allowed(m.start()).tolist(), m.accepts([1, 0, 2])
    ([1], True)
    """
    try:
        converted = any_to_lark(grammar)
    except Exception as err:  # the converter raises its own error type (and others)
        raise ValueError(f"invalid GBNF grammar: {err}") from None
    _check("GBNF grammar", LLMatcher.grammar_from_lark(converted))
    return Grammar("GBNF grammar", converted)


class _Wrapper:
    """What ``LLTokenizer`` reads from a Python tokenizer (see llguidance's
    ``TokenizerWrapper``): token bytes, the EOS id, special ids and a tokenize function."""

    is_tokenizer_wrapper = True
    bos_token_id = None

    def __init__(self, vocab: Vocabulary, tokens: list[bytes], eos: int) -> None:
        self.vocab, self.tokens, self.eos_token_id = vocab, tokens, eos
        self.special_token_ids: list[int] = []  # marked with 0xFF in ``tokens`` instead

    def __call__(self, text: str | bytes) -> list[int]:
        # Only llguidance's forcing tokenizes, and it is off; greedy matching is enough.
        return self.vocab.longest_match(text.encode() if isinstance(text, str) else bytes(text))


class _LLVocab:
    """llguidance's view of one vocabulary: the tokenizer and which bits are text tokens."""

    def __init__(self, vocab: Vocabulary) -> None:
        size = vocab.size
        text = np.zeros(size + 1, dtype=bool)
        tokens: list[bytes] = []
        for i in range(size + 1):
            data = vocab.token_bytes[i] if i < len(vocab.token_bytes) else None
            if data and not vocab.is_eos(i):
                tokens.append(data)
                text[i] = True
            else:  # special (0xFF marks it for llguidance): never matched as text
                tokens.append(b"\xff[%d]" % i)
        self.eos = size  # the placeholder: its bit means "accepting"
        self.tokenizer = LLTokenizer(_Wrapper(vocab, tokens, self.eos))
        nbytes = (size + 1 + 31) // 32 * 4  # llguidance's bitmask: 32-bit words
        self.text_bits = np.zeros(nbytes, dtype=np.uint8)
        packed = np.packbits(text, bitorder="little")
        self.text_bits[: len(packed)] = packed


_LL_VOCABS: weakref.WeakKeyDictionary[Vocabulary, _LLVocab] = weakref.WeakKeyDictionary()


def ll_vocab(vocab: Vocabulary) -> _LLVocab:
    """The llguidance tokenizer of ``vocab``, built once per vocabulary (≈0.2 s at 49k)."""
    found = _LL_VOCABS.get(vocab)
    if found is None:
        found = _LL_VOCABS[vocab] = _LLVocab(vocab)
    return found


class GrammarMatcher(Matcher):
    """A :class:`Grammar` on one vocabulary. States are token tuples (see the module doc).

    Masks are cached per state as llguidance's packed bits (6 KiB at 49k tokens; sorted ids
    would take up to 400 KiB), least recently used first out, up to ``cache_bytes``:
    ``advance`` tests one bit, ``allowed`` unpacks (20-50 µs).
    """

    terminators = b""

    def __init__(self, grammar: Grammar, vocab: Vocabulary, cache_bytes: int = 64 << 20) -> None:
        self.grammar, self.vocab = grammar, vocab
        self.ll = ll_vocab(vocab)
        self._cursor = self._new_matcher()
        self._at: tuple[int, ...] = ()
        self._masks: OrderedDict[tuple[int, ...], tuple[np.ndarray, bool]] = OrderedDict()
        self._max_cached = max(1, cache_bytes // len(self.ll.text_bits))
        self._forced: dict[tuple[int, ...], bytes] = {}
        self.masks_computed, self.mask_seconds = 0, 0.0
        self.restarts = 0  # llguidance matchers replaced after an error

    def _new_matcher(self) -> LLMatcher:
        m = LLMatcher(self.ll.tokenizer, self.grammar.lark_text, log_level=0)
        if m.is_error():
            raise ValueError(f"invalid {self.grammar.kind}: {m.get_error()}")
        return m

    def _restart(self) -> str:
        """Replace the cursor (an llguidance error is permanent); return the error."""
        err = self._cursor.get_error()
        self._cursor, self._at = self._new_matcher(), ()
        return err

    def _goto(self, state: tuple[int, ...]) -> LLMatcher:
        """Move the cursor to ``state``: roll back to the common prefix, consume the rest."""
        at, k = self._at, 0
        n = min(len(at), len(state))
        while k < n and at[k] == state[k]:
            k += 1
        if k < len(at) and not self._cursor.rollback(len(at) - k):
            self._restart()  # not expected; replaying from the start is always right
            k = 0
        if k < len(state) and not self._cursor.consume_tokens(list(state[k:])):
            # States are valid by construction: only llguidance's resource limits get here.
            raise RuntimeError(f"llguidance failed on this {self.grammar.kind}: "
                               f"{self._restart()}")
        self._at = state
        return self._cursor

    def _compute(self, matcher: LLMatcher) -> tuple[np.ndarray, bool]:
        """``matcher``'s mask: packed bits of the valid text tokens, and whether it accepts."""
        return self._packed(matcher.compute_bitmask(), matcher)

    def _packed(self, raw: bytes, matcher: LLMatcher) -> tuple[np.ndarray, bool]:
        bits = np.frombuffer(raw, dtype=np.uint8)
        if matcher.is_error():
            err = matcher.get_error()
            if matcher is self._cursor:
                self._restart()
            # A dead end (no token continues the text, which is not accepted): llguidance
            # stops with this error instead of returning an empty mask.
            if err.startswith("NoExtensionBias"):
                return np.zeros_like(self.ll.text_bits), False
            raise RuntimeError(f"llguidance failed on this {self.grammar.kind}: {err}")
        eos = self.ll.eos
        return bits & self.ll.text_bits, bool(bits[eos >> 3] >> (eos & 7) & 1)

    def _mask(self, state: tuple[int, ...]) -> tuple[np.ndarray, bool]:
        cached = self._masks.get(state)
        if cached is not None:
            self._masks.move_to_end(state)
            return cached
        t0 = time.perf_counter()
        try:
            found = self._compute(self._goto(state))
        except RuntimeError:
            # A long-lived llguidance matcher can exhaust its lexer budget on some schemas
            # (ParserTooComplex) and then refuse valid tokens; the cursor has been replaced,
            # and a fresh matcher at the same state succeeds (adaptrack bench ff: 10 of 10).
            self.restarts += 1
            found = self._compute(self._goto(state))
        self._masks[state] = found
        self.masks_computed += 1
        self.mask_seconds += time.perf_counter() - t0
        if len(self._masks) > self._max_cached:
            self._masks.popitem(last=False)
        return found

    def start(self) -> State:
        return ()

    def allowed(self, state: State) -> np.ndarray:
        if state is DONE:
            return _EMPTY
        bits, accepting = self._mask(state)  # type: ignore[arg-type]
        # flatnonzero is ~5x faster on a bool view than on uint8.
        ids = np.flatnonzero(np.unpackbits(bits, bitorder="little").view(bool))
        if not accepting or not len(self.vocab.eos_ids):
            return ids
        eos = self.vocab.eos_ids  # special, so never among ids
        return np.insert(ids, np.searchsorted(ids, eos), eos)

    def finishing(self, state: State) -> np.ndarray:
        if state is DONE:
            return _EMPTY
        return self.vocab.eos_ids if self._mask(state)[1] else _EMPTY  # type: ignore[arg-type]

    def advance(self, state: State, token: int) -> State | None:
        if state is DONE or not 0 <= token < self.vocab.size:
            return None
        bits, accepting = self._mask(state)  # type: ignore[arg-type]
        if self.vocab.is_eos(token):
            return DONE if accepting else None
        if bits[token >> 3] >> (token & 7) & 1:
            return (*state, token)  # type: ignore[misc]
        return None

    def forced_bytes(self, state: State) -> bytes:
        if state is DONE:
            return b""
        found = self._forced.get(state)  # type: ignore[arg-type]
        if found is None:
            if len(self._forced) >= 1 << 16:  # small values, but keep memory bounded
                self._forced.clear()
            # Forcing pushes the bytes into the parser for good: do it on a copy.
            copy = self._goto(state).deep_copy()  # type: ignore[arg-type]
            found = self._forced[state] = copy.compute_ff_bytes()  # type: ignore[index]
        return found

    def stats(self) -> dict[str, float]:
        return {"grammar_masks": self.masks_computed, "grammar_mask_seconds": self.mask_seconds}
