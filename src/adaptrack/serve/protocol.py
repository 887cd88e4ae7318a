"""The OpenAI-compatible request and response shapes of ``adaptrack serve``.

:func:`parse` turns a JSON body of ``/v1/completions`` or ``/v1/chat/completions`` into
:class:`Options`, and :func:`prepare_calls` into prepared calls of
:func:`adaptrack.generate.prepare`: every check runs there, before any model work, and a bad
request becomes an :class:`APIError` whose body is OpenAI's error object naming the field
(``{"error": {"message", "type", "param", "code"}}``). The rest of the module builds the
response bodies and stream chunks.

Fields, as OpenAI and vLLM spell them: ``prompt`` (a string, a list of token ids, or a list
of either for several prompts) or ``messages``, ``n``, ``max_tokens`` (chat also
``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``, ``stop``, ``logprobs``,
``stream`` (with ``stream_options.include_usage``); the constraints ``response_format``
(``text``, ``json_object``, ``json_schema``), ``guided_json``, ``guided_regex``,
``guided_choice``, ``guided_grammar`` (GBNF when a line defines a rule with ``::=``, else
Lark) and ``guided_api_names`` (dotted names, :func:`adaptrack.constraints.api_names`); and
adaptrack's ``decoding_method``, ``share_q``, ``max_backtrack`` and ``fast_forward``.
Python predicates and ``from_module`` are not reachable: they run code.

>>> import adaptrack as at
>>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
>>> opts = parse(b'{"prompt": "ab", "guided_choice": ["a", "b"], "n": 2}', "completion", lm)
>>> opts.prompts, opts.n, opts.method, opts.constraint_field
([[0, 1]], 2, 'adaptrack', 'guided_choice')
>>> try:
...     parse(b'{"prompt": "ab", "n": 0}', "completion", lm)
... except APIError as err:
...     err.status, err.body()["error"]["param"]
(400, 'n')
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import constraints
from ..constraints.base import Constraint
from ..errors import (
    AdaptrackError,
    GrammarError,
    NoValidSequenceError,
    PromptTooLongError,
    SearchTimeoutError,
    TreeLimitError,
)
from ..generate import END_POLICIES, METHODS, PreparedCall, prepare
from ..lm.base import LanguageModel

#: OpenAI's limit on ``n``: more choices than this in one request is a 400.
MAX_N = 128
#: Most stop strings a request may give (OpenAI's limit).
MAX_STOP = 4
#: ``max_tokens`` when a request gives none: OpenAI's default for completions; for chat (whose
#: OpenAI default is "up to the context") a bound that keeps a search's tree small.
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 256}
#: The longest ``max_tokens`` for a model whose context length is unknown.
MAX_TOKENS_UNKNOWN_CONTEXT = 32_768
#: The largest seed (numpy's SeedSequence takes any non-negative int; OpenAI's is int64).
MAX_SEED = 2**63 - 1

#: Error ``type`` by HTTP status, as OpenAI names them.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               404: "invalid_request_error", 413: "invalid_request_error",
               422: "invalid_request_error",
               429: "rate_limit_error", 499: "invalid_request_error", 500: "server_error",
               503: "server_error", 504: "timeout_error"}

#: A GBNF rule line (``name ::= ...``); Lark writes ``name: ...`` and never ``::=``.
GBNF_RULE = re.compile(r"(?m)^\s*[A-Za-z_][A-Za-z0-9_-]*\s*::=")

_CONSTRAINT_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice",
                      "guided_grammar", "guided_api_names")
_COMMON = {"model", "n", "max_tokens", "temperature", "top_p", "seed", "stop", "logprobs",
           "stream", "stream_options", "decoding_method", "share_q", "max_backtrack",
           "fast_forward", "end", "fallback", "max_seconds", *_CONSTRAINT_FIELDS}
_KIND_FIELDS = {"completion": {"prompt"},
                "chat": {"messages", "max_completion_tokens", "top_logprobs"}}
#: Fields that say nothing about sampling: accepted and not used.
_IGNORED = {"user", "metadata", "safety_identifier", "prompt_cache_key", "service_tier"}
#: OpenAI fields accepted only at the value that changes nothing (adaptrack samples the
#: model as it is: no penalties, biases, echo, suffix, tools or stored completions).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0), "presence_penalty": (None, 0), "logit_bias": (None, {}),
    "echo": (None, False), "suffix": (None, ""), "best_of": (None,), "store": (None, False),
    "tools": (None, []), "tool_choice": (None, "none", "auto"), "functions": (None, []),
    "function_call": (None, "none", "auto"), "parallel_tool_calls": (None, True, False),
}
_ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An HTTP error answer: ``status``, a one-line ``message``, the request field it is
    about (``param``, or None), a ``code`` and extra response ``headers``.

    >>> APIError(400, "invalid 'n': must be at least 1, got 0", param="n").body()["error"]
    {'message': "invalid 'n': must be at least 1, got 0", 'type': 'invalid_request_error', 'param': 'n', 'code': 'invalid_value'}
    """  # noqa: E501

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str = "invalid_value", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message,
                          "type": ERROR_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}


