"""``adaptrack serve``: an OpenAI-compatible HTTP server over the engine (the optional
``serve`` extra: pydantic, Starlette and uvicorn), laid out like vLLM's OpenAI entrypoint
(docs/design.md §4).

:func:`~adaptrack.serve.app.create_app` builds the ASGI app around any
:class:`~adaptrack.LanguageModel`; ``adaptrack serve`` (``cli/serve.py``) loads a model and
runs it with uvicorn. The modules and what each holds: docs/design.md §4. This package
imports only what runs without the extra (the engine thread and the API's errors), so that
the command line starts without it; the rest is imported from its module
(``adaptrack.serve.app``, ``.serving``, ``.preprocess``).
"""

from __future__ import annotations

from .engine_loop import EngineLoop
from .errors import APIError

__all__ = ["APIError", "EngineLoop"]
