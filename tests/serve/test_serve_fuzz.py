"""Property-based fuzz of ``adaptrack serve`` (hypothesis): random request bodies (fields
of the request models with valid, wrong-typed and out-of-bounds values, deep nesting, long
prompts, lone surrogates, text that is not JSON), content types, methods, paths and Host
headers sent to a toy server on 127.0.0.1. Every answer is a 2xx, or a 4xx/5xx other than
500 whose body is OpenAI's error object with a one-line message and no traceback; the
process's peak memory grows by a bounded amount over the whole run.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys

import pytest

pytest.importorskip("uvicorn", reason="adaptrack serve needs the serve extra")
pytest.importorskip("starlette", reason="adaptrack serve needs the serve extra")

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_serve import raw, serving, toy_lm

#: Examples per property; each is one request of a few milliseconds. Set
#: ADAPTRACK_FUZZ_EXAMPLES to search longer, with fresh random examples.
EXAMPLES = int(os.environ.get("ADAPTRACK_FUZZ_EXAMPLES", "300"))
FIXED = "ADAPTRACK_FUZZ_EXAMPLES" not in os.environ  # CI: the same examples every run
#: The most the process's peak RSS may grow over the fuzz (its prompts reach 3 MB).
PEAK_GROWTH_BYTES = 600 << 20

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([0, 1, -1, 0.5, 2**63, 1e308, "", "x", "cd", "none",
                                     "adaptrack", "exact", "json_object"]),
                    st.text(max_size=12))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


def mostly(valid: st.SearchStrategy, junk: st.SearchStrategy) -> st.SearchStrategy:
    """A field's value: valid three times in four, so that requests get past validation."""
    return st.one_of(valid, valid, valid, junk)


ASCII = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=40)


@st.composite
def prompts(draw: st.DrawFn) -> object:
    kind = draw(st.sampled_from(["text"] * 4 + ["long", "ids", "list", "junk", "surrogate"]))
    if kind == "text":  # the toy's vocabulary is printable ASCII
        return draw(mostly(ASCII, st.text(max_size=40)))
    if kind == "long":  # past the context in bytes, from 2 KB to 3 MB
        return draw(st.sampled_from(["x", "é", "ab ", "\x00"])) * draw(
            st.integers(2_000, 3_000_000))
    if kind == "ids":
        return draw(st.lists(st.integers(-5, 200), min_size=0, max_size=draw(
            st.sampled_from([5, 300]))))
    if kind == "list":
        return draw(st.lists(st.one_of(st.text(max_size=8), st.lists(st.integers(0, 100),
                                                                    max_size=4)), max_size=4))
    if kind == "surrogate":
        return "a\ud800" + draw(st.text(max_size=4))
    return draw(JSON)


#: Stands for a value nested ``depth`` lists deep, spliced into the body's text (too deep
#: for json.dumps to write).
DEEP = "\u2063deep:{}\u2063"


def deep(depth: int) -> str:
    return DEEP.format(depth)


