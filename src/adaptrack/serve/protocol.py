"""The OpenAI-compatible request models of ``adaptrack serve``, declared in pydantic.

:class:`CompletionRequest` (``/v1/completions``) and :class:`ChatCompletionRequest`
(``/v1/chat/completions``) hold every field a request may give, with its type, bounds and
default: an unknown field, a value of the wrong type or out of bounds is refused by the
model (``extra="forbid"``, strict types: ``1.5`` is not an ``n``, ``"1"`` not a
``max_tokens``). The bounds that depend on the server (``n`` up to its ``max_n``,
``max_tokens`` up to the model's context) come in the validation context. A ``null`` means
the default, except for ``end`` and ``fallback``. :func:`.validation.validate` turns
pydantic's errors into an :class:`~.errors.APIError` naming the field.

Fields, as OpenAI and vLLM spell them: ``prompt`` (a string, a list of token ids, or a list
of either for several prompts) or ``messages``, ``n``, ``max_tokens`` (chat also
``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``, ``stop``, ``logprobs``,
``stream`` (with ``stream_options.include_usage``); chat's ``top_logprobs``, ``tools``,
``tool_choice`` and ``parallel_tool_calls`` (:mod:`.tool_protocol`); the constraints
``structured_outputs`` (vLLM's), ``response_format`` (``text``, ``json_object``,
``json_schema``), ``guided_json`` (with ``guided_whitespace_pattern``), ``guided_regex``,
``guided_choice``, ``guided_grammar`` (GBNF when a line defines a rule with ``::=``, else
Lark) and ``guided_api_names`` (dotted names, :func:`adaptrack.constraints.api_names`); and
adaptrack's ``decoding_method``, ``share_q``, ``max_backtrack``, ``fast_forward``, ``end``,
``fallback``, ``max_seconds``, ``search_budget`` and ``early_handover``. Python predicates
and ``from_module`` are not reachable: they run code.

>>> req = CompletionRequest.model_validate({"prompt": "ab", "guided_choice": ["a", "b"]})
>>> req.n, req.method, req.constraint_field
(1, 'adaptrack', 'guided_choice')
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..options import SamplingOptions
from ..sampling.methods import METHODS, foreign_options, owners
from ..sampling.treeoptions import END_POLICIES
from .errors import show
from .tool_protocol import ChatMessage, StructuredOutputs, Tool, ToolChoice, invalid

#: OpenAI's limit on ``n``: more choices than this in one request is a 400.
MAX_N = 128
#: Most stop strings a request may give (OpenAI's limit).
MAX_STOP = 4
#: The longest ``max_tokens`` for a model whose context length is unknown.
MAX_TOKENS_UNKNOWN_CONTEXT = 32_768
#: The largest seed (numpy's SeedSequence takes any non-negative int; OpenAI's is int64).
MAX_SEED = 2**63 - 1
#: The most top alternatives a request asks per token (chat's ``top_logprobs``, completions'
#: ``logprobs``), OpenAI's bound on chat.
MAX_TOP_LOGPROBS = 20

#: The constraint fields, in the order they are looked at; a request gives at most one
#: (chat's ``tools``, with a ``tool_choice`` other than ``none``, is one too).
CONSTRAINT_FIELDS = ("structured_outputs", "response_format", "guided_json", "guided_regex",
                     "guided_choice", "guided_grammar", "guided_api_names")
#: OpenAI fields accepted only at the values that change nothing (adaptrack samples the
#: model as it is: no penalties, biases, echo, suffix or stored completions; completions
#: take no tools, and chat takes ``tools`` rather than the deprecated ``functions``).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0), "presence_penalty": (None, 0), "logit_bias": (None, {}),
    "echo": (None, False), "suffix": (None, ""), "store": (None, False),
    "tools": (None, []), "tool_choice": (None, "none", "auto"), "functions": (None, []),
    "function_call": (None, "none", "auto"), "parallel_tool_calls": (None, True, False),
}
#: Fields whose ``null`` is refused rather than read as the default.
NULL_IS_A_VALUE = ("end", "fallback")


def one_of(allowed: Any) -> AfterValidator:
    """A string field whose value must be one of ``allowed`` (a mapping's keys or a
    tuple), named in the error."""

    def check(value: str) -> str:
        if value not in allowed:
            raise invalid(f"must be one of {', '.join(allowed)}, got {show(value)}")
        return value

    return AfterValidator(check)


def _neutral(value: Any, info: ValidationInfo) -> Any:
    allowed = NEUTRAL[str(info.field_name)]
    if value not in allowed:
        raise invalid(f"not supported (adaptrack samples the model as it is); leave it out "
                      f"or at {show(allowed[-1])}, got {show(value)}")
    return value


def _stops(value: Any) -> Any:
    """One stop string or a list of them, as a tuple (JSON has no tuples)."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _unique(value: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(value))


