"""``adaptrack serve``: the OpenAI-compatible server, driven by the real ``openai`` client
against servers started here on 127.0.0.1 (a toy ``TableLM`` for most tests, a tiny random
Llama in a subprocess for SIGTERM, the default model for real JSON).

Every request field and every error of the issue is covered; each server stops by itself.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the serve tests use the openai client")
uvicorn = pytest.importorskip("uvicorn", reason="adaptrack serve needs the serve extra")
pytest.importorskip("starlette", reason="adaptrack serve needs the serve extra")

from loopback import chat_template, serving  # noqa: E402
from stats import chi_square_p  # noqa: E402
from stops import (  # noqa: E402
    STOP_PROMPT,
    STOP_REGEX,
    TRICKY_STOPS,
    stop_targets,
    stop_toy,
    tricky_lm,
)

import adaptrack as at  # noqa: E402
from adaptrack.constraints import with_stop  # noqa: E402
from adaptrack.eval.codetask import cut_at_stop  # noqa: E402
from adaptrack.serve.protocol import MAX_N  # noqa: E402

# -- a toy model: printable ASCII, a few longer tokens, EOS; weights depend on context ------

VOCAB = [chr(c) for c in range(32, 127)] + ["\n", "ab", "the", " the", '{"', '":', "<eos>"]
EOS = len(VOCAB) - 1


def weights(prefix: tuple[int, ...]) -> np.ndarray:
    """Deterministic weights that depend on the last three tokens; EOS gets about 1/20."""
    rng = np.random.default_rng(zlib.crc32(bytes(str(prefix[-3:]), "ascii")))
    w = rng.random(len(VOCAB)) ** 3
    w[EOS] = w[:EOS].sum() / 19
    return w


def toy_lm(context_length: int | None = 256) -> at.TableLM:
    lm = at.TableLM(VOCAB, weights, eos=EOS)
    lm.context_length = context_length
    return lm


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def raw(url: str, method: str, path: str, body: bytes | str | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request without the openai client (bodies it would refuse to send)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    data = body.encode() if isinstance(body, str) else body
    conn.request(method, path, body=data,
                 headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    conn.close()
    return out


def post(url: str, path: str, body: dict, **headers: str) -> tuple[int, dict]:
    status, _, data = raw(url, "POST", path, json.dumps(body), headers)
    return status, json.loads(data) if data else {}


@pytest.fixture(scope="module")
def toy():
    lm = toy_lm()
    with serving(lm) as (url, server):
        yield url, lm, server


def stats(response) -> dict:
    return response.model_extra["adaptrack"]


# -- fields ---------------------------------------------------------------------------------


def test_models_and_a_plain_completion(toy):
    url, lm, _ = toy
    c = client(url)
    assert [m.id for m in c.models.list().data] == ["toy"]
    r = c.completions.create(model="toy", prompt="the cat", max_tokens=5, n=3, seed=1)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert all(ch.finish_reason in ("stop", "length") for ch in r.choices)
    # A seed gives the samples generate() gives; another seed other samples.
    ref = at.generate(lm, "the cat", method="unconstrained", n=3, max_new_tokens=5, seed=1)
    assert [ch.text for ch in r.choices] == ref.texts
    assert r.usage.prompt_tokens == len(lm.encode("the cat"))
    assert r.usage.completion_tokens == sum(len(s.tokens) for s in ref.samples)
    s = stats(r)
    assert s["method"] == "unconstrained" and s["lm_calls"] > 0 and s["seconds"] > 0
    other = c.completions.create(model="toy", prompt="the cat", max_tokens=5, n=3, seed=2)
    assert [ch.text for ch in other.choices] != ref.texts


def test_prompt_forms_temperature_top_p_and_greedy(toy):
    url, lm, _ = toy
    c = client(url)
    ids = lm.encode("hello")
    by_ids = c.completions.create(model="toy", prompt=ids, max_tokens=4, seed=3)
    by_text = c.completions.create(model="toy", prompt="hello", max_tokens=4, seed=3)
    assert by_ids.choices[0].text == by_text.choices[0].text
    two = c.completions.create(model="toy", prompt=["hello", "world"], max_tokens=4, n=2,
                               seed=3)
    assert [ch.index for ch in two.choices] == [0, 1, 2, 3]
    assert two.choices[0].text == by_text.choices[0].text
    greedy = {c.completions.create(model="toy", prompt="hi", max_tokens=6, temperature=0,
                                   seed=s).choices[0].text for s in range(3)}
    assert len(greedy) == 1
    ref = at.generate(lm, "hi", method="unconstrained", max_new_tokens=6, temperature=0.5,
                      top_p=0.8, seed=4)
    got = c.completions.create(model="toy", prompt="hi", max_tokens=6, temperature=0.5,
                               top_p=0.8, seed=4)
    assert got.choices[0].text == ref.texts[0]


BOOL_SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
               "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}


@pytest.mark.parametrize("field,value,check", [
    ("response_format", {"type": "json_schema", "json_schema": {"name": "t",
                                                                "schema": BOOL_SCHEMA}},
     lambda t: json.loads(t)["a"] in (True, False)),
    ("guided_json", BOOL_SCHEMA, lambda t: set(json.loads(t)) == {"a"}),
    ("guided_json", json.dumps(BOOL_SCHEMA), lambda t: set(json.loads(t)) == {"a"}),
    ("guided_regex", "[a-c]{2}x", lambda t: re.fullmatch("[a-c]{2}x", t)),
    ("guided_choice", ["yes", "no", "maybe"], lambda t: t in ("yes", "no", "maybe")),
    ("guided_grammar", 'start: "yes" | "no"', lambda t: t in ("yes", "no")),  # Lark
    ("guided_grammar", 'root ::= "yes" | "no"', lambda t: t in ("yes", "no")),  # GBNF
    ("guided_api_names", ["math.sqrt", "math.pi"],
     lambda t: t in (".math.sqrt", ".math.pi") or t[:-1] in (".math.sqrt", ".math.pi")),
])
def test_every_constraint_field_holds(toy, field, value, check):
    url, _, _ = toy
    r = client(url).chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "go"}], n=3, seed=5, max_tokens=16,
        extra_body={field: value})
    assert stats(r)["method"] == "adaptrack"  # the default with a constraint
    for ch in r.choices:
        assert ch.finish_reason == "stop" and check(ch.message.content), ch.message.content


def test_openai_fields_at_their_neutral_values_are_accepted(toy):
    url, lm, _ = toy
    c = client(url)
    r = c.chat.completions.create(
        model="toy", messages=[{"role": "system", "content": "be brief"},
                               {"role": "user", "content": [{"type": "text", "text": "a"}]}],
        max_completion_tokens=3, seed=0, stop="zz", user="me", frequency_penalty=0,
        presence_penalty=0, logit_bias={}, top_logprobs=0, tools=[], metadata={"k": "v"})
    ref = at.generate(lm, "system: be brief\nuser: a\nassistant:", method="unconstrained",
                      max_new_tokens=3, seed=0)
    assert r.choices[0].message.content == ref.texts[0].split("zz")[0]
    r = c.completions.create(model="toy", prompt="b", max_tokens=3, n=2, best_of=2, echo=False,
                             suffix=None, seed=0)
    assert len(r.choices) == 2


def test_json_object_and_text_formats(toy):
    url, lm, _ = toy
    c = client(url)
    messages = [{"role": "user", "content": "{"}]
    r = c.chat.completions.create(model="toy", messages=messages,
                                  response_format={"type": "json_object"}, max_tokens=12,
                                  seed=0, n=3, extra_body={"decoding_method": "cd"})
    ref = at.generate(lm, chat_template(messages), at.constraints.json_schema({"type": "object"}),
                      method="cd", max_new_tokens=12, seed=0, n=3)
    assert [ch.message.content for ch in r.choices] == ref.texts
    r = c.chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}],
                                  response_format={"type": "text"}, max_tokens=3, seed=0)
    assert stats(r)["method"] == "unconstrained"


@pytest.mark.parametrize("method", ["adaptrack", "exact", "cd", "asap", "unconstrained"])
def test_every_decoding_method_gives_the_python_api_samples(toy, method):
    url, lm, _ = toy
    body = {"guided_choice": ["ab", "ba", "abc"], "decoding_method": method}
    if method == "adaptrack":
        body |= {"share_q": True, "max_backtrack": 3, "fast_forward": False}
    r = client(url).completions.create(model="toy", prompt="q", n=4, seed=6, max_tokens=8,
                                       extra_body=body)
    options = {k: body[k] for k in ("share_q", "max_backtrack", "fast_forward") if k in body}
    ref = at.generate(lm, "q", at.constraints.choice(["ab", "ba", "abc"]), method=method, n=4,
                      seed=6, max_new_tokens=8, **options)
    assert [ch.text for ch in r.choices] == ref.texts
    assert stats(r)["method"] == method


def test_stop_strings_cut_the_text(toy):
    url, lm, _ = toy
    c = client(url)
    ref = at.generate(lm, "abc", method="unconstrained", n=4, max_new_tokens=24, seed=7)
    stop = next(t[2:4] for t in ref.texts if len(t) >= 6)
    r = c.completions.create(model="toy", prompt="abc", n=4, max_tokens=24, seed=7, stop=stop)
    for ch, full in zip(r.choices, ref.texts, strict=True):
        if stop in full:
            assert ch.text == full[:full.index(stop)] and ch.finish_reason == "stop"
        else:
            assert ch.text == full
    # adaptrack's choices are cut after they are final, the same way
    r = c.completions.create(model="toy", prompt="abc", max_tokens=8, seed=7, stop=["b"],
                             extra_body={"guided_choice": ["aab", "bab"]})
    assert r.choices[0].text in ("aa", "") and r.choices[0].finish_reason == "stop"


def test_logprobs_are_the_samples_log_probabilities(toy):
    url, lm, _ = toy
    c = client(url)
    ref = at.generate(lm, "z", at.constraints.choice(["ab", "b a", "the"]), n=2, seed=8,
                      max_new_tokens=8)
    r = c.completions.create(model="toy", prompt="z", n=2, seed=8, max_tokens=8, logprobs=0,
                             extra_body={"guided_choice": ["ab", "b a", "the"]})
    for ch, s in zip(r.choices, ref.samples, strict=True):
        assert ch.text == s.text
        assert sum(ch.logprobs.token_logprobs) == pytest.approx(s.logprob, abs=1e-9)
        assert "".join(ch.logprobs.tokens[:-1]) == s.text  # the last is EOS
    r = c.chat.completions.create(model="toy", messages=[{"role": "user", "content": "z"}],
                                  seed=8, max_tokens=8, logprobs=True,
                                  extra_body={"guided_choice": ["ab", "b a", "the"]})
    content = r.choices[0].logprobs.content
    assert content[-1].bytes is None and all(e.logprob <= 0 for e in content)


def test_streams_cd_token_by_token_and_adaptrack_when_final(toy):
    url, _, _ = toy
    c = client(url)
    for method, pieces in (("cd", "many"), ("adaptrack", "one")):
        body = {"guided_regex": "[a-z]{6,8}", "decoding_method": method}
        messages = [{"role": "user", "content": f"stream {method}"}]
        # streamed first: on a reused tree a walk that needs no model call ends in one step
        chunks = list(c.chat.completions.create(
            model="toy", messages=messages, n=2, seed=9, max_tokens=10, stream=True,
            stream_options={"include_usage": True}, extra_body=body))
        whole = c.chat.completions.create(model="toy", messages=messages, n=2, seed=9,
                                          max_tokens=10, extra_body=body)
        texts: dict[int, list[str]] = {0: [], 1: []}
        finish = {}
        for chunk in chunks[:-1]:
            for ch in chunk.choices:
                if ch.delta.content:
                    texts[ch.index].append(ch.delta.content)
                if ch.finish_reason:
                    finish[ch.index] = ch.finish_reason
        assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
        assert chunks[-1].model_extra["adaptrack"]["method"] == method
        for i in (0, 1):
            assert "".join(texts[i]) == whole.choices[i].message.content
            assert finish[i] == whole.choices[i].finish_reason
            assert (len(texts[i]) > 1) if pieces == "many" else (len(texts[i]) == 1)


def test_streamed_logprobs_line_up_with_the_streamed_text(toy):
    """Each piece's tokens spell its text, even while text that could start a stop string
    is held back, and text_offset counts from the start of the choice."""
    url, _, _ = toy
    stream = client(url).completions.create(
        model="toy", prompt="offsets", n=3, seed=4, max_tokens=40, stream=True, logprobs=0,
        stop=["e~~~", "a~~~", "t~~~"], extra_body={"decoding_method": "unconstrained"})
    texts: dict[int, str] = {}
    pieces = 0
    for chunk in stream:
        for ch in chunk.choices:
            lp = ch.logprobs
            if lp is None or not lp.tokens:
                continue
            pieces += 1
            done = texts.get(ch.index, "")
            spelled = "".join(t for t in lp.tokens if t != "<|special_101|>")  # EOS: no text
            assert spelled == ch.text, (lp.tokens, ch.text)
            assert lp.text_offset[0] == len(done)
            assert lp.text_offset == [len(done) + len("".join(lp.tokens[:j]))
                                      for j in range(len(lp.tokens))]
            texts[ch.index] = done + "".join(lp.tokens)
    assert pieces > 6 and len(texts) == 3


def test_stream_stops_at_a_stop_string(toy):
    url, lm, _ = toy
    ref = at.generate(lm, "abc", method="unconstrained", max_new_tokens=24, seed=7)
    full = ref.texts[0]
    assert len(full) >= 5
    stop = full[3:5]
    chunks = list(client(url).completions.create(model="toy", prompt="abc", max_tokens=24,
                                                 seed=7, stop=[stop], stream=True))
    text = "".join(ch.choices[0].text for ch in chunks)
    assert text == full[:full.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_search_with_stop_targets_the_stop_string():
    """The server's stop ends the constraint's sequences (with_stop): exact samples the
    enumerated target that ends at the stop string, not the constraint's target cut after
    sampling (docs/design.md §2)."""
    lm = stop_toy()
    new, old = stop_targets(lm)
    with serving(lm) as (url, _):
        r = client(url).completions.create(
            model="toy", prompt=STOP_PROMPT, n=MAX_N, seed=3, max_tokens=8, stop="b",
            extra_body={"guided_regex": STOP_REGEX, "decoding_method": "exact",
                        "end": "eos"})
    assert all(ch.finish_reason == "stop" and "b" not in ch.text for ch in r.choices)
    texts = [ch.text for ch in r.choices]
    observed = {t: texts.count(t) for t in set(texts)}
    assert chi_square_p(observed, new) > 1e-3
    assert chi_square_p(observed, old) < 1e-6
    ref = at.generate(lm, STOP_PROMPT, with_stop(at.constraints.regex(STOP_REGEX), ["b"]),
                      method="exact", n=MAX_N, seed=3, max_new_tokens=8, end="eos")
    assert texts == ref.texts


@pytest.mark.filterwarnings("ignore:method='exact' with no constraint")
def test_the_server_cuts_the_tricky_case_as_the_constraints_do():
    """A stop string across a token boundary that another overlaps: the text is cut where
    the earliest-starting one begins, streamed or not, whatever the method."""
    lm = tricky_lm()
    with serving(lm) as (url, _):
        c = client(url)
        for method, stream in (("unconstrained", True), ("cd", False), ("exact", False),
                               ("cd", True)):
            body = {"decoding_method": method}
            if method != "unconstrained":
                body["guided_regex"] = "(xa|bcd|e)+"
            r = c.completions.create(model="toy", prompt="e", temperature=0, max_tokens=4,
                                     stop=TRICKY_STOPS, stream=stream, extra_body=body)
            chunks = list(r) if stream else [r]
            text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
            assert text == cut_at_stop("xabcd", tuple(TRICKY_STOPS)) == "x", (method, stream)
            assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"


def test_the_adaptrack_field_counts_what_generate_counts(toy):
    url, lm, _ = toy
    rx = "(a|b|the|cat| )*x"  # AdapTrack crawls here: siblings fetched ahead
    r = client(url).completions.create(model="toy", prompt="crawl", n=4, seed=3, max_tokens=6,
                                       extra_body={"guided_regex": rx})
    ref = at.generate(lm, "crawl", at.constraints.regex(rx), method="adaptrack", n=4, seed=3,
                      max_new_tokens=6)
    assert [ch.text for ch in r.choices] == ref.texts
    s = stats(r)
    assert s["method"] == "adaptrack" and s["fetched_ahead"] == ref.stats["fetched_ahead"] > 0
    assert s["backtracks"] == ref.stats["backtracks"] and s["lm_calls"] == ref.stats["lm_calls"]


def test_a_reused_tree_gives_the_fresh_samples_with_fewer_model_calls(toy):
    url, lm, _ = toy
    c = client(url)
    body = {"guided_regex": "(ab|ba|the){1,3}", "decoding_method": "exact"}
    first = c.completions.create(model="toy", prompt="reuse me", n=6, seed=11, max_tokens=10,
                                 extra_body=body)
    again = c.completions.create(model="toy", prompt="reuse me", n=6, seed=11, max_tokens=10,
                                 extra_body=body)
    ref = at.generate(lm, "reuse me", at.constraints.regex("(ab|ba|the){1,3}"),
                      method="exact", n=6, seed=11, max_new_tokens=10)
    assert [ch.text for ch in first.choices] == [ch.text for ch in again.choices] == ref.texts
    assert stats(first)["trees_reused"] == 0 and stats(again)["trees_reused"] == 1
    assert stats(again)["lm_calls"] < stats(first)["lm_calls"]
    # another seed on the reused tree: the samples a fresh tree gives for that seed
    other = c.completions.create(model="toy", prompt="reuse me", n=6, seed=12, max_tokens=10,
                                 extra_body=body)
    ref = at.generate(lm, "reuse me", at.constraints.regex("(ab|ba|the){1,3}"),
                      method="exact", n=6, seed=12, max_new_tokens=10)
    assert [ch.text for ch in other.choices] == ref.texts and stats(other)["trees_reused"]
    # cd forces chains where exact prefills them (docs/design.md §2): another tree
    cd = c.completions.create(model="toy", prompt="reuse me", n=6, seed=11, max_tokens=10,
                              extra_body={**body, "decoding_method": "cd"})
    ref = at.generate(lm, "reuse me", at.constraints.regex("(ab|ba|the){1,3}"),
                      method="cd", n=6, seed=11, max_new_tokens=10)
    assert [ch.text for ch in cd.choices] == ref.texts and stats(cd)["trees_reused"] == 0


def test_the_tree_cache_is_bounded_in_bytes():
    body = {"guided_regex": "(ab|ba){1,2}", "decoding_method": "exact"}
    with serving(toy_lm(), tree_cache_bytes=0) as (url, server):
        c = client(url)
        for _ in range(2):
            r = c.completions.create(model="toy", prompt="no room", seed=0, max_tokens=6,
                                     extra_body=body)
            assert stats(r)["trees_reused"] == 0
        assert len(server.engine.trees) == 0
    with serving(toy_lm(), tree_cache_bytes=1 << 20) as (url, server):
        c = client(url)
        for prompt in ("one", "two", "three"):
            c.completions.create(model="toy", prompt=prompt, seed=0, max_tokens=6,
                                 extra_body=body)
        assert 0 < server.engine.trees.used <= 1 << 20


class Recording(at.TableLM):
    """A toy model that records how many prefixes each model call asks for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def _next_logprobs(self, prefixes):
        self.batches.append(len(prefixes))
        return super()._next_logprobs(prefixes)


