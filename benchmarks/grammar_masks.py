"""Grammar masks through llguidance on the default model's vocabulary (49 152 tokens).

Compares two ways to keep llguidance's state in the prefix tree:

- ``cursor`` (what :mod:`adaptrack.constraints.grammar` ships): a state is the token tuple;
  one LLMatcher moves forward, and jumps elsewhere restart from a copy of the nearest
  checkpoint (every 16 tokens) and feed the rest before a mask.
- ``copy``: a state holds its own LLMatcher, made by ``deep_copy`` of the parent's plus one
  ``consume_token``.

The walk imitates the samplers: go down by a random valid token, often back up to a random
ancestor on the current path, sometimes jump to any node made so far (another branch), end
on EOS where the grammar accepts. Both designs replay the same walk (same seed, same masks).
Per new prefix it times ``advance`` (making the child), the first ``allowed`` (its mask:
cursor move + llguidance + conversion to ids) and, inside that, llguidance's own
``compute_bitmask``.

Run:  python benchmarks/grammar_masks.py [--nodes 2000] [--seed 0] [--depth 64]
      [--forced-nodes 500] [--maskbench 6] [--repeat 5] [--only-forced]
(each row runs in a subprocess of its own so that "KiB/node", the growth of resident memory
per new prefix, is that design's: masks cached plus, for ``copy``, one LLMatcher per prefix)
The vocabulary comes from /tmp/smol_vocab.pkl (a pickled Vocabulary) when present, else
from the default model's converted tokenizer.json (needs ``adaptrack setup``).

Then it times forced bytes (``GrammarMatcher.forced_bytes``) with and without the samplers'
limit against llguidance's ``compute_ff_bytes`` on the token matcher, at the prefixes of a
walk and at those of valid instances of a few MaskBench schemas (../shared/data), and on
``a{99999999}|b`` with a limit of 64 bytes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from llguidance import LLMatcher

from adaptrack.constraints import DONE
from adaptrack.constraints.grammar import (
    Grammar,
    GrammarMatcher,
    json_schema,
    lark,
    ll_vocab,
    regex,
)
from adaptrack.tokenization.vocab import Vocabulary

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string",
                                                             "pattern": "^[0-9]{5}$"}},
            "required": ["city"],
        },
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}

LARK = r"""
start: stmt+
stmt: NAME "=" expr ";" | "print" "(" expr ")" ";"
?expr: term (("+" | "-") term)*
?term: factor (("*" | "/") factor)*
?factor: NUMBER | NAME | "(" expr ")" | NAME "(" [expr ("," expr)*] ")"
NAME: /[a-z_][a-z0-9_]*/
NUMBER: /[0-9]+(\.[0-9]+)?/
%ignore /[ \t\n]+/
"""


def default_vocabulary() -> Vocabulary:
    pkl = Path("/tmp/smol_vocab.pkl")
    if pkl.exists():
        with pkl.open("rb") as f:
            return pickle.load(f)
    from tokenizers import Tokenizer

    from adaptrack.lm.default import GGUF_NAME, cache_dir
    from adaptrack.tokenization.hf import vocabulary

    found = sorted((cache_dir() / "converted").glob(f"{Path(GGUF_NAME).stem}-*/tokenizer.json"))
    if not found:
        raise SystemExit("the default model is not set up and converted: run `adaptrack setup`")
    config = json.loads((found[0].parent / "config.json").read_text())
    return vocabulary(Tokenizer.from_file(str(found[0])), config["vocab_size"], config=config)


class _Timed:
    """Records llguidance's own compute_bitmask time."""

    ll_times: list[float]

    def _compute(self, matcher: LLMatcher) -> tuple[np.ndarray, bool]:
        t0 = time.perf_counter()
        raw = matcher.compute_bitmask()
        self.ll_times.append(time.perf_counter() - t0)
        return self._packed(raw, matcher)  # type: ignore[attr-defined]


