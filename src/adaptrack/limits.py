"""Bounds on what users hand over, checked before the work they would cost: how deep a JSON
value may nest (:data:`MAX_JSON_DEPTH`, for every JSON the library, the command line and
the server read) and how many bytes a prompt may have (:func:`prompt_byte_limit`: more
than the model's context can hold is refused before it is read whole or tokenized).

>>> loads('{"a": [1, [2]]}', "the body")
{'a': [1, [2]]}
>>> try:
...     loads("[" * 5000 + "]" * 5000, "the body")
... except JSONDepthError as err:
...     print(err)
the body is nested more than 100 levels deep (the limit of nesting for JSON); flatten it
"""

from __future__ import annotations

import json
from typing import Any

from .errors import JSONDepthError, PromptTooLongError, TokenizerError

__all__ = ["MAX_JSON_DEPTH", "SLACK_BYTES", "JSONDepthError", "check_json_depth", "loads",
           "prompt_byte_limit", "prompt_text"]

#: Bytes past a prompt's byte limit that are still read and tokenized: a small prompt's
#: error then counts its tokens exactly, and a cut text gives the tokenizer the context
#: of the cut (tokenizing costs about 2 µs and 200 bytes of memory a byte).
SLACK_BYTES = 64 << 10

#: The deepest nesting of arrays and objects read from a user (a real JSON schema nests a
#: few tens of levels); deeper values are refused before any recursive code sees them.
MAX_JSON_DEPTH = 100


def _too_deep(what: str, limit: int) -> JSONDepthError:
    return JSONDepthError(f"{what} is nested more than {limit} levels deep (the limit of "
                          f"nesting for JSON); flatten it")


def check_json_depth(value: Any, what: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`~adaptrack.errors.JSONDepthError` naming ``what`` when ``value``'s
    lists, tuples and dicts nest more than ``limit`` levels deep. The walk keeps its own
    stack (no recursion) and stops at the limit, so a value that contains itself is
    refused too.

    >>> check_json_depth({"a": [[1]]}, "x", limit=3)
    >>> check_json_depth({"a": [[[1]]]}, "x", limit=3)
    Traceback (most recent call last):
    adaptrack.errors.JSONDepthError: x is nested more than 3 levels deep (the limit of nesting for JSON); flatten it
    """  # noqa: E501
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            raise _too_deep(what, limit)
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list | tuple))


def loads(data: str | bytes, what: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(data)`` with nesting at most ``limit`` deep, else
    :class:`~adaptrack.errors.JSONDepthError` naming ``what`` (never a
    ``RecursionError``); not JSON is the ``ValueError`` of :func:`json.loads`."""
    opening = (b"[", b"{") if isinstance(data, bytes) else ("[", "{")
    # Fewer brackets than the limit cannot nest deeper: no walk for the usual body.
    if data.count(opening[0]) + data.count(opening[1]) <= limit:  # type: ignore[arg-type]
        return json.loads(data)
    try:
        value = json.loads(data)
    except RecursionError:
        raise _too_deep(what, limit) from None
    check_json_depth(value, what, limit)
    return value


# -- prompts ---------------------------------------------------------------------------------


def prompt_byte_limit(lm: Any, max_new_tokens: int = 0) -> int | None:
    """The most bytes a prompt can have and still fit ``lm``'s context with
    ``max_new_tokens`` to generate, or None when the context is unknown: a token holds at
    most ``lm.vocab.max_token_len`` bytes of the text (the tokenizers adaptrack loads
    reproduce the text's bytes), so a longer prompt has more tokens than fit.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"ab", b"<eos>"], lambda p: [1, 1, 1], eos=2)
    >>> lm.context_length = 10
    >>> prompt_byte_limit(lm, max_new_tokens=4)
    12
    """
    context = getattr(lm, "context_length", None)
    if context is None:
        return None
    return int(max(0, context - max_new_tokens)) * max(1, int(lm.vocab.max_token_len))


def prompt_text(lm: Any, text: str, max_new_tokens: int, truncate: bool = False,
                what: str = "the prompt") -> str:
    """``text``, to be tokenized, or :class:`~adaptrack.errors.PromptTooLongError` from its
    size alone when it has more than :data:`SLACK_BYTES` past the bytes that can fit
    ``lm``'s context with ``max_new_tokens`` (:func:`prompt_byte_limit`); with ``truncate``
    its last that many characters instead. A text within the slack is tokenized (a bounded
    cost) so that its tokens, counted next, say exactly how far over it is. A lone surrogate
    (not UTF-8) is a :class:`~adaptrack.errors.TokenizerError` naming where it is.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"<eos>"], lambda p: [1, 1], eos=1)
    >>> lm.context_length = 6
    >>> prompt_text(lm, "aaa", 4)
    'aaa'
    >>> len(prompt_text(lm, "a" * 100_000, 4, truncate=True)) == 2 + SLACK_BYTES
    True
    >>> prompt_text(lm, "a" * 100_000, 4)
    Traceback (most recent call last):
    adaptrack.errors.PromptTooLongError: the prompt has at least 100000 bytes: more than the 2 bytes that 2 tokens can hold (TableLM's context of 6 tokens less max_new_tokens=4, at most 1 bytes a token); shorten the prompt, lower max_new_tokens, or pass truncate_prompt=True
    """  # noqa: E501
    limit = prompt_byte_limit(lm, max_new_tokens)
    keep = None if limit is None else limit + SLACK_BYTES
    if keep is not None and len(text) > keep:  # a character is at least one byte
        if not (truncate and limit):
            raise too_many_bytes(lm, what, f"at least {len(text)}", max_new_tokens)
        text = text[len(text) - keep:]
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise TokenizerError(f"{what} is not valid UTF-8 text: lone surrogate "
                             f"U+{ord(text[err.start]):04X} at character {err.start}; remove "
                             f"it or replace it: text.encode('utf-8', 'replace').decode()"
                             ) from None
    if keep is not None and size > keep and not truncate:
        raise too_many_bytes(lm, what, str(size), max_new_tokens)
    return text


def too_many_bytes(lm: Any, what: str, size: str, max_new_tokens: int,
                   option: str = "truncate_prompt=True") -> PromptTooLongError:
    """The error of a prompt of ``size`` bytes (a number, or words such as ``at least
    N``) longer than ``lm``'s context can hold."""
    context = getattr(lm, "context_length", None)
    limit = prompt_byte_limit(lm, max_new_tokens)
    room = max(0, (context or 0) - max_new_tokens)
    how = ("lower max_new_tokens" if room == 0 else
           f"shorten the prompt, lower max_new_tokens, or pass {option}")
    return PromptTooLongError(
        f"{what} has {size} bytes: more than the {limit} bytes that {room} tokens can hold "
        f"({type(lm).__name__}'s context of {context} tokens less "
        f"max_new_tokens={max_new_tokens}, at most {lm.vocab.max_token_len} bytes a token); "
        f"{how}")
