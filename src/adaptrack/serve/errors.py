"""The server's error answers: :class:`APIError` (an HTTP status and OpenAI's error object)
and :func:`error_for`, which maps the library's exceptions onto them (docs/design.md §6).

Imports neither pydantic nor Starlette: the engine thread and the command line use it.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import (
    AdaptrackError,
    CallLimitError,
    GrammarError,
    JSONDepthError,
    NoValidSequenceError,
    PromptTooLongError,
    SearchTimeoutError,
    TokenizerError,
    TreeLimitError,
)

#: Error ``type`` by HTTP status, as OpenAI names them.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               404: "invalid_request_error", 405: "invalid_request_error",
               413: "invalid_request_error", 415: "invalid_request_error",
               422: "invalid_request_error",
               429: "rate_limit_error", 499: "invalid_request_error", 500: "server_error",
               503: "server_error", 504: "timeout_error"}


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


def bad(param: str, reason: str) -> APIError:
    """A 400 about one request field."""
    return APIError(400, f"invalid '{param}': {reason}", param=param)


def json_text(value: Any, allow_nan: bool = False) -> str:
    """``value`` as JSON text that encodes to UTF-8: non-ASCII as is, unless a lone
    surrogate (echoed from a request's JSON, which may hold one) forces escapes.

    >>> json_text({"a": "é"}), json_text({"a": chr(0xD800)})
    ('{"a": "é"}', '{"a": "\\\\ud800"}')
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=allow_nan)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, allow_nan=allow_nan)
    return text


def show(value: Any, limit: int = 60) -> str:
    """A request value as JSON, cut to ``limit`` characters, for an error message.

    >>> show({"a": [1, 2]}), show("x" * 70)[-5:]
    ('{"a": [1, 2]}', 'xx...')
    """
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= limit else text[:limit] + "..."


def error_for(err: BaseException, param: str | None = None) -> APIError:
    """The HTTP answer to an exception the library raised (docs/design.md §6): bad input is
    400 (an empty language within ``max_tokens`` too: the request as sent has no answer), a
    search past its node or call budget 422 (the same request meets it again), a search
    past its time 504, anything else 500.

    >>> error_for(NoValidSequenceError("no valid sequence"), "guided_regex").status
    400
    >>> err = error_for(CallLimitError("the search made 2 model calls"))
    >>> err.status, err.body()["error"]["code"]
    (422, 'search_limit')
    """
    if isinstance(err, APIError):
        return err
    message = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, NoValidSequenceError):
        return APIError(400, message, param=param, code="no_valid_sequence")
    if isinstance(err, SearchTimeoutError):
        return APIError(504, message, code="timeout")
    if isinstance(err, TreeLimitError | CallLimitError):
        return APIError(422, message, param=param, code="search_limit")
    if isinstance(err, PromptTooLongError):
        return APIError(400, message, param=param, code="context_length_exceeded")
    if isinstance(err, JSONDepthError):
        return APIError(400, message, param=param, code="json_too_deep")
    if isinstance(err, GrammarError):
        return APIError(400, message, param=param, code="invalid_grammar")
    if isinstance(err, TokenizerError) or (isinstance(err, ValueError | TypeError)
                                           and not isinstance(err, AdaptrackError)):
        return APIError(400, message, param=param)
    return APIError(500, f"{type(err).__name__}: {message}", code="internal_error")
