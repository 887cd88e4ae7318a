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
1.9: after ``"age"`` a JSON-schema matcher allowed digits before the ``:``).
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
from typing import Any

import numpy as np
from llguidance import LLMatcher, LLTokenizer, regex_to_lark
from llguidance.gbnf_to_lark import any_to_lark

from ..cache import LRU
from ..errors import GrammarError
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

    def __init__(self, kind: str, lark_text: str, pattern: str | None = None) -> None:
        self.kind = kind
        self.lark_text = lark_text + _NO_FORCING
        #: The source of a :func:`regex` (``min_new_tokens`` reads it), else None.
        self.pattern = pattern

    def bind(self, vocab: Vocabulary) -> GrammarMatcher:
        return GrammarMatcher(self, vocab)

    def __repr__(self) -> str:
        return f"Grammar({self.kind}, {self.lark_text[:60]!r}…)"


def _check(kind: str, grammar: str) -> None:
    """Compile ``grammar`` (no vocabulary needed) and raise :class:`GrammarError` with
    llguidance's message if it is invalid; pass its warnings on."""
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise GrammarError(f"invalid {kind}: {messages[0].strip()}")
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
    if not isinstance(pattern, str):
        raise TypeError(f"regex needs a pattern string, got {type(pattern).__name__}")
    _check("regex", LLMatcher.grammar_from_regex(pattern))
    return Grammar("regex", f"start: /{regex_to_lark(pattern, '')}/", pattern)


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
            raise GrammarError(f"invalid JSON schema: not JSON: {err}") from None
    if not isinstance(schema, dict | bool):
        raise GrammarError(
            f"invalid JSON schema: expected an object, got {type(schema).__name__}")
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
        self.tokenizer = LLTokenizer(_Wrapper(vocab, tokens, self.eos))
        nbytes = (size + 1 + 31) // 32 * 4  # llguidance's bitmask: 32-bit words
        self.text_bits = np.zeros(nbytes, dtype=np.uint8)
        packed = np.packbits(text, bitorder="little")
        self.text_bits[: len(packed)] = packed
        # Per id, the first byte of a text token (-1 otherwise); per byte, the id of the
        # one-byte text token spelling it (-1: none). Forced bytes are walked with these.
        self.first_byte = np.full(size + 1, -1, dtype=np.int16)
        self.single = np.full(256, -1, dtype=np.int64)
        for i in np.flatnonzero(text).tolist():
            self.first_byte[i] = tokens[i][0]
            if len(tokens[i]) == 1:
                self.single[tokens[i][0]] = i
        self.longest = max((len(tokens[i]) for i in np.flatnonzero(text).tolist()), default=0)
        self._longest_over: dict[frozenset[int], int] = {}

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