def test_concurrent_requests_share_model_calls():
    gate = threading.Event()
    gate.set()

    def gated(prefix):
        gate.wait(30)
        return weights(prefix)

    lm = Recording(VOCAB, gated, eos=EOS)
    with serving(lm) as (url, server):
        c = client(url)
        out: dict[int, str] = {}

        def one(i: int) -> None:
            r = c.completions.create(model="toy", prompt=f"concurrent {i}", max_tokens=12,
                                     seed=i)
            out[i] = r.choices[0].text

        gate.clear()  # the first request's first call waits; the others queue meanwhile
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while server.engine.running + server.engine.queue_length < 8:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        gate.set()
        for t in threads:
            t.join(60)
    assert max(lm.batches) == 8  # one model call served the walks of all eight requests
    for i in range(8):
        ref = at.generate(toy_lm(), f"concurrent {i}", method="unconstrained",
                          max_new_tokens=12, seed=i)
        assert out[i] == ref.texts[0]


def test_health_and_metrics(toy):
    url, _, _ = toy
    client(url).completions.create(model="toy", prompt="m", max_tokens=2)
    status, _, body = raw(url, "GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, headers, body = raw(url, "GET", "/metrics")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ('adaptrack_requests_total{endpoint="/v1/completions",status="200"}',
                 "adaptrack_completion_tokens_total", "adaptrack_lm_calls_total",
                 "adaptrack_backtracks_total", "adaptrack_queue_length",
                 'adaptrack_request_latency_seconds_bucket{le="+Inf"}'):
        assert name in text, name


