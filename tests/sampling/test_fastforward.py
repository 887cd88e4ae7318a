"""Fast-forward tokens (seed 002): canonical tokenization of forced bytes, and the bench."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from paths import SHARED

from adaptrack.cli import main
from adaptrack.constraints import DONE, Matcher, State, json_schema, regex
from adaptrack.constraints.grammar import JSON_WHITESPACE
from adaptrack.sampling.fastforward import forced_tokens
from adaptrack.tokenization.tokenizer import Tokenizer
from adaptrack.tokenization.vocab import Vocabulary

LLAMA3 = SHARED / "tokenizers" / "llama3"

# The seed's two schemas: optional orderId/orderName; required name_of_the_person/age.
# The seed's examples: whitespace may follow a key, so '":' is not forced after it.
ORDER_SCHEMA = {
    "properties": {"orderId": {"type": "string"}, "orderName": {"type": "string"}},
    "required": [],
    "additionalProperties": False,
    "x-guidance": {"whitespace_pattern": JSON_WHITESPACE},
}
PERSON_SCHEMA = {
    "properties": {"name_of_the_person": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name_of_the_person", "age"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_pattern": JSON_WHITESPACE},
}


def reference(tok: Tokenizer, data: bytes, recent: list[int], max_tokens: int,
              allows=None) -> tuple[list[int], bytes]:
    """The seed's loop, literally (a Python loop over the vocabulary: tests only)."""
    tokens = tok._tokenize_in_context(data, recent)
    if max_tokens == 0 or not tokens:
        return tokens, b""
    max_length = len(tok.vocab.decode(tokens[-max_tokens:]))
    for idx in range(len(data) - max_length, len(data)):
        suffix = data[idx:]
        if any(b and b.startswith(suffix) and len(b) > len(suffix)
               and (allows is None or allows(data[:idx] + b))
               for b in tok.vocab.token_bytes):
            while len(tok.vocab.decode(tokens)) > idx:
                del tokens[-1]
            break
    return tokens, data[len(tok.vocab.decode(tokens)):]


def grammar_allows(matcher: Matcher, state: State):
    """``allows(text)``: whether ``text`` may follow ``state`` (greedy tokens, byte-level)."""
    def allows(text: bytes) -> bool:
        s = state
        for t in Tokenizer.longest_match(matcher.vocab).encode_bytes(text):
            if s is None or s is DONE:
                return False
            s = matcher.advance(s, t)
        return s is not None
    return allows


def strings(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.vocab.bytes_of(t).decode() for t in ids]


def after(matcher: Matcher, tokens: list[int]) -> State:
    state = matcher.start()
    for t in tokens:
        state = matcher.advance(state, t)
        assert state is not None
    return state


# -- real tokenizers: the seed's examples ------------------------------------------------


@pytest.fixture(scope="module")
def llama3() -> Tokenizer:
    if not (LLAMA3 / "tokenizer.json").is_file():
        pytest.skip(f"the Llama 3 tokenizer is not at {LLAMA3}")
    pytest.importorskip("tokenizers")
    return Tokenizer.from_file(LLAMA3)


@pytest.fixture(scope="module")
def default_tokenizer() -> Tokenizer:
    """The default model's tokenizer, from its converted directory (as ``default_vocab``)."""
    pytest.importorskip("transformers", reason="the default model's tokenizer")
    from adaptrack.lm.default import default_gguf
    from adaptrack.lm.load import converted_gguf

    return Tokenizer.from_file(converted_gguf(default_gguf()))


def test_llama3_vocabulary(llama3: Tokenizer) -> None:
    assert llama3.vocab.size == 128256
    assert llama3.vocab.eos_ids.tolist() == [128001]  # tokenizer_config.json's eos_token
    ids = llama3.encode_bytes(b'{"orderId":"x"}')
    assert llama3.vocab.decode(ids) == b'{"orderId":"x"}'
    assert "orderId" in strings(llama3, ids)
    # special tokens written in the text are text
    assert llama3.vocab.decode(llama3.encode_bytes(b"<|end_of_text|>")) == b"<|end_of_text|>"


