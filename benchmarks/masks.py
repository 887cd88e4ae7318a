"""Mask time per new node on the default model's 49k vocabulary, for each kind of constraint,
against llguidance's own mask time on the same language.

A *new node* is a prefix the sampler has not seen: the constraint computes its valid-token
set from scratch (caches cleared), exactly what ``PrefixTree`` pays once per prefix. Nodes
are the prefixes of real outputs, tokenized the way the model tokenizes them:

- **choice / TF names**: ``api_names`` over the TF 2.16 API without ``compat`` (the v2
  setting), nodes along ``"." + name + "("`` for random names. llguidance: the Lark grammar
  ``start: "." NAME "("`` with NAME the alternation of the same names.
- **predicate / TF names**: the same language as a Python oracle (``bisect`` over the sorted
  names), checked lazily in probability order (``checked_nucleus``) under the model's real
  next-token distribution at each node, at top_p 1 (every candidate with p > 0 is asked) and
  0.95 (the paper's cutoff: asking stops early).
- **JSON schema**: MaskBench (``../shared/data/maskbench-dev.jsonl.gz``) schemas, nodes along
  each valid instance written as compact JSON. llguidance: ``compute_bitmask`` of an
  ``LLMatcher`` on the same grammar at the same prefix.
- **Lark grammar**: a JSON grammar in Lark over the same instances.

Our time is ``allowed(state)`` (for the grammars: moving the cursor there, llguidance's mask,
and turning its bits into sorted ids); llguidance's is ``compute_bitmask`` alone on a matcher
already at the prefix.

Run:  python benchmarks/masks.py [--names 200] [--instances 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import gzip
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from llguidance import LLMatcher
from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

import adaptrack as at
from adaptrack.constraints import api_names, json_schema, lark, predicate
from adaptrack.constraints.api import API_TERMINATORS
from adaptrack.constraints.grammar import ll_vocab
from adaptrack.eval.tfapi import tensorflow_api_names
from adaptrack.eval.tfv1 import FIGURE3_PROMPT
from adaptrack.sampling.topp import checked_nucleus

MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench-dev.jsonl.gz"
JSON_LARK = r"""
start: value
?value: object | array | string | NUMBER | "true" | "false" | "null"
object: "{" [pair ("," pair)*] "}"
pair: string ":" value
array: "[" [value ("," value)*] "]"
string: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4})*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
"""


def stats_ms(times: list[float]) -> tuple[float, float]:
    a = np.asarray(times) * 1e3
    return float(np.median(a)), float(np.percentile(a, 99))


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def prefixes(tokens: list[int]) -> list[tuple[int, ...]]:
    return [tuple(tokens[:i]) for i in range(len(tokens))]


def ll_times(lm: at.LanguageModel, grammar_text: str, walks: list[list[int]]) -> list[float]:
    """llguidance's own mask time at every prefix of every walk (matcher moved there first)."""
    tok = ll_vocab(lm.vocab).tokenizer
    out = []
    for walk in walks:
        m = LLMatcher(tok, grammar_text + '\n%llguidance {"no_forcing": true}\n', log_level=0)
        for t in walk:
            out.append(timed(m.compute_bitmask))
            if not m.consume_token(t):
                break
    return out


def walk_times(lm: at.LanguageModel, constraint: at.constraints.Constraint,
               walks: list[list[int]]) -> list[float]:
    """Our mask time per new node along the walks (a fresh matcher, so nothing is cached)."""
    matcher = constraint.bind(lm.vocab)
    out = []
    for walk in walks:
        state = matcher.start()
        for t in walk:
            cache = getattr(matcher, "_masks", None)
            if cache is not None:
                cache.clear()
            out.append(timed(lambda s=state: matcher.allowed(s)))
            state = matcher.advance(state, t)
            if state is None or state is at.constraints.DONE:
                break
    return out


