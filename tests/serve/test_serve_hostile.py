"""``adaptrack serve`` against hostile requests (issue 47, docs/security.md): each is
refused with a 4xx naming what is wrong, before any model work and with bounded memory.
A toy ``TableLM`` on 127.0.0.1, as in ``test_serve.py``."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("uvicorn", reason="adaptrack serve needs the serve extra")
pytest.importorskip("starlette", reason="adaptrack serve needs the serve extra")

from test_serve import raw, serving, toy_lm

from adaptrack.limits import MAX_JSON_DEPTH
from adaptrack.serve.serving import Server


@pytest.fixture(scope="module")
def toy():
    lm = toy_lm()
    with serving(lm, allowed_hosts=["api.example.com", "*.lan"]) as (url, _):
        yield url, lm


def error(data: bytes) -> dict:
    body = json.loads(data)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_a_body_that_is_not_json_is_415(toy):
    url, lm = toy
    calls = lm.calls
    for content_type in ("text/plain", "application/x-www-form-urlencoded", ""):
        status, _, data = raw(url, "POST", "/v1/completions", '{"prompt": "x"}',
                              {"Content-Type": content_type})
        err = error(data)
        assert status == 415 and err["code"] == "unsupported_media_type", (content_type, err)
        assert err["type"] == "invalid_request_error" and "application/json" in err["message"]
    status, _, _ = raw(url, "POST", "/v1/completions", '{"prompt": "x", "max_tokens": 1}',
                       {"Content-Type": "application/json; charset=utf-8"})
    assert status == 200
    assert lm.calls > calls


@pytest.mark.parametrize("host,served", [
    ("evil.example", False), ("127.0.0.1.evil.example", False), ("localhost:8000", True),
    ("127.0.0.1", True), ("[::1]:80", True), ("10.1.2.3", True), ("api.example.com", True),
    ("gpu.lan:8000", True), ("lan", False)])
def test_only_the_host_names_it_serves(toy, host, served):
    url, _ = toy
    status, _, data = raw(url, "GET", "/v1/models", headers={"Host": host})
    if served:
        assert status == 200
    else:
        err = error(data)
        assert status == 400 and err["code"] == "invalid_host"
        assert "--allowed-hosts" in err["message"]


@pytest.mark.parametrize("method", ["GET", "OPTIONS", "PUT", "DELETE"])
def test_a_wrong_method_is_a_typed_405(toy, method):
    url, _ = toy
    status, headers, data = raw(url, method, "/v1/chat/completions")
    err = error(data)
    assert status == 405 and err["type"] == "invalid_request_error"
    assert err["code"] == "method_not_allowed" and "POST" in headers["allow"]


def test_an_empty_api_key_is_refused():
    with pytest.raises(ValueError, match="api_key must be a non-empty string"):
        Server(toy_lm(), api_key="")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("body", [
    '{"prompt": "x", "guided_json": {"type": "array", "items": ' + nested(3000) + "}}",
    '{"prompt": "x", "metadata": ' + "[" * 100_000 + "}",
    '{"prompt": "x", "metadata": ' + nested(MAX_JSON_DEPTH) + "}",
    '{"prompt": "x", "guided_json": "' + nested(3000) + '"}',
    '{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": '
    '{"type": "array", "items": ' + nested(500) + "}}}}",
], ids=["guided_json", "metadata", "metadata-at-limit", "guided_json-text",
        "response_format"])
def test_a_body_nested_too_deep_is_400_naming_the_limit(toy, body):
    url, lm = toy
    calls = lm.calls
    status, _, data = raw(url, "POST", "/v1/completions", body)
    err = error(data)
    assert status == 400 and err["code"] == "json_too_deep", err
    assert f"more than {MAX_JSON_DEPTH} levels" in err["message"]
    assert lm.calls == calls


def test_nesting_up_to_the_limit_is_served(toy):
    url, _ = toy
    body = '{"prompt": "x", "max_tokens": 1, "metadata": ' + nested(MAX_JSON_DEPTH - 1) + "}"
    status, _, _ = raw(url, "POST", "/v1/completions", body)
    assert status == 200


def test_a_prompt_past_the_context_is_refused_from_its_bytes(toy):
    url, lm = toy  # context 256 tokens of at most 4 bytes: 255 * 4 bytes with max_tokens 1
    calls = lm.calls
    for body in ({"prompt": "x" * 4_000_000, "max_tokens": 1},
                 {"prompt": [1] * 2_000_000}, {"prompt": [[1], [1] * 300]},
                 {"messages": [{"role": "user", "content": ""}] * 300},
                 {"prompt": ["ab", "x" * 4_000_000]},
                 {"messages": [{"role": "user", "content": "x" * 600}] * 2}):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        status, _, data = raw(url, "POST", path, json.dumps(body))
        err = error(data)
        assert status == 400 and err["code"] == "context_length_exceeded", err
        assert err["param"] in ("prompt", "messages")
        assert re.search(r"bytes|token ids|messages are more", err["message"]), err
    assert lm.calls == calls


def test_more_prompts_than_n_allows_are_refused_before_validation(toy):
    url, _ = toy
    status, _, data = raw(url, "POST", "/v1/completions", json.dumps({"prompt": ["a"] * 500}))
    err = error(data)
    assert status == 400 and err["param"] == "prompt" and "more than 128" in err["message"]


@pytest.mark.parametrize("field,value,words", [
    ("guided_regex", "a" * 5_000_000, "256 KiB"),
    ("guided_grammar", "a" * 5_000_000, "256 KiB"),
    ("guided_choice", ["ab" * 1_500_000], "3000000 characters"),
    ("guided_api_names", ["a"] * 2_000_000, "2000000 characters"),
    ("structured_outputs", {"regex": "a" * 5_000_000}, "256 KiB"),
    ("structured_outputs", {"choice": ["a" * 3_000_000]}, "3000000 characters"),
])
def test_a_constraint_past_its_size_is_refused_before_compiling(toy, field, value, words):
    url, lm = toy
    calls = lm.calls
    status, _, data = raw(url, "POST", "/v1/completions",
                          json.dumps({"prompt": "x", field: value}))
    err = error(data)
    assert status == 400 and err["param"].startswith(field) and words in err["message"], err
    assert lm.calls == calls


def test_a_lone_surrogate_in_the_prompt_is_400(toy):
    url, _ = toy
    status, _, data = raw(url, "POST", "/v1/completions", '{"prompt": "a\\ud800b"}')
    err = error(data)
    assert status == 400 and err["param"] == "prompt" and "lone surrogate" in err["message"]


def test_an_error_that_echoes_a_lone_surrogate_is_still_json(toy):
    url, _ = toy
    status, _, data = raw(url, "POST", "/v1/completions", '["a\\ud800"]')
    err = error(data)
    assert status == 400 and err["code"] == "invalid_json" and "a\ud800" in err["message"]