def test_seed_examples_tokenize_partial(llama3: Tokenizer) -> None:
    assert llama3.tokenize_partial(b"order") == ([], b"order")
    recent = llama3.encode_bytes(b'{"')
    new, leftover = llama3.tokenize_partial(b'name_of_the_person"', recent)
    assert strings(llama3, new) == ["name", "_of", "_the", "_person"]
    assert leftover == b'"'
    # token healing off: the seed's non-canonical forcing
    assert strings(llama3, llama3.tokenize_partial(b"order", max_tokens=0)[0]) == ["order"]


def test_seed_examples_forced_tokens(llama3: Tokenizer) -> None:
    recent = llama3.encode_bytes(b'{"')
    m = json_schema(ORDER_SCHEMA).bind(llama3.vocab)
    state = after(m, recent)
    assert m.forced_bytes(state) == b"order"
    assert forced_tokens(llama3, m, state, recent) == ([], b"order")
    assert forced_tokens(llama3, m, state, recent, conservative=True) == ([], b"order")

    m = json_schema(PERSON_SCHEMA).bind(llama3.vocab)
    state = after(m, recent)
    assert m.forced_bytes(state) == b'name_of_the_person"'
    for conservative in (False, True):
        new, leftover = forced_tokens(llama3, m, state, recent, conservative=conservative)
        assert strings(llama3, new) == ["name", "_of", "_the", "_person"]
        assert leftover == b'"'
    # the leftover '"' is held back because '":' (and friends) may follow
    assert forced_tokens(llama3, m, state, recent, max_tokens=0)[1] == b""


def test_seed_examples_default_tokenizer(default_tokenizer: Tokenizer) -> None:
    tok = default_tokenizer
    assert tok.vocab.size == 49152
    recent = tok.encode_bytes(b'{"')
    for schema in (ORDER_SCHEMA, PERSON_SCHEMA):
        m = json_schema(schema).bind(tok.vocab)
        state = after(m, recent)
        data = m.forced_bytes(state)
        for max_tokens in (0, 1, 2, 4):
            got = forced_tokens(tok, m, state, recent, max_tokens=max_tokens)
            assert got == reference(tok, data, recent, max_tokens, grammar_allows(m, state))
            assert tok.vocab.decode(got[0]) + got[1] == data
            assert tok.tokenize_partial(data, recent, max_tokens=max_tokens) == \
                reference(tok, data, recent, max_tokens)
    # the seed's two outcomes hold for SmolLM2's tokenizer as well
    assert tok.tokenize_partial(b"order") == ([], b"order")
    new, leftover = tok.tokenize_partial(b'name_of_the_person"', recent)
    assert tok.vocab.decode(new) == b"name_of_the_person" and leftover == b'"'
    assert new == tok.encode_bytes(b'{"name_of_the_person"')[len(recent):len(recent) + len(new)]


def test_matches_the_seed_loop_on_json(llama3: Tokenizer) -> None:
    """Every position of a compact instance: the trie-based check equals the seed's loop."""
    m = json_schema(PERSON_SCHEMA).bind(llama3.vocab)
    canon = llama3.encode_bytes(b'{"name_of_the_person":"Ann","age":42}')
    for i in range(len(canon)):
        state = after(m, canon[:i])
        data = m.forced_bytes(state)
        got = forced_tokens(llama3, m, state, canon[:i], max_tokens=2)
        if not data:
            assert got == ([], b"")
            continue
        assert got == reference(llama3, data, canon[:i], 2, grammar_allows(m, state))
        assert got[0] == canon[i:i + len(got[0])]  # a prefix of the canonical tokens


# -- toy vocabularies --------------------------------------------------------------------

SEEDISH = [b"order", b"orderId", b"Id", b"Name", b'"', b'":', b"_x", b"o", b"r", b"d",
           b"e", b"I", b"N", b"<eos>"]


def toy(tokens: list[bytes], eos: int | None = None) -> Tokenizer:
    return Tokenizer.longest_match(Vocabulary(tokens, eos_ids=[] if eos is None else [eos]))