class CursorMatcher(_Timed, GrammarMatcher):
    def __init__(self, grammar: Grammar, vocab: Vocabulary) -> None:
        super().__init__(grammar, vocab)
        self.ll_times = []


class _Copy:
    """A state of the copy design: its own LLMatcher and, once computed, its mask."""

    __slots__ = ("mask", "matcher")

    def __init__(self, matcher: LLMatcher) -> None:
        self.matcher, self.mask = matcher, None


class CopyMatcher(_Timed, GrammarMatcher):
    def __init__(self, grammar: Grammar, vocab: Vocabulary) -> None:
        super().__init__(grammar, vocab)
        self.ll_times = []

    def start(self) -> _Copy:
        return _Copy(self._new_matcher())

    def _mask(self, state: _Copy) -> tuple[np.ndarray, bool]:  # type: ignore[override]
        if state.mask is None:
            state.mask = self._compute(state.matcher)
        return state.mask

    def advance(self, state, token):  # type: ignore[no-untyped-def]
        if state is DONE:
            return None
        bits, accepting = self._mask(state)
        if self.vocab.is_eos(token):
            return DONE if accepting else None
        if not bits[token >> 3] >> (token & 7) & 1:
            return None
        child = state.matcher.deep_copy()
        child.consume_token(token)
        return _Copy(child)


def walk(m: GrammarMatcher, nodes: int, seed: int, depth: int,
         made: list | None = None) -> dict[str, list[float]]:
    """Make ``nodes`` new prefixes the way the samplers move; time each one. The prefixes
    are appended to ``made`` (in the order made) when it is given."""
    rng = random.Random(seed)
    eos = int(m.vocab.eos_ids[0])
    made = [m.start()] if made is None else made
    made[:] = [m.start()]
    path = [made[0]]
    t_adv: list[float] = []
    t_mask: list[float] = []
    t0 = time.perf_counter()
    m.allowed(path[0])
    t_mask.append(time.perf_counter() - t0)
    while len(t_adv) < nodes:
        r = rng.random()
        if r < 0.15 and len(path) > 1:  # back up on this path
            path = path[: rng.randrange(1, len(path))]
        elif r < 0.20:  # jump to another branch
            k = rng.randrange(len(made))
            path = [made[k]]
        state = path[-1]
        ids = m.allowed(state)
        if not len(ids):
            path = [made[0]]
            continue
        # EOS where accepted, sometimes; else a random valid token, short ones preferred
        # (like a model, which rarely writes 15-byte tokens inside JSON strings).
        if eos in m.finishing(state) and rng.random() < 0.3:
            token = eos
        else:
            pick = [int(ids[rng.randrange(len(ids))]) for _ in range(4)]
            token = min(pick, key=lambda t: len(m.vocab.bytes_of(t)) or 99)
        t0 = time.perf_counter()
        child = m.advance(state, token)
        dt = time.perf_counter() - t0
        if child is None:
            raise AssertionError(f"token {token} from the mask was rejected")
        if child is DONE:
            path = [made[0]]
            continue
        t_adv.append(dt)
        t0 = time.perf_counter()
        m.allowed(child)
        t_mask.append(time.perf_counter() - t0)
        made.append(child)
        path.append(child)
        if len(path) > depth:
            path = path[:1]
    return {"advance": t_adv, "mask": t_mask, "llguidance": getattr(m, "ll_times", [])}


