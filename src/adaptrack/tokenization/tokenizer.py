"""The canonical tokenization of partial text: :class:`Tokenizer` and its
:meth:`~Tokenizer.tokenize_partial`.

Bytes that a constraint forces can be fed to the model in one step (llguidance's
documentation of fast-forward tokens; docs/design.md §2, fast-forward target). Feeding them
as tokens changes the model's view of the text, so they must be the tokens the tokenizer
itself would have produced (*canonical*); otherwise the model is pushed off its training
distribution (forcing ``order`` when the text goes on as ``orderId``, itself a single
token, leaves the model to pick ``Id`` after ``order``, which it has almost never seen). The
recipe:

1. *tokenize* the bytes, with a few recent tokens in front where the tokenizer's
   pre-tokenization needs the context;
2. *look back* over the last ``max_tokens`` tokens for a byte position ``idx`` where some
   vocabulary token starts that *spans past the end* of the bytes (and, given an ``allows``
   test, that the caller allows after ``data[:idx]``);
3. *hold back* every token that ends after the first such ``idx``: the model decides how the
   text there is tokenized. The bytes held back are returned as the leftover.

:meth:`Tokenizer.tokenize_partial` does this with no test (any spanning token counts);
:func:`adaptrack.sampling.fastforward.forced_tokens` asks the constraint through
:meth:`Tokenizer.tokenize_partial_with`. Spanning tokens come from the token trie: the
tokens starting with given bytes are one contiguous slice of
:attr:`~adaptrack.tokenization.vocab.TokenTrie.order`, so no step loops over the vocabulary.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..cache import LRU
from ..errors import TokenizerError
from .vocab import Vocabulary

_EMPTY = np.empty(0, dtype=np.int64)

#: ``allows(idx, spanning_ids)``: may one of ``spanning_ids`` follow ``data[:idx]``?
Allows = Callable[[int, np.ndarray], bool]
#: Builds ``allows`` from the tokenization of the bytes and the tokens' byte offsets.
MakeAllows = Callable[[list[int], list[int]], Allows]

#: Encoded strings kept by a tokenizer (short strings: a small cache is plenty).
ENCODED_CACHE_ENTRIES = 4096


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` are an incomplete UTF-8 character (0-3): a lead
    byte followed by fewer continuation bytes than it needs. Invalid bytes do not count."""
    for k in range(1, min(3, len(data)) + 1):
        if data[-k] & 0xC0 != 0x80:  # the last byte that is not a continuation byte
            try:
                data[-k:].decode()
            except UnicodeDecodeError as err:
                if err.start == 0 and err.reason == "unexpected end of data":
                    return k
            return 0
    return 0


