"""Grammar constraints through llguidance: ``regex``, ``json_schema``, ``lark``, ``gbnf``.

Semantics are those of docs/design.md §2: a sequence ends with EOS, EOS (every id in
``vocab.eos_ids``) is valid exactly where the grammar accepts the text, and where the grammar
can continue with nothing else EOS is the only valid token. Special tokens are never valid.

llguidance knows nothing of our EOS ids: its tokenizer is built from our token bytes plus
one placeholder EOS token appended after the model's ids; that placeholder's bit in a mask
says "the grammar accepts here", and we put our own EOS ids in its place.

Matcher states (docs/design.md §4) are the token tuples from the start. One llguidance
matcher, the *cursor*, only ever moves forward: a new state is usually the cursor's state
plus one token (1-2 µs a token). To reach any other state the cursor is replaced by a deep
copy (1-20 µs) of the nearest checkpoint, a copy kept every :data:`_CHECKPOINT_EVERY`
tokens along the way, and consumes the rest. llguidance's ``rollback`` is never used: it
keeps the mask cache of its Earley parser (keyed by lexer state and row index), and a
row index reused after a rollback then returns the mask of the text rolled back (llguidance
1.9: after ``"age"`` a JSON-schema matcher allowed digits before the ``:``). A copy shares
its original's lexer, whose resource limits are spent for all of them at once: after a
failure the cursor starts again from a new matcher (see ``_Track``), so a state fails here
only where a new llguidance matcher fails too.

Forced bytes are walked on a second matcher of the same grammar, over a tokenizer of one
token per byte, moved the same way by the bytes of a state's tokens: its masks have 257
bits, and its lexer (whose states llguidance caps and the copies of a matcher share) is not
the token matcher's (see ``GrammarMatcher.forced_bytes``).
"""

from __future__ import annotations

import json
import math
import re
import re._constants as _sre
import re._parser as _sre_parse
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from llguidance import LLMatcher, LLTokenizer, regex_to_lark
from llguidance.gbnf_to_lark import any_to_lark

from ..cache import LRU
from ..errors import GrammarError
from ..tokenization.vocab import Vocabulary
from .base import DONE, Constraint, Matcher, State, show, utf8

# llguidance normally turns forced bytes into one forced token and returns a singleton mask;
# the samplers need every valid token (the model decides the tokenization), so turn it off.
# Appended (not prepended) so that line numbers in error messages match the user's text.
_NO_FORCING = '\n%llguidance {"no_forcing": true}\n'

_EMPTY = np.empty(0, dtype=np.int64)


class Grammar(Constraint):
    """A language given by an llguidance grammar (build it with :func:`regex`,
    :func:`json_schema`, :func:`lark` or :func:`gbnf`). ``kind`` names the source format and
    ``lark_text`` is the Lark grammar llguidance runs."""

    def __init__(self, kind: str, lark_text: str, pattern: str | None = None,
                 final_bytes: bytes | None = None) -> None:
        self.kind = kind
        self.lark_text = lark_text + _NO_FORCING
        #: The source of a :func:`regex` (``min_new_tokens`` reads it), else None.
        self.pattern = pattern
        #: Where known, bytes one of which every accepted text ends with, whitespace after
        #: it aside (a JSON object: ``}``); :meth:`GrammarMatcher.closing` then tries only
        #: tokens that hold one, or are whitespace. None: not known.
        self.final_bytes = final_bytes

    def bind(self, vocab: Vocabulary) -> GrammarMatcher:
        return GrammarMatcher(self, vocab)

    def __repr__(self) -> str:
        return f"Grammar({self.kind}, {self.lark_text[:60]!r}…)"


def _one_line(message: str) -> str:
    """llguidance's message on one line: its caret display (a line of the source, then a line
    of ``^``) becomes ``|``-separated parts, and marker-only lines are dropped."""
    parts = [line.strip() for line in message.splitlines()]
    return " | ".join(p for p in parts if p.strip("^~- "))


def _source(kind: str, text: object) -> str:
    """The grammar text, checked: a str that UTF-8 can encode (llguidance reads UTF-8)."""
    if not isinstance(text, str):
        raise TypeError(f"{kind} takes the grammar as a str, got {show(text)} "
                        f"({type(text).__name__})")
    utf8(text, kind)
    return text


