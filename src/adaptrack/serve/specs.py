"""The constraint a validated request asks for, as a :class:`ConstraintSpec`: from
``structured_outputs`` (vLLM's), ``response_format`` (OpenAI's), the ``guided_*`` fields
(vLLM's older names, kept) or chat's ``tools`` (:mod:`.tools`). A request gives at most one
(:mod:`.protocol` checks).

>>> from adaptrack.serve.protocol import CompletionRequest
>>> req = CompletionRequest.model_validate({"prompt": "x",
...                                         "structured_outputs": {"choice": ["a", "b"]}})
>>> constraint_spec(req).kind
'choice'
"""

from __future__ import annotations

import json
from typing import Any

from ..constraints.grammar import JSON_WHITESPACE
from ..errors import JSONDepthError
from ..limits import loads
from .constraint_spec import ConstraintSpec
from .errors import bad, error_for
from .protocol import BaseRequest, ChatCompletionRequest
from .tool_protocol import StructuredOutputs
from .tools import text_without, tool_spec


def _loads(text: str, field: str) -> Any:
    """The JSON text of a field, nested at most ``limits.MAX_JSON_DEPTH`` deep."""
    try:
        return loads(text, f"'{field}'")
    except JSONDepthError as err:
        raise error_for(err, field) from None
    except ValueError as err:
        raise bad(field, f"not JSON: {err}") from None


def _json(value: Any, field: str, whitespace: dict[str, Any] | None = None) -> ConstraintSpec:
    """A JSON schema (an object, or its JSON text) with ``whitespace`` options set in its
    ``x-guidance``."""
    if isinstance(value, str):
        value = _loads(value, field)
    if whitespace and isinstance(value, dict):
        value = {**value, "x-guidance": {**(value.get("x-guidance") or {}), **whitespace}}
    elif whitespace and value is True:
        value = {"x-guidance": whitespace}
    return ConstraintSpec.json(value)


def _structural_tag(value: Any) -> ConstraintSpec:
    """vLLM's structural tag ``{"structures": [{"begin", "schema", "end"}], "triggers":
    [...]}`` (its JSON text or the object) as a Lark grammar: text without a trigger, and
    after each trigger one of the structures that begin with it (its body under its schema,
    then its end), then text again. The text is a negated regex (:func:`.tools.text_without`)
    rather than llguidance's lazy lexemes, for the reason :mod:`.tools` gives."""
    field = "structured_outputs.structural_tag"
    if isinstance(value, str):
        value = _loads(value, field)
    if not (isinstance(value, dict) and isinstance(value.get("structures"), list)
            and isinstance(value.get("triggers"), list) and value["structures"]
            and all(isinstance(t, str) and t for t in value["triggers"])):
        raise bad(field, "only the form {\"structures\": [{\"begin\", \"schema\", \"end\"}, "
                         "...], \"triggers\": [non-empty strings]} is supported; write others "
                         "as a grammar")
    rules = []
    for k, s in enumerate(value["structures"]):
        if not (isinstance(s, dict) and isinstance(s.get("begin"), str)
                and isinstance(s.get("end"), str) and isinstance(s.get("schema"), dict)):
            raise bad(field, f"structures[{k}] needs a string begin and end and a schema "
                             "object")
        if not any(s["begin"].startswith(t) for t in value["triggers"]):
            raise bad(field, f"structures[{k}]'s begin {s['begin']!r} starts with no trigger")
        schema = {"x-guidance": {"whitespace_pattern": JSON_WHITESPACE}, **s["schema"]}
        rules.append(f"tag_{k}: {_lark_string(s['begin'])} %json {json.dumps(schema)} "
                     f"{_lark_string(s['end'])}")
    tags = " | ".join(f"tag_{k}" for k in range(len(rules)))
    text = text_without(value["triggers"])
    return ConstraintSpec("lark", "\n".join([f"start: TEXT (({tags}) TEXT)*", *rules,
                                             f"TEXT: {text}"]))


def _lark_string(text: str) -> str:
    """``text`` as a Lark string literal (nothing when empty)."""
    return json.dumps(text, ensure_ascii=False) if text else ""


def _structured(so: StructuredOutputs) -> ConstraintSpec:
    field = "structured_outputs"
    kind = so.given[0]
    whitespace: dict[str, Any] | None = None
    if so.whitespace_pattern is not None:
        whitespace = {"whitespace_pattern": so.whitespace_pattern}
    elif so.disable_any_whitespace:
        whitespace = {"whitespace_flexible": False}
    if kind == "json":
        return _json(so.json_, f"{field}.json", whitespace)
    if kind == "json_object":
        return _json({"type": "object"}, field, whitespace)
    if kind == "regex":
        assert so.regex is not None
        return ConstraintSpec("regex", so.regex)
    if kind == "choice":
        assert so.choice is not None
        return ConstraintSpec.strings("choice", so.choice)
    if kind == "grammar":
        assert so.grammar is not None
        return ConstraintSpec.grammar(so.grammar)
    return _structural_tag(so.structural_tag)


def constraint_spec(req: BaseRequest) -> ConstraintSpec | None:
    """The constraint a validated request asks for (at most one field), as a spec."""
    field = req.constraint_field
    if field is None:
        return None
    if field == "structured_outputs":
        assert req.structured_outputs is not None
        return _structured(req.structured_outputs)
    if field == "tools":
        assert isinstance(req, ChatCompletionRequest) and req.tools
        choice = req.tool_choice
        named = None if isinstance(choice, str | None) else choice.function.name
        return tool_spec(req.tools, req.tool_mode or "auto", req.parallel_tool_calls, named)
    pattern = req.guided_whitespace_pattern
    whitespace = None if pattern is None else {"whitespace_pattern": pattern}
    if req.response_format is not None and field == "response_format":
        if req.response_format.type == "json_object":
            return _json({"type": "object"}, field, whitespace)
        assert req.response_format.json_schema is not None  # the model checked
        return _json(req.response_format.json_schema.schema_, field, whitespace)
    value = getattr(req, field)
    if field == "guided_json":
        return _json(value, field, whitespace)
    if field == "guided_regex":
        return ConstraintSpec("regex", value)
    if field == "guided_grammar":
        return ConstraintSpec.grammar(value)
    return ConstraintSpec.strings(field.removeprefix("guided_"), value)
