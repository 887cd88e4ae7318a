"""Compiled grammars: a :class:`Grammar` compiled for one vocabulary, shared.

A compiled grammar holds what is a function of the grammar and the vocabulary alone: the
llguidance matchers compiled from the Lark text (never moved: each
:class:`~.matcher.GrammarMatcher` moves copies of them, with cursors and checkpoints of its
own), the masks, closing tokens and forced bytes found so far by state (a state is the token
tuple from the start, so each is a pure function of it), the tokens that can close a text,
and the token bound of a regex. As XGrammar's ``GrammarCompiler`` keeps its compiled
grammars, :func:`compiled` keeps the last :data:`COMPILED_GRAMMARS` of them under the
grammar (:attr:`Grammar.key`: its Lark text and options) and the vocabulary (by identity),
so every :meth:`Grammar.bind` of one language on one vocabulary (a generate call, a server
request) shares them: no compile, and the masks of states met before are found.

The copies of an llguidance matcher share its lexer, so the matchers of one compiled grammar
share the lexer's states (built once) and its resource limits: after a failure a matcher
starts again from a new compile (:mod:`.cursor`), which becomes the shared one. The server
prepares requests in worker threads while the engine's thread runs others, so what is found
by state is kept in locked maps.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from ...cache import LRU
from ...errors import GrammarError
from ...tokenization.vocab import Vocabulary
from .bounds import json_min_tokens, regex_min_tokens
from .jsonbound import JsonBound, bounded
from .tokenizer import ll_vocab


class GrammarSource(Protocol):
    """What compiling reads of a grammar (:class:`~.sources.Grammar` has it): declared
    here so that the compiler and the matcher do not import the module that makes matchers.
    """

    kind: str
    lark_text: str
    pattern: str | None
    final_bytes: bytes | None
    schema: Any

    @property
    def key(self) -> tuple[str, str, str | None, bytes | None]: ...

#: Bytes of packed masks a compiled grammar keeps by default (6 KiB a mask at 49k tokens).
MASK_CACHE_BYTES = 64 << 20

#: Compiled grammars :func:`compiled` keeps, least recently used out. Each holds up to its
#: ``cache_bytes`` of masks (64 MiB by default; a request's few hundred masks take a few MiB)
#: and 16 MiB of closing tokens, so 16 of them hold 1.3 GiB at most.
COMPILED_GRAMMARS = 16

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Locked(LRU[K, V]):
    """An :class:`~adaptrack.cache.LRU` that several threads may use at once."""

    def __init__(self, limit: int, size: Callable[[V], int] | None = None, *,
                 keep_one: bool = False) -> None:
        super().__init__(limit, size, keep_one=keep_one)
        self._lock = threading.Lock()

    def get(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            return super().get(key, default)

    def peek(self, key: K) -> V | None:
        with self._lock:
            return super().peek(key)

    def put(self, key: K, value: V, *, trim: bool = True) -> None:
        with self._lock:
            super().put(key, value, trim=trim)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return super().pop(key)

    def clear(self) -> None:
        with self._lock:
            super().clear()


def frozen(bits: np.ndarray) -> np.ndarray:
    """``bits``, read-only: matchers share it."""
    bits.setflags(write=False)
    return bits


def _references_tokens(grammar: GrammarSource) -> bool:
    """Whether ``grammar`` may name tokens (llguidance's ``<[5]>``, ``<|end|>``): never for
    a regex or a JSON schema; for Lark and GBNF, wherever ``<…>`` occurs (also in a string
    or a regex: a false alarm costs only speed)."""
    if grammar.kind in ("regex", "JSON schema"):
        return False
    return re.search(r"<[^<>\n]+>", grammar.lark_text) is not None


class CompiledGrammar:
    """``grammar`` compiled for ``vocab``: llguidance's matchers of it (``root`` over the
    vocabulary, :meth:`byte_root` over bytes) and what is found by state, each least
    recently used out: ``masks`` (packed bits and whether the text is accepted, up to
    ``cache_bytes``), ``closing`` (up to 16 MiB of ids) and ``forced`` (65 536 states).

    >>> from adaptrack.constraints import regex
    >>> from adaptrack.tokenization.vocab import Vocabulary
    >>> c = CompiledGrammar(regex("ab?"), Vocabulary([b"a", b"b", b"<e>"], eos_ids=[2]))
    >>> c.root.is_accepting(), c.min_new_tokens()
    (False, 2)
    """

    def __init__(self, grammar: GrammarSource, vocab: Vocabulary,
                 cache_bytes: int = MASK_CACHE_BYTES) -> None:
        self.grammar, self.vocab, self.cache_bytes = grammar, vocab, cache_bytes
        self.ll = ll_vocab(vocab)
        self.root = self.compile()
        self.masks: LRU[tuple[int, ...], tuple[np.ndarray, bool]] = _Locked(
            cache_bytes, size=lambda v: v[0].nbytes, keep_one=True)
        self.closing: LRU[tuple[int, ...], np.ndarray] = _Locked(
            1 << 24, lambda a: a.nbytes + 64)
        self.forced: LRU[tuple[int, ...], tuple[bytes, bool]] = _Locked(1 << 16)
        self._byte_root: LLMatcher | None = None
        self._candidates: tuple[np.ndarray | None] | None = None
        self._min_tokens: int | None = None
        self._json: tuple[JsonBound | None] | None = None

    def compile(self, tokenizer: LLTokenizer | None = None) -> LLMatcher:
        """A new llguidance matcher of the grammar (over ``tokenizer``, by default the
        vocabulary's), with a lexer of its own."""
        m = LLMatcher(tokenizer or self.ll.tokenizer, self.grammar.lark_text, log_level=0)
        if m.is_error():
            raise GrammarError(f"invalid {self.grammar.kind}: {m.get_error()}")
        return m

    def renew(self) -> LLMatcher:
        """A new ``root``, after llguidance's lexer of the old one ran out of its limits
        (which every copy of it shares)."""
        self.root = self.compile()
        return self.root

    def byte_tokenizer(self) -> LLTokenizer:
        """The tokenizer of one token per byte the forced bytes are walked over."""
        return self.ll.byte_tokenizer(_references_tokens(self.grammar))

    def byte_root(self) -> LLMatcher:
        """The grammar's matcher over :meth:`byte_tokenizer`, compiled on first use."""
        if self._byte_root is None:
            self._byte_root = self.compile(self.byte_tokenizer())
        return self._byte_root

    def renew_bytes(self) -> LLMatcher:
        """A new :meth:`byte_root` (as :meth:`renew`)."""
        self._byte_root = self.compile(self.byte_tokenizer())
        return self._byte_root

    def closing_candidates(self) -> np.ndarray | None:
        """The only tokens that can make a text accepted where the grammar knows its final
        bytes: those holding one, and whitespace (after a text already accepted), as packed
        bits in the layout of a mask (so that a mask is narrowed by ``&``, not by a sort of
        both id lists: 1.5 ms a prefix at 49k tokens); None when it does not. Found at the
        first need (a scan of the vocabulary)."""
        if self._candidates is None:
            final, vocab = self.grammar.final_bytes, self.vocab
            found = None
            if final:
                blank = [i for i in vocab.text_ids.tolist()
                         if vocab.bytes_of(i) and not vocab.bytes_of(i).strip(b" \t\n\r")]
                ids = np.union1d(vocab.tokens_holding(final), np.asarray(blank, dtype=np.int64))
                member = np.zeros(8 * len(self.ll.text_bits), dtype=bool)
                member[ids] = True
                found = frozen(np.packbits(member, bitorder="little") & self.ll.text_bits)
            self._candidates = (found,)
        return self._candidates[0]

    def json_bound(self) -> JsonBound | None:
        """The token bound of a JSON schema's texts (:class:`~.jsonbound.JsonBound`),
        made at the first need; None for other grammars and for a schema whose
        ``x-guidance`` options change more than whitespace."""
        if self._json is None:
            schema = self.grammar.schema
            self._json = (JsonBound(schema, self.vocab) if schema is not None and bounded(schema)
                          else None,)
        return self._json[0]

    def min_new_tokens(self) -> int:
        """A lower bound on the tokens (EOS included) of any complete sequence: for a
        regex, :func:`~.bounds.regex_min_tokens`; for a JSON schema the larger of
        :func:`~.bounds.json_min_tokens` and the token bound's need at the root
        (:class:`~.jsonbound.JsonBound`); other grammars: 1."""
        if self._min_tokens is None:
            pattern, schema = self.grammar.pattern, self.grammar.schema
            found = 1 if pattern is None else regex_min_tokens(pattern, self.ll)
            if schema is not None:
                bound = self.json_bound()
                found = max(found, json_min_tokens(schema, self.ll),
                            bound.need(()) if bound is not None else 1)
            self._min_tokens = found
        return self._min_tokens


_COMPILED: LRU[Hashable, CompiledGrammar] = LRU(COMPILED_GRAMMARS)
_COMPILING = threading.Lock()


def compiled(grammar: GrammarSource, vocab: Vocabulary,
             cache_bytes: int = MASK_CACHE_BYTES) -> CompiledGrammar:
    """The compiled grammar of ``grammar`` on ``vocab`` (with ``cache_bytes`` of masks),
    shared: one of the last :data:`COMPILED_GRAMMARS` made for the same :attr:`Grammar.key`,
    the same vocabulary object and bound, else a new one.

    >>> from adaptrack.constraints import regex
    >>> from adaptrack.tokenization.vocab import Vocabulary
    >>> v = Vocabulary([b"a", b"b", b"<e>"], eos_ids=[2])
    >>> compiled(regex("ab?"), v) is compiled(regex("ab?"), v)
    True
    >>> compiled(regex("ab?"), v) is compiled(regex("ab?"), Vocabulary([b"a", b"b", b"<e>"],
    ...                                                              eos_ids=[2]))
    False
    """
    key = (grammar.key, vocab, cache_bytes)  # the vocabulary by identity (no __eq__)
    with _COMPILING:
        found = _COMPILED.get(key)
        if found is None:
            found = CompiledGrammar(grammar, vocab, cache_bytes)
            _COMPILED.put(key, found)
    return found
