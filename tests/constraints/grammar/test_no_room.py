"""A constraint with no valid text within max_new_tokens is refused by name before any model
call, for every constrained method (docs/design.md §6): a JSON schema whose shortest value is
long (``json_min_bytes``), a grammar that forces more bytes than the limit can hold."""

import json

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import adaptrack as at
from adaptrack.constraints.grammar.bounds import json_min_bytes

VOCAB = [b"a", b"b", b"ab", b"\xc3\xa9", b'"', b"{", b"}", b":", b",", b"0", b"1", b"<eos>"]


def counting_lm() -> at.TableLM:
    return at.TableLM(VOCAB, lambda prefix: [1] * len(VOCAB), eos=len(VOCAB) - 1)


UNREACHABLE = [
    (at.constraints.json_schema({"type": "string", "minLength": 1_000_000_000}), 8),
    (at.constraints.json_schema({"type": "array", "items": {"type": "integer"},
                                 "minItems": 40}), 20),
    (at.constraints.lark('start: "a" start'), 8),
    (at.constraints.lark('start: "ab" "ab" "ab" "ab" "ab" "ab" "ab" "ab"'), 3),
]


@pytest.mark.parametrize("method", ["cd", "asap", "adaptrack", "exact"])
@pytest.mark.parametrize("constraint,limit", UNREACHABLE)
def test_no_valid_text_within_the_limit_is_refused_before_any_call(method, constraint, limit):
    lm = counting_lm()
    with pytest.raises(at.NoValidSequenceError, match=f"max_new_tokens={limit}"):
        at.generate(lm, "a", constraint, method=method, max_new_tokens=limit)
    assert lm.calls == 0


def test_a_reachable_language_is_not_refused():
    lm = counting_lm()
    res = at.generate(lm, "a", at.constraints.lark('start: "ab" "ab" "ab"'), method="cd",
                      max_new_tokens=4)
    assert res.samples[0].complete and res.texts == ["ababab"]
    long = at.constraints.json_schema({"type": "string", "minLength": 3})
    assert at.generate(lm, "a", long, method="exact", max_new_tokens=8, seed=1).samples[0].complete


SCHEMAS = st.deferred(lambda: st.one_of(
    st.builds(lambda k: {"type": "string", "minLength": k}, st.integers(0, 5)),
    st.just({"type": "integer"}), st.just({"type": "boolean"}),
    st.builds(lambda s, k: {"type": "array", "items": s, "minItems": k}, SCHEMAS,
              st.integers(0, 3)),
    st.builds(lambda props, req: {"type": "object", "properties": props,
                                  "required": sorted(props)[:req]},
              st.dictionaries(st.text("xyzé", min_size=1, max_size=3), SCHEMAS, max_size=3),
              st.integers(0, 3))))


def _smallest(schema: dict) -> object:
    kind = schema["type"]
    if kind == "string":
        return "é" * schema["minLength"]
    if kind == "integer":
        return 0
    if kind == "boolean":
        return True
    if kind == "array":
        return [_smallest(schema["items"]) for _ in range(schema["minItems"])]
    return {k: _smallest(schema["properties"][k]) for k in schema["required"]}


@settings(max_examples=200, deadline=None)
@given(SCHEMAS)
def test_json_min_bytes_is_a_lower_bound(schema):
    value = _smallest(schema)  # among the shortest values: no text of the schema is shorter
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert json_min_bytes(schema) <= len(text)
