"""The sizes a request body may have, checked on its parsed JSON before pydantic validates
it item by item or a constraint is compiled (docs/security.md): a list of millions of
token ids, or a choice of a 30 MB string, costs gigabytes and tens of seconds otherwise.

>>> check_sizes({"prompt": [1, 2, 3]}, max_n=8, context=4)
>>> try:
...     check_sizes({"guided_choice": ["x" * (2 << 20)]}, max_n=8, context=4)
... except APIError as err:
...     err.param, err.message
('guided_choice', "invalid 'guided_choice': its strings hold 2097152 characters, more than the 1048576 a choice may have")
"""  # noqa: E501

from __future__ import annotations

from typing import Any

from .errors import APIError, bad

__all__ = ["MAX_CHOICE_CHARS", "MAX_SOURCE_CHARS", "check_sizes"]

#: The longest regex or grammar a request may give (a real one is a few KiB; compiling and
#: bounding one costs about 5 µs a character).
MAX_SOURCE_CHARS = 256 << 10
#: The most characters a choice's strings (or API names) may hold together: its trie costs
#: about 300 bytes and 3 µs a character.
MAX_CHOICE_CHARS = 1 << 20


def _sources(data: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    """Each constraint source given: its field, its value, and whether it is a list of
    strings (a choice) rather than a text (a regex or grammar)."""
    found = [(name, data.get(name), False) for name in ("guided_regex", "guided_grammar")]
    found += [(name, data.get(name), True) for name in ("guided_choice", "guided_api_names")]
    so = data.get("structured_outputs")
    if isinstance(so, dict):
        found += [(f"structured_outputs.{k}", so.get(k), False) for k in ("regex", "grammar")]
        found.append(("structured_outputs.choice", so.get("choice"), True))
    return found


def check_sizes(data: dict[str, Any], max_n: int, context: int | None) -> None:
    """A 400 for a prompt of more token ids, or more messages, than ``context`` tokens, for
    more prompts than ``max_n``, for a regex or grammar past :data:`MAX_SOURCE_CHARS` and
    for a choice past :data:`MAX_CHOICE_CHARS`."""
    prompt, messages = data.get("prompt"), data.get("messages")
    if isinstance(prompt, list) and context is not None:
        if prompt and all(isinstance(p, list | str) for p in prompt[:1]) and len(prompt) > max_n:
            raise bad("prompt", f"{len(prompt)} prompts are more than {max_n}")
        for ids in ([prompt] if prompt[:1] and not isinstance(prompt[0], list | str)
                    else [p for p in prompt if isinstance(p, list)]):
            if len(ids) > context:
                raise APIError(400, f"the prompt has {len(ids)} token ids, more than the "
                                    f"model's context of {context} tokens", param="prompt",
                               code="context_length_exceeded")
    if isinstance(messages, list) and context is not None and len(messages) > context:
        raise APIError(400, f"{len(messages)} messages are more than the model's context of "
                            f"{context} tokens holds", param="messages",
                       code="context_length_exceeded")
    for name, value, strings in _sources(data):
        if strings and isinstance(value, list):
            size = sum(len(v) for v in value if isinstance(v, str))
            if size > MAX_CHOICE_CHARS:
                raise bad(name, f"its strings hold {size} characters, more than the "
                                f"{MAX_CHOICE_CHARS} a choice may have")
        elif not strings and isinstance(value, str) and len(value) > MAX_SOURCE_CHARS:
            raise bad(name, f"is {len(value)} characters, more than the "
                            f"{MAX_SOURCE_CHARS >> 10} KiB a regex or grammar may have")
