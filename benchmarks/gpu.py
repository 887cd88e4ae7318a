"""The transformers backend at a 7B model's shape, on CUDA in bfloat16: decode cost against
the bare model, sampling against ``model.generate``, the constrained methods, the engine's
batch bounds and a long shared prompt.

No model hub is reachable from the benchmark machines, but a model's speed does not depend
on its weights: the model is built from a configuration written here (Qwen2's architecture
with the shapes of Qwen2.5-Coder-1.5B or -7B; ``--tiny``: the same architecture, small
enough for a CPU) with random weights (``AutoModelForCausalLM.from_config``) and the Qwen
tokenizer (``../shared/tokenizers/qwen3``, or ``--tokenizer``), whose 151 669 tokens fit
the configurations' padded vocabularies. It is wrapped by the project's backend
(``TransformersLM``, as ``load_model`` does), bfloat16 on CUDA and float32 on a CPU.
Random weights give a near-uniform next-token distribution over 152 k tokens, which no real
model has: under it the constrained target puts almost all its mass on the fewest tokens a
valid text can take (each token costs a factor of about 1/152 k), and ``adaptrack`` and
``exact`` search far more than on a real model before a sample is accepted. Their rows
therefore run under a time budget (``cd``'s, at most n walks of ``max_new_tokens`` calls,
under none) and report model calls per second and prefixes per
forward pass (what the GPU path decides) besides the samples that finished; how many calls
a real model's dead ends take is measured on real models (docs/benchmarks/backends.md).

Sections, all in one run:

- **decode**: ms per step of ``lm.next_logprobs`` (kept KV state, one new token per row)
  at 1 and 32 rows against the bare model with a ``DynamicCache`` (benchmarks/models.py's
  ``lm_steps`` and ``raw_steps``: greedy tokens, the log-softmax copied to the host).
- **generate**: unconstrained sampling, EOS disabled on both sides, 1 and 32 sequences,
  against ``model.generate(do_sample=True, num_return_sequences=n)``.
- **methods**: ``cd``, ``adaptrack`` and ``exact`` at n = 32 on a grammar (a JSON schema,
  ``allow_truncated``: random text rarely ends) and on an API-name constraint (the TF 2
  names of the paper's TFv1 v2 setting after its Figure 3 prompt): sampled tokens per
  second, model calls (``lm_calls``) and calls per second, forward passes and peak GPU
  memory, with the ratio of tokens/s to ``model.generate``'s at 32 sequences; a run that
  reaches the time budget reports the samples finished by then.
- **batch**: the engine's ``batch_size`` (and the backend's ``max_batch`` with it) at 1, 8,
  32 and 128 for unconstrained sampling of 128 sequences; ``max_batch_tokens`` at 1, 8, 32
  and 128 for ``cd`` on the grammar (whose forced chains return several distributions).
- **long**: a long prompt (4 000 tokens; 512 with ``--tiny``) and 32 samples: rows of a
  pass attending to the shared prompt in place (``lm/shared_attention.py``, the default)
  against kept states that share it but are copied per pass (``shared_attention=False``)
  and against full copies (``share_tokens`` past the prompt), and ``model.generate``.

Run:  python benchmarks/gpu.py --size 7b            (on a GPU; also --size 1.5b)
      python benchmarks/gpu.py --tiny               (CPU smoke run, well under a minute)
      python benchmarks/gpu.py --size 7b --tokenizer .tokenizers/qwen3
Where ``../shared`` is not next to the checkout (a device machine), copy
``../shared/tokenizers/qwen3`` into the checkout's ignored ``.tokenizers/`` and pass it.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)
from models import FREE_PROMPT, NoEOS, lm_steps, med, raw_steps, run_hf

import adaptrack as at
from adaptrack.eval.tfv1 import FIGURE3_PROMPT, setting_constraint
from adaptrack.lm.hf import TransformersLM

TOKENIZER = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers" / "qwen3"
#: Qwen2 settings every size shares (Qwen2.5-Coder's published configurations).
COMMON = dict(max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
              hidden_act="silu", use_sliding_window=False, bos_token_id=151643,
              eos_token_id=151643)
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
               tie_word_embeddings=False),
}
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "size": {"type": "integer"}}, "required": ["name", "tags", "size"]}
JSON_PROMPT = "Describe a package as JSON.\nJSON: "
NEVER = 1 << 30  # share_tokens past any prompt: every kept state a full copy


@dataclass
class Scale:
    """How long each section runs: the GPU sizes and ``--tiny`` differ only here."""

    steps: int = 32  # decode steps
    rows: int = 32  # rows of the batched decode step, sequences of the batched generate
    gen_tokens: int = 64
    n: int = 32  # samples of the methods and the long prompt
    method_tokens: int = 32
    batch_n: int = 128
    batch_tokens: int = 16
    sizes: tuple[int, ...] = (1, 8, 32, 128)
    long_prompt: int = 4000
    long_tokens: int = 32
    repeat: int = 3
    max_seconds: float = 30.0  # budget of one constrained run


TINY = Scale(steps=8, rows=8, gen_tokens=8, n=8, method_tokens=12, batch_n=16,
             batch_tokens=4, long_prompt=512, long_tokens=4, repeat=1, max_seconds=1.0)


def build(size: str, tokenizer_dir: Path, device: str, dtype: torch.dtype) -> TransformersLM:
    """A Qwen2 model of ``size`` with random weights on ``device``, in the backend."""
    import transformers

    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise SystemExit(f"no Qwen tokenizer at {tokenizer_dir} (tokenizer.json): pass "
                         "--tokenizer DIR, a copy of ../shared/tokenizers/qwen3")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = transformers.Qwen2Config(**COMMON, **SIZES[size])
    if config.vocab_size < len(tokenizer):
        raise SystemExit(f"the {size} configuration's vocabulary ({config.vocab_size}) is "
                         f"smaller than the tokenizer's ({len(tokenizer)} tokens)")
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):  # initialized in place: a 7B model's init on a CPU takes minutes
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return TransformersLM(model, tokenizer, name=f"Qwen2 {size}, random weights")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass
class Run:
    wall: float
    passes: int
    fed: int
    peak: float | None  # GB of GPU memory allocated at the peak, None on a CPU


def measure(lm: TransformersLM, fn: Callable[[], Any]) -> tuple[Any, Run]:
    """``fn()``'s result, wall time, forward passes, fed tokens and peak GPU memory."""
    cuda = lm.device.type == "cuda"
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(lm.device)
    f0, t0 = lm.forward_calls, lm.fed_tokens
    start = time.perf_counter()
    out = fn()
    sync()
    wall = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(lm.device) / 1e9 if cuda else None
    return out, Run(wall, lm.forward_calls - f0, lm.fed_tokens - t0, peak)