# -- errors ---------------------------------------------------------------------------------


BAD = [  # (body, status, param, words in the message)
    ('{"prompt": "x", ', 400, None, "not valid JSON"),
    ("[1, 2]", 400, None, "JSON object"),
    ({"prompt": "x", "temprature": 1}, 400, "temprature", "unknown field"),
    ({"prompt": "x", "messages": []}, 400, "messages", "other endpoint"),
    ({"prompt": "x", "decoding_method": "beam"}, 400, "decoding_method", "one of"),
    ({"prompt": "x", "n": 0}, 400, "n", "between 1 and 128"),
    ({"prompt": "x", "n": 129}, 400, "n", "between 1 and 128"),
    ({"prompt": "x", "n": 1.5}, 400, "n", "integer"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "between 1 and 256"),
    ({"prompt": "x", "max_tokens": 257}, 400, "max_tokens", "between 1 and 256"),
    ({"prompt": "x" * 250, "max_tokens": 10}, 400, "prompt", "context"),
    ({"prompt": "", "max_tokens": 1}, 400, "prompt", "empty"),
    ({"prompt": [5, 999]}, 400, "prompt", "outside the vocabulary"),
    ({"prompt": "x", "temperature": 3}, 400, "temperature", "[0, 2]"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p", "(0, 1]"),
    ({"prompt": "x", "seed": -1}, 400, "seed", "between 0"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs", "between 0 and 20"),
    ({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}}, 400,
     "structured_outputs", "exactly one"),
    ({"prompt": "x", "structured_outputs": {"regex": "a"}, "guided_regex": "a"}, 400,
     "guided_regex", "at most one"),
    ({"prompt": "x", "structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, 400,
     "structured_outputs", "apply to json"),
    ({"prompt": "x", "structured_outputs": {"structural_tag": {"format": {}}}}, 400,
     "structured_outputs.structural_tag", "only the form"),
    ({"prompt": "x", "guided_whitespace_pattern": " "}, 400, "guided_whitespace_pattern",
     "JSON constraint"),
    ({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "tools", "not supported"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options",
     "stream"),
    ({"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ({"prompt": "x", "echo": True}, 400, "echo", "not supported"),
    ({"prompt": "x", "guided_regex": "a(", "guided_choice": ["a"]}, 400, "guided_choice",
     "at most one"),
    ({"prompt": "x", "guided_regex": "a("}, 400, "guided_regex", "regex"),
    ({"prompt": "x", "guided_json": {"type": "nonsense"}}, 400, "guided_json", "schema"),
    ({"prompt": "x", "guided_json": "{not json"}, 400, "guided_json", "not JSON"),
    ({"prompt": "x", "guided_grammar": "start: ("}, 400, "guided_grammar", "Lark"),
    ({"prompt": "x", "guided_grammar": "root ::= ("}, 400, "guided_grammar", "GBNF"),
    ({"prompt": "x", "guided_choice": []}, 400, "guided_choice", "non-empty list"),
    ({"prompt": "x", "guided_api_names": ["2d"]}, 400, "guided_api_names", "dotted"),
    ({"prompt": "x", "response_format": {"type": "json_schema"}}, 400, "response_format",
     "schema"),
    ({"prompt": "x", "response_format": {"type": "xml"}}, 400, "response_format", "json"),
    ({"prompt": "x", "decoding_method": "cd", "share_q": True}, 400, "share_q", "adaptrack"),
    ({"prompt": "x", "max_backtrack": -1}, 400, "max_backtrack", "between 0"),
    ({"prompt": "x", "end": "stop"}, 400, "end", "leave, eos"),
    ({"prompt": "x", "fallback": None}, 400, "fallback", "'cd' or 'none'"),
    ({"prompt": "x", "max_seconds": 0}, 400, "max_seconds", "(0, inf]"),
    ({"prompt": "x", "search_budget": -1}, 400, "search_budget", "(0, inf]"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model", "does not exist"),
    ({"prompt": "x", "guided_regex": "[ab]{100}", "max_tokens": 8}, 400, "guided_regex",
     "max_new_tokens=8"),
    ({"prompt": "x", "guided_json": {"type": "string", "minLength": 10**9}, "max_tokens": 8},
     400, "guided_json", "max_new_tokens=8"),
    ({"prompt": "x", "guided_grammar": 'start: "a" start', "max_tokens": 8}, 400,
     "guided_grammar", "max_new_tokens=8"),
]


@pytest.mark.parametrize("body,status,param,words", BAD)
def test_bad_requests_are_refused_before_any_model_work(toy, body, status, param, words):
    url, lm, _ = toy
    calls = lm.calls
    text = body if isinstance(body, str) else json.dumps(body)
    got, _, data = raw(url, "POST", "/v1/completions", text)
    err = json.loads(data)["error"]
    assert got == status and err["param"] == param, err
    assert words in err["message"] and set(err) == {"message", "type", "param", "code"}
    assert lm.calls == calls  # refused before the model was asked anything


def test_a_body_past_the_limit_is_413(toy, monkeypatch):
    from adaptrack.serve import app

    url, _, _ = toy
    monkeypatch.setattr(app, "MAX_BODY_BYTES", 1000)
    status, _, data = raw(url, "POST", "/v1/completions",
                          json.dumps({"prompt": "x" * 2000}))
    assert status == 413 and json.loads(data)["error"]["code"] == "body_too_large"


def test_chat_errors_name_the_field(toy):
    url, _, _ = toy
    c = client(url)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="toy", messages=[{"role": "wizard", "content": "x"}])
    assert e.value.body["param"] == "messages[0]"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="toy", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}])
    assert "only text" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}],
                                  logprobs=True, top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    status, _, data = raw(url, "GET", "/v2/nothing")
    assert status == 404 and json.loads(data)["error"]["code"] == "not_found"