class GrammarMatcher(Matcher):
    """A :class:`Grammar` on one vocabulary. States are token tuples (see the module doc).

    Masks are cached per state as llguidance's packed bits (6 KiB at 49k tokens; sorted ids
    would take up to 400 KiB), least recently used first out, up to ``cache_bytes``:
    ``advance`` tests one bit, ``allowed`` unpacks (20-50 µs). Up to ``checkpoints``
    llguidance matchers (~16 KiB each) are kept as checkpoints.
    """

    terminators = b""

    def __init__(self, grammar: Grammar, vocab: Vocabulary, cache_bytes: int = 64 << 20,
                 checkpoints: int = 1024) -> None:
        self.grammar, self.vocab = grammar, vocab
        self.ll = ll_vocab(vocab)
        self._root = self._new_matcher()  # never consumes: every copy starts from it
        self._cursor = self._root.deep_copy()
        self._at: tuple[int, ...] = ()
        self._checkpoints: LRU[tuple[int, ...], LLMatcher] = LRU(checkpoints)
        self._masks: LRU[tuple[int, ...], tuple[np.ndarray, bool]] = LRU(
            cache_bytes, size=lambda v: v[0].nbytes, keep_one=True)
        self._forced: LRU[tuple[int, ...], tuple[bytes, bool]] = LRU(1 << 16)
        self._min_tokens: int | None = None
        self.masks_computed, self.mask_seconds = 0, 0.0

    def _new_matcher(self) -> LLMatcher:
        m = LLMatcher(self.ll.tokenizer, self.grammar.lark_text, log_level=0)
        if m.is_error():
            raise GrammarError(f"invalid {self.grammar.kind}: {m.get_error()}")
        return m

    def _failed(self, matcher: LLMatcher) -> GrammarError:
        """The error of a failed llguidance matcher (an error is permanent: drop the cursor)."""
        err = matcher.get_error().strip().splitlines()
        if matcher is self._cursor:
            self._cursor, self._at = self._root.deep_copy(), ()
        reason = err[0] if err else "unknown error"
        return GrammarError(f"llguidance failed on this {self.grammar.kind}: {reason} (its "
                            "resource limits; simplify the grammar or shorten max_new_tokens)")

    def _goto(self, state: tuple[int, ...]) -> LLMatcher:
        """Move the cursor to ``state``: forward from where it is when that is a prefix of
        ``state``, else from a copy of the nearest checkpoint (or the start)."""
        at = self._at
        if len(at) > len(state) or state[: len(at)] != at:
            at, self._cursor = (), None  # type: ignore[assignment]
            k = len(state) // _CHECKPOINT_EVERY * _CHECKPOINT_EVERY
            while k > 0:
                found = self._checkpoints.get(state[:k])
                if found is not None:
                    at, self._cursor = state[:k], found.deep_copy()
                    break
                k -= _CHECKPOINT_EVERY
            if self._cursor is None:
                self._cursor = self._root.deep_copy()
            self._at = at
        cursor, k = self._cursor, len(at)
        while k < len(state):
            stop = min(len(state), (k // _CHECKPOINT_EVERY + 1) * _CHECKPOINT_EVERY)
            if not cursor.consume_tokens(list(state[k:stop])):
                # States are valid by construction: only llguidance's resource limits get here.
                raise self._failed(cursor)
            k = stop
            self._at = state[:k]
            if k % _CHECKPOINT_EVERY == 0 and k not in self._checkpoints:
                self._checkpoints.put(self._at, cursor.deep_copy())
        return cursor

    def _compute(self, matcher: LLMatcher) -> tuple[np.ndarray, bool]:
        """``matcher``'s mask: packed bits of the valid text tokens, and whether it accepts."""
        return self._packed(matcher.compute_bitmask(), matcher)

    def _packed(self, raw: bytes, matcher: LLMatcher) -> tuple[np.ndarray, bool]:
        bits = np.frombuffer(raw, dtype=np.uint8)
        if matcher.is_error():
            # A dead end (no token continues the text, which is not accepted): llguidance
            # stops with this error instead of returning an empty mask.
            if matcher.get_error().startswith("NoExtensionBias"):
                if matcher is self._cursor:
                    self._cursor, self._at = self._root.deep_copy(), ()
                return np.zeros_like(self.ll.text_bits), False
            raise self._failed(matcher)
        eos = self.ll.eos
        return bits & self.ll.text_bits, bool(bits[eos >> 3] >> (eos & 7) & 1)

    def _mask(self, state: tuple[int, ...]) -> tuple[np.ndarray, bool]:
        cached = self._masks.get(state)
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        found = self._compute(self._goto(state))
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

    def forced_bytes(self, state: State, limit: int | None = None) -> bytes:
        """Bytes every valid continuation of ``state`` starts with, at most ``limit``.

        Without a limit llguidance computes them (its ``compute_ff_bytes``: ~5 µs a byte,
        with no bound: 1.4 s for ``a{99999999}``, which also exhausts the lexer states its
        matchers share). With one, they are walked here a byte at a time on a copy (one
        mask per byte, one-byte tokens consumed), so at most ``limit`` bytes cost anything.
        A state one token past a state whose forced bytes are known, inside them, reuses
        them (exactly: the rest of those bytes is still forced, and nothing more is).

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
        found = self._walk_forced(key, limit)  # (bytes, whether the limit cut them)
        self._forced.put(key, found)
        return found[0]

    def _walk_forced(self, state: tuple[int, ...], limit: int | None) -> tuple[bytes, bool]:
        """The forced bytes at ``state`` (at most ``limit``), and whether the limit cut them."""
        if limit is None:
            # Forcing changes a matcher for good: on a copy.
            return bytes(self._goto(state).deep_copy().compute_ff_bytes()), False
        out = bytearray()
        copy = None  # made once a first byte is forced: most states force nothing
        while len(out) < limit:
            if copy is None:
                bits, accepting = self._mask(state)
            else:
                bits, accepting = self._compute(copy)
            if accepting:
                return bytes(out), False
            ids = np.flatnonzero(np.unpackbits(bits, bitorder="little").view(bool))
            if not len(ids):
                return bytes(out), False
            first = self.ll.first_byte[ids]
            b = int(first[0])
            if (first != b).any():
                return bytes(out), False
            single = int(self.ll.single[b])
            if copy is None:
                copy = self._goto(state).deep_copy()
            if single < 0:  # no one-byte token to step with: llguidance walks the rest
                rest = bytes(copy.compute_ff_bytes())
                return bytes(out) + rest[: limit - len(out)], len(out) + len(rest) > limit
            out.append(b)
            if not copy.consume_tokens([single]):
                raise self._failed(copy)
        return bytes(out), True

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
        return {"grammar_masks": self.masks_computed, "grammar_mask_seconds": self.mask_seconds}


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
                if any(w is None for w in widths):
                    return None
                total += min(widths)  # type: ignore[type-var]
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