def gb(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def log(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i == 0 else "--:" for i in range(len(head))) + "|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    print()


# ---------------------------------------------------------------------------------------


def section_decode(lm: TransformersLM, s: Scale) -> None:
    prompt = tuple(lm.encode(FIGURE3_PROMPT))
    first = np.argsort(-lm.next_logprobs([prompt])[0])[:s.rows]
    batch = [(*prompt, int(t)) for t in first]  # distinct continuations, equal length
    lm_steps(lm, [prompt], 2)  # warm-up
    raw_steps(lm.model, [prompt], 2)
    rows = []
    for prefixes in ([prompt], batch):
        ours, bare, passes = [], [], 0
        for _ in range(s.repeat):
            times, passes, _ = lm_steps(lm, prefixes, s.steps)
            ours.append(med(times))
            bare.append(med(raw_steps(lm.model, prefixes, s.steps)))
        a, b = 1e3 * med(ours), 1e3 * med(bare)
        rows.append((len(prefixes), f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}",
                     f"{passes / s.steps:.1f}"))
        log(f"decode {len(prefixes)} row(s): {a:.2f} ms vs bare {b:.2f} ms")
    print(f"\n## decode: ms per step after a {len(prompt)}-token prompt\n")
    print(f"{s.steps} greedy steps per run, median step, median of {s.repeat} run(s); the bare "
          "step is `model(...)` with a DynamicCache and the log-softmax copied to the host.\n")
    table(("rows", "`lm.next_logprobs` ms/step", "bare model ms/step", "ratio to bare",
           "forward passes per step"), rows)


