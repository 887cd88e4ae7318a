"""``adaptrack serve``: an OpenAI-compatible HTTP server over the engine (the optional
``serve`` extra: Starlette and uvicorn).

:func:`create_app` builds the ASGI app around any :class:`~adaptrack.LanguageModel`;
``adaptrack serve`` (``cli/serve.py``) loads a model and runs it with uvicorn. Modules:
``protocol`` parses requests into :func:`adaptrack.generate.prepare` calls and shapes the
answers, ``engine_loop`` steps the engine in one thread over every request in flight,
``app`` is the HTTP side, ``metrics`` the Prometheus counters. Only ``app`` needs the extra:
it is imported on first use of :func:`create_app` or :class:`Server`, so that the command
line starts without it.
"""

from __future__ import annotations

from typing import Any

from .engine_loop import EngineLoop
from .protocol import APIError, parse, prepare_calls

__all__ = ["APIError", "EngineLoop", "Server", "create_app", "parse", "prepare_calls"]


def __getattr__(name: str) -> Any:
    if name in ("Server", "create_app"):
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