def _rss() -> int:
    """Resident memory in bytes (llguidance allocates outside Python's view)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))]
    return f"{statistics.median(xs) * 1e3:7.3f} {p99 * 1e3:7.3f}"


GRAMMARS = {"json_schema": lambda: json_schema(SCHEMA), "lark": lambda: lark(LARK)}
DESIGNS = {"cursor": CursorMatcher, "copy": CopyMatcher}


def row(gname: str, dname: str, args: argparse.Namespace) -> None:
    """One table row, in a process of its own so that its memory growth is its own."""
    vocab = default_vocabulary()
    ll_vocab(vocab)
    g = GRAMMARS[gname]()
    t0 = time.perf_counter()
    m = DESIGNS[dname](g, vocab)
    bind = time.perf_counter() - t0
    rss = _rss()
    t0 = time.perf_counter()
    times = walk(m, args.nodes, args.seed, args.depth)
    total = (time.perf_counter() - t0) / args.nodes
    kib = (_rss() - rss) / args.nodes / 1024
    print(f"{gname:12} {dname:7} {bind * 1e3:8.1f} | {_ms(times['advance']):>15} "
          f"{_ms(times['mask']):>15} {_ms(times['llguidance']):>15} {total * 1e3:10.3f} "
          f"{kib:8.1f}", flush=True)


MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench-dev.jsonl.gz"


def maskbench_cases(count: int) -> list[tuple[str, Any, bytes]]:
    """The first ``count`` MaskBench schemas (every 500th line, for variety) with a valid
    instance: (name, schema, the instance as compact JSON)."""
    found: list[tuple[str, Any, bytes]] = []
    if count <= 0 or not MASKBENCH.exists():
        return found
    with gzip.open(MASKBENCH, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f):
            if n % 500:
                continue
            case = json.loads(line)
            tests = [t for t in case.get("tests", []) if t.get("valid")]
            if isinstance(case.get("schema"), dict) and tests:
                data = json.dumps(tests[0]["data"], separators=(",", ":"), ensure_ascii=False)
                found.append((case["name"], case["schema"], data.encode()))
            if len(found) == count:
                break
    return found


def text_states(m: GrammarMatcher, text: bytes) -> list[tuple[int, ...]]:
    """The prefixes of ``text`` tokenized greedily, as far as the grammar takes them."""
    states = [m.start()]
    for token in m.vocab.longest_match(text):
        child = m.advance(states[-1], token)
        if child is None or child is DONE:
            break
        states.append(child)
    return states


def time_forced(make: Any, vocab: Vocabulary, states: list, depth: int,
                repeat: int) -> list[str]:
    """Forced bytes at ``states`` (visited in order, as the samplers visit them) three ways,
    each on a fresh matcher: llguidance's ``compute_ff_bytes`` on a copy of the token
    matcher, ``forced_bytes(state)`` and ``forced_bytes(state, limit)`` with the samplers'
    limit (tokens left to ``depth`` times the longest token's bytes). Each way runs
    ``repeat`` times; a state's time is its fastest (other processes preempt this one)."""
    cells, want, build = [], None, []
    for how in ("llguidance", "no limit", "limit"):
        times = [float("inf")] * len(states)
        for _ in range(repeat):
            m = GrammarMatcher(make(), vocab)  # its own compiled grammar: nothing found yet
            if how != "llguidance":  # timed apart: once per matcher
                t0 = time.perf_counter()
                m._forced._track()
                build.append(time.perf_counter() - t0)
            got = []
            for i, s in enumerate(states):
                t0 = time.perf_counter()
                if how == "llguidance":
                    out = bytes(m._goto(s).deep_copy().compute_ff_bytes())
                elif how == "no limit":
                    out = m.forced_bytes(s)
                else:
                    out = m.forced_bytes(s, limit=max(0, depth - len(s)) * m.ll.longest)
                times[i] = min(times[i], time.perf_counter() - t0)
                got.append(out)
            if want is None:
                want = got
            elif got != [w[: len(g)] if how == "limit" else w
                         for w, g in zip(want, got, strict=True)]:
                raise AssertionError(f"{how}: forced bytes differ from llguidance's")
        cells.append(f"{sum(times) * 1e3:8.2f} {_ms(times)}")
    n_forced = sum(bool(w) for w in want or [])
    return [f"{len(states):6d} {n_forced:6d} {sum(len(w) for w in want or []):7d}", *cells,
            f"{min(build) * 1e3:6.2f}"]


def forced_table(args: argparse.Namespace) -> None:
    vocab = default_vocabulary()
    print(f"\nforced bytes: ms in all, then median / p99 ms a state (fastest of {args.repeat} "
          f"runs); limit = (depth - tokens) "
          f"x {ll_vocab(vocab).longest} bytes (the longest token); 'byte m.': ms to make the "
          "byte matcher (once per GrammarMatcher, not in the columns before)")
    print(f"{'grammar':24} {'states':>6} {'forced':>6} {'bytes':>7} | "
          f"{'llguidance':>24} | {'forced_bytes(s)':>24} | {'forced_bytes(s, limit)':>24} | "
          "byte m.")
    rows: list[tuple[str, Any, list]] = []
    for gname, make in GRAMMARS.items():
        made: list = []
        walk(GrammarMatcher(make(), vocab), args.forced_nodes, args.seed, args.depth, made)
        rows.append((f"{gname} (walk)", make, made))
    for name, schema, data in maskbench_cases(args.maskbench):
        try:
            g = json_schema(schema)
            states = text_states(g.bind(vocab), data)
        except (ValueError, RuntimeError) as err:  # schemas llguidance refuses
            print(f"{name[:24]:24} skipped: {str(err)[:60]}")
            continue
        rows.append((name[:24], lambda g=g: g, states))
    for name, make, states in rows:
        cells = time_forced(make, vocab, states, args.depth, args.repeat)
        print(f"{name:24} " + " | ".join(cells), flush=True)
    a = int(vocab.longest_match(b"a")[0])
    first, then = [], []
    for _ in range(args.repeat):
        m = regex("a{99999999}|b").bind(vocab)
        s = m.advance(m.start(), a)
        t0 = time.perf_counter()
        assert m.forced_bytes(s, limit=64) == b"a" * 64
        t1 = time.perf_counter()
        assert m.forced_bytes(m.advance(s, a), limit=64) == b"a" * 64
        first.append(t1 - t0)
        then.append(time.perf_counter() - t1)
    print(f"regex a{{99999999}}|b after 'a', forced_bytes(s, limit=64), fastest of {args.repeat}:"
          f" {min(first) * 1e3:.2f} ms (first call: makes the byte matcher), then "
          f"{min(then) * 1e3:.2f} ms one token further")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", type=int, default=64, help="longest prefix (max_new_tokens)")
    ap.add_argument("--forced-nodes", type=int, default=500,
                    help="walk states at which forced bytes are timed")
    ap.add_argument("--maskbench", type=int, default=6,
                    help="MaskBench schemas (../shared/data) whose valid instance is walked")
    ap.add_argument("--repeat", type=int, default=5,
                    help="runs of each forced-bytes way (a state's fastest counts)")
    ap.add_argument("--only-forced", action="store_true", help="skip the mask table")
    ap.add_argument("--row", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        row(*args.row.split(":"), args)
        return
    if args.only_forced:
        forced_table(args)
        return
    vocab = default_vocabulary()
    t0 = time.perf_counter()
    ll_vocab(vocab)
    print(f"vocabulary: {vocab.size} tokens; LLTokenizer built in "
          f"{time.perf_counter() - t0:.3f} s (cached per Vocabulary); {args.nodes} new "
          f"prefixes per row, depth <= {args.depth}")
    print(f"{'grammar':12} {'design':7} {'bind ms':>8} | median / p99 in ms: "
          f"{'advance':>15} {'mask (allowed)':>15} {'llguidance':>15} {'total/node':>10} "
          f"{'KiB/node':>8}", flush=True)
    for gname in GRAMMARS:
        for dname in DESIGNS:
            subprocess.run([sys.executable, __file__, "--row", f"{gname}:{dname}",
                            "--nodes", str(args.nodes), "--seed", str(args.seed),
                            "--depth", str(args.depth)], check=True)
    forced_table(args)


if __name__ == "__main__":
    main()