def test_an_empty_language_is_400_with_the_python_apis_error(toy):
    url, lm, _ = toy
    with pytest.raises(at.NoValidSequenceError) as expected:
        at.generate(lm, "x", at.constraints.regex("[ab]{100}"), max_new_tokens=8)
    with pytest.raises(openai.BadRequestError) as got:
        client(url).completions.create(model="toy", prompt="x", max_tokens=8,
                                       extra_body={"guided_regex": "[ab]{100}"})
    assert got.value.body["message"] == str(expected.value)
    assert got.value.body["code"] == "no_valid_sequence"
    # found while sampling (no sequence within top_p's cut), not up front: also 400
    lm2 = at.TableLM(["a", "b", "<eos>"], lambda p: [1, 0, 1], eos=2)
    with serving(lm2) as (url2, _):
        status, body = post(url2, "/v1/completions", {"prompt": "a", "guided_choice": ["b"]})
    assert status == 400 and body["error"]["code"] == "no_valid_sequence"


def test_an_api_key_guards_v1_but_not_health():
    with serving(toy_lm(), api_key="s3cret") as (url, _):
        with pytest.raises(openai.AuthenticationError):
            client(url).models.list()
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").completions.create(model="toy", prompt="x", max_tokens=1)
        r = client(url, "s3cret").completions.create(model="toy", prompt="x", max_tokens=1)
        assert len(r.choices) == 1
        assert raw(url, "GET", "/health")[0] == 200


