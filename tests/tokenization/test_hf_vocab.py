"""Token bytes from Hugging Face tokenizers, checked against the tokenizers' own encoding.

Real tokenizers (Llama 3, Qwen 3) come from ``../shared``; SmolLM2's from the default model's
GGUF when it is set up; SentencePiece-style ones are built here, as no file of one exists.
"""

from __future__ import annotations

import random

import pytest
from paths import SHARED

transformers = pytest.importorskip("transformers")
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402

from adaptrack.tokenization.hf import eos_token_ids, token_bytes, vocabulary  # noqa: E402

FIXED_TEXTS = [
    "Hello, world!",
    " leading space",
    "  two leading spaces and trailing  ",
    "line one\nline two\n\n\nthree\r\nfour",
    "\ttabbed\t\tcode",
    "def f(x: int) -> int:\n    return x ** 2  # square\n",
    'if (a && b) { printf("%d\\n", a[0]); }',
    '{"key": [1, 2.5e-3, null, true], "ü": "ß"}',
    "naïve café, façade, Ångström",
    "Привет, мир! Γειά σου κόσμε",
    "日本語のテキストと中文文本",
    "한국어 문장입니다",
    "مرحبا بالعالم",
    "emoji 😀🙂👍🏽🇫🇷 and a family 👨\u200d👩\u200d👧",
    "combining e\u0301 and zero\u200bwidth and bom \ufeff",
    "control \x00\x01\x7f bytes",
    "12345678901234567890 3.14159",
    "<not special> </s> <|nope|>",
    "'s 're 've 'll 'd I'M",
    "…—“quotes”‘single’ €£¥",
    "\n",
    " ",
    "a",
]
POOLS = [
    "abcdefghijklmnopqrstuvwxyz ABCXYZ",
    " \t\n\r  ",
    "0123456789",
    "éèüßñçøåÆŒ",
    "中文字符日本語한국어",
    "😀🙂👍🏽🇫🇷\u200d🧑‍💻",
    "\u0301\u0308\u200b\ufeff",
    "αβγδΩПриветمرحبا",
    "{}[]()<>;:'\"`~!@#$%^&*_-+=|\\/?.,",
    "\x00\x01\x1b\x7f",
]


def random_texts(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(rng.choice(POOLS)) for _ in range(rng.randint(1, 40)))
            for _ in range(n)]


TEXTS = FIXED_TEXTS + random_texts()


def normalized(tokenizer, text: str) -> str:
    """What the tokenizer encodes: the text after its normalizer (Qwen's is NFC)."""
    norm = tokenizer.backend_tokenizer.normalizer
    return norm.normalize_str(text) if norm is not None else text


def load_shared(name: str):
    path = SHARED / "tokenizers" / name
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"{path} is absent (shared test data not checked out next to the repo)")
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    return tok, token_bytes(tok)


@pytest.fixture(scope="module")
def llama3():
    return load_shared("llama3")


@pytest.fixture(scope="module")
def qwen3():
    return load_shared("qwen3")


@pytest.fixture(scope="module")
def smollm2(request):
    pytest.importorskip("gguf")
    from adaptrack.errors import ModelLoadError
    from adaptrack.lm.default import default_gguf

    try:
        path = default_gguf(download=False)
    except ModelLoadError:
        pytest.skip("the default model is not set up (run `adaptrack setup`)")
    # Converting the GGUF's tokenizer takes ~10 s; pytest's cache keeps the converted one
    # (saved and reloaded it is identical: same backend JSON and special tokens).
    cache = getattr(request.config, "cache", None)
    saved = cache and cache.mkdir(f"adaptrack-{path.stem}-transformers-{transformers.__version__}")
    if saved and (saved / "tokenizer.json").exists():
        tok = transformers.AutoTokenizer.from_pretrained(str(saved))
    else:
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        if saved:
            tok.save_pretrained(str(saved))
    return tok, token_bytes(tok)


BYTE_LEVEL = ["llama3", "qwen3", "smollm2"]


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_byte_level_round_trip(name, request):
    tok, tb = request.getfixturevalue(name)
    assert len(tb) == len(tok)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert all(tb[i] is not None for i in ids), text
        assert b"".join(tb[i] for i in ids) == normalized(tok, text).encode(), text


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_byte_level_every_token_agrees_with_decoder(name, request):
    """Every token whose bytes are whole UTF-8 decodes, alone, to exactly those bytes."""
    tok, tb = request.getfixturevalue(name)
    ids = [i for i, b in enumerate(tb) if b is not None]
    decoded = tok.backend_tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    checked = 0
    for i, text in zip(ids, decoded, strict=True):
        try:
            expected = tb[i].decode()
        except UnicodeDecodeError:
            continue  # a piece of a character: the decoder shows U+FFFD
        assert text == expected, (i, tb[i], text)
        checked += 1
    assert checked > 0.9 * len(ids)


