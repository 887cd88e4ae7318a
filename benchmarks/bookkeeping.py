"""Sampler bookkeeping per generated token on a 50 000-token TableLM (issue: core).

What is timed: one ``adaptrack.generate`` call per row (``n`` samples sharing one prefix
tree, the realistic usage), with the model's own work taken out. The model is a
:class:`adaptrack.TableLM` whose next-token weights are one of ``TABLES`` precomputed
random arrays, picked by Python's hash of the prefix, so producing them costs almost
nothing; what remains (normalising them, TableLM's checks and ``log``) is timed by wrapping
the instance's ``_next_logprobs`` and subtracted:

    bookkeeping ms/token = (generate wall time - time inside _next_logprobs) / tokens

where tokens = Σ len(sample.tokens) over the row's samples. Bookkeeping is everything the
library does around the model: softmax/temperature, constraint masks (computed lazily and
cached per matcher, so a row pays for the first mask of every constraint state it reaches),
the prefix tree, Q updates, drawing, backtracking and building the ``Sample`` objects.
For methods that explore more prefixes than they output (adaptrack, asap, exact) the
per-token cost also grows with the number of prefixes evaluated, so the table also shows
model calls (distinct prefixes evaluated), lm_requests per sample and bookkeeping per call.

The constraint is ``choice`` over a few thousand random dotted API-like names
("tf.<word>[.|_]<word>..."), terminated by "(" (and by any token holding "("). The
vocabulary holds every single byte a-z . _ ( plus name pieces (words, ".word", "_word",
"word(", word prefixes), a few "("-tokens and random lowercase filler up to 50 000 ids
(EOS last). One-off costs (vocabulary trie, constraint construction and binding, the first
mask) are timed separately.

Run:  python benchmarks/bookkeeping.py          (full run: ~1-3 s per row, fastest of 5)
      python benchmarks/bookkeeping.py --quick  (smoke run: one short run per row, ~20 s)

A second model, "aligned", multiplies the weights of the tokens the constraint allows by
``BOOST`` (like an LLM that mostly writes valid names); with the purely random model the
valid tokens hold ~0.5 % of the mass, so the backtracking methods evaluate tens to hundreds
of prefixes per sample and their per-token cost measures that search, not the bookkeeping.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import string
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

import adaptrack as at
from adaptrack.constraints import Anything, Choice, Constraint, Matcher, choice
from adaptrack.tokenization.vocab import Vocabulary

T = TypeVar("T")
VOCAB_SIZE = 50_000
TABLES = 256  # precomputed next-token weight arrays (a power of two: hash & (TABLES - 1))
NAMES = 3_000
WORDS = 600
MAX_NEW_TOKENS = 32
BOOST = 1e4  # aligned model: weight factor of the tokens the constraint allows
TARGET_MS = 0.5
TARGET_METHODS = ("cd", "adaptrack")
LOWER = string.ascii_lowercase
PAREN_TOKENS = ["(", "()", "((", "(x", "(self", "([", "({", "(*", "(**", "(0", "(1", "('",
                '("', "(_", ")(", "_(", "=(", " (", "),(", "(a"]


# ---------------------------------------------------------------------------------------
# The problem: words, names, vocabulary, model


def random_word(rng: np.random.Generator, lo: int, hi: int) -> str:
    return "".join(rng.choice(list(LOWER), size=int(rng.integers(lo, hi + 1))))


def make_words(rng: np.random.Generator, count: int) -> list[str]:
    words: set[str] = set()
    while len(words) < count:
        words.add(random_word(rng, 3, 8))
    return sorted(words)


def make_names(rng: np.random.Generator, words: Sequence[str], count: int) -> list[str]:
    """API-like dotted names: 'tf.' + 1-3 words joined by '.' or '_' (≤ 29 bytes)."""
    names: set[str] = set()
    while len(names) < count:
        parts = [words[int(i)] for i in rng.integers(0, len(words), int(rng.integers(1, 4)))]
        name = "tf." + parts[0]
        for p in parts[1:]:
            name += ("." if rng.random() < 0.6 else "_") + p
        names.add(name)
    return sorted(names)


def make_vocab(rng: np.random.Generator, words: Sequence[str], size: int) -> list[bytes]:
    """``size`` distinct token byte strings; the last entry is the EOS placeholder."""
    tokens: dict[str, None] = {}  # insertion-ordered set

    def add(t: str) -> None:
        if len(tokens) < size - 1:
            tokens.setdefault(t, None)

    for t in [*LOWER, ".", "_", "(", "tf", "tf."]:
        add(t)
    for t in PAREN_TOKENS:
        add(t)
    for w in words:
        for t in (w, "." + w, "_" + w, w + ".", w + "_"):
            add(t)
        for k in range(2, min(len(w), 5)):
            add(w[:k])
            add(w[k:])
    for w in words[::3]:
        add(w + "(")
    while len(tokens) < size - 1:
        t = random_word(rng, 2, 7)
        if rng.random() < 0.1:
            t = rng.choice([".", "_"]) + t
        add(t)
    return [t.encode() for t in tokens] + [b"<eos>"]


class BenchLM(at.TableLM):
    """TableLM over ``vocab`` whose weights come from ``tables[hash(prefix) % TABLES]``.

    ``aligned``: a model that mostly writes valid names, like an LLM that knows the API:
    the weights of the tokens the constraint allows after the prefix are multiplied by
    ``BOOST`` (computed with the model's own matcher, so it counts as model time).
    ``_next_logprobs`` is wrapped with a timer: ``model_s`` is the time spent inside it.
    """

    def __init__(self, vocab: Sequence[bytes], tables: np.ndarray,
                 aligned: at.constraints.Constraint | None = None) -> None:
        mask = len(tables) - 1
        super().__init__(vocab, self._weights, eos=len(vocab) - 1)
        self.tables, self.mask = tables, mask
        self.matcher = None if aligned is None else aligned.bind(self.vocab)
        self.states: dict[tuple[int, ...], object] = {}
        self.model_s = 0.0
        inner = self._next_logprobs

        def timed(prefixes: Sequence[tuple[int, ...]]) -> np.ndarray:
            t0 = time.perf_counter()
            out = inner(prefixes)
            self.model_s += time.perf_counter() - t0
            return out

        self._next_logprobs = timed  # type: ignore[method-assign]

    def _state(self, prefix: tuple[int, ...]) -> object:
        m = self.matcher
        assert m is not None
        if not prefix:
            return m.start()
        if prefix not in self.states:
            before = self._state(prefix[:-1])
            live = before is not None and not m.is_complete(before)
            self.states[prefix] = m.advance(before, prefix[-1]) if live else None
        return self.states[prefix]

    def _weights(self, prefix: tuple[int, ...]) -> np.ndarray:
        w = self.tables[hash(prefix) & self.mask]
        if self.matcher is None:
            return w
        state = self._state(prefix)
        if state is None or self.matcher.is_complete(state):
            return w
        w = w.copy()
        w[self.matcher.allowed(state)] *= BOOST
        return w


def make_tables(rng: np.random.Generator, count: int, size: int) -> np.ndarray:
    """Log-normal weights (σ = 2) for every token, EOS included: a peaked distribution."""
    return np.exp(2.0 * rng.standard_normal((count, size)))


# ---------------------------------------------------------------------------------------
# Rows


@dataclass(frozen=True)
class Row:
    method: str
    constraint: str  # "none" or "choice"
    model: str = "random"  # "random" or "aligned"
    share_q: bool = False

    @property
    def label(self) -> str:
        return self.method + (" share_q" if self.share_q else "")


ROWS = [
    Row("unconstrained", "none"),
    Row("cd", "none"),
    Row("unconstrained", "choice"),
    Row("cd", "choice"),
    Row("adaptrack", "choice"),
    Row("adaptrack", "choice", share_q=True),
    Row("asap", "choice"),
    Row("exact", "choice"),
    Row("cd", "choice", "aligned"),
    Row("adaptrack", "choice", "aligned"),
    Row("adaptrack", "choice", "aligned", share_q=True),
    Row("asap", "choice", "aligned"),
    Row("exact", "choice", "aligned"),
]


@dataclass
class Result:
    row: Row
    samples: int
    tokens: int
    total_s: float
    model_s: float
    bind_s: float
    lm_calls: int
    requests: float
    backtracks: int
    restarts: int
    incomplete: int
    tree_nodes: int

    @property
    def total_ms(self) -> float:
        return 1e3 * self.total_s / max(self.tokens, 1)

    @property
    def book_ms(self) -> float:
        return 1e3 * (self.total_s - self.model_s) / max(self.tokens, 1)

    @property
    def book_ms_call(self) -> float:
        return 1e3 * (self.total_s - self.model_s) / max(self.lm_calls, 1)

    @property
    def target(self) -> str:
        if self.row.method not in TARGET_METHODS:
            return "–"
        return "yes" if self.book_ms <= TARGET_MS else "no"


BIND_S = [0.0]  # time spent in Constraint.bind, which generate() calls once or twice per row


def time_binds() -> None:
    """Wrap ``bind`` of the constraints used here so a row's binding time can be shown."""
    for cls in (Anything, Choice):
        inner = cls.bind

        def bind(self: Constraint, vocab: Vocabulary,
                 _inner: Callable[[Constraint, Vocabulary], Matcher] = inner) -> Matcher:
            t0 = time.perf_counter()
            try:
                return _inner(self, vocab)
            finally:
                BIND_S[0] += time.perf_counter() - t0

        cls.bind = bind  # type: ignore[method-assign]


def run_row(lm: BenchLM, constraint: at.constraints.Constraint | None, row: Row, n: int,
            seed: int) -> Result:
    """One ``generate`` call with ``n`` samples, timed; the model's time measured apart."""
    gc.collect()
    lm.model_s = BIND_S[0] = 0.0
    options = {"share_q": True} if row.share_q else {}
    t0 = time.perf_counter()
    res = at.generate(lm, [], constraint, method=row.method, n=n, temperature=1.0,
                      max_new_tokens=MAX_NEW_TOKENS, seed=seed, **options, search_budget=None)
    total = time.perf_counter() - t0
    s = res.stats
    return Result(row, n, sum(len(x.tokens) for x in res.samples), total, lm.model_s,
                  BIND_S[0], int(s["lm_calls"]),
                  float(np.mean([x.lm_requests for x in res.samples])), int(s["backtracks"]),
                  int(s["restarts"]), int(s["incomplete"]), int(s["tree_nodes"]))


def choose_n(lm: BenchLM, constraint: at.constraints.Constraint | None, row: Row,
             target_s: float, seed: int, cap: int) -> int:
    """Samples for about ``target_s`` seconds, from calibration runs that are not reported.

    Samples get cheaper as the shared tree fills, so the probe grows until it takes a fifth
    of the target before extrapolating (rows then take ~1-3 s for a 2 s target).
    """
    n = 4
    while True:
        r = run_row(lm, constraint, row, n, seed)
        if r.total_s >= target_s / 5 or n >= cap:
            return int(np.clip(round(n * target_s / r.total_s), 1, cap))
        n *= 4


def valid_mass(lm: BenchLM, constraint: at.constraints.Constraint, samples: int) -> float:
    """Mean model mass on the constraint's allowed tokens at the prefixes cd samples visit."""
    res = at.generate(lm, [], constraint, method="cd", n=samples,
                      max_new_tokens=MAX_NEW_TOKENS, seed=0)
    m = constraint.bind(lm.vocab)
    masses = []
    for smp in res.samples:
        state, prefix = m.start(), ()
        for tok in smp.tokens:
            probs = np.exp(lm.next_logprobs([prefix])[0])
            masses.append(float(probs[m.allowed(state)].sum()))
            state, prefix = m.advance(state, tok), (*prefix, tok)
    return float(np.mean(masses))


# ---------------------------------------------------------------------------------------
# Output


def fmt_row(r: Result) -> str:
    backtracking = r.row.method in ("adaptrack", "asap", "exact")
    req = f"{r.requests:.1f}" if backtracking else "–"
    moves = f"{r.backtracks} / {r.restarts}" if backtracking else "–"
    cells = [r.row.label, r.row.model, r.row.constraint, str(r.samples), str(r.tokens),
             f"{r.total_ms:.3f}", f"{r.book_ms:.3f}", f"{1e3 * r.bind_s:.1f}", str(r.lm_calls),
             req,
             f"{r.book_ms_call:.3f}", moves, str(r.incomplete), r.target]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| method | model | constraint | samples | tokens | ms/token total "
          "| ms/token bookkeeping | of which bind, ms | model calls | lm_requests/sample "
          "| bookkeeping ms/call | backtracks / restarts | incomplete | target met (≤ 0.5 ms) |\n"
          "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|")


