"""``adaptrack serve``: an OpenAI-compatible HTTP server over the model (``adaptrack.serve``).

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_arguments(parser)
>>> args = parser.parse_args(["--port", "0", "--timeout", "30"])
>>> args.host, args.port, args.timeout, args.max_concurrent, args.api_key is None
('127.0.0.1', 0, 30.0, 16, True)
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import signal
import socket
import sys
import time
from typing import Any

from ..generate import MAX_SECONDS
from ..lm.default import GGUF_NAME
from ..lm.load import load_model
from ..serve.engine_loop import SEARCH_SECONDS, TREE_CACHE_BYTES
from .common import UsageError, limit, non_negative_int, positive_int, utf8_text
from .model import add_model_arguments

HELP = "serve the model over an OpenAI-compatible HTTP API"
DESCRIPTION = ("Serve the model over HTTP with OpenAI's API (/v1/completions, "
               "/v1/chat/completions, /v1/models) plus /health and /metrics; constraints "
               "as vLLM spells them (response_format, guided_json, guided_regex, "
               "guided_choice, guided_grammar) and adaptrack's decoding_method. Needs the "
               "serve extra: pip install 'adaptrack[serve]'.")

#: The environment variable read when ``--api-key`` is not given (a key on the command line
#: is visible to every user of the machine in the process list).
API_KEY_ENV = "ADAPTRACK_API_KEY"


def port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: any free one).

    >>> port("65536")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be a port from 0 to 65535, got 65536
    """
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, got {value}")
    return value


def host_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of host names, as :class:`~adaptrack.serve.guards.HostGuard`
    reads them.

    >>> host_names("api.example.com, *.lan")
    ('api.example.com', '*.lan')
    >>> host_names("a.*")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 'a.*': a wildcard is '*' or '*.example.com'
    """
    found = tuple(dict.fromkeys(n.strip().lower() for n in utf8_text(text).split(",")
                                if n.strip()))
    if not found:
        raise argparse.ArgumentTypeError("is empty: give one or more host names")
    for name in found:
        if "*" in name[1:] or (name.startswith("*") and name != "*"
                               and not name.startswith("*.")):
            raise argparse.ArgumentTypeError(f"{name!r}: a wildcard is '*' or '*.example.com'")
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, threads=True)  # the model the server loads, and how
    _add_server_arguments(parser)


def _add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the server listens, whom it answers and how much it takes on."""
    parser.add_argument("--host", default="127.0.0.1", type=utf8_text,
                        help="address to listen on (default: 127.0.0.1, this machine only; "
                             "0.0.0.0 for every interface)")
    parser.add_argument("--port", type=port, default=8000,
                        help="port (default: 8000; 0 picks a free one, printed at start)")
    parser.add_argument("--api-key", metavar="KEY", type=utf8_text,
                        help=f"require 'Authorization: Bearer KEY' on /v1/ requests (default: "
                             f"${API_KEY_ENV} if set, else no key)")
    parser.add_argument("--allowed-hosts", metavar="NAMES", type=host_names, default=(),
                        help="host names the server answers to besides its IP addresses and "
                             "localhost, comma-separated ('*.example.com' for subdomains, "
                             "'*' for any); other Host headers get 400, a guard against DNS "
                             "rebinding (default: none)")
    parser.add_argument("--served-model-name", metavar="NAME",
                        help="the model's id in /v1/models and requests (default: --model, "
                             "or the default model's name)")
    parser.add_argument("--max-concurrent", type=positive_int, default=16, metavar="N",
                        help="requests sampled at once, their walks sharing model calls "
                             "(default: 16)")
    parser.add_argument("--max-queue", type=non_negative_int, default=64, metavar="M",
                        help="requests waiting beyond those; more get 429 (default: 64)")
    parser.add_argument("--timeout", type=limit, default=MAX_SECONDS, metavar="S",
                        help=f"seconds a request may take from its arrival, 'inf' for no "
                             f"limit; past it 504 and its walks stop (default: "
                             f"{MAX_SECONDS:g})")
    parser.add_argument("--search-seconds", type=limit, default=SEARCH_SECONDS, metavar="S",
                        help="seconds a search (asap, adaptrack, exact) may take before CD "
                             "draws its missing choices, marked in the 'adaptrack' field; a "
                             "request's max_seconds may lower it, its \"fallback\": \"none\" "
                             f"gets 504 instead (default: {SEARCH_SECONDS:g})")
    parser.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                        help="most prefixes per model call (default: 32)")
    parser.add_argument("--tree-cache-bytes", type=non_negative_int, default=TREE_CACHE_BYTES,
                        metavar="B",
                        help="bytes of prefix trees kept for requests that repeat a prompt "
                             "and its options; 0 keeps none (default: "
                             f"{TREE_CACHE_BYTES >> 20} MiB)")
    parser.add_argument("--replicas", type=positive_int, default=1, metavar="N",
                        help="serve N replicas of the model on Ray Serve behind this one "
                             "endpoint, a request routed to the replica that served its "
                             "prompt's prefix (default: 1, this process alone; needs the "
                             "replicas extra)")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"),
                        help="uvicorn's log level (default: info: one line per request)")


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free one), or a ``UsageError`` saying
    why not.

    >>> sock = listen("127.0.0.1", 0)
    >>> sock.getsockname()[1] > 0
    True
    >>> sock.close()
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET  # a host name: resolved by bind
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _api_key(given: str | None) -> str | None:
    """The key from ``--api-key``, else from the environment; an empty one is refused (it
    would serve without a key while the user meant one)."""
    where = "--api-key"
    if given is None:
        given, where = os.environ.get(API_KEY_ENV), f"${API_KEY_ENV}"
    if given is not None and not given.strip():
        raise UsageError(f"{where} is empty: give a key, or leave it unset to serve without "
                         "one")
    return given


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..serve.app import create_app
    except ImportError as err:
        raise UsageError(f"adaptrack serve needs the serve extra: pip install "
                         f"'adaptrack[serve]' ({err})") from None
    api_key = _api_key(args.api_key)
    if args.replicas > 1:
        return run_replicas(args, api_key)
    sock = listen(args.host, args.port)  # before the model loads: a taken port fails fast
    try:
        lm = load_model(args.model, backend=args.backend, device=args.device,
                        threads=args.threads, dtype=args.dtype)
        name = args.served_model_name or args.model or GGUF_NAME.split(".")[0]
        app = create_app(lm, model_name=name, api_key=api_key,
                         max_concurrent=args.max_concurrent, max_queue=args.max_queue,
                         timeout=args.timeout, search_seconds=args.search_seconds,
                         batch_size=args.batch_size, allowed_hosts=args.allowed_hosts,
                         tree_cache_bytes=args.tree_cache_bytes)
        host, port = sock.getsockname()[:2]
        where = f"[{host}]" if ":" in host else host
        model = getattr(lm, "model", None)  # transformers: say the weights' precision
        weights = (f" ({str(next(model.parameters()).dtype).removeprefix('torch.')} weights)"
                   if model is not None else "")
        print(f"adaptrack: serving {name!r}{weights} at http://{where}:{port}/v1 (SIGTERM or "
              "Ctrl-C stops after the requests in flight)", file=sys.stderr, flush=True)
        _warn_open(args.host, api_key)
        config = uvicorn.Config(app, log_level=args.log_level, lifespan="on",
                                timeout_graceful_shutdown=None)
        _serve(uvicorn.Server(config), sock)
    finally:
        sock.close()
    return 0


