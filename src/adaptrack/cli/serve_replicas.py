"""``adaptrack serve --replicas N``: N replicas of the model on Ray Serve behind one
endpoint on ``--host``/``--port`` (``adaptrack.serve.replicas`` and ``.front``), with the
single server's flags. SIGTERM or Ctrl-C stop taking requests, let those in flight
finish on their replicas, then delete the replicas.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

from ..lm.default import GGUF_NAME
from ..lm.load import load_model
from .common import UsageError
from .serve import _serve, _warn_open, listen


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
