"""What the server refuses before it reads a request (docs/security.md): a ``Host`` it does
not serve (:class:`HostGuard`, against DNS rebinding) and a body that is not JSON
(:func:`check_json_body`, against a web page posting without a CORS preflight).

A page in a browser can send a request to a loopback server under its own domain name (DNS
rebinding: the name resolves to 127.0.0.1 after the page loaded), and can post a
``text/plain`` or form body to any address without asking first. The first carries the
page's name in ``Host``; the second is not ``application/json``. Both are refused, so a
server without an API key on loopback answers only programs on the machine.

>>> guard = HostGuard(None, ["api.example.com", "*.lan"])
>>> [guard.allows(h) for h in ("127.0.0.1:8000", "[::1]", "localhost", "evil.example",
...                            "api.example.com", "gpu.lan:80")]
[True, True, True, False, True, True]
>>> check_json_body("application/json; charset=utf-8")
>>> check_json_body("text/plain")
Traceback (most recent call last):
adaptrack.serve.errors.APIError: the body must be JSON sent with 'Content-Type: application/json', got 'text/plain'
"""  # noqa: E501

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError, json_text, show

__all__ = ["LOOPBACK_NAMES", "HostGuard", "JSONAnswer", "check_json_body"]

#: Host names served without being named: loopback's. Any IP address is served too (a
#: rebinding page sends its own name, never an address).
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def _host_name(header: str) -> str | None:
    """The name or address of a ``Host`` header, without its port (None: unreadable)."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 address: [::1]:8000
        end = header.find("]")
        return header[1:end] if end > 0 else None
    name = header.rpartition(":")[0] if header.count(":") == 1 else header
    return name.rstrip(".") or None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class JSONAnswer(JSONResponse):
    """Starlette's JSON response, whose text encodes even when it echoes a lone surrogate
    (:func:`~.errors.json_text`); Starlette's own would fail with a bare 500."""

    def render(self, content: Any) -> bytes:
        return json_text(content).encode("utf-8")


class HostGuard:
    """ASGI middleware: an HTTP request whose ``Host`` is not an IP address, a loopback
    name or one of ``allowed`` (exact, ``*.example.com`` for its subdomains, ``*`` for any;
    Starlette's TrustedHostMiddleware spells them so) gets 400 ``invalid_host`` naming
    ``--allowed-hosts``. Unlike Starlette's, an IP address is always served: a rebinding
    page cannot send one, and a server on 0.0.0.0 stays reachable by its addresses."""

    def __init__(self, app: ASGIApp | None, allowed: Sequence[str] | None = None) -> None:
        self.app = app
        patterns = [p.strip().lower() for p in allowed or ()]
        for pattern in patterns:
            if "*" in pattern[1:] or (pattern.startswith("*") and pattern != "*"
                                      and not pattern.startswith("*.")):
                raise ValueError(f"allowed host {pattern!r}: a wildcard is '*' or "
                                 "'*.example.com'")
        self.any = "*" in patterns
        self.names = set(LOOPBACK_NAMES) | {p for p in patterns if not p.startswith("*")}
        self.suffixes = tuple(p[1:] for p in patterns if p.startswith("*."))

    def allows(self, header: str) -> bool:
        """Whether a request with this ``Host`` header is served."""
        if self.any:
            return True
        name = _host_name(header)
        if name is None:
            return False
        return _is_address(name) or name in self.names or name.endswith(self.suffixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.app is not None
        if scope["type"] == "http":
            header = Headers(scope=scope).get("host", "")
            if not self.allows(header):
                err = APIError(400, f"the Host {show(header)} is not served here: this server "
                                    "answers its IP addresses and localhost; start it with "
                                    "--allowed-hosts NAME to serve a name (a guard against "
                                    "DNS rebinding)", param="Host", code="invalid_host")
                await JSONAnswer(err.body(), status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def check_json_body(content_type: str | None) -> None:
    """A 415 :class:`~.errors.APIError` unless the request's ``Content-Type`` is
    ``application/json`` (parameters such as ``charset`` allowed)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        got: Any = content_type if content_type else "no Content-Type"
        raise APIError(415, f"the body must be JSON sent with 'Content-Type: application/json'"
                            f", got {got!r}", param="Content-Type",
                       code="unsupported_media_type")
