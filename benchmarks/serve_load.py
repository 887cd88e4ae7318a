"""A bounded load test of ``adaptrack serve``: throughput and latency at 1, 4 and 16
concurrent clients, for cd and adaptrack with a JSON schema, and a count of failed or lost
requests (the target is none).

The script starts ``adaptrack serve`` on 127.0.0.1 (a free port, loopback only) with the
default model, waits for ``/health``, sends one warm-up request, then for each method and
concurrency sends a fixed number of chat requests (``--requests``, 32 by default) from that
many client threads through the ``openai`` client. Each request asks for a fictional person
as JSON under ``SCHEMA`` (``response_format``, strict whitespace), with its own prompt
(person number i, numbered across all configurations, so that no request reuses another's
prefix tree; the backend's KV cache still shares the common prompt prefix) and ``seed=i``.
A configuration stops starting requests at ``--time-limit`` seconds; requests not started
then are reported as "not run".

Per configuration: requests answered 200 with JSON valid under the schema ("ok"), failed
(any other answer or invalid JSON), not run; wall time from the first request's start to the
last one's end; requests/s and completion tokens/s over that wall time; p50 and p99 latency;
model calls per request (the ``adaptrack`` field); requests the server's CD fallback
answered after the search ran past ``--search-seconds``; the CPU seconds the client threads
used (they share the machine with the server). The last table gives each method's
throughput at each concurrency over its one-at-a-time throughput; the target is at least 3×
for cd at 16 concurrent requests (transformers backend, a CPU).

Run:  python benchmarks/serve_load.py [--requests 32] [--concurrency 1,4,16]
                                      [--methods cd,adaptrack] [--threads N] [--time-limit 600]
                                      [--no-fast-forward] [--dtype bfloat16]
      python benchmarks/serve_load.py --requests 4 --concurrency 1,4 --max-tokens 40  (smoke)
      python benchmarks/serve_load.py --in-process   (the engine without HTTP: its bound)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "favourite_colour": {"enum": ["red", "green", "blue", "yellow"]},
    },
    "required": ["name", "age", "favourite_colour"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}


def prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Describe fictional person number {i} as JSON with "
                                        "a name, an age and a favourite colour."}]


def valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (isinstance(value, dict) and set(value) == set(SCHEMA["required"])
            and isinstance(value["age"], int) and 0 <= value["age"] <= 120
            and value["favourite_colour"] in ("red", "green", "blue", "yellow")
            and isinstance(value["name"], str) and len(value["name"]) <= 20)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "adaptrack", "serve", "--host", "127.0.0.1", "--port", "0",
           "--backend", args.backend, "--max-concurrent", str(max(args.concurrency)),
           "--max-queue", str(args.requests), "--timeout", str(args.time_limit),
           "--search-seconds", str(args.search_seconds),
           "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.dtype != "auto":
        cmd += ["--dtype", args.dtype]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    line = ""
    while "serving" not in line:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        if not line and proc.poll() is not None:
            raise SystemExit(f"adaptrack serve exited with {proc.returncode}")
    found = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    assert found, line
    url = found.group(1)
    # stderr must keep draining, or the server blocks once the pipe fills
    threading.Thread(target=lambda: [None for _ in proc.stderr],  # type: ignore[union-attr]
                     daemon=True).start()
    host, port = url.removeprefix("http://").split(":")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, url
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("the server did not become healthy within 300 s")


def one(client, method: str, i: int, max_tokens: int, fast_forward: bool = True) -> dict:
    """Request ``i``: person number ``i``, seed ``i``."""
    started = time.perf_counter()
    try:
        r = client.chat.completions.create(
            model=client.served_model, messages=prompt(i), max_tokens=max_tokens, seed=i,
            response_format={"type": "json_schema", "json_schema": {"name": "person",
                                                                    "schema": SCHEMA}},
            extra_body={"decoding_method": method, "fast_forward": fast_forward})
    except Exception as err:  # counted as failed, with its kind
        return {"ok": False, "error": f"{type(err).__name__}: {err}",
                "seconds": time.perf_counter() - started, "start": started}
    ended = time.perf_counter()
    text = r.choices[0].message.content or ""
    return {"ok": valid(text), "error": None if valid(text) else f"invalid JSON: {text!r}",
            "seconds": ended - started, "start": started, "end": ended,
            "tokens": r.usage.completion_tokens,
            "lm_calls": r.model_extra["adaptrack"]["lm_calls"],
            "fallback": bool(r.model_extra["adaptrack"]["fallback_choices"])}


def configuration(client, method: str, concurrency: int, args: argparse.Namespace,
                  first: int) -> dict:
    """Requests ``first`` … ``first + requests - 1`` (distinct prompts across configurations,
    so that none reuses the tree of an earlier one)."""
    deadline = time.perf_counter() + args.time_limit
    skipped = 0
    lock = threading.Lock()

    def task(i: int) -> dict | None:
        nonlocal skipped
        if time.perf_counter() > deadline:
            with lock:
                skipped += 1
            return None
        return one(client, method, i, args.max_tokens, not args.no_fast_forward)

    cpu = time.process_time()  # this process: the clients, on the server's cores
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = [r for r in pool.map(task, range(first, first + args.requests))
                   if r is not None]
    cpu = time.process_time() - cpu
    ok = [r for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    for r in failed[:3]:
        print(f"  failed: {r['error'][:200]}", file=sys.stderr)
    wall = (max(r.get("end", r["start"] + r["seconds"]) for r in results)
            - min(r["start"] for r in results)) if results else 0.0
    latencies = sorted(r["seconds"] for r in ok)
    return {
        "method": method, "concurrency": concurrency, "ok": len(ok), "failed": len(failed),
        "not_run": skipped, "wall": wall,
        "rps": len(ok) / wall if wall else 0.0,
        "tps": sum(r["tokens"] for r in ok) / wall if wall else 0.0,
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p99": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
        if latencies else float("nan"),
        "calls": statistics.mean(r["lm_calls"] for r in ok) if ok else float("nan"),
        "fallback": sum(r["fallback"] for r in ok),
        "client_cpu": cpu,
    }


def in_process(args: argparse.Namespace) -> None:
    """The same cd requests through the engine in this process, without HTTP: one prompt
    per ``generate`` call against ``max(concurrency)`` prompts per call (the bound on what
    the server's batching can give on this machine)."""
    import adaptrack as at

    lm = at.load_model(args.model, backend=args.backend, dtype=args.dtype)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    from adaptrack.serve.preprocess import hf_chat_template

    schema = at.constraints.json_schema(SCHEMA)
    render = hf_chat_template(lm)  # the server's prompts, token for token
    assert render is not None, "the model has no chat template"

    def ids(i: int) -> list[int]:
        return render(prompt(i))

    def run(first: int, per_call: int) -> float:
        started = time.perf_counter()
        for k in range(first, first + args.requests, per_call):
            res = at.generate(lm, [ids(i) for i in range(k, k + per_call)], schema,
                              method="cd", n=1, max_new_tokens=args.max_tokens, seed=0)
            assert all(valid(r.samples[0].text) for r in res), "invalid JSON"
        return time.perf_counter() - started

    run(1_000_000, 1)  # warm-up
    width = max(args.concurrency)
    one_s, many_s = run(0, 1), run(args.requests, width)
    print("| cd, in process | one prompt per call s | "
          f"{width} prompts per call s | speed-up |")
    print("|---|--:|--:|--:|")
    print(f"| {args.requests} requests | {one_s:.1f} | {many_s:.1f} | {one_s / many_s:.2f}× |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model spec (default: the default model)")
    parser.add_argument("--backend", default="transformers",
                        choices=("auto", "transformers", "llamacpp"))
    parser.add_argument("--threads", type=int, help="the model's CPU threads")
    parser.add_argument("--dtype", default="auto",
                        choices=("auto", "float32", "float16", "bfloat16"),
                        help="the server's weight precision (default: auto)")
    parser.add_argument("--requests", type=int, default=32, help="requests per configuration")
    parser.add_argument("--concurrency", default="1,4,16",
                        type=lambda t: [int(x) for x in t.split(",")])
    parser.add_argument("--methods", default="cd,adaptrack", type=lambda t: t.split(","))
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--search-seconds", type=float, default=60.0,
                        help="the server's search budget, past which CD answers (default 60)")
    parser.add_argument("--no-fast-forward", action="store_true",
                        help="requests with fast_forward: false (forced tokens one by one)")
    parser.add_argument("--time-limit", type=float, default=600.0,
                        help="seconds per configuration before no new request starts")
    parser.add_argument("--in-process", action="store_true",
                        help="no server: the cd requests through the engine in this process, "
                             "one prompt per call against max(concurrency) per call")
    args = parser.parse_args()
    if args.in_process:
        print(f"# the engine in process, {datetime.date.today()}; CPU: {cpu_name()}; load "
              f"average at start: {load()}", flush=True)
        return in_process(args)

    import openai

    print(f"# adaptrack serve load test, {datetime.date.today()}", flush=True)
    print(f"CPU: {cpu_name()}; load average at start: {load()}; {args.requests} requests per "
          f"configuration, max_tokens {args.max_tokens}, backend {args.backend}, threads "
          f"{args.threads or 'default'}, dtype {args.dtype}, fast-forward "
          f"{'off' if args.no_fast_forward else 'on'}"
          "\n", flush=True)
    proc, url = start_server(args)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                               timeout=args.time_limit + 60)
        client.served_model = client.models.list().data[0].id  # type: ignore[attr-defined]
        for method in args.methods:  # warm-up: grammar set-up, first prefill
            one(client, method, 1_000_000, args.max_tokens, not args.no_fast_forward)
        rows = []
        for method in args.methods:
            for c in args.concurrency:
                row = configuration(client, method, c, args, first=len(rows) * args.requests)
                rows.append(row)
                print(f"{method} ×{c}: {row['ok']} ok, {row['failed']} failed, "
                      f"{row['not_run']} not run, {row['wall']:.1f} s", file=sys.stderr,
                      flush=True)
    finally:
        proc.terminate()
        code = proc.wait(120)
    print("| method | clients | ok | failed | not run | wall s | requests/s | tokens/s | "
          "p50 s | p99 s | lm_calls/request | by the CD fallback | client CPU s |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['method']} | {r['concurrency']} | {r['ok']} | {r['failed']} | "
              f"{r['not_run']} | {r['wall']:.1f} | {r['rps']:.2f} | {r['tps']:.1f} | "
              f"{r['p50']:.2f} | {r['p99']:.2f} | {r['calls']:.1f} | {r['fallback']} | "
              f"{r['client_cpu']:.2f} |")
    print("\n| method | clients | throughput / one at a time | target |")
    print("|---|--:|--:|:-:|")
    for method in args.methods:
        base = next((r["rps"] for r in rows if r["method"] == method
                     and r["concurrency"] == 1), 0.0)
        for r in rows:
            if r["method"] == method and r["concurrency"] != 1 and base:
                target = "≥ 3×: " + ("yes" if r["rps"] >= 3 * base else "no") if (
                    method == "cd" and r["concurrency"] == 16) else ""
                print(f"| {method} | {r['concurrency']} | {r['rps'] / base:.2f}× | {target} |")
    lost = sum(r["failed"] for r in rows)
    print(f"\nfailed or lost requests: {lost}; server exit status after SIGTERM: {code}; "
          f"load average at end: {load()}")
    if lost or code != 0:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
