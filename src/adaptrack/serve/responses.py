"""The answers of ``adaptrack serve`` in OpenAI's shapes, declared in pydantic: a whole
answer (:class:`CompletionResponse`, :class:`ChatCompletionResponse`), a streamed chunk
(:class:`CompletionChunk`, :class:`ChatCompletionChunk`), the usage and the log-probs; and
the functions that build them from the engine's :class:`~.events.Choice` (bodies as
dicts, ready for JSON). Each answer carries an ``adaptrack`` field: the request's model
calls, backtracks, fallback and times. A chat answer to a request with tools has its calls
read from the text (:func:`.tools.split_calls`) into ``tool_calls``.

>>> usage_body(3, 2)
{'prompt_tokens': 3, 'completion_tokens': 2, 'total_tokens': 5}
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..lm.base import LanguageModel
from .events import Choice
from .tools import split_calls

#: Per sampled position, the top alternatives: ``(token id, log-probability)`` pairs.
Tops = list[list[tuple[int, float]]]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Usage(_Model):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Model):
    """``logprobs`` of ``/v1/completions``: per sampled token its text, log-probability and
    offset in the text, and with ``logprobs: k`` the k top alternatives ({text: logprob})."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class TopLogprob(_Model):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(_Model):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(_Model):
    """``logprobs`` of ``/v1/chat/completions``."""

    content: list[ChatTokenLogprob]
    refusal: None = None


Logprobs = CompletionLogprobs | ChatLogprobs


class CompletionChoice(_Model):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class FunctionCall(_Model):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Model):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Model):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Model):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str


class DeltaToolCall(_Model):
    """A streamed call: its ``index`` among the choice's calls, and here the whole call."""

    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaMessage(_Model):
    role: Literal["assistant"] | None = None
    content: str | None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(_Model):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class _Answer(_Model):
    id: str
    created: int
    model: str


class CompletionResponse(_Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage
    adaptrack: dict[str, Any]


class ChatCompletionResponse(_Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    adaptrack: dict[str, Any]


class CompletionChunk(_Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None
    adaptrack: dict[str, Any] | None = None


class ChatCompletionChunk(_Answer):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatStreamChoice]
    usage: Usage | None = None
    adaptrack: dict[str, Any] | None = None


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


def logprobs_of(lm: LanguageModel, kind: str, tokens: tuple[int, ...],
                logprobs: list[float] | None, offset: int = 0,
                top: Tops | None = None) -> Logprobs | None:
    """OpenAI's ``logprobs`` object of sampled ``tokens`` for ``kind``'s endpoint (None when
    not asked): per token (EOS included) its text and log-probability under the model at the
    sampling temperature (T = 1 when greedy), and the ``top`` alternatives when asked (the
    likeliest tokens valid at that position). ``offset``: where the first token's text
    starts in the choice's text (a streamed piece after the first)."""
    if logprobs is None:
        return None
    if kind == "chat":
        return chat_logprobs(lm, tokens, logprobs, top)
    return completion_logprobs(lm, tokens, logprobs, offset, top)


def _entry(lm: LanguageModel, token: int) -> dict[str, Any]:
    text, data = token_text(lm, token)
    return {"token": text, "bytes": None if data is None else list(data)}


def chat_logprobs(lm: LanguageModel, tokens: tuple[int, ...], logprobs: list[float],
                  top: Tops | None = None) -> ChatLogprobs:
    tops: Tops = top if top is not None else [[] for _ in tokens]
    return ChatLogprobs(content=[
        ChatTokenLogprob(**_entry(lm, t), logprob=lp, top_logprobs=[
            TopLogprob(**_entry(lm, a), logprob=alp) for a, alp in alts])
        for t, lp, alts in zip(tokens, logprobs, tops, strict=True)])


def completion_logprobs(lm: LanguageModel, tokens: tuple[int, ...], logprobs: list[float],
                        offset: int = 0, top: Tops | None = None) -> CompletionLogprobs:
    texts = [token_text(lm, t)[0] for t in tokens]
    offsets, at = [], offset
    for text in texts:
        offsets.append(at)
        at += len(text)
    tops = None if top is None else [_by_text(lm, alts) for alts in top]
    return CompletionLogprobs(tokens=texts, token_logprobs=logprobs, text_offset=offsets,
                              top_logprobs=tops)


def _by_text(lm: LanguageModel, alternatives: list[tuple[int, float]]) -> dict[str, float]:
    """OpenAI's shape of a completion's alternatives, ``{text: logprob}``, likeliest first;
    of two tokens with one text, the likelier's."""
    out: dict[str, float] = {}
    for token, lp in alternatives:
        out.setdefault(token_text(lm, token)[0], lp)
    return out


def logprobs_body(lm: LanguageModel, kind: str, choice: Choice,
                  offset: int = 0) -> dict[str, Any] | None:
    """The ``logprobs`` object of a choice as a dict (None when not asked)."""
    lps = logprobs_of(lm, kind, choice.tokens, choice.token_logprobs, offset,
                      choice.top_logprobs)
    return None if lps is None else lps.model_dump()


def tool_calls_of(text: str) -> tuple[str | None, list[ToolCall]]:
    """The content and the calls of an answer's text, each call with a fresh id."""
    content, calls = split_calls(text)
    return content, [ToolCall(id=f"call_{uuid.uuid4().hex[:24]}",
                              function=FunctionCall(name=name, arguments=args))
                     for name, args in calls]


def chat_choice(lm: LanguageModel, c: Choice, tools: bool = False) -> ChatChoice:
    """A whole chat choice; with ``tools``, its calls read from the text, and
    ``finish_reason`` ``tool_calls`` when it made some and ended."""
    lps = None if c.token_logprobs is None else chat_logprobs(lm, c.tokens, c.token_logprobs,
                                                              c.top_logprobs)
    if not tools:
        return ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                          logprobs=lps, finish_reason=c.finish_reason)
    content, calls = tool_calls_of(c.text)
    reason = "tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason
    return ChatChoice(index=c.index, logprobs=lps, finish_reason=reason,
                      message=AssistantMessage(content=content, tool_calls=calls or None))


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens).model_dump()