def test_llama3_specials(llama3):
    tok, tb = llama3
    assert len(tb) == 128256
    assert tb[tok.convert_tokens_to_ids("<|begin_of_text|>")] is None
    assert tb[tok.convert_tokens_to_ids("<|eot_id|>")] is None
    assert all(b is None for b in tb[128000:])  # the 256 added tokens are all special
    assert all(b is not None for b in tb[:128000])
    assert {b[0] for b in tb if b is not None and len(b) == 1} == set(range(256))
    assert tb[198] == b"\n"


def test_qwen3_added_tokens(qwen3):
    """Qwen marks <think>, <tool_call> and the FIM tokens non-special: they are text."""
    tok, tb = qwen3
    think = tok.convert_tokens_to_ids("<think>")
    assert tb[think] == b"<think>"
    assert tok.encode("<think>", add_special_tokens=False) == [think]
    assert tb[tok.convert_tokens_to_ids("<|im_end|>")] is None
    assert tb[tok.convert_tokens_to_ids("<|endoftext|>")] is None
    specials = [i for i, t in tok.added_tokens_decoder.items() if t.special]
    assert specials and all(tb[i] is None for i in specials)


def test_smollm2_specials_and_eos(smollm2):
    tok, tb = smollm2
    assert len(tb) == 49152
    assert tb[:17] == [None] * 17  # <|endoftext|>, <|im_start|>, ..., <empty_output>
    assert tb[17] == b"!"
    assert tb[198] == b"\n"
    singles = {b[0] for b in tb if b is not None and len(b) == 1}
    assert len(singles) == 256 - 21
    assert eos_token_ids(tok) == [2]


def test_raw_tokenizer_and_user_added_tokens(llama3):
    """A raw ``tokenizers.Tokenizer`` works too; user-added words are plain UTF-8, not mapped
    through the byte table (``café``'s ``é`` is a byte-table character as well)."""
    _, tb = llama3
    raw = Tokenizer.from_file(str(SHARED / "tokenizers" / "llama3" / "tokenizer.json"))
    raw.add_tokens(["café", AddedToken(" spaced out", normalized=False)])
    raw_tb = token_bytes(raw)
    assert raw_tb[:len(tb)] == tb
    assert raw_tb[len(tb):] == ["café".encode(), b" spaced out"]
    for text in ["un café", "a spaced out b", "café spaced outcafé"]:
        ids = raw.encode(text, add_special_tokens=False).ids
        assert any(i >= len(tb) for i in ids)
        assert b"".join(raw_tb[i] for i in ids) == text.encode()


def test_eos_token_ids_precedence(llama3):
    tok, _ = llama3
    assert eos_token_ids(tok) == [128001]
    assert eos_token_ids(tok, config={"eos_token_id": 128009}) == [128009]
    gen = transformers.GenerationConfig(eos_token_id=[128009, 128001, 128009])
    assert eos_token_ids(tok, {"eos_token_id": 5}, gen) == [128001, 128009]
    assert eos_token_ids(tok, {"eos_token_id": 5}, {"eos_token_id": None}) == [5]


def test_vocabulary_padding(llama3):
    tok, tb = llama3
    v = vocabulary(tok, logits_width=len(tok) + 5)
    assert v.size == len(tok) + 5 and len(v.token_bytes) == len(tok)
    padded = range(len(tok), len(tok) + 5)
    assert all(v.bytes_of(i) == b"" for i in padded)
    assert not set(padded) & set(v.text_ids.tolist())
    assert v.eos_ids.tolist() == [128001]
    assert v.token_bytes[:1000] == tuple(tb[:1000])
    assert vocabulary(tok).size == len(tok)


def test_vocabulary_too_narrow(llama3):
    tok, _ = llama3
    with pytest.raises(ValueError, match="tokenizer has 128256"):
        vocabulary(tok, logits_width=len(tok) - 1)


# --- SentencePiece style, built here -------------------------------------------------------

SP_PIECES = ["▁", "▁the", "▁hello", "hello", "▁world", "ing", "▁▁", "é", "\t",
             *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"()[]{}:;-_=+*/"]