#: An OpenAI field accepted at the values of :data:`NEUTRAL` only.
Neutral = Annotated[Any, AfterValidator(_neutral)]
Strings = Annotated[list[str], Field(min_length=1)]
TokenIds = list[int]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k in NULL_IS_A_VALUE}
        return data


class StreamOptions(_Model):
    """``stream_options``: ``include_usage`` adds a last event with the usage."""

    include_usage: bool = False


class JSONSchemaFormat(_Model):
    """``response_format.json_schema``: OpenAI's named schema (only ``schema`` is used)."""

    name: str | None = None
    description: str | None = None
    strict: bool | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")


class ResponseFormat(_Model):
    """``response_format``: ``text`` (no constraint), ``json_object`` or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None
                                           or self.json_schema.schema_ is None):
            spec = None if self.json_schema is None else self.json_schema.model_dump()
            raise invalid(f"json_schema needs a 'schema' object, got {show(spec)}")
        return self


class BaseRequest(_Model):
    """The fields both endpoints share. The constraint fields are checked here for their
    JSON type; ``preprocess`` compiles the one given."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Annotated[tuple[Annotated[str, Field(min_length=1)], ...],
                    BeforeValidator(_stops), AfterValidator(_unique),
                    Field(max_length=MAX_STOP, description=f"a non-empty string or a list "
                                                           f"of at most {MAX_STOP} of them")] = ()
    stream: bool = False
    stream_options: StreamOptions | None = None
    # constraints
    structured_outputs: StructuredOutputs | None = None
    response_format: ResponseFormat | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: Strings | None = Field(None, description="a non-empty list of strings")
    guided_grammar: str | None = None
    guided_api_names: Strings | None = Field(None, description="a non-empty list of strings")
    guided_whitespace_pattern: str | None = None
    # adaptrack's own
    decoding_method: Annotated[str, one_of(METHODS)] | None = None
    share_q: bool = False
    max_backtrack: int | None = Field(None, ge=0, le=1 << 30)
    fast_forward: bool = True
    end: Annotated[str, one_of(END_POLICIES)] = "leave"
    fallback: Literal["cd", "none"] = "cd"
    max_seconds: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    search_budget: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    early_handover: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    # accepted and not used: they say nothing about sampling
    user: Any = None
    metadata: Any = None
    safety_identifier: Any = None
    prompt_cache_key: Any = None
    service_tier: Any = None
    # OpenAI's, at the values that change nothing
    frequency_penalty: Neutral = None
    presence_penalty: Neutral = None
    logit_bias: Neutral = None
    echo: Neutral = None
    suffix: Neutral = None
    store: Neutral = None
    functions: Neutral = None
    function_call: Neutral = None
    best_of: int | None = None

    @field_validator("n")
    @classmethod
    def _n_within_server(cls, value: int, info: ValidationInfo) -> int:
        return _at_most(value, "max_n", info)

    @field_validator("max_tokens")
    @classmethod
    def _tokens_within_context(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else _at_most(value, "max_tokens", info)

    @model_validator(mode="after")
    def _consistent(self) -> BaseRequest:
        if self.stream_options is not None and not self.stream:
            raise invalid("applies only with \"stream\": true", "stream_options")
        if self.best_of is not None and self.best_of != self.n:
            raise invalid(f"not supported (adaptrack samples the model as it is); leave it "
                          f"out or at n ({self.n}), got {self.best_of}", "best_of")
        given = self.constraint_fields
        if len(given) > 1:
            raise invalid(f"give at most one constraint, got {' and '.join(given)}", given[1])
        if self.guided_whitespace_pattern is not None and (not given or given[0] not in (
                "response_format", "guided_json")):
            raise invalid("applies to a JSON constraint (guided_json or response_format) "
                          "only", "guided_whitespace_pattern")
        given = [o for o in ("share_q", "max_backtrack") if getattr(self, o) not in (None, False)]
        for option in foreign_options(self.method, given):
            them = " or ".join(f"'{m}'" for m in owners(option))
            raise invalid(f"applies to decoding_method {them} only, not '{self.method}'",
                          option)
        return self

    @property
    def constraint_fields(self) -> list[str]:
        """The constraint fields given (``response_format`` of type ``text`` is none)."""
        return [f for f in CONSTRAINT_FIELDS if getattr(self, f) is not None
                and not (f == "response_format" and self.response_format is not None
                         and self.response_format.type == "text")]

    @property
    def constraint_field(self) -> str | None:
        given = self.constraint_fields
        return given[0] if given else None

    @property
    def method(self) -> str:
        """The decoding method: the request's, else AdapTrack with a constraint and plain
        sampling without."""
        if self.decoding_method is not None:
            return self.decoding_method
        return "adaptrack" if self.constraint_field is not None else "unconstrained"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def to_sampling_options(self, max_new_tokens: int) -> SamplingOptions:
        """The request's sampling options (as vLLM's ``to_sampling_params``), with
        ``max_new_tokens``: the request's token limit, or the server's default fitted to the
        context. A field the request leaves out keeps :class:`SamplingOptions`'s default;
        ``max_seconds`` is not here, as the server's own budget caps it. Raises what
        :class:`SamplingOptions` raises (the fields' bounds make that rare).

        >>> req = CompletionRequest(prompt="a", n=2, decoding_method="cd", fallback="none")
        >>> opts = req.to_sampling_options(16)
        >>> opts.method, opts.n, opts.max_new_tokens, opts.fallback, opts.search_budget
        ('cd', 2, 16, None, 3.0)
        """
        given: dict[str, Any] = dict(
            method=self.method, n=self.n, temperature=self.temperature, top_p=self.top_p,
            max_new_tokens=max_new_tokens, seed=self.seed, fast_forward=self.fast_forward,
            share_q=self.share_q, max_backtrack=self.max_backtrack, end=self.end,
            fallback=None if self.fallback == "none" else self.fallback)
        for name in ("search_budget", "early_handover"):
            if getattr(self, name) is not None:
                given[name] = getattr(self, name)
        return SamplingOptions(**given)


def _at_most(value: int, bound: str, info: ValidationInfo) -> int:
    """``value`` within a bound the server sets (in the validation context)."""
    high = (info.context or {}).get(bound)
    if high is not None and value > high:
        raise PydanticCustomError("less_than_equal", "Input should be at most {le}",
                                  {"le": high})
    return value


class CompletionRequest(BaseRequest):
    """A ``/v1/completions`` request. ``logprobs``: 0 for the sampled tokens'
    log-probabilities, k for them and the k likeliest tokens at each position."""

    prompt: Annotated[str | Annotated[list[TokenIds], Field(min_length=1)]
                      | Annotated[list[str], Field(min_length=1)]
                      | Annotated[TokenIds, Field(min_length=1)],
                      Field(description="a string, a list of token ids, or a non-empty list "
                                        "of those")]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Neutral = None
    tool_choice: Neutral = None
    parallel_tool_calls: Neutral = None

    @property
    def top_logprobs(self) -> int:
        return self.logprobs or 0


class ChatCompletionRequest(BaseRequest):
    """A ``/v1/chat/completions`` request: ``messages``, and the ``tools`` the model may
    call (:mod:`.tools`), with ``tool_choice`` and ``parallel_tool_calls``."""

    messages: Annotated[list[ChatMessage],
                        Field(min_length=1, description="a non-empty list of {role, "
                                                        "content} objects")]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    @field_validator("max_completion_tokens")
    @classmethod
    def _within_context(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else _at_most(value, "max_tokens", info)

    @model_validator(mode="after")
    def _one_length(self) -> ChatCompletionRequest:
        a, b = self.max_tokens, self.max_completion_tokens
        if a is not None and b is not None and a != b:
            raise invalid("differs from 'max_tokens'; give one", "max_completion_tokens")
        if self.top_logprobs and not self.logprobs:
            raise invalid("needs \"logprobs\": true", "top_logprobs")
        return self

    @model_validator(mode="after")
    def _tools_agree(self) -> ChatCompletionRequest:
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) < len(names):
            raise invalid(f"function names must differ, got {show(names)}", "tools")
        choice = self.tool_choice
        if choice not in (None, "none") and not names:
            raise invalid(f"{show(choice if isinstance(choice, str) else choice.model_dump())}"
                          f" needs tools; give tools or leave tool_choice out", "tool_choice")
        if not isinstance(choice, str | None) and choice.function.name not in names:
            raise invalid(f"names {show(choice.function.name)}, which is not among the "
                          f"tools ({', '.join(names)})", "tool_choice")
        return self

    @property
    def tool_mode(self) -> str | None:
        """How the model may call tools: ``"auto"`` (text or calls), ``"required"`` (one
        call or more), ``"named"`` (the named function's), or None (no tool: none given,
        or ``tool_choice: "none"``)."""
        if not self.tools or self.tool_choice == "none":
            return None
        if self.tool_choice is None:
            return "auto"
        return self.tool_choice if isinstance(self.tool_choice, str) else "named"

    @property
    def constraint_fields(self) -> list[str]:
        given = super().constraint_fields
        return [*given, "tools"] if self.tool_mode is not None else given


#: The request model of each endpoint kind.
REQUESTS: dict[str, type[BaseRequest]] = {"completion": CompletionRequest,
                                       "chat": ChatCompletionRequest}

