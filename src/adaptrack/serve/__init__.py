"""``adaptrack serve``: an OpenAI-compatible HTTP server over the engine (the optional
``serve`` extra: pydantic, Starlette and uvicorn), laid out like vLLM's OpenAI entrypoint
(docs/design.md §4).

:func:`create_app` builds the ASGI app around any :class:`~adaptrack.LanguageModel`;
``adaptrack serve`` (``cli/serve.py``) loads a model and runs it with uvicorn. The modules
and what each holds: docs/design.md §4. What needs the extra is imported on first use, so
that the command line starts without it.
"""

from __future__ import annotations

from typing import Any

from .engine_loop import EngineLoop
from .errors import APIError

__all__ = ["APIError", "EngineLoop", "Server", "create_app", "parse", "prepare_calls"]

_LAZY = {"Server": "serving", "create_app": "app", "parse": "preprocess",
         "prepare_calls": "preprocess"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