class Gate:
    """A toy model whose calls wait while the gate is closed (a slow model on demand), and
    count the calls made."""

    def __init__(self, delay: float = 0.0) -> None:
        self.open = threading.Event()
        self.open.set()
        self.delay = delay
        self.lm = at.TableLM(VOCAB, self.weights, eos=EOS)
        self.lm.context_length = 256

    def weights(self, prefix):
        self.open.wait(30)
        if self.delay:
            time.sleep(self.delay)
        return weights(prefix)


def test_a_full_queue_is_429_with_retry_after():
    gate = Gate()
    with serving(gate.lm, max_concurrent=1, max_queue=1) as (url, server):
        gate.open.clear()
        results: list[int] = []
        holders = [threading.Thread(target=lambda: results.append(post(
            url, "/v1/completions", {"prompt": "slow", "max_tokens": 2})[0])) for _ in range(2)]
        for t in holders:
            t.start()
        deadline = time.monotonic() + 10
        while server.engine.running + server.engine.queue_length < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        status, headers, data = raw(url, "POST", "/v1/completions",
                                    json.dumps({"prompt": "x", "max_tokens": 1}))
        assert status == 429 and headers["retry-after"] == "1"
        assert json.loads(data)["error"]["type"] == "rate_limit_error"
        gate.open.set()
        for t in holders:
            t.join(30)
        assert results == [200, 200]


