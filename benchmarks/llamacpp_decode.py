"""Decode-step cost of LlamaCppLM against a bare llama-cpp-python loop (default model, CPU).

Rows of the printed markdown table:

- (a) adaptrack: ``LlamaCppLM.next_logprobs([prefix])`` extends one prefix by one sampled
  token per step (KV reuse feeds one token; the full 49 152-wide log-softmax in float64 is
  part of its cost).
- (b) bare loop: the same steps written directly against llama-cpp-python's low-level API:
  ``llama_decode`` of one token (``llama_batch_get_one``), ``llama_get_logits_ith(-1)``,
  softmax and sampling in numpy. Both loops sample the same way from the same seed.
- (c) the throughput ratio (a)/(b) in tokens per second; target >= 0.9.
- (d) 8 prefixes extended in lockstep: one ``next_logprobs`` call with all 8 per step
  (one ``llama_decode`` with 8 sequences) against 8 single-prefix calls per step.

The loops being compared run step by step in turn (an (a) step, then a (b) step; a
batched (d) step, then a sequential one), so that load from other processes hits both
alike. After a warm-up round, ``--repeats`` runs each start from an evaluated prompt (not
timed); the table gives the median per-step time over all their steps.

Run:  python benchmarks/llamacpp_decode.py [--threads 2] [--tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from typing import Any

import numpy as np
from machine import cpu_name  # benchmarks/machine.py (the script's directory)

from adaptrack.lm.default import default_gguf
from adaptrack.lm.llamacpp import LlamaCppLM

PROMPT = ('def mean_pairwise_squared_error(labels, predictions, weights=1.0):\n'
          '    """Adds a pairwise-errors-squared loss to the training procedure."""\n'
          '    import tensorflow as tf\n    return tf')
SEED = 0


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF sampling from unnormalized probabilities (same in both loops)."""
    cdf = np.cumsum(probs)
    return int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))


class BareLoop:
    """The baseline: one llama.cpp context driven directly through the low-level API."""

    def __init__(self, path: str, n_ctx: int, threads: int) -> None:
        import llama_cpp as ll

        self.ll = ll
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        ll.llama_backend_init()
        self.model = ll.llama_model_load_from_file(path.encode(), ll.llama_model_default_params())
        params = ll.llama_context_default_params()
        params.n_ctx, params.n_threads, params.n_threads_batch = n_ctx, threads, threads
        self.ctx = ll.llama_init_from_model(self.model, params)
        self.mem = ll.llama_get_memory(self.ctx)
        self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))

    def feed(self, tokens: list[int]) -> np.ndarray:
        arr = (self.ll.llama_token * len(tokens))(*tokens)
        if self.ll.llama_decode(self.ctx, self.ll.llama_batch_get_one(arr, len(tokens))) != 0:
            raise RuntimeError("llama_decode failed")
        ptr = self.ll.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))


class TimedDecode:
    """Stands in for the ``llama_cpp`` module inside a LlamaCppLM and adds up the time spent
    in ``llama_decode``, so the table can show adaptrack's own per-step overhead."""

    def __init__(self, ll: Any) -> None:
        self._ll, self.seconds = ll, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ll, name)

    def llama_decode(self, ctx: Any, batch: Any) -> int:
        start = time.perf_counter()
        try:
            return self._ll.llama_decode(ctx, batch)
        finally:
            self.seconds += time.perf_counter() - start


def single_prefix_run(lm: LlamaCppLM, bare: BareLoop, prompt: tuple[int, ...], steps: int
                      ) -> tuple[list[float], list[float], list[float], bool]:
    """(a) and (b), one step of each in turn so that load from other processes hits both
    alike. Returns per-step seconds of (a), of (a) outside llama_decode, of (b), and
    whether both sampled the same tokens."""
    timed: TimedDecode = lm._ll
    lm.clear_cache()
    prefix, logprobs = prompt, lm.next_logprobs([prompt])[0]
    bare.ll.llama_memory_clear(bare.mem, True)
    logits = bare.feed(list(prompt))
    rng_a, rng_b = np.random.default_rng(SEED), np.random.default_rng(SEED)
    a, own, b, same = [], [], [], True
    for _ in range(steps):
        t0, timed.seconds = time.perf_counter(), 0.0
        tok_a = draw(np.exp(logprobs), rng_a)
        prefix = (*prefix, tok_a)
        logprobs = lm.next_logprobs([prefix])[0]
        t1 = time.perf_counter()
        x = logits.astype(np.float64)
        tok_b = draw(np.exp(x - x.max()), rng_b)
        logits = bare.feed([tok_b])
        t2 = time.perf_counter()
        a.append(t1 - t0)
        own.append(t1 - t0 - timed.seconds)
        b.append(t2 - t1)
        same &= tok_a == tok_b
    return a, own, b, same


