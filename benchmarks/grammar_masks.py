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
(each row runs in a subprocess of its own so that "KiB/node", the growth of resident memory
per new prefix, is that design's: masks cached plus, for ``copy``, one LLMatcher per prefix)
The vocabulary comes from /tmp/smol_vocab.pkl (a pickled Vocabulary) when present, else
from the default model's converted tokenizer.json (needs ``adaptrack setup``).
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from llguidance import LLMatcher

from adaptrack.constraints import DONE
from adaptrack.constraints.grammar import Grammar, GrammarMatcher, json_schema, lark, ll_vocab
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
    import json

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


def walk(m: GrammarMatcher, nodes: int, seed: int, depth: int) -> dict[str, list[float]]:
    """Make ``nodes`` new prefixes the way the samplers move; time each one."""
    rng = random.Random(seed)
    eos = int(m.vocab.eos_ids[0])
    made = [m.start()]
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
    return {"advance": t_adv, "mask": t_mask, "llguidance": m.ll_times}  # type: ignore[attr-defined]


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", type=int, default=64, help="longest prefix (max_new_tokens)")
    ap.add_argument("--row", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        row(*args.row.split(":"), args)
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


if __name__ == "__main__":
    main()
