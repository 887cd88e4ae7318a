"""The answers of ``adaptrack serve`` in OpenAI's shapes, declared in pydantic: a whole
answer (:class:`CompletionResponse`, :class:`ChatCompletionResponse`), a streamed chunk
(:class:`CompletionChunk`, :class:`ChatCompletionChunk`), the usage and the log-probs; and
the functions that build them from the engine's :class:`~.events.Choice` (bodies as
dicts, ready for JSON). Each answer carries an ``adaptrack`` field: the request's model
calls, backtracks, fallback and times.

>>> usage_body(3, 2)
{'prompt_tokens': 3, 'completion_tokens': 2, 'total_tokens': 5}
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..lm.base import LanguageModel
from .events import Choice


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Usage(_Model):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Model):
    """``logprobs`` of ``/v1/completions``: per sampled token its text, log-probability and
    offset in the text; no top alternatives."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: None = None
    text_offset: list[int]


class ChatTokenLogprob(_Model):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[Any] = []


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


class AssistantMessage(_Model):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Model):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str


class DeltaMessage(_Model):
    role: Literal["assistant"] | None = None
    content: str


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
                logprobs: list[float] | None, offset: int = 0) -> Logprobs | None:
    """OpenAI's ``logprobs`` object of sampled ``tokens`` for ``kind``'s endpoint (None when
    not asked): per token (EOS included) its text and log-probability under the model at the
    sampling temperature (T = 1 when greedy); no top alternatives. ``offset``: where the
    first token's text starts in the choice's text (a streamed piece after the first)."""
    if logprobs is None:
        return None
    if kind == "chat":
        return chat_logprobs(lm, tokens, logprobs)
    return completion_logprobs(lm, tokens, logprobs, offset)


def chat_logprobs(lm: LanguageModel, tokens: tuple[int, ...],
                  logprobs: list[float]) -> ChatLogprobs:
    entries = [token_text(lm, t) for t in tokens]
    return ChatLogprobs(content=[
        ChatTokenLogprob(token=text, logprob=lp, bytes=None if data is None else list(data))
        for (text, data), lp in zip(entries, logprobs, strict=True)])


def completion_logprobs(lm: LanguageModel, tokens: tuple[int, ...], logprobs: list[float],
                        offset: int = 0) -> CompletionLogprobs:
    texts = [token_text(lm, t)[0] for t in tokens]
    offsets, at = [], offset
    for text in texts:
        offsets.append(at)
        at += len(text)
    return CompletionLogprobs(tokens=texts, token_logprobs=logprobs, text_offset=offsets)


def logprobs_body(lm: LanguageModel, kind: str, choice: Choice,
                  offset: int = 0) -> dict[str, Any] | None:
    """The ``logprobs`` object of a choice as a dict (None when not asked)."""
    lps = logprobs_of(lm, kind, choice.tokens, choice.token_logprobs, offset)
    return None if lps is None else lps.model_dump()


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens).model_dump()


def response_body(lm: LanguageModel, kind: str, rid: str, created: int, model: str,
                  choices: list[Choice], usage: dict[str, int],
                  stats: dict[str, Any]) -> dict[str, Any]:
    """The whole answer of a request that does not stream."""
    ordered = sorted(choices, key=lambda c: c.index)
    answer: CompletionResponse | ChatCompletionResponse
    if kind == "chat":
        answer = ChatCompletionResponse(
            id=rid, created=created, model=model, usage=Usage(**usage), adaptrack=stats,
            choices=[ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                                logprobs=None if c.token_logprobs is None else
                                chat_logprobs(lm, c.tokens, c.token_logprobs),
                                finish_reason=c.finish_reason) for c in ordered])
    else:
        answer = CompletionResponse(
            id=rid, created=created, model=model, usage=Usage(**usage), adaptrack=stats,
            choices=[CompletionChoice(index=c.index, text=c.text,
                                      logprobs=None if c.token_logprobs is None else
                                      completion_logprobs(lm, c.tokens, c.token_logprobs),
                                      finish_reason=c.finish_reason) for c in ordered])
    return answer.model_dump()


def chunk_body(kind: str, include_usage: bool, rid: str, created: int, model: str,
               index: int, text: str, *, finish_reason: str | None = None,
               logprobs: Logprobs | None = None, first: bool = False) -> dict[str, Any]:
    """One server-sent event of a streamed answer, in OpenAI's chunk format: a piece of
    one choice's text, and its ``finish_reason`` on its last piece; ``usage`` is null
    until the last event when ``include_usage``, absent otherwise."""
    chunk: CompletionChunk | ChatCompletionChunk
    if kind == "chat":
        delta = DeltaMessage(role="assistant" if first else None, content=text)
        lps = logprobs if isinstance(logprobs, ChatLogprobs) else None
        chunk = ChatCompletionChunk(id=rid, created=created, model=model, choices=[
            ChatStreamChoice(index=index, delta=delta, logprobs=lps,
                             finish_reason=finish_reason)])
    else:
        lp = logprobs if isinstance(logprobs, CompletionLogprobs) else None
        chunk = CompletionChunk(id=rid, created=created, model=model, choices=[
            CompletionChoice(index=index, text=text, logprobs=lp,
                             finish_reason=finish_reason)])
    body = chunk.model_dump(exclude={"adaptrack"} if include_usage else {"usage", "adaptrack"})
    if kind == "chat" and not first:
        del body["choices"][0]["delta"]["role"]
    return body


def final_chunk(kind: str, rid: str, created: int, model: str, usage: dict[str, int],
                stats: dict[str, Any]) -> dict[str, Any]:
    """The last event of a stream with ``stream_options.include_usage``: no choices, the
    usage and the ``adaptrack`` stats."""
    cls = ChatCompletionChunk if kind == "chat" else CompletionChunk
    return cls(id=rid, created=created, model=model, choices=[], usage=Usage(**usage),
               adaptrack=stats).model_dump()