def test_holding_back() -> None:
    tok = toy(SEEDISH)
    assert tok.tokenize_partial(b"order") == ([], b"order")
    assert tok.tokenize_partial(b'Name_x"') == ([3, 6], b'"')
    assert tok.tokenize_partial(b"Name") == ([3], b"")  # nothing longer starts in "Name"
    assert tok.tokenize_partial(b"") == ([], b"")
    assert tok.tokenize_partial(b"orderId") == ([1], b"")
    with pytest.raises(ValueError, match="max_tokens"):
        tok.tokenize_partial(b"x", max_tokens=-1)


def test_max_tokens_window() -> None:
    """The spanning token "xyzw" starts two tokens back ("x", "yz")."""
    tok = toy([b"x", b"yz", b"y", b"z", b"w", b"xyzw"])
    assert tok.encode_bytes(b"xyz") == [0, 1]
    assert tok.tokenize_partial(b"xyz", max_tokens=0) == ([0, 1], b"")
    assert tok.tokenize_partial(b"xyz", max_tokens=1) == ([0, 1], b"")  # not seen
    assert tok.tokenize_partial(b"xyz", max_tokens=2) == ([], b"xyz")
    assert tok.tokenize_partial(b"xyz", max_tokens=4) == ([], b"xyz")


def test_constraint_decides_and_conservative_does_not() -> None:
    tok = toy(SEEDISH, eos=13)
    m = regex("order(Name|_x)").bind(tok.vocab)  # orderId is not allowed here
    s = m.start()
    assert m.forced_bytes(s) == b"order"
    assert forced_tokens(tok, m, s, []) == ([0], b"")
    assert forced_tokens(tok, m, s, [], conservative=True) == ([], b"order")
    m = regex("order(Id|Name)").bind(tok.vocab)  # it is here
    assert forced_tokens(tok, m, m.start(), []) == ([], b"order")
    assert forced_tokens(tok, m, m.start(), [], max_tokens=0) == ([0], b"")
    # nothing forced, or a finished state
    m = regex("(a|b)").bind(Vocabulary([b"a", b"b", b"<e>"], eos_ids=[2]))
    assert forced_tokens(Tokenizer.longest_match(m.vocab), m, m.start(), []) == ([], b"")
    assert forced_tokens(tok, m, DONE, []) == ([], b"")


def test_spanning_token_must_be_allowed_where_it_starts() -> None:
    """'":' starts at the last byte of 'Name_x"'; the grammar decides whether ':' follows."""
    tok = toy([*SEEDISH, b":", b",", b";"], eos=13)
    for pattern, expected in (('Name_x"(:|,)', ([3, 6], b'"')),
                              ('Name_x"(;|,)', ([3, 6, 4], b""))):
        m = regex(pattern).bind(tok.vocab)
        got = forced_tokens(tok, m, m.start(), [])
        assert got == expected
        assert got == reference(tok, m.forced_bytes(m.start()), [], 4,
                                grammar_allows(m, m.start()))


def test_incomplete_and_invalid_utf8() -> None:
    tok = toy([b"a", b"\xe2", b"\x82", b"\xac", b"\xe2\x82\xac", b"\xff"])
    euro = "€".encode()
    assert tok.encode_bytes(b"a" + euro) == [0, 4]
    assert tok.encode_bytes(b"a\xff\xe2") == [0, 5, 1]  # greedy over the invalid bytes
    # an incomplete character at the end is always left over, even with max_tokens=0
    assert tok.tokenize_partial(b"a\xe2\x82") == ([0], b"\xe2\x82")
    assert tok.tokenize_partial(b"a\xe2\x82", max_tokens=0) == ([0], b"\xe2\x82")
    assert tok.tokenize_partial(b"\xe2") == ([], b"\xe2")
    # invalid bytes (not incomplete) are tokenized greedily, and may be forced
    assert tok.tokenize_partial(b"a\xff") == ([0, 5], b"")
    # a token that crosses into the incomplete character holds back the one before it
    tok = toy([b"a", b"\xe2", b"\x82", b"\xac", b"a\xe2"])
    assert tok.tokenize_partial(b"a\xe2") == ([], b"a\xe2")
    assert tok.tokenize_partial(b"a\xe2", max_tokens=0) == ([0], b"\xe2")
    # bytes no token covers
    with pytest.raises(ValueError, match="no token starts"):
        toy([b"a"]).encode_bytes(b"a\xff")


