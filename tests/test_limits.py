"""Hostile input to the Python API (issue 47, docs/security.md): each reproduction gives a
one-line named error at once, before any model work; JSON deeper than the limit never
reaches recursive code."""

from __future__ import annotations

import json

import pytest

import adaptrack as at
from adaptrack import constraints
from adaptrack.eval.runner import read_results
from adaptrack.limits import (
    MAX_JSON_DEPTH,
    SLACK_BYTES,
    check_json_depth,
    loads,
    prompt_byte_limit,
)


def toy(context: int | None = 64) -> at.TableLM:
    lm = at.TableLM([b"a", b"bb", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    lm.context_length = context
    return lm


def nested_schema(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert text and "\n" not in text
    return text


DEEP_TEXT = '{"type": "array", "items": ' * 4999 + '{"type": "integer"}' + "}" * 4999


@pytest.mark.parametrize("schema", [nested_schema(5000), DEEP_TEXT,
                                    "[" * 100_000, nested_schema(MAX_JSON_DEPTH + 1)],
                         ids=["object", "text", "brackets", "one-past"])
def test_a_schema_nested_too_deep_is_a_named_error(schema):
    with pytest.raises(at.JSONDepthError) as err:
        constraints.json_schema(schema)
    assert f"more than {MAX_JSON_DEPTH} levels" in one_line(err)


def test_a_schema_at_the_limit_is_compiled():
    lm = toy(None)
    matcher = constraints.json_schema(nested_schema(MAX_JSON_DEPTH)).bind(lm.vocab)
    assert matcher.start() is not None


def test_a_value_that_contains_itself_is_refused_not_walked_forever():
    loop: dict = {}
    loop["a"] = [loop]
    with pytest.raises(at.JSONDepthError):
        check_json_depth(loop, "the value")
    assert isinstance(at.JSONDepthError("x"), ValueError)  # `except ValueError` still holds


def test_loads_is_json_loads_within_the_limit():
    text = json.dumps({"a": [1, {"b": "[[[["}]})
    assert loads(text, "x") == json.loads(text)
    with pytest.raises(at.JSONDepthError):
        loads(b"[" * 3000 + b"]" * 3000, "x")
    with pytest.raises(ValueError):
        loads("{not json", "x")


def test_a_results_line_nested_too_deep_is_a_results_error(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"header": {"task": "binary"}}\n' + "[" * 100_000 + "\n")
    with pytest.raises(at.AdaptrackError) as err:
        read_results(path)
    assert "line 2 is nested more than" in one_line(err)


# -- arguments that are not what they should be ---------------------------------------------


@pytest.mark.parametrize("lm,words", [
    (None, "got None (NoneType)"),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "load_model('HuggingFaceTB/SmolLM2-135M-Instruct')"),
])
def test_generate_names_an_lm_that_is_not_a_model(lm, words):
    for call in (lambda: at.generate(lm, "The capital of France is"),
                 lambda: at.exact_distribution(lm, "x"),
                 lambda: at.generate_each(lm, [{"prompt": "x"}])):
        with pytest.raises(TypeError) as err:
            call()
        assert one_line(err).startswith("lm must be an adaptrack.LanguageModel")
        assert words in str(err.value)


def test_generate_names_a_prompt_that_is_none():
    with pytest.raises(TypeError, match="prompt must be a str or a sequence of token ids"):
        at.generate(toy(), None, max_new_tokens=4)


@pytest.mark.parametrize("spec", [123, 1.5, b"model", ["model"]])
def test_load_model_names_a_spec_that_is_not_one(spec):
    with pytest.raises(TypeError) as err:
        at.load_model(spec)
    assert one_line(err).startswith("spec must be a model id")


def test_a_lone_surrogate_in_the_prompt_is_a_tokenizer_error():
    with pytest.raises(at.TokenizerError) as err:
        at.generate(toy(), "a\ud800b", max_new_tokens=4)
    assert "lone surrogate U+D800 at character 1" in one_line(err)


def test_from_module_of_a_missing_module_is_a_named_import_error():
    with pytest.raises(at.ModuleImportError) as err:
        constraints.from_module("no_such_module_adaptrack")
    assert "no module named 'no_such_module_adaptrack'" in one_line(err)
    assert isinstance(err.value, ImportError)


# -- a prompt longer than the context holds ----------------------------------------------------


class CountingLM(at.TableLM):
    """A toy whose ``encode`` records the length of each text it tokenizes."""

    def __init__(self) -> None:
        super().__init__([b"a", b"bb", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
        self.context_length = 64
        self.encoded: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.encoded.append(len(text))
        return super().encode(text)


def test_a_prompt_past_the_context_is_refused_before_it_is_tokenized():
    lm = CountingLM()
    assert prompt_byte_limit(lm, 4) == 60 * 2  # 60 tokens of at most 2 bytes
    with pytest.raises(at.PromptTooLongError) as err:
        at.generate(lm, "a" * 30_000_000, max_new_tokens=4)
    assert "at least 30000000 bytes" in one_line(err) and "truncate_prompt" in str(err.value)
    with pytest.raises(at.PromptTooLongError, match="80000 bytes"):
        at.generate(lm, "é" * 40_000, max_new_tokens=4)  # fewer characters than the bound
    assert lm.encoded == []  # neither was tokenized
    # within the slack past the bound, the text is tokenized: its tokens say how far over
    with pytest.raises(at.PromptTooLongError, match="the prompt has 121 tokens"):
        at.generate(lm, "a" * 121, max_new_tokens=4)
    assert lm.encoded == [121]


def test_truncate_prompt_tokenizes_a_bounded_end():
    lm = CountingLM()
    res = at.generate(lm, "a" * 2_000_000, max_new_tokens=4, truncate_prompt=True,
                      method="unconstrained", seed=0)
    assert lm.encoded == [120 + SLACK_BYTES]  # the bytes that fit and the slack
    assert len(res.samples) == 1
