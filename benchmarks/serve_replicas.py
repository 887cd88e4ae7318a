"""``adaptrack serve --replicas N`` measured: the time to start, 16 concurrent requests,
and what prefix-aware routing saves on requests that share a prompt prefix.

The script starts ``adaptrack serve --replicas N`` (default 2; 1 is the single process,
without Ray) on 127.0.0.1 with the default model and ``--threads`` per replica, and
reports:

- start: seconds from the command to its "serving" line (Ray, the replicas, their models);
- 16 at once: 16 chat requests for a JSON object (cd, ``response_format``), each with its
  own prompt, from 16 client threads: wall time, how many each replica answered, failures;
- prefix reuse: a request, then the same request (the second samples the first one's
  prefix tree on the replica that holds it: its model calls and time), and a chat's two
  turns (the second goes where the first went, whose KV states it starts with).

Run:  python benchmarks/serve_replicas.py [--replicas 2] [--threads 1] [--model SPEC]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import time

import openai

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                 "strict": True}}


def start(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str, float]:
    cmd = [sys.executable, "-m", "adaptrack", "serve", "--port", "0", "--replicas",
           str(args.replicas), "--threads", str(args.threads), "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RAY_ADDRESS": "local"})
    assert proc.stderr is not None
    line = ""
    while "serving" not in line:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"adaptrack serve exited with {proc.returncode}")
    found = re.search(r"http://([^ /]+)/v1", line)
    assert found is not None, line
    while True:  # the single process prints its line before it listens
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection(found.group(1), timeout=60)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                break
        time.sleep(0.1)
    return proc, found.group(0), time.perf_counter() - began


def chat(c: openai.OpenAI, messages: list[dict[str, str]], **extra: object) -> tuple[
        dict[str, object], str, float]:
    model = c.models.list().data[0].id
    began = time.perf_counter()
    r = c.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                  max_tokens=40, response_format=FORMAT,  # type: ignore[arg-type]
                                  extra_body=extra, seed=0)
    extra_fields = r.model_extra or {}
    return extra_fields["adaptrack"], r.choices[0].message.content or "", (
        time.perf_counter() - began)


def concurrent16(c: openai.OpenAI) -> None:
    def one(i: int) -> tuple[str, bool]:
        try:
            stats, text, _ = chat(c, [{"role": "user", "content": f"Invent person number "
                                                                  f"{i}: a name and an age."}],
                                  decoding_method="cd")
            json.loads(text)
            return str(stats["replica"] if "replica" in stats else "single"), True
        except Exception:
            return "-", False

    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    wall = time.perf_counter() - began
    served = collections.Counter(name for name, ok in results if ok)
    failed = sum(not ok for _, ok in results)
    print(f"16 at once: {wall:.1f} s wall, {16 / wall:.2f} requests/s, answered by "
          f"{dict(sorted(served.items()))}, {failed} failed")


def reuse(c: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "Invent one person: a name and an age."}]
    for label in ("first", "same again"):
        stats, _, secs = chat(c, ask, decoding_method="adaptrack")
        print(f"{label}: {stats.get('replica', 'single')}, {stats['lm_calls']} model calls, "
              f"trees reused {stats['trees_reused']}, {secs:.2f} s")
    turn = [{"role": "system", "content": "You invent people for a novel."},
            {"role": "user", "content": "Invent one person: a name and an age."}]
    stats, text, secs = chat(c, turn, decoding_method="cd")
    print(f"chat turn 1: {stats.get('replica', 'single')}, {secs:.2f} s")
    turn += [{"role": "assistant", "content": text},
             {"role": "user", "content": "Now one more person, older."}]
    stats, _, secs = chat(c, turn, decoding_method="cd")
    print(f"chat turn 2: {stats.get('replica', 'single')}, {secs:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per replica")
    parser.add_argument("--model", help="model spec (default: the default model)")
    args = parser.parse_args()
    proc, url, secs = start(args)
    try:
        print(f"--replicas {args.replicas}, --threads {args.threads}: serving after "
              f"{secs:.1f} s")
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        chat(c, [{"role": "user", "content": "warm up"}], decoding_method="cd")
        concurrent16(c)
        reuse(c)
    finally:
        proc.terminate()
        proc.wait(120)


if __name__ == "__main__":
    main()