def tf_rows(lm: at.LanguageModel, n_names: int, rng: random.Random) -> list[tuple]:
    names = [n for n in tensorflow_api_names() if not n.startswith(("compat.", "__"))]
    picked = rng.sample(names, n_names)
    walks = [lm.encode("." + n + "(") for n in picked]
    rows = []
    choice_c = api_names(names)
    ours = walk_times(lm, choice_c, walks)
    alternation = " | ".join(json.dumps(n) for n in names)
    theirs = ll_times(lm, f'start: "." NAME "("\nNAME: {alternation}', walks)
    rows.append(("choice (api_names, TF 2.16 v2)", len(ours), *stats_ms(ours), *stats_ms(theirs),
                 f"{len(names)} names"))

    # The oracle: the same language asked of Python, under the model's real distribution.
    dotted = sorted("." + n for n in names)  # prefix_ok never sees a terminator
    full = set(dotted)
    terminators = set(API_TERMINATORS.decode())

    def prefix_ok(text: str) -> bool:
        i = bisect.bisect_left(dotted, text)
        return i < len(dotted) and dotted[i].startswith(text)

    def is_complete(text: str) -> bool:
        return text[-1:] in terminators and text[:-1] in full

    oracle = predicate(prefix_ok, is_complete, terminators=API_TERMINATORS)
    prompt = lm.encode(FIGURE3_PROMPT)
    nodes = [p for w in walks for p in prefixes(w)]
    probs = np.exp(lm.next_logprobs([tuple(prompt) + p for p in nodes]))
    for top_p in (1.0, 0.95):
        m = oracle.bind(lm.vocab)
        times = []
        for node, row in zip(nodes, probs, strict=True):
            state = lm.vocab.decode(node)
            candidates = m.allowed(state)

            def check(tok: int, m: at.constraints.Matcher = m, state: bytes = state) -> bool:
                return m.advance(state, tok) is not None

            with m.checking():
                started = time.perf_counter()
                checked_nucleus(row, candidates, check, top_p)
                times.append(time.perf_counter() - started)
        checks = m.checks / len(nodes)
        rows.append((f"predicate (bisect over the names), top_p {top_p}", len(times),
                     *stats_ms(times), None, None, f"{checks:.0f} checks a node"))
    return rows


def maskbench(limit: int, rng: random.Random) -> list[tuple[dict, str]]:
    cases = []
    with gzip.open(MASKBENCH, "rt") as f:
        for line in f:
            d = json.loads(line)
            schema, tests = d["schema"], d["tests"]
            if isinstance(schema, str):
                schema = json.loads(schema)
            if isinstance(tests, str):
                tests = json.loads(tests)
            valid = [t["data"] for t in tests if t.get("valid")]
            if valid:
                cases.append((schema, json.dumps(valid[0], separators=(",", ":"))))
    return rng.sample(cases, min(limit, len(cases)))


def json_rows(lm: at.LanguageModel, limit: int, rng: random.Random) -> list[tuple]:
    ours: list[float] = []
    theirs: list[float] = []
    used = 0
    for schema, text in maskbench(limit, rng):
        try:
            c = json_schema(schema)
        except ValueError:
            continue  # llguidance rejects a few MaskBench schemas
        walk = lm.encode(text)[:200]
        ours += walk_times(lm, c, [walk])
        theirs += ll_times(lm, c.lark_text.split("\n%llguidance")[0], [walk])
        used += 1
    rows = [("JSON schema (MaskBench)", len(ours), *stats_ms(ours), *stats_ms(theirs),
             f"{used} schemas")]
    walks = [lm.encode(text)[:200] for _, text in maskbench(limit, rng)]
    ours = walk_times(lm, lark(JSON_LARK), walks)
    theirs = ll_times(lm, JSON_LARK, walks)
    rows.append(("Lark grammar (JSON)", len(ours), *stats_ms(ours), *stats_ms(theirs),
                 f"{len(walks)} instances"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--names", type=int, default=200, help="TF names walked (default 200)")
    ap.add_argument("--instances", type=int, default=40, help="MaskBench instances (default 40)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    lm = at.load_model()
    print(f"# mask time per new node, {datetime.date.today()}, {cpu_name()}, "
          f"load {load()}, vocabulary {lm.vocab.size}, model {getattr(lm, 'name', '')}")
    rows = tf_rows(lm, args.names, rng)
    if MASKBENCH.exists():
        rows += json_rows(lm, args.instances, rng)
    else:
        print(f"(skipping JSON rows: {MASKBENCH} is absent)")
    print("| constraint | nodes | median ms | p99 ms | llguidance median ms | "
          "llguidance p99 ms | note |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, n, med, p99, ll_med, ll_p99, note in rows:
        ll = ("—", "—") if ll_med is None else (f"{ll_med:.3f}", f"{ll_p99:.3f}")
        print(f"| {name} | {n} | {med:.3f} | {p99:.3f} | {ll[0]} | {ll[1]} | {note} |")


if __name__ == "__main__":
    main()