def _bad(param: str, reason: str) -> APIError:
    return APIError(400, f"invalid '{param}': {reason}", param=param)


def _show(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= limit else text[:limit] + "..."


def error_for(err: BaseException, param: str | None = None) -> APIError:
    """The HTTP answer to an exception the library raised (docs/design.md §6): bad input is
    400, an empty language or a search past its node budget 422, a search past its time
    504, anything else 500.

    >>> error_for(NoValidSequenceError("no valid sequence"), "guided_regex").status
    422
    """
    if isinstance(err, APIError):
        return err
    message = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, NoValidSequenceError):
        return APIError(422, message, param=param, code="no_valid_sequence")
    if isinstance(err, SearchTimeoutError):
        return APIError(504, message, code="timeout")
    if isinstance(err, TreeLimitError):
        return APIError(422, message, param=param, code="search_limit")
    if isinstance(err, PromptTooLongError):
        return APIError(400, message, param=param, code="context_length_exceeded")
    if isinstance(err, GrammarError):
        return APIError(400, message, param=param, code="invalid_grammar")
    if isinstance(err, ValueError | TypeError) and not isinstance(err, AdaptrackError):
        return APIError(400, message, param=param)
    return APIError(500, f"{type(err).__name__}: {message}", code="internal_error")


@dataclass
class Options:
    """A parsed request: the prompts' token ids and what :func:`prepare_calls` needs."""

    kind: str  # "completion" or "chat"
    prompts: list[list[int]]
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    constraint: Constraint | None = None
    constraint_field: str | None = None
    #: What identifies the constraint (its field and value): part of the tree cache's key.
    constraint_key: Hashable = None
    method: str = "unconstrained"
    share_q: bool = False
    max_backtrack: int | None = None
    fast_forward: bool = True
    end: str = "leave"
    fallback: str | None = "cd"
    #: The search's time budget (None: the server's); past it the fallback answers.
    max_seconds: float | None = None

    @property
    def prompt_field(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"

    def tree_key(self, ids: Sequence[int]) -> Hashable:
        """What determines a prompt's prefix tree (docs/design.md §4): prompt ids,
        constraint, temperature (0 keeps the model's own distribution, as 1 does), top_p,
        max_new_tokens, fast-forward (forced or prefilled, by method), and whether the walk
        is unconstrained."""
        unconstrained = self.method == "unconstrained"
        ff = self.fast_forward and not unconstrained
        # The constraint stays in the key when unconstrained: its terminators end the walk.
        return (tuple(ids), self.constraint_key,
                self.temperature or 1.0, self.top_p, self.max_tokens,
                ff, ff and METHODS[self.method].forces_chains, unconstrained,
                unconstrained or self.end)


# -- parsing -------------------------------------------------------------------------------


def _integer(body: dict[str, Any], name: str, default: int | None, low: int,
             high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"must be an integer, got {_show(value)}")
    if not low <= value <= high:
        raise _bad(name, f"must be between {low} and {high}, got {value}")
    return value


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float, *,
            open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(name, f"must be a number, got {_show(value)}")
    ok = (low < value if open_low else low <= value) and value <= high and math.isfinite(value)
    if not ok:
        span = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
        raise _bad(name, f"must be in {span}, got {value}")
    return float(value)


def _boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(name, f"must be true or false, got {_show(value)}")
    return value


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise _bad("stop", f"must be a non-empty string or a list of them, got {_show(value)}")
    if len(items) > MAX_STOP:
        raise _bad("stop", f"at most {MAX_STOP} strings, got {len(items)}")
    return tuple(dict.fromkeys(items))


def _token_ids(lm: LanguageModel, value: list[Any], param: str) -> list[int]:
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise _bad(param, "a list of token ids must hold integers only")
    bad = [t for t in value if not 0 <= t < lm.vocab.size]
    if bad:
        raise _bad(param, f"token ids {bad[:5]} are outside the vocabulary "
                          f"(0..{lm.vocab.size - 1})")
    return list(value)


def _encode(lm: LanguageModel, text: str, param: str) -> list[int]:
    try:
        return list(lm.encode(text))
    except (ValueError, TypeError) as err:
        raise _bad(param, f"cannot be tokenized: {' '.join(str(err).split())}") from None


def _prompts(lm: LanguageModel, body: dict[str, Any]) -> list[list[int]]:
    value = body.get("prompt")
    if value is None:
        raise APIError(400, "missing 'prompt': give a string, a list of token ids, or a list "
                            "of those", param="prompt", code="missing_field")
    if isinstance(value, str):
        return [_encode(lm, value, "prompt")]
    if not isinstance(value, list) or not value:
        raise _bad("prompt", f"must be a string, a list of token ids or a non-empty list of "
                             f"those, got {_show(value)}")
    if all(isinstance(p, str) for p in value):
        return [_encode(lm, p, "prompt") for p in value]
    if all(isinstance(p, list) for p in value):
        return [_token_ids(lm, p, "prompt") for p in value]
    return [_token_ids(lm, value, "prompt")]


#: Renders chat messages ([{"role", "content"}]) to a prompt: its text or its token ids.
ChatTemplate = Callable[[list[dict[str, str]]], "str | list[int]"]


def hf_chat_template(lm: LanguageModel) -> ChatTemplate | None:
    """The tokenizer's chat template of a transformers model (None when it has none): the
    messages rendered with the assistant's turn opened, tokenized without adding special
    tokens (the template writes them)."""
    tokenizer = getattr(lm, "tokenizer", None)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None

    def render(messages: list[dict[str, str]]) -> list[int]:
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))

    return render