def test_a_request_past_the_timeout_is_504_and_the_engine_goes_on():
    gate = Gate(delay=0.05)
    with serving(gate.lm, timeout=0.5) as (url, _):
        with pytest.raises(openai.APIStatusError) as e:
            client(url).completions.create(model="toy", prompt="long", max_tokens=200,
                                           extra_body={"guided_regex": "[a-z]{150}"})
        assert e.value.status_code == 504 and e.value.body["code"] == "timeout"
        calls = gate.lm.calls
        time.sleep(0.3)
        assert gate.lm.calls == calls  # its walks were cancelled
        # streamed: the text sent so far, then the error as an event
        stream = client(url).completions.create(
            model="toy", prompt="long", max_tokens=200, stream=True,
            extra_body={"guided_regex": "[a-z]{150}", "decoding_method": "cd"})
        pieces = []
        with pytest.raises(openai.APIError) as e:
            for chunk in stream:
                pieces.append(chunk.choices[0].text)
        assert pieces and "timeout" in str(e.value.message)
        gate.delay = 0
        r = client(url).completions.create(model="toy", prompt="short", max_tokens=2)
        assert len(r.choices) == 1


def test_a_search_past_its_budget_is_answered_by_the_cd_fallback_and_says_so(toy):
    url, _, _ = toy
    body = {"prompt": "x", "n": 2, "max_tokens": 8, "seed": 0, "guided_regex": "[a-z]{2,4}",
            "decoding_method": "exact", "max_seconds": 1e-6}
    status, out = post(url, "/v1/completions", body)
    assert status == 200, out
    assert out["adaptrack"]["fallback_choices"] == [0, 1]
    assert "max_seconds" in out["adaptrack"]["fallback"]
    assert all(re.fullmatch("[a-z]{2,4}", c["text"]) for c in out["choices"])
    status, out = post(url, "/v1/completions", {**body, "fallback": "none"})
    assert status == 504 and out["error"]["code"] == "timeout"
    status, out = post(url, "/v1/completions", {**body, "max_seconds": 60})
    assert status == 200 and out["adaptrack"]["fallback_choices"] == []
    assert out["adaptrack"]["fallback"] is None


def test_a_request_sets_its_own_call_budget(toy):
    url, _, _ = toy
    # A prompt of its own: a tree another test left in the server's cache needs no calls.
    body = {"prompt": "a call budget", "n": 2, "max_tokens": 8, "seed": 0,
            "guided_regex": "[a-z]{2,4}", "decoding_method": "exact"}
    status, out = post(url, "/v1/completions", {**body, "search_budget": 0.01})
    assert status == 200 and out["adaptrack"]["fallback_choices"] == [0, 1], out
    # No sample by the first one's due: 0.01 x 64 x (2 + 1) / 2 calls (of 0.01 x 2 x 64).
    assert "max_calls=1 (no sample yet" in out["adaptrack"]["fallback"]
    # Without the fallback the spent call budget is the request's error, as a node budget's.
    status, out = post(url, "/v1/completions", {**body, "search_budget": 0.01,
                                                "fallback": "none"})
    assert status == 422 and out["error"]["code"] == "search_limit", out
    status, out = post(url, "/v1/completions", body)  # the library's default: 3
    assert status == 200 and out["adaptrack"]["fallback"] is None


