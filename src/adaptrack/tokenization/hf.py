"""Token byte values from Hugging Face tokenizers.

Constraints walk the bytes of tokens, so every id needs its exact byte value. Two families
of fast tokenizers are understood, told apart by the backend's decoder and pre-tokenizer
(never by model name):

* **Byte-level BPE** (GPT-2 style: Llama 3, Qwen, SmolLM2): a token is stored as a string of
  stand-in characters, one per byte (GPT-2's ``bytes_to_unicode`` table); the table is
  inverted exactly, and a character outside it is an error.
* **SentencePiece style** (Llama 2, Mistral, Gemma; Metaspace, Replace or ByteFallback
  decoders): ``<0xHH>`` is the single byte 0xHH, ``▁`` is a space, anything else is its
  UTF-8. A leading ``▁`` is kept as a space: the model did emit it. Most of these
  tokenizers (not Gemma's) prepend ``▁`` when encoding (Llama 2 always, Metaspace
  ``"first"`` unless the text starts with a space) and their decoder strips a space at the
  start of the whole text, so the joined bytes of ``encode(text)`` are ``b" " + text``
  where ``decode`` gives ``text``. Beyond that the bytes equal what the backend's
  ``decode`` gives, except that a Metaspace decoder drops every ``▁`` of the first token
  (``"  two"`` decodes to ``"two"``, from bytes ``b"  two"``).

Special tokens (added tokens marked special, the tokenizer's declared special tokens such as
BOS/EOS/UNK/PAD, and the model's unknown token) are ``None``: they carry no text. So are ids
with no token at all (holes in the id range). Non-special added tokens are stored as plain
text, not in the byte-level alphabet, and map to the UTF-8 of the text that encoding matches
them to. (``tokenizers`` decodes a byte-level added token such as ``café`` through the byte
table, giving ``caf\\xe9``; the encoding side is the one kept here.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from .vocab import Vocabulary


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes for
    the characters from U+0100 on, in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    others = (b for b in range(256) if b not in table)
    table.update({b: chr(0x100 + n) for n, b in enumerate(others)})
    return table


# A str.translate table turning each stand-in character into the character whose code is
# its byte, so ``.encode("latin-1")`` gives the token's bytes. Code points below 256 that are
# not stand-ins go to U+FFFF, which Latin-1 refuses, as it refuses everything above 255:
# an unknown character cannot slip through as a wrong byte.
_UNBYTE: dict[int, int | str] = {cp: "\uffff" for cp in range(256)}
_UNBYTE.update({ord(c): b for b, c in _bytes_to_unicode().items()})
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _backend(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind a fast transformers tokenizer (or itself)."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "get_vocab") or not hasattr(backend, "decoder"):
        raise TypeError(f"{type(tokenizer).__name__} is not a fast (tokenizers-backed) "
                        "tokenizer; load it with use_fast=True")
    return backend


def _parts(component: Any) -> Iterator[dict[str, Any]]:
    """Every typed JSON node of a decoder or pre-tokenizer, Sequences flattened. Only the
    component is serialized: the whole tokenizer's ``to_str()`` costs a second on big vocabs."""
    stack: list[Any] = [json.loads(component.__getstate__())] if component is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if "type" in node:
                yield node
            stack.extend(v for v in node.values() if isinstance(v, list | dict))


def _space_marker(backend: Any) -> str | None:
    """``None`` for byte-level BPE, else the SentencePiece space marker (normally ``▁``)."""
    parts = [*_parts(backend.decoder), *_parts(backend.pre_tokenizer)]
    types = {p["type"] for p in parts}
    if "ByteLevel" in types:
        return None
    for p in parts:
        if p["type"] == "Metaspace":
            return str(p.get("replacement", "▁"))
        if p["type"] == "Replace" and p.get("content") == " " and "String" in p["pattern"]:
            return str(p["pattern"]["String"])
    if "ByteFallback" in types:
        return "▁"
    raise ValueError(
        f"unsupported tokenizer: decoder/pre-tokenizer types {sorted(types)} are neither "
        "byte-level BPE (ByteLevel) nor SentencePiece style (Metaspace, Replace '▁', "
        "ByteFallback)"
    )


def _special_ids(tokenizer: Any, backend: Any, added: Mapping[int, Any]) -> set[int]:
    special = {i for i, tok in added.items() if tok.special}
    special.update(getattr(tokenizer, "all_special_ids", None) or ())
    # The model's unknown token stands for text it could not encode, not for its own name.
    unk = getattr(backend.model, "unk_token", None)
    if unk is not None and (unk_id := backend.token_to_id(unk)) is not None:
        special.add(unk_id)
    return special


