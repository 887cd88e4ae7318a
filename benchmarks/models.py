"""The transformers backend on the default model (SmolLM2-135M, CPU): decode cost, sampling
throughput against ``model.generate``, what sharing one tree saves, and LM calls per sample.

Every section uses ``adaptrack.load_model(backend="transformers")`` and its ``lm.model``.

- **decode**: ms per decode step through ``lm.next_logprobs`` (the backend keeps the KV
  state of the prefix and feeds only the new token): one prefix extended 64 times after the
  Figure 3 prompt (greedy tokens), and 8 prefixes extended in lockstep (one call with 8
  prefixes per step). The same steps through a bare ``lm.model(...)`` call with a
  ``DynamicCache`` give the floor; the difference is the backend's overhead.
- **generate**: unconstrained sampling, 64 new tokens, T = 1, top_p = 1:
  ``adaptrack.generate(..., method="unconstrained")`` against ``lm.model.generate(
  do_sample=True, top_k=0, top_p=1.0, temperature=1.0)``. EOS is disabled on both sides so
  that both produce exactly 64 tokens: ``min_new_tokens=64`` for transformers (it sets the EOS
  logit to -inf) and, for adaptrack, a wrapper around ``lm._next_logprobs`` that sets the EOS
  log-prob to -inf. ``lm.clear_cache()`` runs before every adaptrack call, so the prompt is
  prefilled on both sides. Runs alternate between the two sides; the ratio is the median of
  the adjacent pairs' ratios, and a second ratio uses process CPU time (with one torch thread
  it is less disturbed by other work on the machine than wall time).
- **shared**: 20 samples of one prompt in one ``generate(..., n=20)`` call (one tree, one KV
  cache, samples batched 16 at a time) against 20 ``generate(..., n=1)`` calls with different
  seeds and ``lm.clear_cache()`` before each, so that nothing is shared. ``clear_cache`` also
  runs before the shared call. Rows: the Figure 3 prompt with ``figure3_constraint()`` (cd,
  adaptrack, max_new_tokens 24) and free text without a constraint (max_new_tokens 32, EOS
  allowed).
- **calls**: ``Sample.lm_requests`` (prefixes whose distribution a sample used, the paper's
  "calls to LM per sample", Table 5) for cd and adaptrack on the Figure 3 prompt and
  constraint, n = 20, T = 1 (reuses the shared section's runs when both run).
- **threads**: the bare decode step at 1 and 2 torch threads (on a loaded 2-core machine,
  2 threads can be several times slower than 1).

Run:  python benchmarks/models.py                  (full run, 2 torch threads)
      python benchmarks/models.py --threads 1      (full run on a loaded machine, ~8 min)
      python benchmarks/models.py --quick          (smoke run, ~1-2 min)
      python benchmarks/models.py --only decode,calls --threads 1
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

import adaptrack as at
from adaptrack.eval.tfv1 import FIGURE3_PROMPT, figure3_constraint

SECTIONS = ("decode", "generate", "shared", "calls", "threads")
DEFAULT_SECTIONS = SECTIONS
FREE_PROMPT = "The old harbour town was quiet that morning. Anna walked down to the"
DECODE_STEPS = 64
BATCH = 8
GEN_TOKENS = 64
SHARED_N = 20
FIG3_TOKENS = 24
FREE_TOKENS = 32


# ---------------------------------------------------------------------------------------
# Machine, load, timing


def machine() -> str:
    cpu = cpu_name()
    import transformers

    return (f"{cpu}, {os.cpu_count()} logical CPUs; Python {platform.python_version()}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}, "
            f"numpy {np.__version__}, adaptrack {at.__version__}")



def caption(title: str, started: str) -> None:
    print(f"\n## {title}\n")
    print(f"torch threads {torch.get_num_threads()}; load average (1, 5, 15 min) at start "
          f"{started}, at end {load()}; {time.strftime('%Y-%m-%d %H:%M')}\n")


def log(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------------------------------
# decode


def greedy(row: np.ndarray | torch.Tensor) -> int:
    return int(row.argmax())


def lm_steps(lm: Any, prefixes: list[tuple[int, ...]], steps: int) -> tuple[list[float], int, int]:
    """Extend every prefix by its greedy token ``steps`` times through ``lm.next_logprobs``
    (one call per step for all prefixes); per-step seconds, forward passes, fed tokens."""
    lm.clear_cache()
    lp = lm.next_logprobs(prefixes)  # prefill, not timed
    f0, t0 = lm.forward_calls, lm.fed_tokens
    times = []
    for _ in range(steps):
        prefixes = [(*p, greedy(r)) for p, r in zip(prefixes, lp, strict=True)]
        start = time.perf_counter()
        lp = lm.next_logprobs(prefixes)
        times.append(time.perf_counter() - start)
    return times, lm.forward_calls - f0, lm.fed_tokens - t0


def raw_steps(model: Any, prefixes: list[tuple[int, ...]], steps: int) -> list[float]:
    """The same steps through ``model(...)`` with a DynamicCache (the prefixes have equal
    length), plus the log-softmax to numpy that a sampler needs."""
    # transformers 5 names the KV cache ``cache``; older releases ``past_key_values``.
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"
    with torch.inference_mode():
        out = model(input_ids=torch.tensor(prefixes, device=model.device), use_cache=True,
                    logits_to_keep=1)
        cache = getattr(out, name)
        times = []
        for _ in range(steps):
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            start = time.perf_counter()
            out = model(input_ids=tok, use_cache=True, logits_to_keep=1, **{name: cache})
            cache = getattr(out, name)
            torch.log_softmax(out.logits[:, -1].float(), dim=-1).cpu().numpy()
            times.append(time.perf_counter() - start)
    return times


def section_decode(lm: Any, args: argparse.Namespace) -> None:
    started = load()
    steps = 8 if args.quick else DECODE_STEPS
    prompt = tuple(lm.encode(FIGURE3_PROMPT))
    first = np.argsort(-lm.next_logprobs([prompt])[0])[:BATCH]
    batch = [(*prompt, int(t)) for t in first]  # 8 different continuations, equal length
    lm_steps(lm, [prompt], 4)  # warm-up
    raw_steps(lm.model, [prompt], 4)
    rows: dict[str, list[float]] = {k: [] for k in ("lm1", "raw1", "lm8", "raw8")}
    counts: dict[str, tuple[int, int]] = {}
    for r in range(args.repeat):
        times, fw, fed = lm_steps(lm, [prompt], steps)
        rows["lm1"].append(med(times))
        counts["lm1"] = (fw, fed)
        rows["raw1"].append(med(raw_steps(lm.model, [prompt], steps)))
        times, fw, fed = lm_steps(lm, batch, steps)
        rows["lm8"].append(med(times))
        counts["lm8"] = (fw, fed)
        rows["raw8"].append(med(raw_steps(lm.model, batch, steps)))
        log(f"decode repeat {r + 1}: " + ", ".join(f"{k} {1e3 * v[-1]:.1f} ms"
                                                     for k, v in rows.items()))
    caption("decode: ms per step after the Figure 3 prompt", started)
    print(f"{len(prompt)}-token prompt, {steps} greedy steps per run; median step of each run, "
          f"median of {args.repeat} run(s).\n")
    print("| path | prefixes per step | ms/step | ms/token | forward passes | fed tokens | "
          "overhead vs bare model |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for key, label, width in (("lm1", "`lm.next_logprobs` (KV reuse)", 1),
                              ("raw1", "bare `lm.model` + DynamicCache", 1),
                              ("lm8", "`lm.next_logprobs` (KV reuse)", BATCH),
                              ("raw8", "bare `lm.model` + DynamicCache", BATCH)):
        ms = 1e3 * med(rows[key])
        fw, fed = counts.get(key, ("–", "–"))
        base = 1e3 * med(rows["raw1" if width == 1 else "raw8"])
        over = f"{100 * (ms / base - 1):+.0f} %" if key.startswith("lm") else "–"
        print(f"| {label} | {width} | {ms:.1f} | {ms / width:.1f} | {fw} | {fed} | {over} |")


# ---------------------------------------------------------------------------------------
# generate


class NoEOS:
    """Sets the EOS log-probs of ``lm``'s output to -inf while active (restores on exit)."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm

    def __enter__(self) -> NoEOS:
        inner = self.lm._next_logprobs
        eos = self.lm.vocab.eos_ids

        def no_eos(prefixes: Sequence[tuple[int, ...]]) -> np.ndarray:
            out = inner(prefixes)
            out[:, eos] = -np.inf
            return out

        self.lm._next_logprobs = no_eos
        return self

    def __exit__(self, *exc: object) -> None:
        del self.lm._next_logprobs  # back to the class's method