def test_tokenizer_must_reproduce_the_text() -> None:
    vocab = Vocabulary([b"a", b" a"])
    tok = Tokenizer(vocab, lambda text: [1])  # prepends a space, as SentencePiece does
    with pytest.raises(ValueError, match="does not reproduce"):
        tok.encode_bytes(b"a")


def test_recent_tokens_change_the_tokenization() -> None:
    """Digits go in groups of three from the start of a run (like Llama 3's ``\\p{N}{1,3}``)."""
    vocab = Vocabulary([b"1", b"2", b"3", b"4", b"12", b"34", b" ", b" 1"])

    def encode(text: str) -> list[int]:
        return [t for part in re.findall(r" ?\d{1,3}|\D", text)
                for t in Tokenizer.longest_match(vocab).encode(part)]

    tok = Tokenizer(vocab, encode)
    assert tok.encode_bytes(b"34") == [5]
    assert tok.encode_bytes(b"1234") == [4, 2, 3]  # "123" "4" -> "12" "3" "4"
    # after "12" the text "34" is tokenized "3" "4": the boundary after "12" is kept
    assert tok.tokenize_partial(b"34", [4], max_tokens=0) == ([2, 3], b"")
    assert tok.tokenize_partial(b"34", [], max_tokens=0) == ([5], b"")
    # after " " the digit joins it (" 1"): no boundary, so the text is tokenized alone
    assert tok.tokenize_partial(b"1", [6], max_tokens=0) == ([0], b"")
    # special tokens (no bytes) cut the context
    vocab2 = Vocabulary([*vocab.token_bytes, None])
    tok2 = Tokenizer(vocab2, encode)
    assert tok2.tokenize_partial(b"34", [4, 8], max_tokens=0) == ([5], b"")
    tok0 = Tokenizer(vocab, encode, context_tokens=0)
    assert tok0.tokenize_partial(b"34", [4], max_tokens=0) == ([5], b"")


class LazyRegex(Matcher):
    """A lazy matcher (like a predicate) over a regex matcher that also forces bytes."""

    lazy = True

    def __init__(self, inner: Matcher) -> None:
        self.inner, self.vocab = inner, inner.vocab
        self.checks = 0

    def start(self) -> State:
        return self.inner.start()

    def allowed(self, state: State) -> np.ndarray:
        return np.arange(self.vocab.size)  # candidates only

    def finishing(self, state: State) -> np.ndarray:
        return self.inner.finishing(state)

    def advance(self, state: State, token: int) -> State | None:
        self.checks += 1
        return self.inner.advance(state, token)

    def forced_bytes(self, state: State) -> bytes:
        return self.inner.forced_bytes(state)


def test_lazy_matcher() -> None:
    tok = toy(SEEDISH, eos=13)
    for pattern, expected in (("order(Name|_x)", ([0], b"")), ("order(Id|Name)", ([], b"order"))):
        m = LazyRegex(regex(pattern).bind(tok.vocab))
        assert forced_tokens(tok, m, m.start(), []) == expected
        assert m.checks > 0


def test_lazy_done_counts_as_allowed() -> None:
    """A spanning token that ends the sequence (advance gives DONE) holds back too."""
    tok = toy([b"a", b"ab", b"b"])

    class EndsWithAb(LazyRegex):
        def advance(self, state: State, token: int) -> State | None:
            self.checks += 1
            return DONE if (state, token) == ((), 1) else None

        def forced_bytes(self, state: State) -> bytes:
            return b"a"

    m = EndsWithAb(regex("a").bind(tok.vocab))
    assert forced_tokens(tok, m, (), []) == ([], b"a")


# -- the bench and its command -------------------------------------------------------------