def _messages(lm: LanguageModel, body: dict[str, Any],
              template: ChatTemplate | None) -> list[list[int]]:
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise APIError(400, f"invalid 'messages': must be a non-empty list of "
                            f"{{role, content}} objects, got {_show(value)}",
                       param="messages", code="missing_field" if value is None else
                       "invalid_value")
    messages = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _bad(where, f"must be an object with a role of {', '.join(_ROLES)}, got "
                              f"{_show(m)}")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise _bad(where, f"only text content is supported, got {_show(part)}")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise _bad(where, f"content must be a string or text parts, got {_show(content)}")
        messages.append({"role": m["role"], "content": content})
    if template is None:
        raise APIError(400, "this model has no chat template: use /v1/completions with a "
                            "prompt", param="messages", code="no_chat_template")
    try:
        rendered = template(messages)
    except Exception as err:  # a template's own check (roles must alternate, …)
        raise _bad("messages", f"the chat template refused them: "
                               f"{' '.join(str(err).split())}") from None
    if isinstance(rendered, str):
        return [_encode(lm, rendered, "messages")]
    return [_token_ids(lm, list(rendered), "messages")]


def _json_value(value: Any, param: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as err:
            raise _bad(param, f"not JSON: {err}") from None
    return value


def _constraint(body: dict[str, Any]) -> tuple[Constraint | None, str | None, Hashable]:
    """The constraint the request asks for (at most one field), its field and its key."""
    given = [f for f in _CONSTRAINT_FIELDS if body.get(f) is not None]
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object",
                                                                 "json_schema"):
            raise _bad("response_format", "must be {\"type\": \"text\"}, {\"type\": "
                       "\"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": "
                       f"{{\"schema\": ...}}}}, got {_show(fmt)}")
        if fmt["type"] == "text":
            given.remove("response_format")
    if len(given) > 1:
        raise APIError(400, f"give at most one constraint, got {' and '.join(given)}",
                       param=given[1])
    if not given:
        return None, None, None
    field = given[0]
    value = body[field]
    try:
        if field == "response_format":
            if value["type"] == "json_object":
                schema: Any = {"type": "object"}
            else:
                spec = value.get("json_schema")
                schema = spec.get("schema") if isinstance(spec, dict) else None
                if schema is None:
                    raise _bad("response_format", "json_schema needs a 'schema' object, got "
                                                  f"{_show(spec)}")
            return (constraints.json_schema(schema), field,
                    ("json", json.dumps(schema, sort_keys=True)))
        if field == "guided_json":
            schema = _json_value(value, field)
            return (constraints.json_schema(schema), field,
                    ("json", json.dumps(schema, sort_keys=True)))
        if field == "guided_regex":
            if not isinstance(value, str):
                raise _bad(field, f"must be a string, got {_show(value)}")
            return constraints.regex(value), field, ("regex", value)
        if field == "guided_grammar":
            if not isinstance(value, str):
                raise _bad(field, f"must be a string, got {_show(value)}")
            if GBNF_RULE.search(value):
                return constraints.gbnf(value), field, ("gbnf", value)
            return constraints.lark(value), field, ("lark", value)
        if not (isinstance(value, list) and value and all(isinstance(s, str) for s in value)):
            raise _bad(field, f"must be a non-empty list of strings, got {_show(value)}")
        if field == "guided_choice":
            return constraints.choice(value), field, ("choice", tuple(value))
        return constraints.api_names(value), field, ("api_names", tuple(value))
    except APIError:
        raise
    except (GrammarError, ValueError, TypeError) as err:
        raise _bad(field, " ".join(str(err).split())) from None