def machine() -> str:
    cpu = cpu_name()
    ram = ""
    try:
        ram = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"
    except (ValueError, OSError, AttributeError):
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs{ram}; Python {platform.python_version()}, "
            f"numpy {np.__version__}, adaptrack {at.__version__}")



def stopwatch(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and its wall time in ms."""
    t0 = time.perf_counter()
    out = fn()
    return out, 1e3 * (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: ~0.1 s per row, one repeat")
    ap.add_argument("--seconds", type=float, default=None,
                    help="target wall time of one row (default 2; 0.1 with --quick)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs per row, same seed; the fastest is reported (default 5; 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    per_row = args.seconds if args.seconds is not None else (0.1 if args.quick else 2.0)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    cap = 64 if args.quick else 5_000

    rng = np.random.default_rng(args.seed)
    words = make_words(rng, WORDS)
    names = make_names(rng, words, NAMES)
    vocab = make_vocab(rng, words, VOCAB_SIZE)
    tables = make_tables(rng, TABLES, VOCAB_SIZE)
    lm = BenchLM(vocab, tables)
    assert lm.vocab.size == VOCAB_SIZE

    # One-off costs, each timed on fresh objects.
    trie, trie_ms = stopwatch(lambda: Vocabulary(lm.vocab.token_bytes, lm.vocab.eos_ids).trie)
    _, text_ids_ms = stopwatch(lambda: Vocabulary(lm.vocab.token_bytes, lm.vocab.eos_ids).text_ids)
    lm.vocab.trie  # noqa: B018 - build the cached trie and id list the rows use
    lm.vocab.text_ids  # noqa: B018
    names_c, construct_ms = stopwatch(lambda: choice(names, terminators="("))
    matcher, bind_ms = stopwatch(lambda: names_c.bind(lm.vocab))
    matcher.allowed(matcher.start())  # numpy's first np.unique call costs ~20 ms: not ours
    matcher = names_c.bind(lm.vocab)
    root_mask, root_mask_ms = stopwatch(lambda: matcher.allowed(matcher.start()))
    (tf_id,) = lm.encode("tf.")
    tf_state = matcher.advance(matcher.start(), tf_id)
    tf_mask, tf_mask_ms = stopwatch(lambda: matcher.allowed(tf_state))
    _, anything_ms = stopwatch(lambda: Anything().bind(lm.vocab))
    _, anything_term_ms = stopwatch(lambda: Anything("(").bind(lm.vocab))
    aligned = BenchLM(vocab, tables, aligned=names_c)
    aligned.vocab = lm.vocab  # same ids; reuse the built trie
    aligned.matcher = names_c.bind(lm.vocab)
    models = {"random": lm, "aligned": aligned}

    print(f"# Sampler bookkeeping ({'quick' if args.quick else 'full'} run)\n")
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d')}; load average at start: {load()}")
    mass = valid_mass(aligned, names_c, 16 if args.quick else 100)
    random_mass = valid_mass(lm, names_c, 16 if args.quick else 100)
    print(f"vocabulary: {lm.vocab.size} tokens ({len(trie.children)} trie nodes); constraint: "
          f"choice over {len(names)} names ({len(names_c.children)} string-trie nodes), "
          f"terminator '('; models: {TABLES} log-normal (σ = 2) weight tables chosen by "
          f"hash(prefix), 'aligned' with allowed tokens x{BOOST:g}; mean valid mass at cd's "
          f"prefixes: random {random_mass:.4f}, aligned {mass:.2f}; temperature 1, "
          f"max_new_tokens {MAX_NEW_TOKENS}, seed {args.seed}, fastest of {repeat} "
          f"run(s) per row\n")
    print("| one-off cost | ms |\n|---|--:|")
    print(f"| Vocabulary.trie ({lm.vocab.size} tokens) | {trie_ms:.1f} |")
    print(f"| Vocabulary.text_ids | {text_ids_ms:.1f} |")
    print(f"| choice(...) construction ({len(names)} names) | {construct_ms:.1f} |")
    print(f"| choice bind | {bind_ms:.3f} |")
    print(f"| choice first mask at the root ({len(root_mask)} tokens) | {root_mask_ms:.2f} |")
    print(f"| choice first mask after 'tf.' ({len(tf_mask)} tokens) | {tf_mask_ms:.2f} |")
    print(f"| Anything().bind (constraint=None: once per generate) | {anything_ms:.1f} |")
    print(f"| Anything('(').bind (unconstrained: once more per generate) "
          f"| {anything_term_ms:.1f} |")
    print()

    time_binds()
    # Warm-up (not reported): numpy, the allocator, every code path, the aligned model's masks.
    for row in ROWS:
        run_row(models[row.model], names_c if row.constraint == "choice" else None, row, 2,
                args.seed + 7)

    results = []
    for i, row in enumerate(ROWS):
        model = models[row.model]
        constraint = names_c if row.constraint == "choice" else None
        n = choose_n(model, constraint, row, per_row, args.seed + 100 + i, cap)
        runs = [run_row(model, constraint, row, n, args.seed + i) for _ in range(repeat)]
        r = min(runs, key=lambda x: x.total_s)
        results.append(r)
        print(f"  {row.label} / {row.model} / {row.constraint}: n={n}, "
              f"{', '.join(f'{x.total_s:.2f}' for x in runs)} s (model {r.model_s:.2f} s), "
              f"{r.tree_nodes} tree nodes", file=sys.stderr)

    print(HEADER)
    for r in results:
        print(fmt_row(r))
    print()
    for name in models:
        rs = [r for r in results if r.row.model == name]
        per_call = 1e3 * sum(r.model_s for r in rs) / max(sum(r.lm_calls for r in rs), 1)
        print(f"model time per call, {name} model (excluded from bookkeeping): "
              f"{per_call:.3f} ms")
    print(f"load average at end: {load()}")
    missed = [r for r in results if r.target == "no"]
    print("targets: " + ("all met" if not missed else "missed by " + ", ".join(
        f"{r.row.label} / {r.row.model} / {r.row.constraint}" for r in missed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
