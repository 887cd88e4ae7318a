"""A request body validated against its model (:mod:`.protocol`), or the first problem as
an :class:`~.errors.APIError` in OpenAI's shape: ``param`` names the field (``messages[2]``
for an item of a list), the message says what is wrong and what is expected.

>>> try:
...     validate(b'{"prompt": "x", "n": 0}', "completion", max_n=128)
... except APIError as err:
...     err.status, err.param, err.message
(400, 'n', "invalid 'n': must be between 1 and 128, got 0")
"""

from __future__ import annotations

import math
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from ..errors import JSONDepthError
from ..limits import loads
from .bounds import check_sizes
from .errors import APIError, bad, show
from .protocol import REQUESTS, BaseRequest

#: How a type error reads, by pydantic's error type.
EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
            "string_type": "a string", "dict_type": "an object", "model_type": "an object",
            "model_attributes_type": "an object", "list_type": "a list",
            "tuple_type": "a list", "finite_number": "a finite number",
            "too_short": "not empty", "string_too_short": "a non-empty string"}
#: pydantic's error types of a value out of bounds.
RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def validate(body: bytes | str, kind: str, *, max_n: int,
             max_tokens: int | None = None) -> BaseRequest:
    """The request ``body`` of ``kind`` (``"completion"`` or ``"chat"``) as its model, with
    ``n`` at most ``max_n`` and ``max_tokens`` at most ``max_tokens``; else the
    :class:`APIError` of its first problem."""
    try:
        data = loads(body, "the request body")
    except JSONDepthError as err:
        raise APIError(400, str(err), code="json_too_deep") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise APIError(400, f"the body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, got {show(data)}",
                       code="invalid_json")
    check_sizes(data, max_n, max_tokens)
    model = REQUESTS[kind]
    context = {"max_n": max_n, "max_tokens": max_tokens}
    try:
        return model.model_validate(data, context=context)
    except ValidationError as err:
        raise api_error(err, data, kind, context) from None


def api_error(err: ValidationError, data: dict[str, Any], kind: str,
              context: dict[str, Any]) -> APIError:
    """The :class:`APIError` of the first problem pydantic found: an unknown field first
    (the likeliest typo), else the first in field order."""
    errors = err.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 1]
    if unknown:
        name = str(unknown[0]["loc"][0])
        other = REQUESTS["chat" if kind == "completion" else "completion"].model_fields
        hint = " (a field of the other endpoint)" if name in other else ""
        return APIError(400, f"unknown field '{name}'{hint}", param=name, code="unknown_field")
    first = errors[0]
    loc = first["loc"]
    if not loc:  # a check across fields: it names the field itself
        ctx = first.get("ctx") or {}
        return bad(str(ctx.get("param")), first["msg"])
    name = str(loc[0])
    model = REQUESTS[kind]
    field = model.model_fields.get(name)
    if first["type"] == "missing" and len(loc) == 1:
        what = field.description if field is not None and field.description else "a value"
        return APIError(400, f"missing '{name}': give {what}", param=name,
                        code="missing_field")
    param = f"{name}[{loc[1]}]" if len(loc) > 1 and isinstance(loc[1], int) else name
    return bad(param, _reason(first, model, data, context))


def _reason(error: ErrorDetails, model: type[BaseModel], data: dict[str, Any],
            context: dict[str, Any]) -> str:
    """What is wrong with the value, and what the field expects."""
    loc, kind = error["loc"], error["type"]
    name = str(loc[0])
    field = model.model_fields.get(name)
    if kind == "adaptrack":
        return error["msg"]
    if kind in RANGE_ERRORS and len(loc) == 1 and field is not None:
        return f"must be {_span(name, model, context)}, got {show(error['input'])}"
    item = len(loc) > 1 and isinstance(loc[1], int)  # an item of a list: messages[2]
    if field is not None and field.description and not item:
        # the field's own shape (a union's branches all failed): say what it takes
        return f"must be {field.description}, got {show(data.get(name))}"
    inner = [str(part) for part in loc[2 if item else 1:] if isinstance(part, str)]
    where = f"'{'.'.join(inner)}' " if inner else ""
    if kind == "extra_forbidden":
        return f"{where}is not a known field"
    if kind == "missing":
        return f"{where}is missing"
    if kind == "literal_error":
        expected = (error.get("ctx") or {}).get("expected", "")
        return f"{where}must be {expected}, got {show(error['input'])}"
    if kind == "too_long":
        limit = (error.get("ctx") or {}).get("max_length")
        return f"{where}takes at most {limit} items, got {len(error['input'])}"
    expected = EXPECTED.get(kind)
    if expected is None:
        return f"{where}{error['msg']}, got {show(error['input'])}"
    return f"{where}must be {expected}, got {show(error['input'])}"


def _span(name: str, model: type[BaseModel], context: dict[str, Any]) -> str:
    """A numeric field's bounds as words: ``between 1 and 128`` for an integer, ``[0, 2]``
    or ``(0, 1]`` for a number; an upper bound the server sets comes from ``context``."""
    field = model.model_fields[name]
    low: Any = None
    high: Any = None
    open_low = open_high = False
    for rule in field.metadata:
        if isinstance(rule, Ge):
            low = rule.ge
        elif isinstance(rule, Gt):
            low, open_low = rule.gt, True
        elif isinstance(rule, Le):
            high = rule.le
        elif isinstance(rule, Lt):
            high, open_high = rule.lt, True
    bound = {"n": "max_n", "max_tokens": "max_tokens",
             "max_completion_tokens": "max_tokens"}.get(name)
    if bound is not None and context.get(bound) is not None:
        high, open_high = context[bound], False
    if "float" not in str(field.annotation):
        return f"between {low} and {high}" if high is not None else f"at least {low}"
    top = math.inf if high is None else high
    return f"in {'(' if open_low else '['}{low:g}, {top:g}{')' if open_high else ']'}"