def sentencepiece_tokenizer(style: str):
    """A Unigram model with byte fallback, in Llama 2 style (Prepend/Replace normalizer and
    a Replace/ByteFallback/Fuse/Strip decoder) or Metaspace style (Mistral, newer Llama 2)."""
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SP_PIECES]
    # Longer pieces score better, single characters worst, byte tokens are the fallback.
    vocab = [(p, -10.0 if p.startswith("<") else -5.0 / len(p)) for p in pieces]
    raw = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    if style == "metaspace":
        raw.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
        raw.decoder = decoders.Sequence([decoders.ByteFallback(),
                                         decoders.Metaspace(prepend_scheme="first", split=False)])
    else:
        raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
        raw.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    raw.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>",
                                               eos_token="</s>", unk_token="<unk>")
    tok.add_tokens([AddedToken("<custom>", normalized=False),
                    AddedToken("big deal", normalized=True)])
    return tok


@pytest.fixture(scope="module", params=["llama2", "metaspace"])
def sentencepiece(request):
    tok = sentencepiece_tokenizer(request.param)
    return request.param, tok, token_bytes(tok)


def test_sentencepiece_pieces(sentencepiece):
    style, tok, tb = sentencepiece
    ids = tok.convert_tokens_to_ids
    assert tb[ids("<0x0A>")] == b"\n"
    assert tb[ids("<0x00>")] == b"\x00" and tb[ids("<0xFF>")] == b"\xff"
    assert tb[ids("▁the")] == b" the" and tb[ids("▁▁")] == b"  " and tb[ids("é")] == "é".encode()
    assert [tb[ids(t)] for t in ("<unk>", "<s>", "</s>")] == [None] * 3
    assert tb[ids("<custom>")] == b"<custom>"
    # A normalized added token is matched against its normalized content: Llama 2's
    # normalizer turns "big deal" into "▁big▁deal", so the token covers " big deal".
    assert tb[len(tok) - 1] == (b" big deal" if style == "llama2" else b"big deal")
    assert eos_token_ids(tok) == [ids("</s>")]


def test_sentencepiece_round_trip(sentencepiece):
    """Joined bytes are the text with the one ``▁`` the tokenizer prepends, as a space. The
    decoder strips that space (Llama 2's Strip) or every space of the first token (Metaspace)
    and otherwise gives the same text."""
    style, tok, tb = sentencepiece
    for text in [*FIXED_TEXTS, *random_texts(100, seed=1)]:
        text = text.replace("</s>", "")  # a special token in the text has no bytes
        ids = tok.encode(text, add_special_tokens=False)
        joined = b"".join(tb[i] for i in ids)
        keeps_own_space = style == "metaspace" and text.startswith(" ")
        assert joined == (b"" if keeps_own_space else b" ") + text.encode(), text
        decoded = tok.backend_tokenizer.decode(ids, skip_special_tokens=False).encode()
        if style == "metaspace":
            first = tb[ids[0]]
            assert decoded == first.replace(b" ", b"") + joined[len(first):], text
        else:
            assert decoded == joined.removeprefix(b" "), text


def test_sentencepiece_added_token_spacing():
    """Llama 2's normalizer prepends ``▁`` to every stretch between added tokens, so a
    space appears after ``<custom>`` that the text did not have; the decoder shows it too."""
    tok = sentencepiece_tokenizer("llama2")
    tb = token_bytes(tok)
    ids = tok.encode("a <custom>b", add_special_tokens=False)
    assert b"".join(tb[i] for i in ids) == b" a <custom> b"
    assert tok.backend_tokenizer.decode(ids) == "a <custom> b"


# --- strictness ----------------------------------------------------------------------------


def test_byte_level_unknown_character_is_an_error():
    raw = Tokenizer(models.BPE({"a": 0, "Ġ": 1, "☃": 2}, []))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    with pytest.raises(ValueError, match=r"token 2 \('☃'\)"):
        token_bytes(raw)
    raw.model = models.BPE({"a": 0, "Ġ": 1, "ĊĠ": 2}, [])
    assert token_bytes(raw) == [b"a", b" ", b"\n "]


def test_unknown_tokenizer_family_is_an_error():
    raw = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.decoder = decoders.WordPiece()
    with pytest.raises(ValueError, match="unsupported tokenizer"):
        token_bytes(raw)


def test_holes_and_eos_made_special():
    """Ids with no token are special, even past transformers' ``len`` (which counts tokens);
    an EOS id is special in the vocabulary even when it has text."""
    raw = Tokenizer(models.BPE({"a": 0, "b": 1, "Ġ": 3}, []))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    assert token_bytes(raw) == [b"a", b"b", None, b" "]
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw)
    assert len(tok) == 3 and token_bytes(tok) == [b"a", b"b", None, b" "]
    v = vocabulary(tok, logits_width=6, config={"eos_token_id": 1})
    assert v.token_bytes == (b"a", None, None, b" ") and v.eos_ids.tolist() == [1]
    with pytest.raises(ValueError, match="scores 3 token ids but the tokenizer has 4"):
        vocabulary(tok, logits_width=3)
