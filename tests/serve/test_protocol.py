"""The server's request models, their errors and the answer shapes, without HTTP: what a
body validates to (stop strings, the implied method, the one constraint), which field an error
names and that its message says what to give."""

from __future__ import annotations

import argparse
import json

import pytest

pytest.importorskip("pydantic")

import adaptrack as at
from adaptrack.cli.common import constraint_spec as cli_spec
from adaptrack.sampling.policy import EARLY_RATIO
from adaptrack.serve import APIError
from adaptrack.serve.constraint_spec import ConstraintSpec
from adaptrack.serve.events import Choice, Done
from adaptrack.serve.preprocess import constraint_spec, parse
from adaptrack.serve.protocol import ChatCompletionRequest, CompletionRequest
from adaptrack.serve.responses import chunk_body, response_body
from adaptrack.serve.validation import validate


def toy_lm(context_length: int | None = 64) -> at.TableLM:
    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    lm.context_length = context_length
    return lm


def refused(body: dict, kind: str = "completion", **limits) -> APIError:
    limits.setdefault("max_n", 128)
    with pytest.raises(APIError) as err:
        validate(json.dumps(body), kind, **limits)
    return err.value


def test_null_means_the_default_except_for_end_and_fallback():
    req = validate(json.dumps({"prompt": "a", "n": None, "temperature": None, "stop": None,
                               "decoding_method": None}), "completion", max_n=8)
    assert (req.n, req.temperature, req.stop, req.method) == (1, 1.0, (), "unconstrained")
    for field in ("end", "fallback"):
        err = refused({"prompt": "a", field: None})
        assert err.param == field and "null" in err.message


@pytest.mark.parametrize("field,value,words", [
    ("max_tokens", "4", "an integer"),  # no string-to-number coercion
    ("n", True, "an integer"),
    ("temperature", "0.5", "a number"),
    ("stream", 1, "true or false"),
    ("model", 3, "a string"),
])
def test_types_are_strict(field, value, words):
    err = refused({"prompt": "a", field: value})
    assert (err.status, err.param) == (400, field) and words in err.message


def test_server_bounds_come_from_the_context():
    assert validate('{"prompt": "a", "n": 8}', "completion", max_n=8).n == 8
    err = refused({"prompt": "a", "n": 9}, max_n=8)
    assert err.param == "n" and "between 1 and 8" in err.message
    err = refused({"messages": [{"role": "user", "content": "x"}],
                   "max_completion_tokens": 65}, "chat", max_tokens=64)
    assert err.param == "max_completion_tokens" and "between 1 and 64" in err.message


def test_errors_inside_an_object_name_the_key():
    err = refused({"prompt": "a", "stream": True, "stream_options": {"usage": True}})
    assert err.param == "stream_options" and "'usage' is not a known field" in err.message
    err = refused({"messages": [{"role": "user", "content": "x"}, {"role": "bot",
                                                                   "content": "y"}]}, "chat")
    assert err.param == "messages[1]" and "'role' must be" in err.message
    assert "'assistant'" in err.message  # says what to give


def test_a_field_of_the_other_endpoint_says_so():
    err = refused({"prompt": "a", "max_completion_tokens": 3})
    assert err.code == "unknown_field" and "other endpoint" in err.message
    err = refused({"prompt": "a", "max_tokenz": 3})
    assert err.code == "unknown_field" and "other endpoint" not in err.message


def test_best_of_equal_to_n_is_accepted():
    assert validate('{"prompt": "a", "n": 2, "best_of": 2}', "completion", max_n=8).n == 2
    err = refused({"prompt": "a", "n": 2, "best_of": 3})
    assert err.param == "best_of" and "n (2)" in err.message


def test_the_models_are_frozen_and_know_their_method():
    req = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}]}],
        "response_format": {"type": "json_object"}})
    assert req.messages[0].content == "ab" and req.method == "adaptrack"
    assert req.constraint_field == "response_format"
    text = CompletionRequest.model_validate({"prompt": "a",
                                             "response_format": {"type": "text"}})
    assert text.constraint_field is None and text.method == "unconstrained"
    with pytest.raises(ValueError):
        req.n = 3  # type: ignore[misc]


def test_parse_checks_what_needs_the_model():
    lm = toy_lm()
    with pytest.raises(APIError) as err:
        parse(b'{"messages": [{"role": "user", "content": "a"}]}', "chat", lm)
    assert err.value.code == "no_chat_template"
    with pytest.raises(APIError) as err:
        parse(b'{"prompt": ["a", "b", "a"], "n": 3}', "completion", lm, max_n=8)
    assert err.value.param == "n" and "3 prompts" in err.value.message
    with pytest.raises(APIError) as err:
        parse(b'{"prompt": "a", "model": "other"}', "completion", lm, model="toy")
    assert err.value.status == 404
    opts = parse(b'{"prompt": "ab"}', "completion", lm)
    assert opts.max_tokens == 16 and opts.constraint is None


@pytest.mark.parametrize("text,kind", [('root ::= "a"', "gbnf"), ('start: "a"', "lark"),
                                       ('start: "::="', "lark")])
def test_a_grammar_is_gbnf_when_a_line_defines_a_rule_with_colons(text, kind):
    assert ConstraintSpec.grammar(text).kind == kind


def test_a_spec_refuses_a_source_of_the_wrong_shape():
    with pytest.raises(ValueError, match="one of"):
        ConstraintSpec("xml", "a")
    with pytest.raises(TypeError, match="tuple of strings"):
        ConstraintSpec("choice", "ab")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="choice"):
        ConstraintSpec("regex", "a", terminators="(")


