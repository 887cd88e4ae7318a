"""A validated request made ready for the engine: :func:`parse` turns a body into
:class:`Options` (its model from :mod:`.validation`, the prompts' token ids, the
constraint), and :func:`prepare_calls` into prepared calls of
:func:`adaptrack.generate.prepare`. Every check runs here, before any model work; a bad
request becomes an :class:`~.errors.APIError` naming the field.

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

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..call import fit_prompt
from ..constraints.base import Constraint
from ..constraints.compose import with_stop
from ..errors import GrammarError, PromptTooLongError
from ..generate import PreparedCall, prepare
from ..limits import prompt_byte_limit, prompt_text, too_many_bytes
from ..lm.base import LanguageModel
from ..options import SamplingOptions
from ..sampling.methods import METHODS
from .errors import APIError, bad, error_for
from .protocol import (
    MAX_N,
    MAX_TOKENS_UNKNOWN_CONTEXT,
    ChatCompletionRequest,
    CompletionRequest,
)
from .specs import constraint_spec
from .tools import knows_tools, native_messages, plain_messages
from .validation import validate

__all__ = ["DEFAULT_MAX_TOKENS", "ChatTemplate", "Options", "constraint_spec",
           "hf_chat_template", "parse", "prepare_calls"]

#: ``max_tokens`` when a request gives none: OpenAI's default for completions; for chat (whose
#: OpenAI default is "up to the context") a bound that keeps a search's tree small.
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 256}

#: Renders chat messages ([{"role", "content"}]) to a prompt: its text or its token ids. One
#: with a true ``hermes_tools`` attribute also takes ``tools=`` and messages with
#: ``tool_calls`` (:mod:`.tools`).
ChatTemplate = Callable[..., "str | list[int]"]


@dataclass
class Options:
    """A parsed request: the prompts' token ids, its :class:`SamplingOptions` (checked there,
    as every caller of the library's are) and the server's own fields."""

    kind: str  # "completion" or "chat"
    prompts: list[list[int]]
    sampling: SamplingOptions
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    #: How many top alternatives to give per sampled token (0: none).
    top_logprobs: int = 0
    #: Whether the answer's text is read for tool calls (:func:`.tools.split_calls`).
    tool_calls: bool = False
    stream: bool = False
    include_usage: bool = False
    constraint: Constraint | None = None
    constraint_field: str | None = None
    #: What identifies the constraint (its field and value): part of the tree cache's key.
    constraint_key: Hashable = None
    #: The request's own time budget (None: the server's); it can only lower the server's.
    max_seconds: float | None = None

    @property
    def n(self) -> int:
        return self.sampling.n

    @property
    def method(self) -> str:
        return self.sampling.method

    @property
    def max_tokens(self) -> int:
        return self.sampling.max_new_tokens

    @property
    def prompt_field(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"

    def tree_key(self, ids: Sequence[int]) -> Hashable:
        """What determines a prompt's prefix tree (docs/design.md §4): prompt ids,
        constraint, temperature (0 keeps the model's own distribution, as 1 does), top_p,
        max_new_tokens, fast-forward (forced or prefilled, by method), and whether the walk
        is unconstrained."""
        s = self.sampling
        unconstrained = not METHODS[s.method].constrained
        # The constraint stays in the key when unconstrained: its terminators end the walk.
        return (tuple(ids), self.constraint_key, s.temperature or 1.0, s.top_p,
                s.max_new_tokens, None if unconstrained else s.chains(), unconstrained,
                unconstrained or s.end)


def parse(body: bytes | str, kind: str, lm: LanguageModel, *, model: str | None = None,
          chat_template: ChatTemplate | None = None, max_n: int = MAX_N) -> Options:
    """The request ``body`` of ``kind`` (``"completion"`` or ``"chat"``) as :class:`Options`,
    or an :class:`APIError` naming the field and the reason. ``model``: the served model's
    name (another name is a 404); ``chat_template`` renders ``messages``."""
    context = lm.context_length
    cap = context if context is not None else MAX_TOKENS_UNKNOWN_CONTEXT
    req = validate(body, kind, max_n=max_n, max_tokens=cap)
    if req.model is not None and model is not None and req.model != model:
        raise APIError(404, f"the model '{req.model}' does not exist; this server serves "
                            f"'{model}' (GET /v1/models)", param="model",
                       code="model_not_found")
    spec = constraint_spec(req)
    constraint = None
    if spec is not None:
        try:
            constraint = spec.build()
        except (GrammarError, ValueError, TypeError) as err:
            raise bad(str(req.constraint_field), " ".join(str(err).split())) from None
    # Stop strings end the constraint's sequences, so a search targets them (docs/design.md
    # §2), and they are part of what determines the tree.
    try:
        constraint = with_stop(constraint, req.stop)
    except (ValueError, TypeError) as err:
        raise bad("stop", " ".join(str(err).split())) from None
    key = None if spec is None else spec.key
    tool_calls = False
    if isinstance(req, ChatCompletionRequest):
        prompts = _messages(lm, req, chat_template)
        max_tokens = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
        top, tool_calls = req.top_logprobs, req.tool_mode is not None
    else:
        assert isinstance(req, CompletionRequest)
        prompts, max_tokens, top = _prompts(lm, req), req.max_tokens, req.logprobs or 0
    param = "messages" if kind == "chat" else "prompt"
    if any(not ids for ids in prompts):
        raise bad(param, "is empty (no tokens); give some text")
    if len(prompts) * req.n > max_n:
        raise bad("n", f"{len(prompts)} prompts × n={req.n} choices is more than {max_n}")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS[kind]
        if context is not None:  # fit the default to the context; a given one is checked
            max_tokens = max(1, min(max_tokens, context - max(len(p) for p in prompts)))
    try:
        sampling = req.to_sampling_options(max_tokens)
    except (TypeError, ValueError) as err:  # the request model's bounds make this rare
        raise error_for(err) from None
    return Options(kind, prompts, sampling, req.stop,
                   req.logprobs is not None and req.logprobs is not False,
                   top, tool_calls, req.stream, req.include_usage, constraint,
                   req.constraint_field, (key, req.stop) if req.stop else key,
                   req.max_seconds)


# -- prompts -------------------------------------------------------------------------------


def _token_ids(lm: LanguageModel, value: list[int], param: str) -> list[int]:
    bad_ids = [t for t in value if not 0 <= t < lm.vocab.size]
    if bad_ids:
        raise bad(param, f"token ids {bad_ids[:5]} are outside the vocabulary "
                         f"(0..{lm.vocab.size - 1})")
    return list(value)


def _encode(lm: LanguageModel, text: str, param: str, max_tokens: int | None) -> list[int]:
    """The text's token ids; one longer than the context holds is refused from its size in
    bytes before it is tokenized, or from its tokens at once (docs/security.md)."""
    try:
        ids = list(lm.encode(prompt_text(lm, text, max_tokens or 1, what=f"'{param}'")))
        return fit_prompt(lm, ids, max_tokens or 1, False)
    except PromptTooLongError as err:
        raise error_for(err, param) from None
    except (ValueError, TypeError) as err:
        raise bad(param, f"cannot be tokenized: {' '.join(str(err).split())}") from None


def _prompts(lm: LanguageModel, req: CompletionRequest) -> list[list[int]]:
    value, most = req.prompt, req.max_tokens
    if isinstance(value, str):
        return [_encode(lm, value, "prompt", most)]
    if all(isinstance(p, str) for p in value):
        return [_encode(lm, p, "prompt", most) for p in value]  # type: ignore[arg-type]
    if all(isinstance(p, list) for p in value):
        return [_token_ids(lm, p, "prompt") for p in value]  # type: ignore[arg-type]
    return [_token_ids(lm, value, "prompt")]  # type: ignore[arg-type]


def hf_chat_template(lm: LanguageModel) -> ChatTemplate | None:
    """The tokenizer's chat template of a transformers model (None when it has none): the
    messages rendered with the assistant's turn opened, tokenized without adding special
    tokens (the template writes them)."""
    tokenizer = getattr(lm, "tokenizer", None)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
               ) -> list[int]:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))

    # Hermes' tool format (Qwen2.5, Hermes): the template offers tools and writes calls.
    render.hermes_tools = "<tool_call>" in str(tokenizer.chat_template)  # type: ignore[attr-defined]
    return render


def _messages(lm: LanguageModel, req: ChatCompletionRequest,
              template: ChatTemplate | None) -> list[list[int]]:
    if template is None:
        raise APIError(400, "this model has no chat template: use /v1/completions with a "
                            "prompt", param="messages", code="no_chat_template")
    most = req.max_tokens or req.max_completion_tokens or 1
    limit, size = prompt_byte_limit(lm, most), sum(len(m.content or "") for m in req.messages)
    if limit is not None and size > limit:  # before the template renders it all
        raise error_for(too_many_bytes(lm, "the messages' content", f"at least {size}",
                                       most, option="fewer messages"), "messages")
    try:
        if knows_tools(template):
            tools = None if req.tool_mode is None or not req.tools else [
                t.model_dump(exclude_none=True) for t in req.tools]
            rendered = template(native_messages(req.messages), tools=tools)
        else:
            rendered = template(plain_messages(req.messages, None if req.tool_mode is None
                                               else req.tools))
    except APIError:
        raise
    except Exception as err:  # a template's own check (roles must alternate, …)
        raise bad("messages", f"the chat template refused them: "
                              f"{' '.join(str(err).split())}") from None
    if isinstance(rendered, str):
        return [_encode(lm, rendered, "messages", req.max_tokens)]
    return [_token_ids(lm, list(rendered), "messages")]


def prepare_calls(lm: LanguageModel, opts: Options, **budgets: Any) -> list[PreparedCall]:
    """One prepared call per prompt of ``opts`` (:func:`adaptrack.generate.prepare`, with
    ``budgets`` such as ``max_seconds``, which the request's own ``max_seconds`` can only
    lower): the library's own checks, before any model work, as :class:`APIError` naming
    the field (a prompt too long for the context is 400, an empty language found up front
    too)."""
    if opts.max_seconds is not None:
        cap = budgets.get("max_seconds")
        budgets["max_seconds"] = opts.max_seconds if cap is None else min(cap, opts.max_seconds)
    try:
        options = replace(opts.sampling, **budgets)
    except TypeError as err:
        raise TypeError(f"prepare_calls() got an unknown budget: {err}") from None
    calls = []
    for ids in opts.prompts:
        try:
            calls.append(prepare(lm, ids, opts.constraint, options=options))
        except PromptTooLongError as err:
            too_long = lm.context_length is not None and opts.max_tokens >= lm.context_length
            raise error_for(err, "max_tokens" if too_long else opts.prompt_field) from None
        except Exception as err:  # the library's checks: mapped by kind
            raise error_for(err, opts.constraint_field) from None
    return calls
