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

import time
from dataclasses import dataclass
from typing import Any

from ..constraints import Choice, choice
from .jobs import Job, Record
from .modeltask import PAPER_OPTIONS, ModelTask, check_methods, check_study, seed_for

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
        options: dict[str, Any] = {"share_q": True} if method == "adaptrack" else {}
        res = generate(self.lm, self.prompt, constraint(), method=method, n=self.n,
                       temperature=self.temperature, max_new_tokens=MAX_NEW_TOKENS,
                       seed=seed_for(self.seed, method), **PAPER_OPTIONS, **options)
        return {
            "key": method, "method": method, **({"share_q": True} if options else {}),
            "samples": [list(s.tokens) for s in res.samples],
            "texts": res.texts,
            "logprobs": [s.logprob for s in res.samples],
            "complete": [s.complete for s in res.samples],
            "lm_requests": [s.lm_requests for s in res.samples],
            "lm_calls": res.stats["lm_calls"],
            "backtracks": res.stats["backtracks"],
            "seconds": time.perf_counter() - started,
        }