def test_the_command_line_and_the_server_describe_a_constraint_alike(tmp_path):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    names = dict.fromkeys(("constraint", "api_names", "api_module", "regex", "json_schema",
                           "lark", "gbnf", "terminators"))
    from_cli = cli_spec(argparse.Namespace(**{**names, "json_schema": str(path)}))
    req = CompletionRequest.model_validate({"prompt": "a", "guided_json": schema})
    assert from_cli is not None and from_cli.key == constraint_spec(req).key
    from_cli = cli_spec(argparse.Namespace(**{**names, "regex": "[ab]+"}))
    req = CompletionRequest.model_validate({"prompt": "a", "guided_regex": "[ab]+"})
    assert from_cli == constraint_spec(req)


def test_answer_shapes():
    lm = toy_lm()
    choice = Choice(0, "ab", "stop", (0, 1, 2), [-0.5, -0.5, -0.1])
    done = Done([choice], prompt_tokens=2)
    assert done.completion_tokens == 3
    body = response_body(lm, "completion", "cmpl-1", 0, "toy", [choice],
                         {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}, {})
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "ab"
    assert body["choices"][0]["logprobs"]["text_offset"] == [0, 1, 2]
    first = chunk_body("chat", False, "c", 0, "toy", 0, "a", first=True)
    later = chunk_body("chat", True, "c", 0, "toy", 0, "b")
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert later["choices"][0]["delta"] == {"content": "b"}
    assert "usage" not in first and later["usage"] is None  # null until the last event


def test_stop_is_a_tuple_of_distinct_non_empty_strings():
    def stop(value):
        return validate(json.dumps({"prompt": "a", "stop": value}), "completion",
                        max_n=8).stop

    assert stop("\n") == ("\n",)  # one string or a list of them
    assert stop(["b", "a", "b"]) == ("b", "a")  # duplicates once, in their order
    err = refused({"prompt": "a", "stop": ["a", ""]})
    assert err.param == "stop[1]"  # the empty one


def test_a_text_response_format_is_no_constraint_and_does_not_count_as_one():
    req = CompletionRequest.model_validate({"prompt": "a", "guided_regex": "[ab]+",
                                            "response_format": {"type": "text"}})
    assert req.constraint_fields == ["guided_regex"] and req.method == "adaptrack"
    err = refused({"prompt": "a", "guided_regex": "a", "guided_json": {"type": "string"}})
    assert err.param == "guided_regex" and "at most one constraint" in err.message


def test_adaptrack_options_need_adaptrack_even_when_the_method_is_implied():
    # No constraint and no decoding_method: the method is plain sampling, so share_q is
    # refused; with a constraint the method becomes AdapTrack and it is accepted.
    err = refused({"prompt": "a", "share_q": True})
    assert err.param == "share_q" and "'unconstrained'" in err.message
    req = CompletionRequest.model_validate({"prompt": "a", "guided_choice": ["a"],
                                            "share_q": True, "max_backtrack": 2})
    assert (req.method, req.share_q, req.max_backtrack) == ("adaptrack", True, 2)


def test_chat_lengths_agree_and_top_logprobs_need_logprobs():
    messages = [{"role": "user", "content": "x"}]
    req = ChatCompletionRequest.model_validate({"messages": messages, "max_tokens": 4,
                                                "max_completion_tokens": 4})
    assert req.max_tokens == req.max_completion_tokens == 4
    err = refused({"messages": messages, "max_tokens": 4, "max_completion_tokens": 5}, "chat")
    assert err.param == "max_completion_tokens" and "max_tokens" in err.message
    err = refused({"messages": messages, "top_logprobs": 2}, "chat")
    assert err.param == "top_logprobs" and '"logprobs": true' in err.message
    err = refused({"messages": messages, "logprobs": True, "top_logprobs": 21}, "chat")
    assert err.param == "top_logprobs" and "between 0 and 20" in err.message
    assert validate(json.dumps({"messages": messages, "logprobs": True, "top_logprobs": 2}),
                    "chat", max_n=8).top_logprobs == 2
    ok = ChatCompletionRequest.model_validate({"messages": messages, "top_logprobs": 0,
                                               "stream": True,
                                               "stream_options": {"include_usage": True}})
    assert ok.include_usage


def test_request_builds_its_sampling_options():
    # The request model builds the options (as vLLM's to_sampling_params); a field the
    # request leaves out keeps SamplingOptions' default.
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], n=3,
                                temperature=0.5, top_p=0.9, seed=7, share_q=True,
                                max_backtrack=2, end="eos", fast_forward=False,
                                search_budget=5, guided_regex="a+")
    opts = req.to_sampling_options(12)
    assert opts == at.SamplingOptions(method="adaptrack", n=3, temperature=0.5, top_p=0.9,
                                      seed=7, share_q=True, max_backtrack=2, end="eos",
                                      fast_forward=False, search_budget=5,
                                      max_new_tokens=12)
    plain = CompletionRequest(prompt="a").to_sampling_options(4)
    assert plain == at.SamplingOptions(method="unconstrained", max_new_tokens=4)
    assert CompletionRequest(prompt="a", fallback="none").to_sampling_options(4).fallback is None
    late = CompletionRequest(prompt="a", early_handover=5).to_sampling_options(4)
    assert late.early_handover == 5
    assert plain.early_handover == at.SamplingOptions().early_handover == EARLY_RATIO == 2
