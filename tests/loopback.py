"""A server of ``adaptrack serve`` on a free loopback port in a thread, and the ``openai``
client for it: for the serve tests that drive it as a user would."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

import adaptrack as at
from adaptrack.cli.serve import listen
from adaptrack.serve.app import create_app
from adaptrack.serve.serving import Server


def chat_template(messages: list[dict[str, str]]) -> str:
    """A plain template: one line a message, then the assistant's turn."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


@contextlib.contextmanager
def serving(lm: at.LanguageModel, **options: Any) -> Iterator[tuple[str, Server]]:
    """A server on a free loopback port in a thread; yields its base URL and its
    :class:`Server`, then stops it."""
    options.setdefault("chat_template", chat_template)
    app = create_app(lm, model_name="toy", **options)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    sock = listen("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.server
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def client(url: str, key: str = "none") -> Any:
    """The ``openai`` client of the server at ``url``."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
