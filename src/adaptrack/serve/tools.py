"""Tool calls on ``/v1/chat/completions``: the tools in the prompt, the call as a constraint,
and the call read back from the sampled text.

The format is Hermes' (Qwen's): each call is ``<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>``, calls one after another on their own lines. A chat template that
knows this format (its source holds ``<tool_call>``: Qwen2.5, Hermes) gets the tools and the
history's calls as it expects them; any other template (the default model's has no tool
format) gets the tools described in a system message (:func:`describe`), an assistant's
earlier calls written in that format and a tool's result as a user message in
``<tool_response>`` tags.

The constraint (:func:`tool_grammar`, a Lark grammar for llguidance) makes the call's name
one of the tools' and its arguments valid under that function's ``parameters`` schema, so
the request's method samples it (AdapTrack and ``exact`` without distortion):
``required`` is one call or more (one with ``parallel_tool_calls: false``), a named
``tool_choice`` the same with that function alone, and ``auto`` either text without ``<tool_call>``
or such text and then calls: once ``<tool_call>`` is written, only a valid call may follow.
(A lazy lexeme ending the text at the first ``<tool_call>``, as llguidance's structural
tags have it, gives the same language, but its masks and its accepted texts disagree at
places, and the searches then sample another distribution than the enumerated target;
the negated regex agrees with it, ``tests/serve/test_tools.py``.)

>>> split_calls('Let me see.<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>')
('Let me see.', [('f', '{"x": 1}')])
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import JSONDepthError
from ..limits import loads
from .constraint_spec import ConstraintSpec
from .errors import bad, error_for
from .tool_protocol import ChatMessage, Tool

#: Where a call starts and ends in the text (Hermes' tags).
OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: Whitespace between a call's JSON tokens: none or one space (a call is one line, written
#: compact or as ``json.dumps`` writes it). Newlines and runs of spaces would let a model pad
#: a call, which a search then spends its calls backing out of.
CALL_WHITESPACE = "[ ]?"
#: Characters a regex of llguidance (Rust's syntax, between ``/``) must escape.
_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


def text_without(marks: Sequence[str]) -> str:
    """A Lark terminal of any text that holds none of ``marks`` (llguidance's ``&`` and
    ``~`` on regexes; the intersection with ``.*`` keeps the negation to valid UTF-8).

    >>> text_without(["<a>"])
    '/(?s:.*)/ & ~/(?s:.*)(?:<a>)(?s:.*)/'
    """
    alternatives = "|".join("".join(f"\\{c}" if c in _REGEX_META else c for c in m)
                            for m in marks)
    return f"/(?s:.*)/ & ~/(?s:.*)(?:{alternatives})(?s:.*)/"


def call_schema(tools: Sequence[Tool]) -> dict[str, Any]:
    """The JSON schema of one call: ``{"name": ..., "arguments": ...}`` with the name one of
    ``tools``' and the arguments under that function's ``parameters``, name first."""
    branches = [{"type": "object", "properties": {
        "name": {"const": t.function.name}, "arguments": t.function.arguments_schema()},
        "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    return {**schema, "x-guidance": {"whitespace_pattern": CALL_WHITESPACE}}


def tool_grammar(tools: Sequence[Tool], mode: str, parallel: bool = True) -> str:
    """The Lark grammar of what the assistant may answer under ``mode`` (``auto``,
    ``required`` or ``named``, whose ``tools`` is the named one alone).

    >>> t = Tool.model_validate({"type": "function", "function": {"name": "f"}})
    >>> tool_grammar([t], "required", parallel=False).splitlines()[0].split()[:3]
    ['start:', '"<tool_call>"', 'body']
    """
    # A newline may end the calls: models trained on the format write one after a call.
    more = (' ("\\n" "<tool_call>" body)*' if parallel else "") + ' "\\n"?'
    calls = f'"{OPEN}" body{more}'
    lines = [f"start: TEXT | TEXT {calls}" if mode == "auto" else f"start: {calls}",
             f'body: "\\n" %json {json.dumps(call_schema(tools))} "\\n{CLOSE}"']
    return "\n".join([*lines, f"TEXT: {text_without([OPEN])}"] if mode == "auto" else lines)


def tool_spec(tools: Sequence[Tool], mode: str, parallel: bool,
              named: str | None = None) -> ConstraintSpec:
    """The constraint of a request's tool calls (``named``: the function a named
    ``tool_choice`` gives)."""
    offered = [t for t in tools if named is None or t.function.name == named]
    return ConstraintSpec("lark", tool_grammar(offered, mode, parallel))


def describe(tools: Sequence[Tool]) -> str:
    """The system text that offers ``tools`` to a model whose chat template has no tool
    format, and shows the format of a call."""
    lines = "\n".join(json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False)
                      for t in tools)
    return ("You can call functions to answer. These are the functions, one JSON object "
            f"a line:\n<tools>\n{lines}\n</tools>\nTo call one, answer with its name and "
            f"arguments as JSON between tags, one call per block:\n{OPEN}\n"
            f'{{"name": "<function name>", "arguments": {{<arguments>}}}}\n{CLOSE}')


def _arguments(text: str, where: str) -> Any:
    try:
        return loads(text, f"'{where}'")
    except JSONDepthError as err:
        raise error_for(err, where) from None
    except ValueError as err:
        raise bad(where, f"the arguments of a tool call are not JSON: {err}") from None


def _block(name: str, arguments: Any) -> str:
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{call}\n{CLOSE}"


def native_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """``messages`` as a tool-aware chat template reads them (transformers' convention: a
    call's arguments as an object)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        d: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.tool_calls:
            d["tool_calls"] = [{"type": "function", "id": c.id, "function": {
                "name": c.function.name,
                "arguments": _arguments(c.function.arguments, f"messages[{i}]")}}
                for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def plain_messages(messages: Sequence[ChatMessage],
                   tools: Sequence[Tool] | None) -> list[dict[str, str]]:
    """``messages`` for a template without a tool format: the ``tools`` (None: not
    offered) described in the first system message, an assistant's calls written as
    blocks, a tool's result as a user message."""
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        text = m.content or ""
        if m.tool_calls:
            blocks = [_block(c.function.name, _arguments(c.function.arguments,
                                                         f"messages[{i}]"))
                      for c in m.tool_calls]
            text = "\n".join([text, *blocks] if text else blocks)
        role = m.role
        if role == "tool":
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if tools:
        offer = describe(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{offer}"}
        else:
            out.insert(0, {"role": "system", "content": offer})
    return out


def knows_tools(template: Callable[..., Any] | None) -> bool:
    """Whether a chat template writes Hermes' tool format itself (it then takes
    ``tools=``)."""
    return bool(getattr(template, "hermes_tools", False))


def split_calls(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """An answer's text before its first call (None when there is none) and its calls,
    each ``(name, arguments as JSON text)``; text after the last whole call (a call cut
    by ``max_tokens`` or a stop string) goes back to the content."""
    start = text.find(OPEN)
    if start < 0:
        return (text or None), []
    content, calls, at = text[:start], [], start
    decoder = json.JSONDecoder()
    while text.startswith(OPEN, at):
        try:
            obj, end = decoder.raw_decode(text, at + len(OPEN) + 1)
        except ValueError:
            break
        close = text.find(CLOSE, end)
        if (close < 0 or text[end:close].strip() or not isinstance(obj, dict)
                or not isinstance(obj.get("name"), str)):
            break
        calls.append((obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)))
        at = close + len(CLOSE)
        at += len(text[at:]) - len(text[at:].lstrip("\n"))
    rest = text[at:] if at < len(text) else ""
    content = (content + rest) if calls else text
    return (content or None), calls