def _warn_open(host: str, api_key: str | None) -> None:
    if not _loopback(host) and api_key is None:
        print(f"adaptrack: warning: listening on {host} without an API key: anyone "
              f"who can reach it can use the model (--api-key or ${API_KEY_ENV})",
              file=sys.stderr, flush=True)


def _serve(server: Any, sock: socket.socket) -> None:
    """Run uvicorn until SIGTERM or SIGINT, then let it finish the requests in flight.
    uvicorn raises the signal again once it has shut down; a handler that ignores it makes
    that a normal exit (status 0) instead of death by the signal."""
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM,
                                                                     signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_replicas(args: argparse.Namespace, api_key: str | None) -> int:
    """Serve ``args.replicas`` replicas (Ray Serve must be installed: else a one-line
    error naming the extra)."""
    try:
        import uvicorn

        from ..serve.front import create_front
        from ..serve.replicas import launch, ray_serve
    except ImportError as err:
        raise UsageError(f"adaptrack serve needs the serve extra: pip install "
                         f"'adaptrack[serve]' ({err})") from None
    ray_serve()  # Ray Serve missing: the error says which extra, before any other work
    sock = listen(args.host, args.port)
    try:
        n = args.replicas
        # Each replica's model gets an equal share of this machine's cores by default.
        threads = args.threads or max(1, (os.cpu_count() or 1) // n)
        load = functools.partial(load_model, args.model, backend=args.backend,
                                 device=args.device, threads=threads, dtype=args.dtype)
        name = args.served_model_name or args.model or GGUF_NAME.split(".")[0]
        options = dict(model_name=name, api_key=api_key, max_concurrent=args.max_concurrent,
                       max_queue=args.max_queue, timeout=args.timeout,
                       search_seconds=args.search_seconds, batch_size=args.batch_size,
                       tree_cache_bytes=args.tree_cache_bytes)
        print(f"adaptrack: starting {n} replicas of {name!r} on Ray Serve", file=sys.stderr,
              flush=True)
        begun = time.perf_counter()
        replicas = launch(load, n, options, gpus=args.device != "cpu")
        try:
            host, port = sock.getsockname()[:2]
            where = f"[{host}]" if ":" in host else host
            print(f"adaptrack: serving {name!r} on {n} replicas (started in "
                  f"{time.perf_counter() - begun:.1f} s) at http://{where}:{port}/v1 "
                  "(SIGTERM or Ctrl-C stops after the requests in flight)", file=sys.stderr,
                  flush=True)
            _warn_open(args.host, api_key)
            config = uvicorn.Config(create_front(replicas),
                                    log_level=args.log_level, lifespan="off",
                                    timeout_graceful_shutdown=None)
            _serve(uvicorn.Server(config), sock)
        finally:
            replicas.close()
    finally:
        sock.close()
    return 0