def section_generate(lm: TransformersLM, s: Scale) -> dict[int, float]:
    """Unconstrained sampling against ``model.generate``; its tokens/s per sequence count."""
    hf_rate: dict[int, float] = {}
    rows = []
    with NoEOS(lm):
        for n in (1, s.rows):
            run_hf(lm, FREE_PROMPT, n, 2, 0)  # warm-up
            ours, theirs, passes = [], [], 0
            for r in range(s.repeat):
                def sample(r: int = r, n: int = n) -> Any:
                    lm.clear_cache()
                    return at.generate(lm, FREE_PROMPT, None, method="unconstrained", n=n,
                                       max_new_tokens=s.gen_tokens, seed=r)
                res, run = measure(lm, sample)
                count = sum(len(x.tokens) for x in res.samples)
                ours.append(count / run.wall)
                passes = run.passes
                (_, _, hf_count), hf_run = measure(
                    lm, lambda r=r, n=n: run_hf(lm, FREE_PROMPT, n, s.gen_tokens, r))
                theirs.append(hf_count / hf_run.wall)
            hf_rate[n] = med(theirs)
            rows.append((n, f"{med(ours):.1f}", f"{med(theirs):.1f}",
                         f"{med(ours) / med(theirs):.2f}", passes))
            log(f"generate n={n}: {med(ours):.1f} vs {med(theirs):.1f} tokens/s")
    print("\n## generate: unconstrained sampling against `model.generate`\n")
    print(f"{s.gen_tokens} new tokens per sequence, EOS disabled on both sides, T = 1, "
          f"median tokens/s of {s.repeat} run(s), prefill included.\n")
    table(("sequences", "adaptrack tokens/s", "`model.generate` tokens/s",
           "ratio to `model.generate`", "adaptrack forward passes"), rows)
    return hf_rate


def constraints() -> list[tuple[str, str, Any, dict[str, Any]]]:
    return [("grammar (JSON schema)", JSON_PROMPT, at.constraints.json_schema(SCHEMA),
             {"allow_truncated": True}),
            ("API names (TF 2, v2 setting)", FIGURE3_PROMPT, setting_constraint("v2"), {})]


def section_methods(lm: TransformersLM, s: Scale, hf_rate: float) -> None:
    rows = []
    for label, prompt, c, options in constraints():
        at.generate(lm, prompt, c, method="cd", n=2, max_new_tokens=4, seed=0,
                    **options)  # warm-up: binds the constraint to the vocabulary
        for method in ("cd", "adaptrack", "exact"):
            def sample(method: str = method, prompt: str = prompt, c: Any = c,
                       options: dict[str, Any] = options) -> Any:
                lm.clear_cache()
                try:
                    return at.generate(lm, prompt, c, method=method, n=s.n, seed=0,
                                       max_new_tokens=s.method_tokens,
                                       max_seconds=None if method == "cd" else s.max_seconds,
                                       **options, search_budget=None)
                except at.SearchLimitError as err:  # random weights: see the docstring
                    return err.partial
            res, run = measure(lm, sample)
            count = sum(len(x.tokens) for x in res.samples)
            rate = count / run.wall
            calls = res.stats["lm_calls"]
            rows.append((label, method, f"{run.wall:.2f}", f"{len(res.samples)}/{s.n}", count,
                         f"{rate:.1f}", f"{rate / hf_rate:.2f}", calls,
                         f"{calls / run.wall:.0f}", run.passes, f"{calls / max(run.passes, 1):.1f}",
                         res.stats["backtracks"] + res.stats["restarts"], gb(run.peak)))
            log(f"methods {label} {method}: {run.wall:.2f} s")
    print(f"\n## methods: n = {s.n}, T = 1, max_new_tokens {s.method_tokens}\n")
    print("tokens/s: tokens of the samples that finished over the call's wall time (constraint "
          f"binding excluded), at most {s.max_seconds:g} s a run; ratio to `model.generate` at "
          f"{s.rows} sequences (previous section); model calls: distinct prefixes evaluated; "
          "backtracks: adaptrack's backtracks and exact's restarts; peak GPU GB: torch's "
          "largest allocation during the run, the weights included (– on a CPU).\n")
    table(("constraint", "method", "s", "samples", "sampled tokens", "tokens/s",
           "ratio to `model.generate`", "model calls", "calls/s", "forward passes",
           "calls per pass", "backtracks", "peak GPU GB"), rows)


