"""The request models of tool calling and of ``structured_outputs`` (pydantic), apart from
:mod:`.protocol`, which uses them: a chat message (with an assistant's ``tool_calls`` and a
tool's result), a tool (a function and its ``parameters`` schema), a ``tool_choice`` and
vLLM's ``structured_outputs`` object.

>>> Tool.model_validate({"type": "function", "function": {"name": "f"}}).function.arguments_schema()
{'type': 'object', 'properties': {}}
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from .errors import show

#: OpenAI's rule for a function's name.
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
#: The fields of ``structured_outputs`` that give a constraint; a request gives one.
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def invalid(message: str, param: str | None = None) -> PydanticCustomError:
    """A validation error whose ``message`` is shown as is; ``param``: the field it is
    about when pydantic cannot tell (a check across fields)."""
    return PydanticCustomError("adaptrack", message, {"param": param} if param else None)


def _text_content(value: Any) -> Any:
    """A message's content: a string, or a list of text parts joined."""
    if isinstance(value, list):
        for part in value:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise invalid(f"only text content is supported, got {show(part)}")
        return "".join(part["text"] for part in value)
    if value is not None and not isinstance(value, str):
        raise invalid(f"content must be a string or text parts, got {show(value)}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FunctionCall(BaseModel):
    """A call in an assistant message of the history: a name and its arguments (JSON text,
    as OpenAI sends them back)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    name: str
    arguments: str


class ToolCallParam(BaseModel):
    """One of an assistant message's ``tool_calls``."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message: a role and its text (other keys OpenAI sends are ignored); an
    assistant's may hold ``tool_calls`` instead of text, a tool's names the call it
    answers (``tool_call_id``)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str | None, BeforeValidator(_text_content)] = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise invalid(f"only an assistant message holds tool_calls, not a {self.role}'s")
        if self.content is None and not self.tool_calls:
            raise invalid("'content' is missing: give a string (an assistant message may "
                          "give tool_calls instead)")
        return self


class Function(_Strict):
    """A function a tool offers: its name, what it does, and its arguments' JSON schema."""

    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def arguments_schema(self) -> dict[str, Any]:
        """The arguments' schema (an object with no properties when not given)."""
        return self.parameters if self.parameters is not None else {
            "type": "object", "properties": {}}


class Tool(_Strict):
    """``tools[i]``: a function the model may call."""

    type: Literal["function"]
    function: Function


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """``tool_choice`` naming the one function to call."""

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs``: one of ``json`` (a schema, or its JSON text),
    ``regex``, ``choice``, ``grammar`` (Lark or GBNF), ``json_object`` and
    ``structural_tag``; ``whitespace_pattern`` and ``disable_any_whitespace`` shape the
    whitespace of ``json`` and ``json_object``."""

    json_: Any = Field(None, alias="json")
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1)] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: Any = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False

    @property
    def given(self) -> list[str]:
        """The constraint kinds given (``json_object: false`` is none)."""
        return [k for k in STRUCTURED_KINDS
                if getattr(self, "json_" if k == "json" else k) not in (None, False)]

    @model_validator(mode="after")
    def _one(self) -> StructuredOutputs:
        given = self.given
        if len(given) != 1:
            got = " and ".join(given) if given else "none"
            raise invalid(f"give exactly one of {', '.join(STRUCTURED_KINDS)}, got {got}")
        spaced = self.whitespace_pattern is not None or self.disable_any_whitespace
        if spaced and given[0] not in ("json", "json_object"):
            raise invalid(f"whitespace_pattern and disable_any_whitespace apply to json and "
                          f"json_object, not to {given[0]}")
        return self