def run_adaptrack(lm: Any, prompt: str, n: int, tokens: int,
                  seed: int) -> tuple[float, float, int]:
    """Wall seconds, process CPU seconds and generated tokens of one adaptrack call."""
    lm.clear_cache()
    start, cpu = time.perf_counter(), time.process_time()
    res = at.generate(lm, prompt, None, method="unconstrained", n=n, max_new_tokens=tokens,
                      temperature=1.0, seed=seed)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return wall, cpu, sum(len(s.tokens) for s in res.samples)


def run_hf(lm: Any, prompt: str, n: int, tokens: int, seed: int) -> tuple[float, float, int]:
    """The same for ``lm.model.generate`` (tokenization included, like adaptrack's)."""
    eos = [int(e) for e in lm.vocab.eos_ids]
    torch.manual_seed(seed)
    start, cpu = time.perf_counter(), time.process_time()
    ids = torch.tensor([lm.encode(prompt)], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=tokens,
            min_new_tokens=tokens, top_k=0, top_p=1.0, temperature=1.0,
            num_return_sequences=n, eos_token_id=eos, pad_token_id=eos[0])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return wall, cpu, int(out.shape[0] * (out.shape[1] - ids.shape[1]))


def section_generate(lm: Any, args: argparse.Namespace) -> None:
    started = load()
    tokens = 16 if args.quick else GEN_TOKENS
    repeat = args.gen_repeat if args.gen_repeat is not None else args.repeat
    results = []
    with NoEOS(lm):
        for n in (1, BATCH):
            run_adaptrack(lm, FREE_PROMPT, n, 4, 0)  # warm-up
            run_hf(lm, FREE_PROMPT, n, 4, 0)
            ours, theirs, paired, cpu_ratio, fw = [], [], [], [], []
            for r in range(repeat):
                f0 = lm.forward_calls
                wall, cpu, count = run_adaptrack(lm, FREE_PROMPT, n, tokens, args.seed + r)
                fw.append(lm.forward_calls - f0)
                assert count == n * tokens, count
                hf_wall, hf_cpu, hf_count = run_hf(lm, FREE_PROMPT, n, tokens, args.seed + r)
                assert hf_count == n * tokens, hf_count
                ours.append(count / wall)
                theirs.append(hf_count / hf_wall)
                paired.append(ours[-1] / theirs[-1])
                cpu_ratio.append(hf_cpu / cpu)
                log(f"generate n={n} repeat {r + 1}: adaptrack {ours[-1]:.1f} tok/s "
                    f"({cpu:.2f} s CPU), transformers {theirs[-1]:.1f} tok/s ({hf_cpu:.2f} s CPU)")
            results.append((n, med(ours), med(theirs), med(paired), med(cpu_ratio), med(fw)))
    caption("generate: unconstrained sampling throughput", started)
    print(f"Prompt {FREE_PROMPT!r} ({len(lm.encode(FREE_PROMPT))} tokens), {tokens} new tokens "
          f"per sequence (EOS disabled on both sides), T = 1, top_p = 1, top_k = 0. tokens/s "
          f"= generated tokens / wall time of the call (prefill included), median of "
          f"{repeat} run(s) per side; the two sides alternate, and the wall ratio is the "
          f"median of the {repeat} adjacent pairs' ratios. The CPU ratio is transformers' "
          f"process CPU time / adaptrack's (median of pairs), which the machine's load "
          f"disturbs less with one torch thread.\n")
    print("| sequences | adaptrack tokens/s | transformers `generate` tokens/s | "
          "ratio adaptrack / transformers (wall) | ratio (CPU time) | "
          "adaptrack forward passes | target ≥ 0.9 (wall) |")
    print("|--:|--:|--:|--:|--:|--:|:-:|")
    for n, ours_, theirs_, ratio, cpu_r, fw_ in results:
        print(f"| {n} | {ours_:.1f} | {theirs_:.1f} | {ratio:.2f} | {cpu_r:.2f} | {fw_:.0f} | "
              f"{'yes' if ratio >= 0.9 else 'no'} |")