def _check(kind: str, grammar: str) -> None:
    """Compile ``grammar`` (no vocabulary needed) and raise :class:`GrammarError` with
    llguidance's message, on one line, if it is invalid; pass its warnings on."""
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise GrammarError(f"invalid {kind}: {_one_line(messages[0])}")
    for msg in messages:
        warnings.warn(f"{kind}: {_one_line(msg)}", stacklevel=3)


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
    _source("regex", pattern)
    _check("regex", LLMatcher.grammar_from_regex(pattern))
    return Grammar("regex", f"start: /{regex_to_lark(pattern, '')}/", pattern)


#: Whitespace allowed between JSON tokens unless the schema's ``"x-guidance"`` says otherwise:
#: none, one space, or a newline and up to 20 spaces or tabs (llama.cpp's JSON grammar does
#: the same), so compact and pretty-printed JSON stay valid but a model cannot pad forever;
#: measured against llguidance's unbounded default in docs/benchmarks.md (everyday requests).
JSON_WHITESPACE = r"(?:[ ]|\n[ \t]{0,20})?"


def json_schema(schema: str | dict[str, Any]) -> Grammar:
    """The text must be JSON valid under ``schema``, with :data:`JSON_WHITESPACE` between
    tokens and llguidance's ``","`` and ``":"`` separators; an ``"x-guidance"`` key in the
    schema changes them (``{"whitespace_flexible": true}``: any whitespace;
    ``{"whitespace_flexible": false}``: none; ``{"whitespace_pattern": "..."}``).

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
        utf8(schema, "json_schema")
        try:
            schema = json.loads(schema)
        except ValueError as err:
            raise GrammarError(f"invalid JSON schema: not JSON: {err}") from None
    if not isinstance(schema, dict | bool):
        raise GrammarError(
            f"invalid JSON schema: expected an object, got {type(schema).__name__}")
    if isinstance(schema, dict):
        options = schema.get("x-guidance")
        if options is None or (isinstance(options, dict) and not {
                "whitespace_flexible", "whitespace_pattern"} & set(options)):
            schema = {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE,
                                               **(options or {})}}
    _check("JSON schema", LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    # An object ends with "}", then whitespace (ours or llguidance's; a pattern of the
    # caller's may match anything, so then nothing is known).
    final = None
    if isinstance(schema, dict) and schema.get("type") == "object":
        options = schema.get("x-guidance")
        if isinstance(options, dict) and options.get(
                "whitespace_pattern", JSON_WHITESPACE) == JSON_WHITESPACE:
            final = b"}"
    return Grammar("JSON schema", f"start: %json {json.dumps(schema)}", final_bytes=final)


def lark(grammar: str) -> Grammar:
    """The text must be derived from ``grammar``'s ``start`` rule (llguidance's Lark dialect:
    https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md).

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b"1", b"+", b"1+", b"<eos>"], lambda p: [1] * 4, eos=3)
    >>> m = lark('start: NUM ("+" NUM)*\\nNUM: /[0-9]+/').bind(lm.vocab)
    >>> m.accepts([2, 0, 3]), m.accepts([2, 3])
    (True, False)
    """
    _check("Lark grammar", LLMatcher.grammar_from_lark(_source("lark", grammar)))
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
    _source("gbnf", grammar)
    try:
        converted = any_to_lark(grammar)
    except Exception as err:  # the converter raises its own error type (and others)
        raise GrammarError(f"invalid GBNF grammar: {err}") from None
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


class _ByteWrapper:
    """``LLTokenizer``'s view of a :func:`byte_tokenizer`."""

    is_tokenizer_wrapper = True
    bos_token_id = None

    def __init__(self, tokens: list[bytes], eos: int) -> None:
        self.tokens, self.eos_token_id = tokens, eos
        self.special_token_ids: list[int] = []  # marked with 0xFF in ``tokens`` instead

    def __call__(self, text: str | bytes) -> list[int]:
        data = text.encode() if isinstance(text, str) else bytes(text)
        return [self.eos_token_id + 1 + b for b in data]


_BYTE_TOKENIZERS: dict[int, LLTokenizer] = {}