def token_bytes(tokenizer: Any) -> list[bytes | None]:
    """The bytes of every token id ``0 .. len(tokenizer) - 1``; ``None`` for special tokens.
    (If the ids have holes, which ``len`` of a transformers tokenizer does not count, the list
    reaches the largest id; the holes are ``None``.)

    ``tokenizer`` is a fast ``transformers`` tokenizer or a raw ``tokenizers.Tokenizer``.
    Raises ``ValueError`` for a tokenizer family it does not know, or for a byte-level token
    with a character outside the byte table (naming the id), rather than guessing.

    >>> from transformers import AutoTokenizer  # doctest: +SKIP
    >>> tok = AutoTokenizer.from_pretrained("meta-llama/Meta-Llama-3-8B")  # doctest: +SKIP
    >>> tb = token_bytes(tok)  # doctest: +SKIP
    >>> tb[198], tb[128000]  # doctest: +SKIP
    (b'\\n', None)
    """
    backend = _backend(tokenizer)
    marker = _space_marker(backend)
    pieces = {i: piece for piece, i in backend.get_vocab(with_added_tokens=False).items()}
    added = getattr(tokenizer, "added_tokens_decoder", None) or backend.get_added_tokens_decoder()
    n = max(len(tokenizer) if tokenizer is not backend else 0,
            max(pieces, default=-1) + 1, max(added, default=-1) + 1)
    out: list[bytes | None] = [None] * n
    for i, piece in pieces.items():
        if marker is None:
            try:
                out[i] = piece.translate(_UNBYTE).encode("latin-1")
            except UnicodeEncodeError:
                raise ValueError(f"token {i} ({piece!r}) has a character outside the "
                                 "byte-level table; cannot tell its bytes") from None
        elif m := _BYTE_TOKEN.fullmatch(piece):
            out[i] = bytes([int(m[1], 16)])
        else:
            out[i] = piece.replace(marker, " ").encode()

    # Llama 2 style normalizers write spaces as the marker (and prepend one); Metaspace
    # pre-tokenizers do it after added tokens are matched, so those keep plain spaces.
    norm = backend.normalizer
    marks_spaces = marker is not None and norm is not None and marker in norm.normalize_str(" ")
    for i, tok in added.items():
        if tok.special or pieces.get(i) == tok.content:
            continue  # special: cleared below; same as the model's own token: mapped above
        # An added token is matched in the text as written or, when ``normalized``, in the
        # normalized text against its normalized content (what ``id_to_token`` returns).
        text = tok.content
        if tok.normalized:
            text = backend.id_to_token(i) or text
            if marks_spaces:
                text = text.replace(marker, " ")
        out[i] = text.encode()
    for i in _special_ids(tokenizer, backend, added):
        if 0 <= i < n:
            out[i] = None
    return out


def _field(source: Any, name: str) -> Any:
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def eos_token_ids(tokenizer: Any, config: Any = None, generation_config: Any = None) -> list[int]:
    """EOS ids, sorted and deduplicated: ``generation_config.eos_token_id`` (an int or a
    list), else ``config.eos_token_id``, else ``tokenizer.eos_token_id``; ``[]`` if none
    sets one. The configs may be objects or dicts. Chat models often end turns with a token
    that only the generation config lists, hence that order.

    >>> eos_token_ids(None, {"eos_token_id": 2}, {"eos_token_id": [7, 3, 7]})
    [3, 7]
    """
    for source in (generation_config, config, tokenizer):
        eos = _field(source, "eos_token_id")
        if eos is not None and eos != []:
            return sorted({int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])})
    return []


def vocabulary(tokenizer: Any, logits_width: int | None = None, config: Any = None,
               generation_config: Any = None) -> Vocabulary:
    """The :class:`Vocabulary` of a model with this tokenizer.

    ``logits_width`` is the width of the model's output scores (default ``len(tokenizer)``);
    models often pad it past the tokenizer, and those extra ids are special. EOS ids (see
    :func:`eos_token_ids`) are made special too: ending the text is not text.
    """
    tb = token_bytes(tokenizer)
    width = len(tb) if logits_width is None else int(logits_width)
    if width < len(tb):
        raise ValueError(
            f"the model scores {width} token ids but the tokenizer has {len(tb)}: the model "
            "could never produce the tokenizer's last ids, which usually means this "
            "tokenizer belongs to a different model"
        )
    eos = eos_token_ids(tokenizer, config, generation_config)
    for e in eos:
        if e < len(tb):
            tb[e] = None
    return Vocabulary(tb, eos_ids=eos, size=width)
