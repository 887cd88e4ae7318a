"""benchmarks/gpu.py --tiny: the GPU benchmark's sections run on a CPU with a tiny model of
the same architecture and print every table row (the Qwen tokenizer from ../shared)."""

from __future__ import annotations

import sys

import pytest
from paths import ROOT, SHARED

pytest.importorskip("torch", reason="the benchmark runs the transformers backend")
pytest.importorskip("transformers", reason="the benchmark runs the transformers backend")

BENCHMARKS = ROOT / "benchmarks"
TOKENIZER = SHARED / "tokenizers" / "qwen3"


def test_the_tiny_run_prints_every_table(capsys, monkeypatch):
    if not (TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"{TOKENIZER} is absent (shared test data not checked out next to the repo)")
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports its neighbours
    sys.modules.pop("gpu", None)
    import gpu

    assert gpu.main(["--tiny", "--device", "cpu", "--tokenizer", str(TOKENIZER)]) == 0
    out = capsys.readouterr().out
    assert "Qwen2 tiny" in out and "on cpu" in out and "device: CPU" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")]
    cells = [[c.strip("| ") for c in row] for row in rows]
    decode = [c for c in cells if c[0] in ("1", "8") and len(c) == 5]
    assert len(decode) == 4  # 1 and 8 rows, decode and generate
    methods = {(c[0], c[1]) for c in cells if len(c) == 13 and c[0] != "constraint"}
    assert methods == {(k, m) for k in ("grammar (JSON schema)", "API names (TF 2, v2 setting)")
                       for m in ("cd", "adaptrack", "exact")}
    batch = {c[0] for c in cells if c[0].startswith(("batch_size ", "max_batch_tokens "))}
    assert batch == {f"{k} {v}" for k in ("batch_size", "max_batch_tokens")
                     for v in (1, 8, 32, 128)}
    long = {c[0] for c in cells if len(c) == 6 and not c[0].startswith(("batch", "max_"))}
    assert long >= {"attended in place (default)", "shared states, copied per pass",
                    "full copies", "`model.generate`"}
    cd = [c for c in cells if len(c) == 13 and c[1] == "cd"]
    assert all(c[3] == "8/8" and float(c[5]) > 0 for c in cd)  # cd always finishes