# ---------------------------------------------------------------------------------------
# shared and calls


class Runs:
    """The n=20 results of the shared section, reused by the calls section."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, int], at.GenerationResult] = {}


def gen(lm: Any, prompt: str, constraint: Any, method: str, n: int, tokens: int,
        seed: int) -> tuple[at.GenerationResult, float, int, int]:
    lm.clear_cache()
    f0, t0 = lm.forward_calls, lm.fed_tokens
    start = time.perf_counter()
    res = at.generate(lm, prompt, constraint, method=method, n=n, max_new_tokens=tokens,
                      temperature=1.0, seed=seed, search_budget=None)
    wall = time.perf_counter() - start
    return res, wall, lm.forward_calls - f0, lm.fed_tokens - t0


def shared_rows(quick: bool) -> list[tuple[str, str, Any, str, int]]:
    c = figure3_constraint()
    return [
        ("Figure 3 + `figure3_constraint()`", FIGURE3_PROMPT, c, "cd", FIG3_TOKENS),
        ("Figure 3 + `figure3_constraint()`", FIGURE3_PROMPT, c, "adaptrack", FIG3_TOKENS),
        ("free text, no constraint", FREE_PROMPT, None, "unconstrained",
         8 if quick else FREE_TOKENS),
    ]


def section_shared(lm: Any, args: argparse.Namespace, runs: Runs) -> None:
    started = load()
    n = 4 if args.quick else SHARED_N
    repeat = max(1, min(args.repeat, args.shared_repeat))
    for _, prompt, c, method, tokens in shared_rows(args.quick):  # warm-up
        gen(lm, prompt, c, method, 2, min(tokens, 6), 99)
    table = []
    for label, prompt, c, method, tokens in shared_rows(args.quick):
        ratios, shared_s, indep_s = [], [], []
        for r in range(repeat):
            res, wall, fw, fed = gen(lm, prompt, c, method, n, tokens, args.seed)
            runs.results[(method, n)] = res
            shared = (wall, res.stats["lm_calls"], fw, fed,
                      sum(len(s.tokens) for s in res.samples))
            total = [0.0, 0, 0, 0, 0]
            for i in range(n):
                one, wall1, fw1, fed1 = gen(lm, prompt, c, method, 1, tokens,
                                            args.seed * 1000 + 1 + i)
                for k, v in enumerate((wall1, one.stats["lm_calls"], fw1, fed1,
                                       len(one.samples[0].tokens))):
                    total[k] += v
            ratios.append(total[0] / shared[0])
            shared_s.append(shared[0])
            indep_s.append(total[0])
            log(f"shared {method} repeat {r + 1}: shared {shared[0]:.1f} s, independent "
                f"{total[0]:.1f} s, ratio {ratios[-1]:.2f}")
        table.append((label, method, tokens, shared, total, med(shared_s), med(indep_s),
                      med(ratios)))
    caption(f"shared: {n} samples in one call vs {n} independent calls", started)
    print(f"T = 1; shared: one `generate(..., n={n})` call (batch_size 16); independent: {n} "
          f"`generate(..., n=1)` calls, seeds differ, `lm.clear_cache()` before each call; "
          f"wall times are medians of {repeat} run(s); the counts are from the last run.\n")
    print("| prompt / constraint | method | max_new_tokens | shared s | independent s | "
          "speed-up | lm_calls shared / indep. | forward passes shared / indep. | "
          "fed tokens shared / indep. | sampled tokens shared / indep. | target ≥ 3× |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|:-:|")
    for label, method, tokens, sh, ind, sh_s, ind_s, ratio in table:
        print(f"| {label} | {method} | {tokens} | {sh_s:.1f} | {ind_s:.1f} | {ratio:.1f}× | "
              f"{sh[1]} / {ind[1]} | {sh[2]} / {ind[2]} | {sh[3]} / {ind[3]} | "
              f"{sh[4]} / {ind[4]} | {'yes' if ratio >= 3 else 'no'} |")


def section_calls(lm: Any, args: argparse.Namespace, runs: Runs) -> None:
    started = load()
    n = args.calls_n or (4 if args.quick else SHARED_N)
    c = figure3_constraint()
    stats = {}
    for method in ("cd", "adaptrack"):
        res = runs.results.get((method, n))
        if res is None:
            res = gen(lm, FIGURE3_PROMPT, c, method, n, FIG3_TOKENS, args.seed)[0]
        stats[method] = res
    caption("calls: LM calls per sample (paper Table 5 format)", started)
    print(f"Figure 3 prompt, `figure3_constraint()`, n = {n}, T = 1, max_new_tokens "
          f"{FIG3_TOKENS}, seed {args.seed}. lm_requests: prefixes whose next-token "
          f"distribution the sample used, cache hits included.\n")
    print("| method | lm_requests avg | min | max | lm_calls (distinct prefixes, all samples) | "
          "backtracks | valid samples | most frequent text |")
    print("|---|--:|--:|--:|--:|--:|--:|---|")
    avg = {}
    for method, res in stats.items():
        req = [s.lm_requests for s in res.samples]
        avg[method] = float(np.mean(req))
        texts: dict[str, int] = {}
        for s in res.samples:
            texts[s.text] = texts.get(s.text, 0) + 1
        top, k = max(texts.items(), key=lambda kv: kv[1])
        print(f"| {method} | {avg[method]:.1f} | {min(req)} | {max(req)} | "
              f"{res.stats['lm_calls']} | {res.stats['backtracks']} | "
              f"{sum(s.valid for s in res.samples)}/{n} | `{top}` ({k}) |")
    print(f"\nratio adaptrack / cd (average lm_requests): {avg['adaptrack'] / avg['cd']:.2f}× "
          "(paper: 1.2–1.6×)")


# ---------------------------------------------------------------------------------------
# threads


def section_threads(lm: Any, args: argparse.Namespace) -> None:
    started = load()
    steps = 8 if args.quick else 16
    runs = min(args.repeat, 2)  # 2 threads on a loaded machine can take seconds a step
    prompt = tuple(lm.encode(FIGURE3_PROMPT))
    chosen = torch.get_num_threads()
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        raw_steps(lm.model, [prompt], 2)  # warm-up
        meds = [1e3 * med(raw_steps(lm.model, [prompt], steps)) for _ in range(runs)]
        rows.append((threads, med(meds), min(meds), max(meds)))
        log(f"threads {threads}: " + ", ".join(f"{m:.1f}" for m in meds) + " ms/step")
    torch.set_num_threads(chosen)
    caption("threads: bare decode step at 1 and 2 torch threads", started)
    print(f"Bare `lm.model` step with a DynamicCache after the Figure 3 prompt, {steps} steps "
          f"per run, median step per run; {runs} run(s).\n")
    print("| torch threads | ms/step (median of runs) | fastest run | slowest run |")
    print("|--:|--:|--:|--:|")
    for threads, m, lo, hi in rows:
        print(f"| {threads} | {m:.1f} | {lo:.1f} | {hi:.1f} |")


# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: short runs, one repeat")
    ap.add_argument("--only", default=",".join(DEFAULT_SECTIONS),
                    help=f"comma-separated sections (default: all of {','.join(SECTIONS)})")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs per measurement; medians are reported (default 3; 1 with --quick)")
    ap.add_argument("--shared-repeat", type=int, default=2,
                    help="runs of the (long) shared section, at most --repeat (default 2)")
    ap.add_argument("--gen-repeat", type=int, default=None,
                    help="paired runs of the generate section (default: --repeat)")
    ap.add_argument("--calls-n", type=int, default=None,
                    help=f"samples of the calls section (default {SHARED_N}; 4 with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    args.repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    lm = at.load_model(backend="transformers")
    load_s = time.perf_counter() - t0
    print(f"# The transformers backend on the default model ({'quick' if args.quick else 'full'}"
          " run)\n")
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d')}; torch threads {args.threads}; load average at "
          f"start {load()}; model {lm.name} ({lm.vocab.size} tokens), loaded in {load_s:.1f} s; "
          f"seed {args.seed}; sections {','.join(only)}")

    cores = os.cpu_count() or 1
    if args.threads > 1 and hasattr(os, "getloadavg") and os.getloadavg()[0] > cores - 0.5:
        print(f"warning: load average {load()} on {cores} CPUs with {args.threads} torch "
              "threads: torch's worker threads wait on each other and a step can be several "
              "times slower than with --threads 1 (see the threads section)", file=sys.stderr)
    runs = Runs()
    sections: dict[str, Callable[[], None]] = {
        "decode": lambda: section_decode(lm, args),
        "generate": lambda: section_generate(lm, args),
        "shared": lambda: section_shared(lm, args, runs),
        "calls": lambda: section_calls(lm, args, runs),
        "threads": lambda: section_threads(lm, args),
    }
    for name in SECTIONS:
        if name in only:
            start = time.perf_counter()
            sections[name]()
            log(f"{name}: {time.perf_counter() - start:.0f} s")
    print(f"\nTotal wall time {time.perf_counter() - t0:.0f} s; load average at end {load()}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