def response_body(lm: LanguageModel, kind: str, rid: str, created: int, model: str,
                  choices: list[Choice], usage: dict[str, int],
                  stats: dict[str, Any], tools: bool = False) -> dict[str, Any]:
    """The whole answer of a request that does not stream (``tools``: read the chat
    choices' tool calls)."""
    ordered = sorted(choices, key=lambda c: c.index)
    answer: CompletionResponse | ChatCompletionResponse
    if kind == "chat":
        answer = ChatCompletionResponse(
            id=rid, created=created, model=model, usage=Usage(**usage), adaptrack=stats,
            choices=[chat_choice(lm, c, tools) for c in ordered])
    else:
        answer = CompletionResponse(
            id=rid, created=created, model=model, usage=Usage(**usage), adaptrack=stats,
            choices=[CompletionChoice(index=c.index, text=c.text,
                                      logprobs=None if c.token_logprobs is None else
                                      completion_logprobs(lm, c.tokens, c.token_logprobs,
                                                          top=c.top_logprobs),
                                      finish_reason=c.finish_reason) for c in ordered])
    return answer.model_dump()


def chunk_body(kind: str, include_usage: bool, rid: str, created: int, model: str,
               index: int, text: str | None, *, finish_reason: str | None = None,
               logprobs: Logprobs | None = None, first: bool = False,
               tool_calls: list[ToolCall] | None = None) -> dict[str, Any]:
    """One server-sent event of a streamed answer, in OpenAI's chunk format: a piece of
    one choice's text (chat: or its ``tool_calls``, each whole, with a null ``text``), and
    its ``finish_reason`` on its last piece; ``usage`` is null until the last event when
    ``include_usage``, absent otherwise."""
    chunk: CompletionChunk | ChatCompletionChunk
    if kind == "chat":
        calls = None if tool_calls is None else [
            DeltaToolCall(index=j, id=c.id, function=c.function)
            for j, c in enumerate(tool_calls)]
        delta = DeltaMessage(role="assistant" if first else None, content=text,
                             tool_calls=calls)
        lps = logprobs if isinstance(logprobs, ChatLogprobs) else None
        chunk = ChatCompletionChunk(id=rid, created=created, model=model, choices=[
            ChatStreamChoice(index=index, delta=delta, logprobs=lps,
                             finish_reason=finish_reason)])
    else:
        lp = logprobs if isinstance(logprobs, CompletionLogprobs) else None
        chunk = CompletionChunk(id=rid, created=created, model=model, choices=[
            CompletionChoice(index=index, text=text or "", logprobs=lp,
                             finish_reason=finish_reason)])
    body = chunk.model_dump(exclude={"adaptrack"} if include_usage else {"usage", "adaptrack"})
    if kind == "chat":
        delta_body = body["choices"][0]["delta"]
        if not first:
            del delta_body["role"]
        if tool_calls is None:
            del delta_body["tool_calls"]
    return body


def final_chunk(kind: str, rid: str, created: int, model: str, usage: dict[str, int],
                stats: dict[str, Any]) -> dict[str, Any]:
    """The last event of a stream with ``stream_options.include_usage``: no choices, the
    usage and the ``adaptrack`` stats."""
    cls = ChatCompletionChunk if kind == "chat" else CompletionChunk
    return cls(id=rid, created=created, model=model, choices=[], usage=Usage(**usage),
               adaptrack=stats).model_dump()