def test_search_seconds_bound_searches_only():
    gate = Gate(delay=0.01)
    with serving(gate.lm, search_seconds=0.05) as (url, _):
        body = {"prompt": "x", "max_tokens": 12, "seed": 0, "guided_regex": "[a-z]{8}"}
        status, out = post(url, "/v1/completions", {**body, "decoding_method": "cd"})
        assert status == 200 and out["adaptrack"]["fallback"] is None  # 9 calls, ~0.1 s
        status, out = post(url, "/v1/completions", {**body, "decoding_method": "exact"})
        assert status == 200 and out["adaptrack"]["fallback_choices"] == [0]
        assert "max_seconds=0.05" in out["adaptrack"]["fallback"]


def test_the_end_policy_is_part_of_the_request(toy):
    url, lm, _ = toy
    body = {"prompt": "q", "n": 3, "max_tokens": 6, "seed": 0, "guided_regex": "[a-c]{1,4}",
            "decoding_method": "exact"}
    for end in ("leave", "eos"):
        status, out = post(url, "/v1/completions", {**body, "end": end})
        assert status == 200, out
        want = at.generate(lm, "q", at.constraints.regex("[a-c]{1,4}"), method="exact", n=3,
                           seed=0, max_new_tokens=6, end=end)
        assert [c["text"] for c in out["choices"]] == want.texts


def test_a_request_that_expires_in_the_queue_is_504_and_counted_as_cancelled():
    gate = Gate()
    with serving(gate.lm, max_concurrent=1, timeout=0.5) as (url, server):
        gate.open.clear()
        statuses: list[int] = []

        def ask(prompt: str) -> None:
            statuses.append(post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 2})[0])

        running, queued = threading.Thread(target=ask, args=("a",)), threading.Thread(
            target=ask, args=("b",))
        running.start()
        deadline = time.monotonic() + 10
        while server.engine.running < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        queued.start()
        while server.engine.queue_length < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.8)  # both past the timeout: one running, one still queued
        gate.open.set()
        running.join(30)
        queued.join(30)
        assert statuses == [504, 504]
        metrics = raw(url, "GET", "/metrics")[2].decode()
        assert "adaptrack_cancelled_total 2" in metrics


def test_a_client_that_disconnects_has_its_walks_cancelled():
    gate = Gate(delay=0.02)
    with serving(gate.lm) as (url, server):
        for stream in (False, True):
            port = int(url.rsplit(":", 1)[1])
            sock = socket.create_connection(("127.0.0.1", port))
            body = json.dumps({"prompt": "bye", "max_tokens": 250, "stream": stream,
                               "guided_regex": "[a-z]{240}", "decoding_method": "cd"})
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                         f"{body}".encode())
            before = gate.lm.calls
            deadline = time.monotonic() + 10
            while gate.lm.calls < before + 3:  # sampling has begun
                assert time.monotonic() < deadline
                time.sleep(0.01)
            sock.close()
            deadline = time.monotonic() + 10
            while server.engine.running:
                assert time.monotonic() < deadline, "the request was not cancelled"
                time.sleep(0.01)
            calls = gate.lm.calls
            time.sleep(0.2)
            assert gate.lm.calls == calls
        metrics = raw(url, "GET", "/metrics")[2].decode()
        assert "adaptrack_cancelled_total 2" in metrics
        assert 'status="499"} 2' in metrics
        r = client(url).completions.create(model="toy", prompt="still here", max_tokens=2)
        assert len(r.choices) == 1


def test_a_request_cancelled_while_it_waits_for_admission_is_never_run():
    """A client that leaves while the engine is inside a model call: the request is
    cancelled and admitted in the same turn. It must not run, keep a slot, nor keep the
    engine thread from stopping."""
    from adaptrack.serve import EngineLoop
    from adaptrack.serve.events import Done, Failed
    from adaptrack.serve.preprocess import parse, prepare_calls

    prefixes: list[tuple[int, ...]] = []

    def slow(prefix: tuple[int, ...]) -> list[float]:
        prefixes.append(tuple(prefix))
        time.sleep(0.3)
        return [1, 1, 0.001]

    lm = at.TableLM([b"a", b"b", b"<eos>"], slow, eos=2)
    loop = EngineLoop(lm)
    loop.start()
    try:
        def submit(prompt: str, events: list) -> object:
            opts = parse(json.dumps({"prompt": prompt, "max_tokens": 4, "seed": 0}).encode(),
                         "completion", lm)
            return loop.submit(prepare_calls(lm, opts), opts, events.append)

        first: list = []
        submit("a", first)
        deadline = time.monotonic() + 10
        while not prefixes:  # the engine is inside its first model call
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second: list = []
        job = submit("b", second)
        loop.cancel(job, RuntimeError("the client left"))
        deadline = time.monotonic() + 20
        while not (first and isinstance(first[-1], Done)):
            assert time.monotonic() < deadline, "the first request did not finish"
            time.sleep(0.02)
        assert [type(e) for e in second] == [Failed]
        assert all(p[0] == 0 for p in prefixes)  # the prompt "b" never reached the model
        assert loop.running == 0 and loop.queue_length == 0
    finally:
        loop.close(timeout=10)
    assert not loop.alive