class Tokenizer:
    """A vocabulary with its canonical tokenizer.

    ``encode(text)`` gives the canonical token ids of ``text`` without BOS or any special
    token, and the ids' bytes (``vocab.bytes_of``) must join to exactly ``text.encode()``
    (byte-level BPE tokenizers such as Llama 3's, Qwen's and SmolLM2's do; a SentencePiece
    tokenizer that prepends a space does not, and :meth:`encode_bytes` then raises
    :class:`~adaptrack.errors.TokenizerError`, a ``ValueError``; so it does where ``encode``
    raises a ``ValueError``, or no token starts at a byte of text that is not UTF-8).

    ``context_tokens``: at most this many recent tokens are tokenized together with new
    bytes (see :meth:`tokenize_partial`).

    >>> v = Vocabulary([b"a", b"b", b"ab", b"abc", b"c"])
    >>> tok = Tokenizer.longest_match(v)       # a toy canonical tokenizer: longest match
    >>> tok.encode_bytes(b"abcab")
    [3, 2]
    >>> tok.tokenize_partial(b"ab")            # "abc" could still follow: nothing is certain
    ([], b'ab')
    >>> tok.tokenize_partial(b"abcb")          # "b" may grow into no longer token
    ([3, 1], b'')
    """

    def __init__(self, vocab: Vocabulary, encode: Callable[[str], list[int]], *,
                 context_tokens: int = 4) -> None:
        self.vocab = vocab
        self.encode = encode
        self.context_tokens = int(context_tokens)
        self.trie = vocab.trie
        # No token is longer than this: a suffix of at least this many bytes spans nothing.
        self.max_token_len = vocab.max_token_len
        self._encoded: LRU[str, list[int]] = LRU(ENCODED_CACHE_ENTRIES)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def for_model(cls, lm: Any) -> Tokenizer:
        """The tokenizer of a :class:`~adaptrack.LanguageModel` (its ``text_tokens``: the
        model's own tokenization without BOS), what ``generate`` fast-forwards with.

        >>> from adaptrack import TableLM
        >>> lm = TableLM([b"a", b"b", b"ab", b"<eos>"], lambda p: [1] * 4, eos=3)
        >>> Tokenizer.for_model(lm).tokenize_partial(b"abab")
        ([2, 2], b'')
        """
        return cls(lm.vocab, lm.text_tokens)

    @classmethod
    def longest_match(cls, vocab: Vocabulary) -> Tokenizer:
        """A tokenizer that encodes by greedy longest match over ``vocab`` (for toy
        vocabularies, where that is the canonical tokenization by definition)."""
        return cls(vocab, lambda text: vocab.longest_match(text.encode()))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """A ``tokenizers`` tokenizer from ``tokenizer.json`` or the directory holding it.

        The vocabulary comes from :func:`adaptrack.tokenization.hf.vocabulary`. Its width is
        ``vocab_size`` of a ``config.json`` beside the file (else the tokenizer's size), its
        EOS ids those of ``generation_config.json``, ``config.json`` or the ``eos_token`` of
        ``tokenizer_config.json``, in that order (none if no file names one). Special
        tokens written in the text (``<|end_of_text|>``) are encoded as plain text.
        """
        from tokenizers import Tokenizer as HFTokenizer

        from .hf import vocabulary

        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {os.fspath(path)!r}")
        try:
            backend = HFTokenizer.from_file(str(file))
        except Exception as err:  # tokenizers raises plain Exception on a bad file
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(f"cannot load the tokenizer {os.fspath(file)!r}: {first}") from None
        backend.encode_special_tokens = True
        backend.no_padding()
        backend.no_truncation()
        config = _read_json(file.parent / "config.json")
        generation = _read_json(file.parent / "generation_config.json")
        eos = _read_json(file.parent / "tokenizer_config.json").get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        eos_id = backend.token_to_id(eos) if isinstance(eos, str) else None
        if config.get("eos_token_id") is None and eos_id is not None:
            config = {**config, "eos_token_id": eos_id}
        width = config.get("vocab_size")
        vocab = vocabulary(backend, width if isinstance(width, int) else None, config or None,
                           generation or None)

        def encode(text: str) -> list[int]:
            return backend.encode(text, add_special_tokens=False).ids

        return cls(vocab, encode)

    # -- encoding -------------------------------------------------------------------------

    def _encode_text(self, text: str) -> list[int]:
        found = self._encoded.get(text)
        if found is not None:
            return found
        try:
            ids = [int(t) for t in self.encode(text)]
        except ValueError as err:  # e.g. a vocabulary with no token for some byte
            raise TokenizerError(f"the tokenizer cannot encode {text[:40]!r}: {err}") from None
        if self.vocab.decode(ids) != text.encode():
            raise TokenizerError(
                f"the tokenizer does not reproduce the text {text[:40]!r}: its tokens' bytes "
                f"are {self.vocab.decode(ids)[:40]!r} (a prepended space or a normalizer?)")
        self._encoded.put(text, ids)
        return ids

    def encode_bytes(self, data: bytes) -> list[int]:
        """Token ids of ``data``: valid UTF-8 runs through ``encode``; bytes that are not
        valid UTF-8 (including an incomplete character at the end) by greedy longest match
        over the vocabulary, each run on its own (text tokenizers see only text).

        >>> v = Vocabulary([b"a", b"\\xe2", b"\\x82", b"\\xac", b"\\xe2\\x82", b"\\xe2\\x82\\xac"])
        >>> tok = Tokenizer.longest_match(v)
        >>> tok.encode_bytes("a€".encode()), tok.encode_bytes(b"a\\xe2\\x82")
        ([0, 5], [0, 4])
        >>> tok.encode_bytes(b"\\xac")                     # not UTF-8: greedy
        [3]
        """
        data = bytes(data)
        out: list[int] = []
        pos = 0
        while pos < len(data):
            try:
                out += self._encode_text(data[pos:].decode())
                break
            except UnicodeDecodeError as err:
                if err.start:
                    out += self._encode_text(data[pos:pos + err.start].decode())
                try:
                    out += self.vocab.longest_match(data[pos + err.start:pos + err.end])
                except ValueError as bad:
                    raise TokenizerError(str(bad)) from None
                pos += err.end
        return out

    def _tokenize_in_context(self, body: bytes, recent: Sequence[int]) -> list[int]:
        """Step 1: the tokens of ``body`` tokenized after the bytes of up to
        ``context_tokens`` recent tokens: tokenize recent + body and keep the tokens after
        the boundary that falls exactly at the end of the recent bytes; without such a
        boundary, retry with fewer recent tokens, down to none (``body`` alone)."""
        n = max(0, self.context_tokens)
        recent = [int(t) for t in recent[max(0, len(recent) - n):]] if n else []
        # Special tokens carry no text and split the text: only what follows the last counts.
        for i in range(len(recent) - 1, -1, -1):
            if not self.vocab.bytes_of(recent[i]):
                recent = recent[i + 1:]
                break
        for k in range(len(recent), 0, -1):
            context = self.vocab.decode(recent[len(recent) - k:])
            tokens = self.encode_bytes(context + body)
            at = 0
            for i, tok in enumerate(tokens):
                if at == len(context):
                    return tokens[i:]
                at += len(self.vocab.bytes_of(tok))
                if at > len(context):
                    break
        return self.encode_bytes(body)

    # -- step 2: tokens spanning the end ----------------------------------------------------

    def _node_at(self, data: bytes, start: int, end: int) -> int | None:
        """The trie node of ``data[start:end]``, ``None`` if no token starts with it."""
        node, children = 0, self.trie.children
        for b in data[start:end]:
            nxt = children[node].get(b)
            if nxt is None:
                return None
            node = nxt
        return node

    def _spans(self, node: int, data: bytes, end: int) -> bool:
        """Whether a token continues ``node`` (the bytes from ``idx`` to ``end``) past
        ``end`` and agrees with the bytes of ``data`` after ``end``.

        Conservative mode is this test alone. Its precomputed set is the token trie's
        inner nodes: a byte string is a proper prefix of a longer token exactly when its
        node has children, so with nothing after ``end`` the test is ``children[node]``."""
        children = self.trie.children
        for b in data[end:]:  # an incomplete UTF-8 character that follows ``end``
            node_next = children[node].get(b)
            if node_next is None:
                return False
            node = node_next
            if len(self.trie.ends[node]):
                return True
        return bool(children[node])

    def _spanning_ids(self, node: int, data: bytes, end: int) -> np.ndarray:
        """Ids (unsorted, unique) of the tokens that :meth:`_spans` looks for: they end after
        ``end`` and agree with ``data`` up to where either ends (subtree slices of the trie;
        each token ends at one node, so the slices do not overlap)."""
        trie, parts = self.trie, []
        for b in data[end:]:
            node_next = trie.children[node].get(b)
            if node_next is None:
                break
            node = node_next
            parts.append(trie.ends[node])
        else:
            lo, hi = trie.span[node]
            # The subtree of ``node`` lists the tokens ending at ``node`` first (depth-first
            # numbering): those end at ``end`` (no span) or are in ``parts`` already.
            parts.append(trie.order[lo + len(trie.ends[node]):hi])
        if not parts:
            return _EMPTY
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    # -- the whole recipe -------------------------------------------------------------------

    def tokenize_partial_with(self, data: bytes, recent: Sequence[int], max_tokens: int,
                              make_allows: MakeAllows | None) -> tuple[list[int], bytes]:
        """Steps 1-3 of the recipe (module docstring): the kept tokens and the leftover.
        ``make_allows(tokens, offsets)`` builds the test a spanning token must pass to hold
        back (the caller's constraint); without it every spanning token counts.

        >>> tok = Tokenizer.longest_match(Vocabulary([b"a", b"ab", b"b"]))
        >>> tok.tokenize_partial_with(b"aa", (), 4, lambda tokens, offsets: lambda i, ids: False)
        ([0, 0], b'')
        """
        end = len(data) - _incomplete_tail(data)  # an incomplete character is left over
        if end == 0:
            return [], data
        tokens = self._tokenize_in_context(data[:end], recent)  # step 1
        offsets = [0]
        for tok in tokens:
            offsets.append(offsets[-1] + len(self.vocab.bytes_of(tok)))
        keep = len(tokens)
        allows = None if make_allows is None else make_allows(tokens, offsets)
        if max_tokens > 0 and tokens:
            # Step 2: candidate start positions, first to last, within the last max_tokens
            # tokens (and less than the longest token away from the end).
            first = max(offsets[max(0, len(tokens) - max_tokens)], end - self.max_token_len + 1)
            for idx in range(max(first, 0), end):
                node = self._node_at(data, idx, end)
                if node is None:
                    continue
                if allows is None:
                    found = self._spans(node, data, end)
                else:
                    ids = self._spanning_ids(node, data, end)
                    found = bool(len(ids)) and allows(idx, ids)
                if found:
                    # Step 3: hold back every token that ends after idx.
                    keep = bisect_right(offsets, idx) - 1
                    break
        return tokens[:keep], data[offsets[keep]:]

    def tokenize_partial(self, data: bytes, recent_tokens: Sequence[int] = (), *,
                         max_tokens: int = 4) -> tuple[list[int], bytes]:
        """The canonical tokens of a prefix of ``data`` that no continuation should change
        (see :func:`adaptrack.sampling.fastforward.forced_tokens` for the limits of that),
        and the bytes left over (like llguidance's ``LLTokenizer.tokenize_partial``).

        ``data`` is tokenized after the bytes of ``recent_tokens`` (the tokens before it;
        at most ``context_tokens`` of them, and only where a token boundary falls exactly
        between them and ``data``). Then the recipe's loop: final tokens are held back while
        a vocabulary token that starts within the last ``max_tokens`` tokens spans past the
        end of ``data`` (``max_tokens=0`` holds nothing back). An incomplete UTF-8
        character at the end is always left over. The tokens' bytes plus the leftover are
        ``data``.

        >>> v = Vocabulary([b"order", b"orderId", b"Id", b"Name", b'"', b'":', b"_x", b"{"])
        >>> tok = Tokenizer.longest_match(v)
        >>> tok.tokenize_partial(b"order")                   # "orderId" may follow
        ([], b'order')
        >>> tok.tokenize_partial(b'Name_x"')                 # '":' may follow
        ([3, 6], b'"')
        >>> tok.tokenize_partial(b'Name_x"', max_tokens=0)   # token healing off
        ([3, 6, 4], b'')
        """
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        data = bytes(data)
        if not data:
            return [], b""
        return self.tokenize_partial_with(data, recent_tokens, max_tokens, None)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deep
        return {}
    return found if isinstance(found, dict) else {}