def section_batch(lm: TransformersLM, s: Scale) -> None:
    max_batch = lm.max_batch
    rows = []
    for size in s.sizes:
        lm.max_batch = size

        def sample(size: int = size) -> Any:
            lm.clear_cache()
            return at.generate(lm, FREE_PROMPT, None, method="unconstrained", n=s.batch_n,
                               max_new_tokens=s.batch_tokens, seed=0, batch_size=size)
        with NoEOS(lm):
            res, run = measure(lm, sample)
        count = sum(len(x.tokens) for x in res.samples)
        rows.append((f"batch_size {size}", f"unconstrained, n = {s.batch_n}", f"{run.wall:.2f}",
                     f"{count / run.wall:.1f}", run.passes, gb(run.peak)))
        log(f"batch_size {size}: {run.wall:.2f} s")
    lm.max_batch = max_batch
    label, prompt, c, options = constraints()[0]
    for tokens in s.sizes:
        def sample_cd(tokens: int = tokens) -> Any:
            lm.clear_cache()
            return at.generate(lm, prompt, c, method="cd", n=s.n, seed=0,
                               max_new_tokens=s.method_tokens, max_batch_tokens=tokens,
                               **options)
        res, run = measure(lm, sample_cd)
        count = sum(len(x.tokens) for x in res.samples)
        rows.append((f"max_batch_tokens {tokens}", f"cd, {label}, n = {s.n}", f"{run.wall:.2f}",
                     f"{count / run.wall:.1f}", run.passes, gb(run.peak)))
        log(f"max_batch_tokens {tokens}: {run.wall:.2f} s")
    print("\n## batch: the engine's batch_size and max_batch_tokens\n")
    print(f"batch_size rows: `max_batch_tokens` 1024 (the default), the backend's `max_batch` "
          f"set to the batch size, EOS disabled, {s.batch_tokens} new tokens; max_batch_tokens "
          f"rows: batch_size 32 (the default), max_new_tokens {s.method_tokens}.\n")
    table(("setting", "run", "s", "tokens/s", "forward passes", "peak GPU GB"), rows)


def long_ids(lm: TransformersLM, tokens: int) -> list[int]:
    """``tokens`` tokens of Python source (the standard library's argparse, repeated)."""
    import argparse as source

    text = Path(str(source.__file__)).read_text()
    ids = lm.encode(text)
    while len(ids) < tokens:
        ids += ids
    return ids[:tokens]


def section_long(lm: TransformersLM, s: Scale) -> None:
    ids = long_ids(lm, s.long_prompt)
    configs = (("attended in place (default)", True, lm.share_tokens),
               ("shared states, copied per pass", False, lm.share_tokens),
               ("full copies", False, NEVER))
    saved = lm.shared_attention, lm.share_tokens
    rows, base = [], None
    with NoEOS(lm):
        for label, in_place, share in configs:
            lm.shared_attention, lm.share_tokens = saved[0] and in_place, share

            def sample() -> Any:
                lm.clear_cache()
                return at.generate(lm, ids, None, method="unconstrained", n=s.n,
                                   max_new_tokens=s.long_tokens, seed=0)
            res, run = measure(lm, sample)
            count = sum(len(x.tokens) for x in res.samples)
            base = base or res.texts
            same = sum(a == b for a, b in zip(res.texts, base, strict=True))
            rows.append((label, f"{run.wall:.2f}", f"{count / run.wall:.1f}", run.passes,
                         gb(run.peak), f"{same}/{s.n}"))
            log(f"long {label}: {run.wall:.2f} s")
        lm.shared_attention, lm.share_tokens = saved
        lm.clear_cache()

        def hf() -> Any:
            torch.manual_seed(0)
            prompt = torch.tensor([ids], device=lm.device)
            eos = [int(e) for e in lm.vocab.eos_ids]
            with torch.inference_mode():
                return lm.model.generate(
                    prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                    max_new_tokens=s.long_tokens, min_new_tokens=s.long_tokens, top_k=0,
                    top_p=1.0, num_return_sequences=s.n, eos_token_id=eos,
                    pad_token_id=eos[0])
        out, run = measure(lm, hf)
        count = int(out.shape[0] * (out.shape[1] - len(ids)))
        rows.append(("`model.generate`", f"{run.wall:.2f}", f"{count / run.wall:.1f}", "–",
                     gb(run.peak), "–"))
    print(f"\n## long: a {len(ids)}-token prompt, {s.n} samples of {s.long_tokens} tokens\n")
    print("Unconstrained, EOS disabled, prefill included; same texts: samples equal to the "
          "first configuration's (bfloat16 rounding differs between the paths).\n")
    table(("kept states", "s", "tokens/s", "forward passes", "peak GPU GB", "same texts"), rows)