def byte_tokenizer(eos: int) -> LLTokenizer:
    """An llguidance tokenizer of one token per byte: ids below ``eos`` are special, so that
    a grammar's token references (``<[5]>``, ``<[*]>``) name tokens the byte walk never
    takes; ``eos`` is its EOS (the bit that says "accepting"); byte ``b`` is id
    ``eos + 1 + b``, except 0xFF, which llguidance reserves to mark special tokens and no
    UTF-8 text holds (special here too). The one for ``eos=0`` is kept for good.

    >>> t = byte_tokenizer(0)
    >>> t.vocab_size, t.decode_bytes([1 + ord("{"), 1 + ord("a")])
    (257, b'{a')
    """
    found = _BYTE_TOKENIZERS.get(eos)
    if found is None:
        tokens = [b"\xff[%d]" % i for i in range(eos + 1)]
        tokens += [bytes([b]) for b in range(255)] + [b"\xff[%d]" % (eos + 256)]
        found = LLTokenizer(_ByteWrapper(tokens, eos), slices=[])  # type: ignore[arg-type]
        if eos == 0:
            _BYTE_TOKENIZERS[eos] = found
    return found


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
        self.text_tokens = [tokens[i] for i in np.flatnonzero(text).tolist()]
        # A duck-typed TokenizerWrapper, as llguidance's Python API reads it.
        self.tokenizer = LLTokenizer(_Wrapper(vocab, tokens, self.eos))  # type: ignore[arg-type]
        nbytes = (size + 1 + 31) // 32 * 4  # llguidance's bitmask: 32-bit words
        self.text_bits = np.zeros(nbytes, dtype=np.uint8)
        packed = np.packbits(text, bitorder="little")
        self.text_bits[: len(packed)] = packed
        self.longest = max((len(tokens[i]) for i in np.flatnonzero(text).tolist()), default=0)
        self._longest_over: dict[frozenset[int], int] = {}
        self._bytes: LLTokenizer | None = None

    def byte_tokenizer(self, references: bool) -> LLTokenizer:
        """A tokenizer of one token per byte, for walking forced bytes: see
        :func:`byte_tokenizer`. ``references``: with this tokenizer's ids up to its EOS (built
        on first use, ≈0.1 s at 49k; its masks take ~5 µs more), else the 257-token one."""
        if not references:
            return byte_tokenizer(0)
        if self._bytes is None:
            self._bytes = byte_tokenizer(self.eos)
        return self._bytes

    def longest_over(self, alphabet: frozenset[int]) -> int:
        """The length of the longest text token made only of bytes in ``alphabet``."""
        found = self._longest_over.get(alphabet)
        if found is None:
            found = max((len(t) for t in self.text_tokens if alphabet.issuperset(t)),
                        default=0)
            self._longest_over[alphabet] = found
        return found


_LL_VOCABS: weakref.WeakKeyDictionary[Vocabulary, _LLVocab] = weakref.WeakKeyDictionary()


def ll_vocab(vocab: Vocabulary) -> _LLVocab:
    """The llguidance tokenizer of ``vocab``, built once per vocabulary (≈0.2 s at 49k)."""
    found = _LL_VOCABS.get(vocab)
    if found is None:
        found = _LL_VOCABS[vocab] = _LLVocab(vocab)
    return found


#: Tokens between two checkpoints of the cursor's path (see the module doc): a jump to a
#: state replays at most this many tokens after copying the nearest checkpoint.
_CHECKPOINT_EVERY = 16


def _failure(kind: str, matcher: LLMatcher) -> GrammarError:
    """The error of a failed llguidance matcher."""
    err = matcher.get_error().strip().splitlines()
    reason = err[0] if err else "unknown error"
    return GrammarError(f"llguidance failed on this {kind}: {reason} (its resource limits; "
                        "simplify the grammar or shorten max_new_tokens)")


class _Spent(Exception):
    """An llguidance matcher failed where a new one may not (see :meth:`_Track.run`)."""

    def __init__(self, error: GrammarError) -> None:
        super().__init__(str(error))
        self.error = error


def _dead_end(matcher: LLMatcher) -> bool:
    """Whether ``matcher`` stopped because no token continues its text (not a failure)."""
    return matcher.get_error().startswith("NoExtensionBias")


T = TypeVar("T")


