"""The memory of ``adaptrack serve`` under prompts far longer than its context (issue 47,
docs/security.md): its resident set before, at its peak while ``--clients`` requests with
a ``--mb`` MB prompt each are in flight at once, and after; and how long each took to be
refused (400 ``context_length_exceeded``).

The script starts ``adaptrack serve`` on 127.0.0.1 (a free port, loopback only) with the
default model, waits for ``/health``, then sends the requests from that many threads (a
bounded number, once) while a thread samples the server's RSS every 50 ms (psutil).

Run:  python benchmarks/serve_memory.py [--clients 4] [--mb 30] [--chat | --ids]
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time

import psutil


def start(port_line: re.Pattern[str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "adaptrack", "serve", "--port", "0",
                             "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        found = port_line.search(line)
        if found:
            return proc, int(found.group(1))
    raise SystemExit("the server did not start")


def post(port: int, path: str, body: bytes) -> tuple[int, float, str]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    code = json.loads(data).get("error", {}).get("code", "") if data else ""
    return resp.status, time.perf_counter() - started, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--mb", type=float, default=30.0)
    parser.add_argument("--chat", action="store_true", help="send messages, not a prompt")
    parser.add_argument("--ids", action="store_true",
                        help="send the prompt as token ids (the largest body to parse)")
    args = parser.parse_args()
    proc, port = start(re.compile(r"at http://127\.0\.0\.1:(\d+)/v1"))
    try:
        for _ in range(600):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        server = psutil.Process(proc.pid)
        before = server.memory_info().rss
        text = "The quick brown fox jumps over the lazy dog. " * int(args.mb * 1e6 / 45)
        if args.ids:  # "1000, " is 6 bytes a token
            path, doc = "/v1/completions", {"prompt": [1000] * int(args.mb * 1e6 / 6),
                                            "max_tokens": 8}
        elif args.chat:
            path, doc = "/v1/chat/completions", {"messages": [{"role": "user",
                                                                "content": text}]}
        else:
            path, doc = "/v1/completions", {"prompt": text, "max_tokens": 8}
        body = json.dumps(doc).encode()
        peak, done = [before], threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], server.memory_info().rss)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        results: list[tuple[int, float, str]] = []
        threads = [threading.Thread(target=lambda: results.append(post(port, path, body)))
                   for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        time.sleep(1.0)
        after = server.memory_info().rss
        mib = 1 << 20
        print(f"{args.clients} x {len(body) / 1e6:.1f} MB bodies to {path}: "
              f"{[f'{s} {c} {t:.1f} s' for s, t, c in results]}")
        print(f"server RSS: before {before / mib:.0f} MiB, peak {peak[0] / mib:.0f} MiB "
              f"(+{(peak[0] - before) / mib:.0f}), after {after / mib:.0f} MiB")
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
