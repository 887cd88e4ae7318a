"""Tool calls, ``structured_outputs`` and top alternatives on ``adaptrack serve``, driven by
the ``openai`` client on loopback: a toy model that knows Hermes' call format (most tests)
and the default model (one short test).

The toy puts most of its mass on a few answers, some of which break the tools' schemas (a
city not in the enum, a number past the maximum), and a little on every token, so that a
constraint has work to do and a search stays short.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the serve tests use the openai client")
pytest.importorskip("uvicorn", reason="adaptrack serve needs the serve extra")
jsonschema = pytest.importorskip("jsonschema", reason="arguments are checked by jsonschema")

from loopback import client, serving  # noqa: E402
from stats import chi_square_p  # noqa: E402

import adaptrack as at  # noqa: E402
from adaptrack.sampling.engine import expand  # noqa: E402
from adaptrack.serve import APIError  # noqa: E402
from adaptrack.serve.preprocess import parse  # noqa: E402
from adaptrack.serve.tool_protocol import Tool  # noqa: E402
from adaptrack.serve.tools import tool_spec  # noqa: E402


def _call(name: str, args: dict, sep: str = ", ") -> str:
    text = json.dumps({"name": name, "arguments": args}, separators=(sep, ": "))
    return f"<tool_call>\n{text}\n</tool_call>"


#: What the toy says after "assistant:", with its weight.
ANSWERS = [
    (_call("get_weather", {"city": "Paris", "unit": "C"}), 4.0),
    (_call("get_weather", {"city": "Lyon", "unit": "C"}), 3.0),  # not in the enum
    (_call("add", {"a": 2, "b": 3}), 2.0),
    (_call("add", {"a": 12, "b": 3}), 2.0),  # a past its maximum
    (_call("get_weather", {"city": "Rome", "unit": "F"}) + "\n"
     + _call("add", {"a": 1, "b": 1}), 1.0),
    ("It is sunny.", 3.0),
]
PIECES = ["<tool_call>", "</tool_call>", '{"name": "', '", "arguments": ', '{"', '": ', ', "',
          "}}", "get_weather", "add", "Paris", "Rome", "Oslo", "Lyon", "city", "unit"]
VOCAB = [chr(c) for c in range(32, 127)] + ["\n", *PIECES, "<eos>"]
EOS = len(VOCAB) - 1

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 9}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                           "description": "The weather in a city"}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
#: The searches' own samples: the toy puts a little mass on every token, so its searches run
#: past the early hand-over, whose samples can depend on what the server's reused tree had
#: cached (docs/design.md §6); these tests are about the tool calls, not the hand-over.
OWN = {"early_handover": 1000}


def weights(prefix: tuple[int, ...]) -> np.ndarray:
    """Mass on the next piece of every answer the text so far begins, EOS at an answer's
    end, and a little on every token."""
    text = "".join(VOCAB[t] for t in prefix if t != EOS)
    said = text.rsplit("assistant:", 1)[-1]
    w = np.full(len(VOCAB), 0.0005)
    for answer, mass in ANSWERS:
        if answer == said:
            w[EOS] += mass
        elif answer.startswith(said):
            rest = answer[len(said):]
            for t, piece in enumerate(VOCAB[:EOS]):
                if rest.startswith(piece):
                    w[t] += mass * (2 if len(piece) > 1 else 1)
    return w


@pytest.fixture(scope="module")
def toy():
    lm = at.TableLM(VOCAB, weights, eos=EOS)
    lm.context_length = 2048
    with serving(lm) as (url, server):
        yield url, lm, server


def check_calls(calls, names=tuple(SCHEMAS)) -> None:
    """Each call names one of ``names`` and its arguments validate under its schema."""
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments),
                            SCHEMAS[call.function.name])


# -- tool calls -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["cd", "adaptrack", "exact"])
@pytest.mark.parametrize("choice", ["required", "named", "auto"])
def test_tool_calls_follow_the_functions_schemas(toy, method, choice):
    url, _, _ = toy
    tool_choice = ({"type": "function", "function": {"name": "add"}} if choice == "named"
                   else choice)
    r = client(url).chat.completions.create(
        model="toy", messages=ASK, tools=TOOLS, tool_choice=tool_choice, n=3, seed=1,
        max_tokens=80, extra_body={"decoding_method": method, **OWN})
    stats = r.model_extra["adaptrack"]
    assert stats["method"] == method and stats["fallback"] is None  # the method's own
    called = [ch for ch in r.choices if ch.message.tool_calls]
    if choice != "auto":
        assert called == r.choices
    assert called, [ch.message.content for ch in r.choices]  # the toy mostly calls
    for ch in called:
        # CD may run out of tokens in a second call: the whole calls are given, the rest
        # is content; a search's samples end.
        ends = ("tool_calls", "length") if method == "cd" else ("tool_calls",)
        assert ch.finish_reason in ends
        assert ch.finish_reason == "tool_calls" or ch.message.content.startswith("<tool_call>")
        check_calls(ch.message.tool_calls, ("add",) if choice == "named" else tuple(SCHEMAS))
    for ch in r.choices:
        if not ch.message.tool_calls:  # auto: a text answer, no call in it
            assert ch.finish_reason == "stop" and "<tool_call>" not in ch.message.content


def test_parallel_tool_calls_false_gives_one_call(toy):
    url, _, _ = toy
    r = client(url).chat.completions.create(
        model="toy", messages=ASK, tools=TOOLS, tool_choice="required", n=4, seed=2,
        max_tokens=80, parallel_tool_calls=False, extra_body={"decoding_method": "cd"})
    assert all(len(ch.message.tool_calls) == 1 for ch in r.choices)


@pytest.mark.parametrize("method", ["cd", "adaptrack"])
def test_a_streamed_tool_call_is_the_one_not_streamed(toy, method):
    url, _, _ = toy
    c = client(url)
    ask = dict(model="toy", messages=ASK, tools=TOOLS, tool_choice="required", n=2, seed=3,
               max_tokens=80, extra_body={"decoding_method": method, **OWN})
    whole = c.chat.completions.create(**ask)
    calls: dict[int, dict[int, dict]] = {0: {}, 1: {}}
    finish = {}
    for chunk in c.chat.completions.create(stream=True, **ask):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or ():
                got = calls[ch.index].setdefault(d.index, {"name": "", "arguments": ""})
                got["id"] = d.id or got.get("id")
                got["name"] += d.function.name or ""
                got["arguments"] += d.function.arguments or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    for i in (0, 1):
        want = whole.choices[i].message.tool_calls
        assert [(c["name"], c["arguments"]) for _, c in sorted(calls[i].items())] == [
            (w.function.name, w.function.arguments) for w in want]
        assert all(c["id"].startswith("call_") for c in calls[i].values())
        assert finish[i] == "tool_calls"


def test_tool_choice_none_leaves_the_tools_out(toy):
    url, _, _ = toy
    r = client(url).chat.completions.create(
        model="toy", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=20, seed=0)
    assert r.choices[0].message.tool_calls is None
    assert r.model_extra["adaptrack"]["method"] == "unconstrained"


def captured(lm, body, template):
    """The messages (and tools) the chat template was given for ``body``."""
    seen = {}

    def render(messages, tools=None):
        seen.update(messages=messages, tools=tools)
        return "assistant:"

    if template == "hermes":
        render.hermes_tools = True
    parse(json.dumps(body), "chat", lm, chat_template=render)
    return seen


HISTORY = [
    {"role": "user", "content": "Add 2 and 3"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
]


def test_the_history_of_calls_and_results_reaches_the_template(toy):
    _, lm, _ = toy
    plain = captured(lm, {"messages": HISTORY, "tools": TOOLS}, "plain")
    roles = [m["role"] for m in plain["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert '"name": "get_weather"' in plain["messages"][0]["content"]  # the tools offered
    assert plain["messages"][2]["content"] == _call("add", {"a": 2, "b": 3})
    assert plain["messages"][3]["content"] == "<tool_response>\n5\n</tool_response>"
    hermes = captured(lm, {"messages": HISTORY, "tools": TOOLS}, "hermes")
    assert [t["function"]["name"] for t in hermes["tools"]] == ["get_weather", "add"]
    call = hermes["messages"][1]["tool_calls"][0]
    assert call["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert hermes["messages"][2] == {"role": "tool", "content": "5", "tool_call_id": "call_1"}
    # tool_choice "none": the tools are not offered
    none = captured(lm, {"messages": HISTORY, "tools": TOOLS, "tool_choice": "none"}, "hermes")
    assert none["tools"] is None


@pytest.mark.parametrize("body,param,words", [
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "not among"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools", "must differ"),
    ({"tools": TOOLS, "guided_regex": "a"}, "tools", "at most one"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "nonsense"}}}]}, "tools", "schema"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0]",
     "pattern"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{oops"}}]}]}, "messages[0]", "not JSON"),
    ({"messages": [{"role": "user"}]}, "messages[0]", "'content' is missing"),
])
def test_bad_tool_requests_name_the_field(toy, body, param, words):
    _, lm, _ = toy
    with pytest.raises(APIError) as err:
        parse(json.dumps({"messages": ASK, **body}), "chat", lm,
              chat_template=lambda m: "assistant:")
    assert err.value.status == 400 and err.value.param == param, err.value.message
    assert words in err.value.message


# -- what auto samples ----------------------------------------------------------------------

SMALL = ["<tool_call>", "\n", '{"name": "f", "arguments": {"x": ', "1", "2", "9", "}}",
         "</tool_call>", "hi", "<", "x", "<eos>"]
FOLLOW = {"start": {"<tool_call>": 1, "hi": 1, "<": 0.5}, "<tool_call>": {"\n": 1, "x": 0.3},
          "{": {"1": 1, "2": 1, "9": 1}, "1": {"}}": 1}, "2": {"}}": 1}, "9": {"}}": 1},
          "}}": {"\n": 1}, "</tool_call>": {"<eos>": 1, "\n": 0.5},
          "hi": {"<eos>": 1, "hi": 0.5, "<tool_call>": 0.3}, "<": {"x": 1},
          "x": {"<eos>": 1, "hi": 0.3}}
AFTER_NEWLINE = {"<tool_call>": {SMALL[2]: 1, "hi": 0.2}, "}}": {"</tool_call>": 1, "hi": 0.1}}


def small_weights(prefix: tuple[int, ...]) -> np.ndarray:
    """A model that calls f, answers "hi", or writes "<x", a little of each off the format."""
    last = "start" if len(prefix) == 1 else SMALL[prefix[-1]]
    if last == "\n":
        follow = AFTER_NEWLINE.get(SMALL[prefix[-2]], {"<tool_call>": 1})
    else:
        follow = FOLLOW["{" if last.startswith("{") else last]
    w = np.zeros(len(SMALL))
    for token, weight in follow.items():
        w[SMALL.index(token)] = weight
    return w


@pytest.mark.parametrize("parallel", [False, True])
def test_auto_samples_the_target_of_text_or_calls(parallel):
    """``exact`` samples the tool grammar's target as enumerated: text, calls after text,
    calls whose arguments break the schema (x = 9) and a second call too long for
    max_tokens all weighed right. (A lazy lexeme in place of the negated text gave another
    language to the masks than to the enumeration: p < 1e-6 here.)"""
    lm = at.TableLM(SMALL, small_weights, eos=len(SMALL) - 1)
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"enum": [1, 2]}}, "required": ["x"],
        "additionalProperties": False}}})
    constraint = tool_spec([tool], "auto", parallel).build()
    target = at.exact_distribution(lm, [8], constraint, max_new_tokens=10)
    calls = [s for s in target if 0 in s]  # 0: <tool_call>
    assert 0.1 < sum(target[s] for s in calls) < 0.5  # both answers weigh
    r = at.generate(lm, [8], constraint, method="exact", n=2000, seed=0, max_new_tokens=10)
    observed: dict = {}
    for sample in r.samples:
        observed[sample.tokens] = observed.get(sample.tokens, 0) + 1
    assert chi_square_p(observed, target) > 1e-3


# -- structured_outputs ---------------------------------------------------------------------


BOOL = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
        "additionalProperties": False}


@pytest.mark.parametrize("spec,check", [
    ({"json": BOOL, "whitespace_pattern": ""}, lambda t: t in ('{"a":true}', '{"a":false}')),
    ({"json": json.dumps(BOOL), "disable_any_whitespace": True},
     lambda t: json.loads(t)["a"] in (True, False)),
    ({"json_object": True, "disable_any_whitespace": True},
     lambda t: isinstance(json.loads(t), dict)),
    ({"regex": "[a-c]{2}x"}, lambda t: re.fullmatch("[a-c]{2}x", t)),
    ({"choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
    ({"grammar": 'start: "up" | "down"'}, lambda t: t in ("up", "down")),
    ({"grammar": 'root ::= "on" | "off"'}, lambda t: t in ("on", "off")),
    ({"structural_tag": {"type": "structural_tag", "triggers": ["<f="], "structures": [
        {"begin": "<f=add>", "schema": ADD, "end": "</f>"}]}},
     lambda t: all(jsonschema.validate(json.loads(m), ADD) is None
                   for m in re.findall(r"<f=add>(.*?)</f>", t))),
])
@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_structured_outputs_hold(toy, spec, check, endpoint):
    url, _, _ = toy
    c = client(url)
    extra = {"structured_outputs": spec}
    if endpoint == "chat":
        r = c.chat.completions.create(model="toy", messages=ASK, n=2, seed=4, max_tokens=24,
                                      extra_body=extra)
        texts = [ch.message.content for ch in r.choices]
    else:
        r = c.completions.create(model="toy", prompt="assistant:", n=2, seed=4,
                                 max_tokens=24, extra_body=extra)
        texts = [ch.text for ch in r.choices]
    assert r.model_extra["adaptrack"]["method"] == "adaptrack"
    for ch, text in zip(r.choices, texts, strict=True):
        assert ch.finish_reason == "stop" and check(text), text


def test_structured_outputs_json_gives_the_guided_json_samples(toy):
    url, _, _ = toy
    c = client(url)
    ask = dict(model="toy", prompt="assistant:", n=3, seed=5, max_tokens=24)
    new = c.completions.create(**ask, extra_body={"structured_outputs": {
        "json": BOOL, "whitespace_pattern": " ?"}, **OWN})
    old = c.completions.create(**ask, extra_body={"guided_json": BOOL, **OWN,
                                                  "guided_whitespace_pattern": " ?"})
    assert [ch.text for ch in new.choices] == [ch.text for ch in old.choices]
    assert old.model_extra["adaptrack"]["trees_reused"] == 1  # one constraint, one tree
    assert new.model_extra["adaptrack"]["fallback"] is None


# -- top alternatives -----------------------------------------------------------------------


def test_top_logprobs_are_the_models_likeliest_tokens(toy):
    url, lm, _ = toy
    c = client(url)
    r = c.chat.completions.create(model="toy", messages=ASK, max_tokens=12, seed=6,
                                  logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) > 1
    prompt = lm.encode("user: Weather in Paris?\nassistant:")
    said = list(prompt)
    for entry in content:
        assert len(entry.top_logprobs) == 2
        first, second = entry.top_logprobs
        assert first.logprob >= second.logprob
        # the model's own two likeliest tokens at this position (T = 1, unconstrained)
        row = lm.next_logprobs([said])[0]
        best = np.argsort(-row, kind="stable")[:2]
        assert [first.logprob, second.logprob] == pytest.approx(row[best].tolist(), abs=1e-9)
        assert [first.token, second.token] == [VOCAB[t] for t in best]
        if entry.token in (first.token, second.token):
            assert entry.logprob == pytest.approx(
                {first.token: first.logprob, second.token: second.logprob}[entry.token])
        said.append(VOCAB.index(entry.token) if entry.bytes is not None else EOS)


def test_top_logprobs_of_a_constrained_sample_are_its_valid_tokens(toy):
    url, _, _ = toy
    r = client(url).completions.create(
        model="toy", prompt="assistant:", max_tokens=8, seed=6, logprobs=2,
        extra_body={"guided_choice": ["yes", "no", "nay"]})
    lp = r.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens)
    assert set(lp.top_logprobs[0]) == {"y", "n"}  # the valid first tokens, no others
    assert all(len(top) <= 2 and all(v <= 0 for v in top.values()) for top in lp.top_logprobs)


def test_streamed_top_logprobs_come_with_each_piece(toy):
    url, _, _ = toy
    stream = client(url).chat.completions.create(
        model="toy", messages=ASK, max_tokens=10, seed=7, logprobs=True, top_logprobs=2,
        stream=True, extra_body={"decoding_method": "unconstrained"})
    entries = [e for chunk in stream for ch in chunk.choices if ch.logprobs
               for e in ch.logprobs.content]
    assert entries and all(len(e.top_logprobs) == 2 for e in entries)


def test_top_alternatives_remake_an_expansion_the_cache_dropped():
    from adaptrack.sampling.tree import PrefixTree
    from adaptrack.sampling.treeoptions import TreeOptions
    from adaptrack.serve.prefixes import top_alternatives

    lm = at.TableLM(SMALL, small_weights, eos=len(SMALL) - 1)
    kept = PrefixTree([8], at.constraints.anything().bind(lm.vocab))
    dropped = PrefixTree([8], at.constraints.anything().bind(lm.vocab),
                         TreeOptions(max_cache_bytes=0))
    nodes = []
    for tree in (kept, dropped):
        node = tree.root
        for token in (0, 1, 2):  # <tool_call> \n {"name": ...
            node = tree.child(node, token, expand(lm, tree, node))
            tree.finish([])  # the cache back within its bound: nothing kept when 0 bytes
        nodes.append(node)
    assert dropped.root.expansion is None and kept.root.expansion is not None
    calls = lm.calls
    again = top_alternatives(lm, dropped, nodes[1], 2)
    assert lm.calls == calls + 3  # the three positions, in one batched call
    assert again == top_alternatives(lm, kept, nodes[0], 2)
    assert [t for t, _ in again[2]] == [2, 8]  # after a newline: the call, then "hi"


# -- the default model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_model():
    pytest.importorskip("transformers", reason="the default model runs on transformers")
    return at.load_model(backend="transformers", device="cpu")


def test_a_named_tool_call_on_the_default_model(default_model):
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                 "maxLength": 12}},
                       "required": ["city"], "additionalProperties": False}}}
    with serving(default_model, chat_template=None) as (url, _):
        r = client(url).chat.completions.create(
            model="toy", messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[tool], tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=40, seed=0, parallel_tool_calls=False)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1
    args = json.loads(ch.message.tool_calls[0].function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    assert r.model_extra["adaptrack"]["method"] == "adaptrack"