SECTIONS = ("decode", "generate", "methods", "batch", "long")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("1.5b", "7b"), default="7b")
    ap.add_argument("--tiny", action="store_true",
                    help="a tiny model of the same architecture and short runs (CPU smoke run)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                    default="auto", help="auto: bfloat16 on CUDA, float32 on a CPU")
    ap.add_argument("--tokenizer", type=Path, default=TOKENIZER,
                    help="the Qwen tokenizer's directory (default ../shared/tokenizers/qwen3)")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections (default: all of {','.join(SECTIONS)})")
    ap.add_argument("--repeat", type=int, help="runs per timed row (default 3; 1 with --tiny)")
    ap.add_argument("--max-seconds", type=float,
                    help="time budget of one constrained run (default 30; 1 with --tiny)")
    args = ap.parse_args(argv)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    if set(only) - set(SECTIONS):
        ap.error(f"unknown section(s) {', '.join(sorted(set(only) - set(SECTIONS)))}")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" \
        else args.device
    dtype_name = ("bfloat16" if device == "cuda" else "float32") if args.dtype == "auto" \
        else args.dtype
    size = "tiny" if args.tiny else args.size
    scale = TINY if args.tiny else Scale()
    if args.repeat is not None:
        scale.repeat = args.repeat
    if args.max_seconds is not None:
        scale.max_seconds = args.max_seconds
    started = time.perf_counter()
    lm = build(size, args.tokenizer, device, getattr(torch, dtype_name))
    built = time.perf_counter() - started
    import transformers

    where = (f"{torch.cuda.get_device_name(lm.device)} (CUDA {torch.version.cuda})"
             if lm.device.type == "cuda" else f"CPU {cpu_name()}, {os.cpu_count()} logical CPUs, "
             f"torch threads {torch.get_num_threads()}")
    params = sum(p.numel() for p in lm.model.parameters()) / 1e9
    print(f"# The transformers backend at Qwen2 {size} ({params:.2f} B parameters, random "
          f"weights, {dtype_name}) on {lm.device.type}\n")
    print(f"device: {where}; Python {platform.python_version()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, adaptrack {at.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}; load average {load()}; model built in "
          f"{built:.1f} s; vocabulary {lm.vocab.size}; shared-prefix attention "
          f"{'on' if lm.shared_attention else 'off'}")
    hf_rate: dict[int, float] = {}
    for name in SECTIONS:
        if name not in only:
            continue
        start = time.perf_counter()
        if name == "decode":
            section_decode(lm, scale)
        elif name == "generate":
            hf_rate = section_generate(lm, scale)
        elif name == "methods":
            rate = hf_rate.get(scale.rows)
            if rate is None:  # the reference of the ratios, measured once
                with NoEOS(lm):
                    (_, _, count), run = measure(lm, lambda: run_hf(
                        lm, FREE_PROMPT, scale.rows, scale.gen_tokens, 0))
                rate = count / run.wall
            section_methods(lm, scale, rate)
        elif name == "batch":
            section_batch(lm, scale)
        else:
            section_long(lm, scale)
        log(f"{name}: {time.perf_counter() - start:.1f} s")
    print(f"Total wall time {time.perf_counter() - started:.0f} s; load average at end {load()}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