class _Track:
    """An llguidance matcher, the cursor, moved to token tuples as the module doc says:
    forward from where it is when that is a prefix of the target, else from a copy of the
    nearest checkpoint (or of ``root``, which never consumes). ``new()`` makes a new
    llguidance matcher of the grammar; ``ids(tokens)`` is what the matcher consumes for
    ``tokens`` (the tokens themselves, or their bytes).

    The copies of a matcher share its lexer, and llguidance's lexer fails for good once
    it runs out of *fuel* (or of states): every copy then fails, the root too. It refills
    the fuel only when it computes a mask, so tokens consumed with no mask in between (a
    jump from a checkpoint) can run it dry where a new matcher, whose first fuel is not a
    step's, consumes them. :meth:`run` therefore restarts from a new matcher, with a lexer
    of its own, and if that fails too, from another one that computes a mask before each
    token it consumes."""

    def __init__(self, new: Callable[[], LLMatcher],
                 ids: Callable[[tuple[int, ...]], list[int]], checkpoints: int,
                 kind: str) -> None:
        self.new, self.ids, self.kind = new, ids, kind
        self.root = new()
        self.cursor = self.root.deep_copy()
        self.at: tuple[int, ...] = ()
        self.checkpoints: LRU[tuple[int, ...], LLMatcher] = LRU(checkpoints)
        self.restarts = 0

    def reset(self) -> None:
        """Drop the cursor (an llguidance error is permanent; the lexer is still sound)."""
        self.cursor, self.at = self.root.deep_copy(), ()

    def restart(self) -> None:
        """Start again from a new matcher: the checkpoints share the old one's lexer."""
        self.root = self.new()
        self.checkpoints.clear()
        self.reset()
        self.restarts += 1

    def run(self, state: tuple[int, ...], compute: Callable[[LLMatcher], T]) -> T:
        """``compute`` on the cursor moved to ``state`` (states are valid: only
        llguidance's resource limits make a matcher fail on the way, or ``compute`` raise
        :class:`_Spent`). After a failure, once more from a new matcher, then from another
        one with a mask before each token; a third failure is a :class:`GrammarError`."""
        for attempt in range(3):
            try:
                return compute(self.goto(state, masks=attempt == 2))
            except _Spent as spent:
                self.restart()
                if attempt == 2:
                    raise spent.error from None
        raise AssertionError("unreachable")

    def goto(self, state: tuple[int, ...], masks: bool = False) -> LLMatcher:
        """The cursor, moved to ``state`` (``masks``: a mask computed before each token,
        which refills llguidance's lexer fuel); :class:`_Spent` if it fails."""
        at, every = self.at, _CHECKPOINT_EVERY
        if len(at) > len(state) or state[: len(at)] != at:
            at, cursor = (), None
            k = len(state) // every * every
            while k > 0:
                found = self.checkpoints.get(state[:k])
                if found is not None:
                    at, cursor = state[:k], found.deep_copy()
                    break
                k -= every
            self.cursor = self.root.deep_copy() if cursor is None else cursor
            self.at = at
        cursor, k = self.cursor, len(at)
        while k < len(state):
            stop = min(len(state), (k // every + 1) * every)
            if masks:
                ok = True
                for token in state[k:stop]:
                    cursor.compute_bitmask()
                    ok = not cursor.is_error() and cursor.consume_tokens(self.ids((token,)))
                    if not ok:
                        break
            else:
                ok = cursor.consume_tokens(self.ids(state[k:stop]))
            if not ok:
                err = _failure(self.kind, cursor)
                self.reset()
                raise _Spent(err)
            k = stop
            self.at = state[:k]
            if k % every == 0 and self.at not in self.checkpoints:
                self.checkpoints.put(self.at, cursor.deep_copy())
        return cursor


def _references_tokens(grammar: Grammar) -> bool:
    """Whether ``grammar`` may name tokens (llguidance's ``<[5]>``, ``<|end|>``): never for
    a regex or a JSON schema; for Lark and GBNF, wherever ``<…>`` occurs (also in a string
    or a regex: a false alarm costs only speed)."""
    if grammar.kind in ("regex", "JSON schema"):
        return False
    return re.search(r"<[^<>\n]+>", grammar.lark_text) is not None


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
    """

    terminators = b""

    def __init__(self, grammar: Grammar, vocab: Vocabulary, cache_bytes: int = 64 << 20,
                 checkpoints: int = 1024) -> None:
        self.grammar, self.vocab = grammar, vocab
        self.ll = ll_vocab(vocab)
        self._n_checkpoints = checkpoints
        self._tokens = _Track(self._new_matcher, list, checkpoints, grammar.kind)
        self._bytes: _Track | None = None  # see _byte_track
        self._byte_eos = 0
        self._masks: LRU[tuple[int, ...], tuple[np.ndarray, bool]] = LRU(
            cache_bytes, size=lambda v: v[0].nbytes, keep_one=True)
        self._forced: LRU[tuple[int, ...], tuple[bytes, bool]] = LRU(1 << 16)
        self._closing: LRU[tuple[int, ...], np.ndarray] = LRU(1 << 24, lambda a: a.nbytes + 64)
        self._candidates: np.ndarray | None = None  # see _closing_candidates
        self._min_tokens: int | None = None
        self.masks_computed, self.mask_seconds = 0, 0.0

    def _new_matcher(self, tokenizer: LLTokenizer | None = None) -> LLMatcher:
        m = LLMatcher(tokenizer or self.ll.tokenizer, self.grammar.lark_text, log_level=0)
        if m.is_error():
            raise GrammarError(f"invalid {self.grammar.kind}: {m.get_error()}")
        return m

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
            if _dead_end(matcher):
                if matcher is self._tokens.cursor:
                    self._tokens.reset()
                return np.zeros_like(self.ll.text_bits), False
            raise _failure(self.grammar.kind, matcher)
        eos = self.ll.eos
        return bits & self.ll.text_bits, bool(bits[eos >> 3] >> (eos & 7) & 1)

    def _compute_on_cursor(self, matcher: LLMatcher) -> tuple[np.ndarray, bool]:
        """:meth:`_compute` for :meth:`_Track.run`: a failure (a lexer error while the
        mask is computed) starts the cursor again."""
        try:
            return self._compute(matcher)
        except GrammarError as err:
            raise _Spent(err) from None

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
        """The only tokens that can make a text accepted where the grammar knows its final
        bytes: those holding one, and whitespace (after a text already accepted); None when
        it does not. Found at the first need (a scan of the vocabulary)."""
        final = self.grammar.final_bytes
        if final and self._candidates is None:
            vocab = self.vocab
            blank = [i for i in vocab.text_ids.tolist()
                     if vocab.bytes_of(i) and not vocab.bytes_of(i).strip(b" \t\n\r")]
            self._candidates = np.union1d(vocab.tokens_holding(final),
                                          np.asarray(blank, dtype=np.int64))
        return self._candidates

    def closing(self, state: State) -> np.ndarray:
        """The contract's set exactly: each allowed token is consumed on the cursor, the
        matcher asked whether its text is then accepted, and the token rolled back (~1 µs a
        token, 50 ms for a whole vocabulary: less than a model call, where the prefix tree
        would otherwise open one dead last position per token). Where the grammar knows its
        final bytes (a JSON object's ``}``) only the tokens holding one, or whitespace, are
        tried (~1 ms). Should llguidance fail on the way, every allowed token (a superset,
        as the contract allows)."""
        if state is DONE:
            return _EMPTY
        key: tuple[int, ...] = state  # type: ignore[assignment]
        found = self._closing.get(key)
        if found is not None:
            return found
        bits, accepting = self._mask(key)
        ids = _text_ids(bits)
        candidates = self._closing_candidates()
        if candidates is not None:
            ids = np.intersect1d(ids, candidates, assume_unique=True)

        def compute(m: LLMatcher) -> np.ndarray:
            keep = np.zeros(len(ids), dtype=bool)
            for j, token in enumerate(ids.tolist()):
                if not m.consume_token(token):
                    raise _Spent(_failure(self.grammar.kind, m))
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
        self._closing.put(key, found)
        return found

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
        tokens as the token matcher is moved by its tokens (see the module doc). A byte
        costs a mask over 257 tokens and one token consumed (~3-6 µs; one mask over a 49k
        vocabulary is ~0.4 ms), so a limit bounds the cost. Without a limit, llguidance's
        ``compute_ff_bytes`` on a copy of that matcher finds them: ~0.03 µs a byte through
        lexer states built before, ~6 µs a new one, unbounded (1.5 s for ``a{99999999}``,
        where it stops at the 250 000 lexer states the copies share and spends them; the
        byte matcher is then made anew, and the token matcher's lexer is its own). A state
        one token past a state whose forced bytes are known, inside them, reuses them
        (exactly: the rest of those bytes is still forced, and nothing more is).

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
        key: tuple[int, ...] = state  # type: ignore[assignment]
        found = self._forced.get(key)
        if found is None and key:
            parent = self._forced.peek(key[:-1])
            data = self.vocab.bytes_of(key[-1])
            if parent is not None and len(data) < len(parent[0]) and parent[0].startswith(data):
                found = parent[0][len(data):], parent[1]
        if found is not None and (not found[1] or (limit is not None and len(found[0]) >= limit)):
            self._forced.put(key, found)
            return found[0] if limit is None else found[0][:limit]
        track = self._byte_track()

        def walk(matcher: LLMatcher) -> tuple[bytes, bool]:
            try:
                return self._walk_forced(track, matcher, limit)
            except GrammarError as err:  # the byte matcher's lexer, spent: start it again
                raise _Spent(err) from None

        found = track.run(key, walk)
        self._forced.put(key, found)
        return found[0]

    def _byte_track(self) -> _Track:
        """The byte matcher (see :meth:`forced_bytes`), made on first use."""
        if self._bytes is None:
            tokenizer = self.ll.byte_tokenizer(_references_tokens(self.grammar))
            self._byte_eos = tokenizer.eos_token
            offset = self._byte_eos + 1
            bytes_of = self.vocab.bytes_of

            def ids(tokens: tuple[int, ...]) -> list[int]:
                return [offset + b for t in tokens for b in bytes_of(t)]

            self._bytes = _Track(lambda: self._new_matcher(tokenizer), ids,
                                 self._n_checkpoints, self.grammar.kind)
        return self._bytes

    def _walk_forced(self, track: _Track, matcher: LLMatcher,
                     limit: int | None) -> tuple[bytes, bool]:
        """The forced bytes at the state of ``matcher``, ``track``'s cursor (at most
        ``limit``), and whether the limit cut them."""
        eos = self._byte_eos
        if limit is None:
            # Forcing changes a matcher for good: on a copy.
            copy = matcher.deep_copy()
            found = bytes(copy.compute_ff_bytes())
            if copy.is_error():
                raise _failure(self.grammar.kind, copy)
            return found, False
        # Mask bits: token references below the EOS, the EOS ("accepting"), then the bytes
        # (0xFF last: special). A byte is forced where its bit is the only one set.
        head, shift, top = eos >> 3, eos & 7, 1 << 256
        below, low = bytes(head), (1 << shift) - 1
        out = bytearray()
        walker = matcher
        while len(out) < limit:
            raw = walker.compute_bitmask()
            if (head and not raw.startswith(below)) or raw[head] & low:
                break
            bits = int.from_bytes(raw[head:], "little") >> shift
            if bits & (bits - 1) or not 1 < bits < top:
                break
            b = bits.bit_length() - 2
            if walker is matcher:  # consuming changes a matcher for good: on a copy
                walker = matcher.deep_copy()
            out.append(b)
            if not walker.consume_token(eos + 1 + b):
                raise _failure(self.grammar.kind, walker)
        else:
            return bytes(out), True
        if walker.is_error():
            if not _dead_end(walker):
                raise _failure(self.grammar.kind, walker)
            if walker is matcher:  # a dead end (nothing forced): the cursor is spent
                track.reset()
        return bytes(out), False

    def min_new_tokens(self) -> int:
        """A lower bound on the tokens (EOS included) of any complete sequence.

        For a :func:`regex`: its shortest match in bytes (Python's regex parser; a pattern
        it reads differently from the Rust syntax, or cannot read, gets the bound 1) over
        the longest vocabulary token made only of bytes the pattern can match, plus EOS.
        Other grammars: 1.

        >>> from adaptrack.tokenization.vocab import Vocabulary
        >>> v = Vocabulary([b"a", b"b", b"ab", b"xxxx", b"<e>"], eos_ids=[4])
        >>> regex("[ab]{10}").bind(v).min_new_tokens()   # 10 bytes, tokens of <= 2: 5 + EOS
        6
        """
        if self._min_tokens is None:
            self._min_tokens = 1
            if self.grammar.pattern is not None:
                found = regex_min_bytes(self.grammar.pattern)
                if found is not None and found[0] > 0:
                    width, alphabet = found
                    longest = (self.ll.longest if alphabet is None
                               else self.ll.longest_over(alphabet))
                    if longest == 0:
                        self._min_tokens = _UNREACHABLE
                    else:
                        self._min_tokens = min(_UNREACHABLE, math.ceil(width / longest) + 1)
        return self._min_tokens

    def stats(self) -> dict[str, float]:
        """Masks computed over the vocabulary, their seconds, and how often an llguidance
        matcher was made anew after a resource-limit failure (``_Track.run``)."""
        restarts = self._tokens.restarts + (self._bytes.restarts if self._bytes else 0)
        return {"grammar_masks": self.masks_computed, "grammar_mask_seconds": self.mask_seconds,
                "grammar_restarts": restarts}


#: ``min_new_tokens`` of a language no token sequence reaches (larger than any budget).
_UNREACHABLE = 1 << 62

# Rust regex syntax that Python's parser reads differently (nested classes and set
# operations, POSIX classes, some flags, spaces in counted repetitions); a pattern holding
# any of these gets no bound.
_RUST_ONLY = re.compile(r"\[\[|\[:|&&|--|~~|\(\?[a-zA-Z]*[xuRU]|\{[\d\s,]*\s[\d\s,]*\}")


def _nested_class(pattern: str) -> bool:
    """Whether a ``[`` occurs inside a character class (a nested class in Rust, a literal
    in Python)."""
    depth, i = 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            if depth:
                return True
            depth = 1
            i += 1
            if pattern[i:i + 1] == "^":
                i += 1
            if pattern[i:i + 1] == "]":  # a leading "]" is a literal
                i += 1
            continue
        if c == "]":
            depth = 0
        i += 1
    return False


def regex_min_bytes(pattern: str) -> tuple[int, frozenset[int] | None] | None:
    """The fewest bytes a full match of ``pattern`` has, and the bytes a match can hold
    (None: any), where Python's parser reads the pattern as the Rust ``regex`` crate does;
    None where it cannot tell (then no bound is sound).

    >>> width, alphabet = regex_min_bytes("[ab]{3}x?")
    >>> width, bytes(sorted(alphabet))
    (3, b'abx')
    >>> regex_min_bytes(r"é+|\\d"), regex_min_bytes("[[:alpha:]]")
    ((1, None), None)
    """
    if _RUST_ONLY.search(pattern) or _nested_class(pattern):
        return None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parsed = _sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None
    if caught:  # "possible nested set", "possible set difference": Rust reads it otherwise
        return None
    alphabet: set[int] | None = set()
    ignore_case = bool(parsed.state.flags & re.IGNORECASE) or "(?" in pattern

    def chars(c: int) -> None:
        nonlocal alphabet
        if alphabet is None:
            return
        if c >= 0x80 or ignore_case:  # other encodings and case folds: any byte
            alphabet = None
        else:
            alphabet.add(c)

    def width(items: Any) -> int | None:
        nonlocal alphabet
        total = 0
        for op, av in items:
            if op is _sre.LITERAL:
                chars(av)
                total += 1 if ignore_case else len(chr(av).encode("utf-8", "surrogatepass"))
            elif op is _sre.IN:
                for sub_op, sub_av in av:
                    if sub_op is _sre.LITERAL:
                        chars(sub_av)
                    elif sub_op is _sre.RANGE and sub_av[1] < 0x80 and not ignore_case:
                        if alphabet is not None:
                            alphabet.update(range(sub_av[0], sub_av[1] + 1))
                    else:  # NEGATE, CATEGORY, non-ASCII ranges
                        alphabet = None
                total += 1
            elif op in (_sre.ANY, _sre.NOT_LITERAL):
                alphabet = None
                total += 1
            elif op is _sre.BRANCH:
                widths = [width(b) for b in av[1]]
                known = [w for w in widths if w is not None]
                if len(known) < len(widths):
                    return None
                total += min(known)
            elif op is _sre.SUBPATTERN:
                inner = width(av[-1])
                if inner is None:
                    return None
                total += inner
            elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
                inner = width(av[2])
                if inner is None:
                    return None
                total += av[0] * inner
            else:  # anchors, lookarounds, backreferences, …: not in the Rust syntax
                return None
        return total

    found = width(parsed)
    if found is None:
        return None
    return found, None if alphabet is None else frozenset(alphabet)