def lockstep_run(batched: LlamaCppLM, single: LlamaCppLM, prompt: tuple[int, ...],
                 steps: int) -> tuple[list[float], list[float]]:
    """(d): 8 branches off the prompt (its 8 likeliest next tokens), each extended by one
    sampled token per step, with one 8-prefix call (``batched``) or 8 one-prefix calls
    (``single``) per step, the two alternating step by step. Per-step seconds of each."""
    top = np.argsort(batched.next_logprobs([prompt])[0])[::-1][:8]
    times: list[list[float]] = [[], []]
    state = []
    for lm in (batched, single):
        lm.clear_cache()
        lm.next_logprobs([prompt])
        branches = [(*prompt, int(t)) for t in top]
        state.append([branches, lm.next_logprobs(branches), np.random.default_rng(SEED)])
    for _ in range(steps):
        for k, lm in enumerate((batched, single)):
            branches, rows, rng = state[k]
            start = time.perf_counter()
            branches = [(*b, draw(np.exp(r), rng)) for b, r in zip(branches, rows, strict=True)]
            if k == 0:
                rows = lm.next_logprobs(branches)
            else:
                rows = np.stack([lm.next_logprobs([b])[0] for b in branches])
            times[k].append(time.perf_counter() - start)
            state[k][:2] = branches, rows
    return times[0], times[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per run")
    ap.add_argument("--lockstep-steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n-ctx", type=int, default=4096)
    args = ap.parse_args()

    import llama_cpp

    path = str(default_gguf())
    lm = LlamaCppLM(path, n_ctx=args.n_ctx, n_threads=args.threads, max_slots=8)
    lm._ll = TimedDecode(lm._ll)
    lm8 = LlamaCppLM(path, n_ctx=args.n_ctx, n_threads=args.threads, max_slots=8)
    bare = BareLoop(path, args.n_ctx, args.threads)
    prompt = tuple(lm.encode(PROMPT))

    # Warm-up round (not counted), then the repeats; medians over all steps of all repeats.
    single_prefix_run(lm, bare, prompt, 8)
    lockstep_run(lm8, lm, prompt, 2)
    a, own, b, same = [], [], [], True
    batch, seq = [], []
    for _ in range(args.repeats):
        ra, rown, rb, rsame = single_prefix_run(lm, bare, prompt, args.tokens)
        a, own, b, same = a + ra, own + rown, b + rb, same and rsame
        rbatch, rseq = lockstep_run(lm8, lm, prompt, args.lockstep_steps)
        batch, seq = batch + rbatch, seq + rseq
    a_ms, own_ms, b_ms, batch_ms, seq_ms = (statistics.median(t) * 1e3
                                            for t in (a, own, b, batch, seq))

    print(f"llama-cpp-python {llama_cpp.__version__}, {cpu_name()}"
          f", {os.cpu_count()} cores, threads={args.threads}, prompt {len(prompt)} tokens, "
          f"{args.tokens} steps x {args.repeats} repeats (median), load average "
          f"{os.getloadavg()[0]:.1f}; same sampled tokens in (a) and (b): {same}\n")
    print("| measurement | ms/step | tokens/s |")
    print("|---|---:|---:|")
    print(f"| (a) adaptrack `next_logprobs`, 1 prefix + 1 token per step | {a_ms:.2f} | "
          f"{1e3 / a_ms:.1f} |")
    print(f"| (a) of which outside `llama_decode` (Python, log-softmax, sampling) | "
          f"{own_ms:.2f} | |")
    print(f"| (b) bare llama-cpp-python loop (decode 1 token, logits, sample) | {b_ms:.2f} | "
          f"{1e3 / b_ms:.1f} |")
    print(f"| (c) throughput ratio (a)/(b) (target >= 0.9) | {b_ms / a_ms:.3f} | |")
    print(f"| (d) 8 prefixes in lockstep, one batched call per step | {batch_ms:.2f} | "
          f"{8e3 / batch_ms:.1f} |")
    print(f"| (d) 8 prefixes in lockstep, 8 sequential calls per step | {seq_ms:.2f} | "
          f"{8e3 / seq_ms:.1f} |")
    print(f"| (d) batching speed-up | {seq_ms / batch_ms:.2f}x | |")


if __name__ == "__main__":
    main()