def test_a_choice_cut_at_a_stop_string_stops_its_walk(toy):
    """With n > 1, a cd or unconstrained choice that meets a stop string asks the model for
    nothing beyond it, while the other choices go on."""
    prefixes: list[tuple[int, ...]] = []

    def counted(prefix: tuple[int, ...]) -> np.ndarray:
        prefixes.append(tuple(prefix))
        return weights(prefix)

    lm = at.TableLM(VOCAB, counted, eos=EOS)
    lm.context_length = 512
    with serving(lm, tree_cache_bytes=0) as (url, _):
        r = client(url).completions.create(
            model="toy", prompt="x", n=6, max_tokens=150, seed=3, stop=["e"],
            extra_body={"decoding_method": "unconstrained"})
    prompt = len(lm.encode("x"))
    assert sum(c.finish_reason == "stop" for c in r.choices) >= 3
    assert all("e" not in c.text for c in r.choices)
    # The token that puts the stop string into the text ends the walk: no prefix that
    # holds it is asked for.
    past = [p for p in prefixes if b"e" in lm.vocab.decode(p[prompt:])]
    assert not past, f"{len(past)} model calls past a stop string"


def test_a_failing_request_does_not_affect_another():
    poison = VOCAB.index("~")

    def picky(prefix):
        if prefix[0] == poison:  # prompts that start with it (samples may hold it later)
            return [float("nan")] * len(VOCAB)  # a broken model output: ModelOutputError
        return weights(prefix)

    lm = at.TableLM(VOCAB, picky, eos=EOS)
    lm.context_length = 256
    with serving(lm) as (url, _):
        out: dict[str, int] = {}

        def one(prompt: str) -> None:
            out[prompt] = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 8,
                                                        "n": 4})[0]

        threads = [threading.Thread(target=one, args=(p,)) for p in ("ok", "~bad", "fine")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert out == {"ok": 200, "~bad": 500, "fine": 200}
        assert raw(url, "GET", "/health")[0] == 200


# -- a real model: a tiny random Llama in a subprocess, and the default model ------------


def tiny_llama_dir(path) -> str:
    """A 2-layer random Llama with a byte-level tokenizer and a chat template, saved."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(table))}
    vocab["<eos>"] = len(vocab)
    raw_tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    raw_tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw_tok.decoder = decoders.ByteLevel()
    raw_tok.add_special_tokens(["<eos>"])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw_tok, eos_token="<eos>")
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                         "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=256,
                                   eos_token_id=len(tok) - 1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_sigterm_finishes_the_requests_in_flight_and_exits_0(tmp_path):
    model = tiny_llama_dir(tmp_path / "tiny")
    proc = subprocess.Popen([sys.executable, "-m", "adaptrack", "serve", "--model", model,
                             "--port", "0", "--threads", "1", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "serving" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, line
            line = proc.stderr.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line).group(1)
        deadline = time.monotonic() + 60
        while True:  # the port is bound before the model loads; wait for the app
            with contextlib.suppress(OSError):
                if raw(url, "GET", "/health")[0] == 200:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        c = client(url)
        chat = c.chat.completions.create(model=model, messages=[{"role": "user",
                                                                 "content": "hi"}],
                                         max_tokens=4, seed=0, extra_body={
                                             "guided_choice": ["yes", "no"]})
        assert chat.choices[0].message.content in ("yes", "no")
        pieces = [ch.choices[0].text for ch in c.completions.create(
            model=model, prompt="ab", max_tokens=8, seed=0, stream=True,
            extra_body={"guided_regex": "[a-z]{6}", "decoding_method": "cd"}) if ch.choices]
        assert len([p for p in pieces if p]) >= 2 and len("".join(pieces)) == 6
        result: dict[str, object] = {}

        def slow() -> None:
            result["r"] = c.completions.create(
                model=model, prompt="x", max_tokens=120, n=4, seed=1,
                extra_body={"guided_regex": "[a-z]{100,110}", "decoding_method": "cd"})

        worker = threading.Thread(target=slow)
        worker.start()
        deadline = time.monotonic() + 30
        while "adaptrack_requests_running 1" not in raw(url, "GET", "/metrics")[2].decode():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.terminate()  # SIGTERM
        worker.join(120)
        assert proc.wait(120) == 0
        r = result["r"]
        assert all(len(ch.text) >= 100 for ch in r.choices)
        with pytest.raises(OSError):
            raw(url, "GET", "/health")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


@pytest.fixture(scope="module")
def default_model():
    pytest.importorskip("transformers", reason="the default model runs on transformers")
    return at.load_model(backend="transformers", device="cpu")


def test_a_json_schema_sampled_by_adaptrack_on_the_default_model(default_model):
    # Strict whitespace: with llguidance's flexible default the model pads with spaces and
    # tabs, and AdapTrack spends hundreds of model calls backtracking out of them.
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False}}
    with serving(default_model, chat_template=None) as (url, _):
        r = client(url).chat.completions.create(
            model="toy", messages=[{"role": "user", "content": "Describe a person as JSON "
                                                               "with a name and an age."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person",
                                                                    "schema": schema}},
            max_tokens=40, seed=0)
    person = json.loads(r.choices[0].message.content)
    assert set(person) == {"name", "age"} and 0 <= person["age"] <= 120
    assert stats(r)["method"] == "adaptrack" and r.choices[0].finish_reason == "stop"


def test_the_row_cost_is_timed_at_start_up_not_in_a_request():
    """A search's width comes from the model's row cost, timed once: at start-up, so that
    the first ``exact`` request does not pay for it."""
    lm = toy_lm()
    lm.row_cost = None  # as a model that does not declare it
    with serving(lm):
        assert lm.row_cost is not None and lm.row_cost >= 0
