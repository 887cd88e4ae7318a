"""The binary task (paper §6.4, RQ4; from ASAp): five random bits from a real model, where
only ``00000`` and the strings starting with ``1`` are valid.

Greedy CD picks the first bit by the model's local odds, so it gives ``00000`` about as much
mass as all sixteen ``1…`` strings together; the target P(s | c) gives it only its own
share. The paper could only estimate KL to the target from samples (its Table 4 numbers
carry an unknown ``log Z``); here the target is enumerated exactly (a few dozen token
sequences), so KL(samples ‖ target) is a number with no offset.

Jobs: ``target`` (the exact distribution, by :func:`adaptrack.exact_distribution`) and one
per method, each drawing ``n`` samples in one :func:`adaptrack.generate` call (so ASAp and
AdapTrack with ``share_q`` learn across them, in the order recorded).

>>> c = constraint()
>>> [s.decode() for s in c.strings[:3]], len(c.strings)
(['00000', '10000', '10001'], 17)
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..constraints import Choice, choice
from ..errors import AdaptrackError
from . import metrics
from .checks import INT, NUMBER, POSITIVE, STAMPS, STR, TARGET, TOKEN_SAMPLES, fields, samples_match
from .jobs import Job, Record
from .modeltask import ModelTask, check_methods, check_study, paper_options, seed_for
from .tables import METHOD_NAMES, header_line, iid_kls, method_table, ordered_methods, pyplot
from .taskspec import Sampling, TaskSpec, methods_option, model_options

PROMPT = "Here is a random sequence of five bits: "
METHODS = ("cd", "asap", "adaptrack", "exact")
# Five bits and EOS take at most six tokens; two more leave room for odd tokenizations.
MAX_NEW_TOKENS = 8
# One method's samples make one results line (about 64 bytes a sample), which must stay
# under the runner's LINE_LIMIT (64 MiB) to be read back.
MAX_N = 250_000


def constraint() -> Choice:
    """``00000`` or any five bits starting with ``1``, then EOS."""
    return choice(["00000"] + [f"1{i:04b}" for i in range(16)])


@dataclass
class BinaryTask(ModelTask):
    """RQ4's binary problem on a model; AdapTrack runs with ``share_q`` as in the paper.
    The backend defaults to transformers: llama.cpp's log-probs of a sequence can differ
    by up to a nat between prefix trees (float16 KV reuse), too much for a KL this small.
    For the same reason transformers runs in float32 here on every device, CUDA included:
    half precision's log-probs change with the path that built a prefix's cache.

    Records: ``{"key": "target", "target": [[tokens, probability, text], …]}`` and, per
    method, ``samples`` (token lists in the order drawn), ``texts``, ``logprobs`` (log P
    under the model at the temperature), ``lm_requests``, ``lm_calls``, ``seconds``.
    """

    model: str | None = None
    backend: str = "transformers"
    device: str = "auto"
    methods: tuple[str, ...] = METHODS
    n: int = 2000
    temperature: float = 1.0
    seed: int = 0
    prompt: str = PROMPT

    def __post_init__(self) -> None:
        check_methods(self.methods)
        check_study("binary", self.n, MAX_N, self.temperature)

    def weights_dtype(self) -> str:
        """float32 on transformers, whatever the device (not an option of this study)."""
        return "float32" if self.backend == "transformers" else "auto"

    def config(self) -> dict[str, object]:
        return {"task": "binary", **self.model_config(), "n": self.n,
                "temperature": self.temperature, "seed": self.seed, "prompt": self.prompt,
                "max_new_tokens": MAX_NEW_TOKENS}

    def jobs(self) -> list[Job]:
        return [{"key": "target"}] + [{"key": m, "method": m} for m in self.methods]

    def run(self, job: Job) -> Record:
        from ..generate import exact_distribution, generate

        started = time.perf_counter()
        if job["key"] == "target":
            dist = exact_distribution(self.lm, self.prompt, constraint(),
                                      max_new_tokens=MAX_NEW_TOKENS,
                                      temperature=self.temperature, end="eos")
            decode = self.lm.vocab.decode
            rows = [[list(s), p, decode(s).decode("utf-8", "replace")]
                    for s, p in sorted(dist.items(), key=lambda kv: -kv[1])]
            return {"key": "target", "target": rows, "seconds": time.perf_counter() - started}
        method = job["method"]
        options = paper_options(method=method, n=self.n, temperature=self.temperature,
                                max_new_tokens=MAX_NEW_TOKENS, seed=seed_for(self.seed, method),
                                share_q=method == "adaptrack")
        res = generate(self.lm, self.prompt, constraint(), options=options)
        return {
            "key": method, "method": method, **({"share_q": True} if options.share_q else {}),
            "samples": [list(s.tokens) for s in res.samples],
            "texts": res.texts,
            "logprobs": [s.logprob for s in res.samples],
            "complete": [s.complete for s in res.samples],
            "lm_requests": [s.lm_requests for s in res.samples],
            "lm_calls": res.stats["lm_calls"],
            "backtracks": res.stats["backtracks"],
            "seconds": time.perf_counter() - started,
        }


# -- the declaration: record, report (Table 4, Figure 4), options ---------------------------


def binary_record(r: Record) -> str | None:
    """What is wrong with a binary record (:class:`BinaryTask`), or None.

    >>> binary_record({"key": "cd", "samples": [[1]], "logprobs": [], "lm_requests": [1],
    ...                "lm_calls": 1, "seconds": 0.1})
    '1 samples but 0 logprobs'
    """
    if r["key"] == "target":
        return fields(r, {"target": TARGET}, {"seconds": NUMBER, **STAMPS})
    return fields(r, TOKEN_SAMPLES, STAMPS) or samples_match(r, "logprobs")


def binary_scores(records: list[Record]) -> dict[str, Any]:
    """KL of each method's samples to the exact target, the paper's sample KL (support: the
    union of every method's samples), P(00000), and sliding-window KL (window n/4)."""
    by_key = {r["key"]: r for r in records}
    if "target" not in by_key:
        raise AdaptrackError("the results file has no exact target yet (the 'target' job)")
    target = {tuple(t): p for t, p, _ in by_key["target"]["target"]}
    text_of = {tuple(t): text for t, _, text in by_key["target"]["target"]}
    runs = {k: r for k, r in by_key.items() if k != "target" and "samples" in r}
    # A sample outside the target (incomplete, or invalid) would make every KL infinite:
    # it is counted apart and the KLs are over the rest.
    logprob: dict[tuple[int, ...], float] = {}
    for r in runs.values():
        for t, lp in zip(r["samples"], r["logprobs"], strict=True):
            if tuple(t) in target:
                logprob[tuple(t)] = lp
    support = list(logprob)
    out: dict[str, Any] = {"target": target, "text_of": text_of, "methods": {},
                           "support": len(support)}
    for method in ordered_methods(list(runs)):
        r = runs[method]
        seqs = [tuple(t) for t in r["samples"] if tuple(t) in target]
        n = len(seqs)
        if not n:
            continue
        window, step = max(1, n // 4), max(1, n // 200)
        out["methods"][method] = {
            "n": n,
            "kl": metrics.kl_divergence(Counter(seqs), target),
            "sample_kl": metrics.sample_kl(seqs, logprob, support=support),
            "p00000": sum(text_of[t] == "00000" for t in seqs) / n,
            "lm_calls": r["lm_calls"],
            "calls_per_sample": sum(r["lm_requests"]) / len(r["lm_requests"]),
            "seconds": r["seconds"],
            "window": window,
            "step": step,
            "sliding": metrics.sliding_kl(seqs, window, target=target, step=step),
            "outside": len(r["samples"]) - n,
        }
    return out


def binary_report(header: dict[str, Any], records: list[Record],
                  plots: str | os.PathLike[str] | None = None) -> str:
    """Table 4 for the binary study: per method the exact KL to the enumerated target, the
    paper's sample KL, P(00000) and costs; with ``plots``, Figure 4 (KL over sliding
    windows)."""
    s = binary_scores(records)
    target, methods = s["target"], s["methods"]
    p0 = sum(p for t, p in target.items() if s["text_of"][t] == "00000")
    lines = [f"# Binary (RQ4): five random bits, {header.get('n')} samples per method", "",
             f"{header_line(header)}; prompt {header.get('prompt')!r}.", "",
             f"Exact target by enumeration: {len(target)} token sequences, "
             f"P(00000 | c) = {p0:.4f}.", ""]
    if not methods:
        return "\n".join([*lines, "No method has finished yet."])
    lines += method_table(["KL to target (exact)", "sample KL (paper)", "P(00000)", "calls/sample",
                     "lm_calls", "seconds"],
                    {m: [f"{r['kl']:.4f}", f"{r['sample_kl']:.4f}", f"{r['p00000']:.4f}",
                         f"{r['calls_per_sample']:.2f}", str(r["lm_calls"]),
                         f"{r['seconds']:.1f}"] for m, r in methods.items()})
    n = min(r["n"] for r in methods.values())
    noise = iid_kls(target, n)
    lines += ["", "KL to target: KL(empirical ‖ P(· | c)) in nats, the target enumerated. "
              f"Sampling noise alone gives {noise.mean():.4f} on average and less than "
              f"{float(np.quantile(noise, 0.99)):.4f} in 99 % of cases (KL of {n} independent "
              "draws from the target, 1000 simulations). "
              "Sample KL: the paper's estimate, the model's "
              f"sequence probabilities renormalized over the {s['support']} sequences any "
              "method drew; it differs from the exact KL by a constant shared by all "
              "methods, so only differences between rows mean something."]
    outside = {m: r["outside"] for m, r in methods.items() if r["outside"]}
    if outside:
        lines.append(f"Samples outside the target's support (incomplete or invalid), left "
                     f"out of the KLs: {outside}.")
    if plots is not None:
        lines += ["", f"![KL over sliding windows]({_plot_binary(s, header, Path(plots))})"]
    return "\n".join(lines)


def _plot_binary(s: dict[str, Any], header: dict[str, Any], out: Path) -> Path:
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for m, r in s["methods"].items():
        xs = [i * r["step"] for i in range(len(r["sliding"]))]
        ax.plot(xs, r["sliding"], label=METHOD_NAMES.get(m, m))
    window = next(iter(s["methods"].values()))["window"]
    ax.axhline(iid_kls(s["target"], window).mean(), color="gray", linestyle=":",
               label="sampling noise (i.i.d. from the target)")
    ax.set_yscale("log")
    ax.set_xlabel(f"first sample of the window ({window} samples)")
    ax.set_ylabel("KL to the exact target (nats)")
    ax.set_title(f"Binary, {header.get('model')}: KL over sliding windows", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "binary-kl.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


SPEC = TaskSpec(
    "binary", help="paper RQ4: five random bits, KL to the exact target",
    description="Five random bits on a real model: valid are 00000 and any string starting "
                "with 1. KL of each method's samples to the exact target (by enumeration) "
                "and the paper's sample-based KL (Table 4, Figure 4).",
    options=(methods_option(METHODS, "; adaptrack shares Q across samples, as in the paper"),
             Sampling("n", 2000, note="per method")),
    # float32 on every device (BinaryTask), so no --dtype
    model_options=model_options(backend="transformers", dtype=False), task=BinaryTask,
    header={"model": STR, "backend": STR, "device": STR, "n": POSITIVE,
            "temperature": NUMBER, "seed": INT, "prompt": STR, "max_new_tokens": POSITIVE},
    record=binary_record, scores=binary_scores, report=binary_report)
"""The declaration of the binary task: its flags, header, records and report."""

