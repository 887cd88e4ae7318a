"""Our vocabulary as llguidance's tokenizer (an ``LLTokenizer``), one per vocabulary.

llguidance knows nothing of our EOS ids: its tokenizer is built from our token bytes plus
one placeholder EOS token appended after the model's ids; that placeholder's bit in a mask
says "the grammar accepts here", and the matcher puts our own EOS ids in its place. Special
tokens (and ids without bytes) are marked with a leading 0xFF byte, which no UTF-8 text
holds, so llguidance never matches them as text.
"""

from __future__ import annotations

import weakref

import numpy as np
from llguidance import LLTokenizer

from ...tokenization.vocab import Vocabulary


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


class LLVocab:
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


_LL_VOCABS: weakref.WeakKeyDictionary[Vocabulary, LLVocab] = weakref.WeakKeyDictionary()


def ll_vocab(vocab: Vocabulary) -> LLVocab:
    """The llguidance tokenizer of ``vocab``, built once per vocabulary (≈0.2 s at 49k).

    >>> v = Vocabulary([b"a", b"b", b"<e>"], eos_ids=[2])
    >>> ll_vocab(v) is ll_vocab(v), ll_vocab(v).eos  # the placeholder EOS after the ids
    (True, 3)
    """
    found = _LL_VOCABS.get(vocab)
    if found is None:
        found = _LL_VOCABS[vocab] = LLVocab(vocab)
    return found