FIELDS = {
    "n": mostly(st.integers(1, 3), st.one_of(st.integers(-2, 300), SCALARS)),
    "max_tokens": mostly(st.integers(1, 8), st.one_of(st.integers(-1, 10**6), SCALARS)),
    "temperature": mostly(st.floats(0, 2), st.one_of(st.floats(-1, 3), SCALARS)),
    "top_p": mostly(st.floats(0.1, 1), st.one_of(st.floats(-1, 2), SCALARS)),
    "seed": mostly(st.integers(0, 1000), st.one_of(st.integers(-1, 2**64), SCALARS)),
    "stop": mostly(st.lists(st.text(min_size=1, max_size=3), max_size=2), JSON),
    "stream": mostly(st.booleans(), SCALARS),
    "logprobs": mostly(st.sampled_from([None, 0]), st.one_of(st.booleans(), SCALARS)),
    "guided_regex": mostly(st.sampled_from(["a+", "[ab]{2}", "(x|y)z?"]),
                           st.one_of(st.sampled_from(["(", "a{9999}", ""]), JSON)),
    "guided_choice": mostly(st.lists(st.text(min_size=1, max_size=5), min_size=1,
                                     max_size=4), JSON),
    "guided_json": mostly(st.just({"type": "string", "maxLength": 3}), st.one_of(
        st.integers(50, 3000).map(lambda d: {"type": "array", "items": deep(d)}),
        st.integers(50, 3000).map(lambda d: "[" * d + "]" * d), JSON)),
    "response_format": mostly(st.just({"type": "json_object"}), JSON),
    "decoding_method": mostly(st.sampled_from(["cd", "adaptrack", "unconstrained"]),
                              st.one_of(st.sampled_from(["asap", "exact", "x"]), SCALARS)),
    "metadata": mostly(JSON, st.integers(50, 200_000).map(deep)),
    "max_seconds": mostly(st.floats(1, 5), st.one_of(st.floats(-1, 5), SCALARS)),
    "structured_outputs": mostly(st.sampled_from([{"choice": ["a", "b"]}, {"regex": "a+"},
                                                   {"json": {"type": "integer"}}]),
                                 st.one_of(JSON, st.integers(50, 3000).map(
                                     lambda d: {"json": "[" * d + "]" * d}))),
    "tools": mostly(st.just([{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {
            "x": {"type": "integer"}}}}}]), JSON),
    "bogus": JSON,
}


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    chat = draw(st.booleans())
    doc: dict[str, object] = {}
    if chat:
        if draw(st.integers(0, 4)):
            doc["messages"] = draw(st.one_of(
                st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system",
                                                                         "x"]),
                                                "content": prompts()}), min_size=1,
                         max_size=3), JSON))
    else:
        doc["prompt"] = draw(prompts())
    names = draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=3, unique=True))
    for name in names:
        doc[name] = draw(FIELDS[name])
    doc.setdefault("max_tokens", 4)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    text = re.sub(r'"\\u2063deep:(\d+)\\u2063"',
                  lambda m: "[" * int(m.group(1)) + "1" + "]" * int(m.group(1)),
                  json.dumps(doc))
    mangle = draw(st.sampled_from(["none"] * 12 + ["cut", "junk", "array", "empty"]))
    if mangle == "cut":
        text = text[: len(text) // 2]
    elif mangle == "junk":
        text = draw(st.text(max_size=30))
    elif mangle == "array":
        text = "[" + text + "]"
    elif mangle == "empty":
        text = ""
    return path, text.encode("utf-8", "surrogatepass")


def check_answer(status: int, data: bytes, what: object) -> None:
    event(f"status {status}" + (f" {json.loads(data)['error']['code']}" if status >= 400
                                and data.startswith(b"{") else ""))
    assert status != 500 and status < 600, (status, data[:500], what)
    assert b"Traceback" not in data, (data[:500], what)
    if status >= 400:
        err = json.loads(data)["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert err["message"] and "\n" not in err["message"], err
        assert err["type"] != "server_error" or status in (503, 504), (status, err, what)


@pytest.fixture(scope="module")
def toy():
    with serving(toy_lm(), timeout=20.0) as (url, _):
        yield url, peak_rss()


def peak_rss() -> int:
    scale = 1 if sys.platform == "darwin" else 1024  # Linux reports KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


@settings(max_examples=EXAMPLES, deadline=None, derandomize=FIXED,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request=bodies())
def test_no_body_gets_a_500(toy, request):
    path, body = request
    status, _, data = raw(toy[0], "POST", path, body)
    if status == 200 and data.startswith(b"data:"):  # a stream: its events are JSON
        assert b"Traceback" not in data and b'"server_error"' not in data, data[-500:]
        event("status 200 stream")
        return
    check_answer(status, data, body[:300])


@settings(max_examples=EXAMPLES // 3, deadline=None, derandomize=FIXED,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"]),
       path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/models",
                             "/health", "/metrics", "/", "/v1", "/v1/x", "/%ff"]),
       content_type=st.sampled_from(["application/json", "text/plain", "",
                                     "multipart/form-data; boundary=x", "APPLICATION/JSON",
                                     "application/json; charset=latin-1"]),
       host=st.sampled_from(["127.0.0.1"] * 6 + ["localhost", "evil.example", "", "[::1]:1",
                                                 "a:b:c", "127.0.0.1.nip.io", "%00"]))
def test_no_method_path_or_header_gets_a_500(toy, method, path, content_type, host):
    status, _, data = raw(toy[0], method, path, b'{"prompt": "ab", "max_tokens": 2}',
                          {"Content-Type": content_type, "Host": host})
    if status < 400:
        return
    check_answer(status, data, (method, path, content_type, host))


def test_the_fuzz_kept_memory_bounded(toy):
    """Runs after the properties above (file order): the process's peak RSS grew by less
    than :data:`PEAK_GROWTH_BYTES` since the server started."""
    assert peak_rss() - toy[1] < PEAK_GROWTH_BYTES