def maskbench_file(tmp_path: Path) -> Path:
    cases = [
        {"schema": PERSON_SCHEMA, "tests": [
            {"valid": True, "data": {"name_of_the_person": "Ann", "age": 42}},
            {"valid": False, "data": {"age": 1}},
            {"valid": True, "data": {"name_of_the_person": "Bé", "age": 7}},
        ]},
        # a schema stored as a JSON string; a string instance
        {"schema": json.dumps({"type": "string", "enum": ["orderId", "orderName"]}),
         "tests": [{"valid": True, "data": "orderName"}]},
        {"schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}},
                    "required": ["a"]},
         "tests": [{"valid": True, "data": {"a": 1}}]},  # llguidance rejects the schema
        {"schema": ORDER_SCHEMA, "tests": [{"valid": True, "data": {"orderId": "x"}}]},
    ]
    path = tmp_path / "mb.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for case in cases:
            f.write(json.dumps(case) + "\n")
    return path


def test_bench_ff(tmp_path: Path, llama3: Tokenizer) -> None:
    pytest.importorskip("llguidance")
    from adaptrack.eval.ffbench import bench_ff

    path = maskbench_file(tmp_path)
    r = bench_ff(path, LLAMA3, max_tokens=4)
    assert r["instances"] == 4 and r["schemas"] == 4 and r["skipped_schemas"] == 1
    assert r["noncanonical"] == 0 and r["llguidance_agreement"] == 1.0
    assert r["forced_tokens"] == r["llguidance_forced_tokens"] > 0
    assert 0 < r["forced_share"] < 1 and r["tokens"] > r["forced_tokens"]
    r0 = bench_ff(path, LLAMA3, max_tokens=0, limit=1)
    assert r0["instances"] == 1 and r0["noncanonical"] > 0  # name…_person" (not ":")
    assert r0["llguidance_agreement"] < 1.0


def test_bench_ff_counts_a_failed_instance_and_goes_on(
        tmp_path: Path, llama3: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    # The error the grammar matcher raises past llguidance's limits is a GrammarError (a
    # catch of RuntimeError let it abort the run).
    pytest.importorskip("llguidance")
    from adaptrack.errors import GrammarError
    from adaptrack.eval.ffbench import bench_ff
    from adaptrack.sampling import fastforward

    real, calls = fastforward.forced_tokens, []

    def failing_once(tok, matcher, state, *args, **kwargs):
        calls.append(state)
        if len(calls) == 3:
            raise GrammarError("llguidance failed on this JSON schema: (a test)")
        return real(tok, matcher, state, *args, **kwargs)

    monkeypatch.setattr(fastforward, "forced_tokens", failing_once)
    r = bench_ff(maskbench_file(tmp_path), LLAMA3, max_tokens=4)
    assert r["failed_instances"] == 1 and r["instances"] == 3
    assert r["noncanonical"] == 0 and r["matcher_restarts"] == 0


def test_bench_cli(tmp_path: Path, llama3: Tokenizer, capsys: pytest.CaptureFixture) -> None:
    path = maskbench_file(tmp_path)
    assert main(["bench", "ff", "--data", str(path), "--tokenizer", str(LLAMA3),
                 "--limit", "2", "--conservative"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["instances"] == 2 and out["conservative"] is True
    assert {"ff_sequences", "noncanonical", "forced_share", "llguidance_agreement",
            "llguidance_forced_share", "skipped_schemas", "seconds"} <= set(out)


@pytest.mark.parametrize("args, message", [
    (["--data", "/nonexistent.jsonl", "--tokenizer", "."], "cannot read data file"),
    (["--data", "DATA", "--tokenizer", "/nonexistent-dir"], "no tokenizer.json"),
    (["--data", "DATA", "--tokenizer", "TOK", "--max-tokens", "-1"], "must be >= 0"),
    (["--data", "DATA", "--tokenizer", "TOK", "--limit", "0"], "must be at least 1"),
    (["--tokenizer", "TOK"], "required: --data"),
    (["--data", "DATA", "--tokenizer", "TOK"], "cannot load the tokenizer"),
])
def test_bench_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str],
                          message: str) -> None:
    data = tmp_path / "mb.jsonl"
    data.write_text("")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    args = [str(data) if a == "DATA" else str(tok) if a == "TOK" else a for a in args]
    assert main(["bench", "ff", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaptrack: error: ") and message in err
    assert err.count("\n") == 1