def _check_fields(body: dict[str, Any], kind: str) -> None:
    known = _COMMON | _KIND_FIELDS[kind] | _IGNORED | set(_NEUTRAL)
    unknown = sorted(set(body) - known)
    if unknown:
        other = _KIND_FIELDS["chat" if kind == "completion" else "completion"]
        hint = (" (a field of the other endpoint)" if unknown[0] in other else "")
        raise APIError(400, f"unknown field '{unknown[0]}'{hint}", param=unknown[0],
                       code="unknown_field")
    for name, allowed in _NEUTRAL.items():
        value = body.get(name)
        if name == "best_of" and value is not None and value == body.get("n", 1):
            continue
        if value not in allowed:
            raise _bad(name, f"not supported (adaptrack samples the model as it is); leave it "
                             f"out or at {_show(allowed[-1])}, got {_show(value)}")


def parse(body: bytes | str, kind: str, lm: LanguageModel, *, model: str | None = None,
          chat_template: ChatTemplate | None = None, max_n: int = MAX_N) -> Options:
    """The request ``body`` of ``kind`` (``"completion"`` or ``"chat"``) as :class:`Options`,
    or an :class:`APIError` naming the field and the reason. ``model``: the served model's
    name (another name is a 404); ``chat_template`` renders ``messages``."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise APIError(400, f"the body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, got {_show(data)}",
                       code="invalid_json")
    _check_fields(data, kind)
    name = data.get("model")
    if name is not None and model is not None and name != model:
        raise APIError(404, f"the model '{name}' does not exist; this server serves "
                            f"'{model}' (GET /v1/models)", param="model",
                       code="model_not_found")
    n = _integer(data, "n", 1, 1, max_n) or 1
    context = lm.context_length
    cap = context if context is not None else MAX_TOKENS_UNKNOWN_CONTEXT
    max_tokens = _integer(data, "max_tokens", None, 1, cap)
    if kind == "chat":
        alt = _integer(data, "max_completion_tokens", None, 1, cap)
        if max_tokens is not None and alt is not None and alt != max_tokens:
            raise _bad("max_completion_tokens", "differs from 'max_tokens'; give one")
        max_tokens = max_tokens if max_tokens is not None else alt
    temperature = _number(data, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(data, "top_p", 1.0, 0.0, 1.0, open_low=True)
    seed = _integer(data, "seed", None, 0, MAX_SEED)
    stop = _stops(data)
    stream = _boolean(data, "stream", False)
    usage = False
    options = data.get("stream_options")
    if options is not None:
        if not stream:
            raise _bad("stream_options", "applies only with \"stream\": true")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _bad("stream_options", f"takes {{\"include_usage\": bool}}, got "
                                         f"{_show(options)}")
        usage = _boolean(options, "include_usage", False)
    logprobs = _logprobs(data, kind)
    constraint, field, key = _constraint(data)
    method = data.get("decoding_method")
    if method is None:
        method = "adaptrack" if constraint is not None else "unconstrained"
    elif method not in METHODS:
        raise _bad("decoding_method", f"must be one of {', '.join(METHODS)}, got "
                                      f"{_show(method)}")
    share_q = _boolean(data, "share_q", False)
    max_backtrack = _integer(data, "max_backtrack", None, 0, 1 << 30)
    if method != "adaptrack":
        for option in ("share_q", "max_backtrack"):
            if data.get(option) not in (None, False):
                raise _bad(option, f"applies to decoding_method 'adaptrack' only, not "
                                   f"'{method}'")
    fast_forward = _boolean(data, "fast_forward", True)
    end = data.get("end", "leave")
    if end not in END_POLICIES:
        raise _bad("end", f"must be one of {', '.join(END_POLICIES)}, got {_show(end)}")
    fallback = data.get("fallback", "cd")
    if fallback not in ("cd", "none"):
        raise _bad("fallback", f"must be 'cd' or 'none', got {_show(fallback)}")
    max_seconds = _number(data, "max_seconds", math.inf, 0.0, math.inf, open_low=True)
    prompts = _messages(lm, data, chat_template) if kind == "chat" else _prompts(lm, data)
    param = "messages" if kind == "chat" else "prompt"
    if any(not ids for ids in prompts):
        raise _bad(param, "is empty (no tokens); give some text")
    if len(prompts) * n > max_n:
        raise _bad("n", f"{len(prompts)} prompts × n={n} choices is more than {max_n}")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS[kind]
        if context is not None:  # fit the default to the context; a given one is checked
            max_tokens = max(1, min(max_tokens, context - max(len(p) for p in prompts)))
    return Options(kind, prompts, n, max_tokens, temperature, top_p, seed, stop, logprobs,
                   stream, usage, constraint, field, key, method, share_q, max_backtrack,
                   fast_forward, end, None if fallback == "none" else fallback,
                   None if math.isinf(max_seconds) else max_seconds)


def _logprobs(data: dict[str, Any], kind: str) -> bool:
    """Whether to return the sampled tokens' log-probabilities. Top alternatives are not
    computed (the tree keeps the valid tokens' probabilities only): asking for any is a 400."""
    value = data.get("logprobs")
    if kind == "chat":
        wanted = _boolean(data, "logprobs", False)
        top = _integer(data, "top_logprobs", None, 0, 20)
        if top:
            raise _bad("top_logprobs", "top alternatives are not returned; leave it out or at "
                                       "0 (logprobs: true gives the sampled tokens')")
        return wanted
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad("logprobs", f"must be an integer, got {_show(value)}")
    if value != 0:
        raise _bad("logprobs", f"top alternatives are not returned; use 0 for the sampled "
                               f"tokens' log-probabilities, got {value}")
    return True


def prepare_calls(lm: LanguageModel, opts: Options, **budgets: Any) -> list[PreparedCall]:
    """One prepared call per prompt of ``opts`` (:func:`adaptrack.generate.prepare`, with
    ``budgets`` such as ``max_seconds``, which the request's own ``max_seconds`` can only
    lower): the library's own checks, before any model work, as :class:`APIError` naming
    the field (a prompt too long for the context is 400, an empty language found up front
    422)."""
    if opts.max_seconds is not None:
        cap = budgets.get("max_seconds")
        budgets["max_seconds"] = opts.max_seconds if cap is None else min(cap, opts.max_seconds)
    calls = []
    for ids in opts.prompts:
        try:
            calls.append(prepare(
                lm, ids, opts.constraint, opts.method, opts.n, opts.temperature, opts.top_p,
                opts.max_tokens, opts.seed, opts.fast_forward, share_q=opts.share_q,
                max_backtrack=opts.max_backtrack, end=opts.end, fallback=opts.fallback,
                **budgets))
        except PromptTooLongError as err:
            too_long = lm.context_length is not None and opts.max_tokens >= lm.context_length
            raise error_for(err, "max_tokens" if too_long else opts.prompt_field) from None
        except Exception as err:  # the library's checks: mapped by kind
            raise error_for(err, opts.constraint_field) from None
    return calls


# -- responses -----------------------------------------------------------------------------


@dataclass
class Choice:
    """One finished choice: its index, text (cut at a stop string), why it ended, the
    tokens sampled and, when asked, their log-probabilities."""

    index: int
    text: str
    finish_reason: str
    tokens: tuple[int, ...]
    token_logprobs: list[float] | None = None


def token_text(lm: LanguageModel, token: int) -> tuple[str, bytes | None]:
    """A token's text and bytes for ``logprobs``; a special token (EOS) has no bytes and is
    named by the tokenizer where it has one."""
    data = lm.vocab.bytes_of(token)
    if data:
        return data.decode("utf-8", errors="replace"), data
    tokenizer = getattr(lm, "tokenizer", None)
    name = None
    if tokenizer is not None and hasattr(tokenizer, "convert_ids_to_tokens"):
        try:
            name = tokenizer.convert_ids_to_tokens(token)
        except Exception:  # an id past the tokenizer's table (padded logits)
            name = None
    return (name if isinstance(name, str) else f"<|special_{token}|>"), None


def logprobs_body(lm: LanguageModel, kind: str, choice: Choice,
                  offset: int = 0) -> dict[str, Any] | None:
    """OpenAI's ``logprobs`` object of a choice: per sampled token (EOS included) its text
    and log-probability under the model at the sampling temperature (T = 1 when greedy); no
    top alternatives. ``offset``: where the first token's text starts in the choice's text
    (a streamed piece after the first)."""
    if choice.token_logprobs is None:
        return None
    entries = [token_text(lm, t) for t in choice.tokens]
    if kind == "chat":
        return {"content": [{"token": text, "logprob": lp,
                             "bytes": None if data is None else list(data), "top_logprobs": []}
                            for (text, data), lp in zip(entries, choice.token_logprobs,
                                                        strict=True)],
                "refusal": None}
    offsets, at = [], offset
    for text, _ in entries:
        offsets.append(at)
        at += len(text)
    return {"tokens": [text for text, _ in entries], "token_logprobs": choice.token_logprobs,
            "top_logprobs": None, "text_offset": offsets}


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_body(lm: LanguageModel, opts: Options, rid: str, created: int, model: str,
                  choices: list[Choice], usage: dict[str, int],
                  stats: dict[str, Any]) -> dict[str, Any]:
    """The whole answer of a request that does not stream."""
    items = []
    for c in sorted(choices, key=lambda c: c.index):
        item: dict[str, Any] = {"index": c.index}
        if opts.kind == "chat":
            item["message"] = {"role": "assistant", "content": c.text}
        else:
            item["text"] = c.text
        item["logprobs"] = logprobs_body(lm, opts.kind, c)
        item["finish_reason"] = c.finish_reason
        items.append(item)
    return {"id": rid, "object": "chat.completion" if opts.kind == "chat" else
            "text_completion", "created": created, "model": model, "choices": items,
            "usage": usage, "adaptrack": stats}


def chunk_body(opts: Options, rid: str, created: int, model: str, index: int, text: str, *,
               finish_reason: str | None = None, logprobs: dict[str, Any] | None = None,
               first: bool = False) -> dict[str, Any]:
    """One server-sent event of a streamed answer, in OpenAI's chunk format: a piece of
    one choice's text, and its ``finish_reason`` on its last piece."""
    choice: dict[str, Any] = {"index": index}
    if opts.kind == "chat":
        delta: dict[str, Any] = {"content": text}
        if first:
            delta = {"role": "assistant", **delta}
        choice["delta"] = delta
    else:
        choice["text"] = text
    choice["logprobs"] = logprobs
    choice["finish_reason"] = finish_reason
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if opts.kind == "chat"
                            else "text_completion", "created": created, "model": model,
                            "choices": [choice]}
    if opts.include_usage:
        body["usage"] = None
    return body


def final_chunk(opts: Options, rid: str, created: int, model: str, usage: dict[str, int],
                stats: dict[str, Any]) -> dict[str, Any]:
    """The last event of a stream with ``stream_options.include_usage``: no choices, the
    usage and the ``adaptrack`` stats."""
    return {"id": rid, "object": "chat.completion.chunk" if opts.kind == "chat" else
            "text_completion", "created": created, "model": model, "choices": [],
            "usage": usage, "adaptrack": stats}
