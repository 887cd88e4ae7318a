"""Fuzz of the command line: random argv and stdin through ``adaptrack.cli.main`` exit 0, or
2 with ``adaptrack: error: ...`` as the last line of stderr and no traceback, never a hang
(the error contract, docs/design.md §6; the shared machinery is in ``fuzzing.py``).

The cases run ``adaptrack.cli.main`` in this process with the model loader replaced by a toy
byte-level model: nothing loads a real model, and a case that would load one from disk is
skipped. Cases come from a seeded ``random.Random`` per case, as in ``test_fuzz.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fuzzing import (
    REGEXES,
    Findings,
    Hang,
    check_regression,
    pinned,
    rand_text,
    signature,
    tail,
    watchdog,
)

from adaptrack import METHODS, TableLM

CLI_SEEDS = range(400)


# ------------------------------------------------------------------ the command line


def _toy_model() -> TableLM:
    """Bytes 0..255 and EOS (P(EOS) ~ 0.3 everywhere): every prompt encodes, outputs end."""
    weights = np.ones(257)
    weights[256] = 110.0
    lm = TableLM([bytes([b]) for b in range(256)] + [b"<eos>"], lambda prefix: weights,
                 eos=256)
    lm.name = "toy"  # type: ignore[attr-defined]
    return lm


class Refused(BaseException):
    """The case would load a real model from disk: skipped, not a failure."""


@contextlib.contextmanager
def fake_loader() -> Iterator[None]:
    """Replace ``load_model`` wherever the command line and the harness look it up: the
    default model becomes the toy model; a path that does not exist goes to the real loader
    (which refuses it before loading anything); anything else is refused (:class:`Refused`)."""
    from adaptrack.lm import load as load_module

    real = load_module.load_model

    def fake(spec: Any = None, backend: str = "auto", device: str = "auto", **kw: Any) -> Any:
        if spec is None and backend in ("auto", "transformers") and device != "cuda":
            return _toy_model()
        path = Path(str(spec)).expanduser() if spec is not None else None
        if spec is None or ((str(spec).startswith("/") or str(spec).endswith(".gguf")) and (
                not path.exists())):
            return real(spec, backend=backend, device=device, **kw)
        raise Refused(f"would load {spec!r}")

    import adaptrack.cli  # noqa: F401 (so that its submodules are in sys.modules)

    targets = [load_module] + [m for name, m in list(sys.modules.items())
                               if (name == "adaptrack.cli" or name.startswith("adaptrack.cli.")
                                   or name == "adaptrack.demo")
                               and m is not None and hasattr(m, "load_model")]
    saved = [(m, m.load_model) for m in targets]
    for m in targets:
        m.load_model = fake
    try:
        yield
    finally:
        for m, f in saved:
            m.load_model = f


@dataclass
class Files:
    """Paths the command-line cases name: files of every kind, a directory, missing ones."""

    root: Path
    paths: dict[str, str] = field(default_factory=dict)

    def make(self) -> Files:
        r = self.root
        rng = random.Random(7)

        def put(name: str, data: bytes) -> str:
            p = r / name
            p.write_bytes(data)
            return str(p)

        self.paths = {
            "empty": put("empty.txt", b""),
            "random": put("random.bin", bytes(rng.randrange(256) for _ in range(300))),
            "latin1": put("latin1.txt", "caf\xe9\nna\xefve\n".encode("latin-1")),
            "choices": put("choices.txt", b"ab\nb\n\n(a\n"),
            "names": put("names.txt", b"a.b\nab\n_x\n"),
            "bad_names": put("bad_names.txt", b"2d\n.a\n"),
            "schema": put("schema.json", b'{"type": "string", "maxLength": 3}'),
            "bad_schema": put("bad_schema.json", b'{"type": "nope"'),
            "lark": put("g.lark", b'start: "a" "b"?\n'),
            "gbnf": put("g.gbnf", b'root ::= "a" [ab]?\n'),
            "jsonl": put("r.jsonl", b'{"a": 1}\n[1, 2]\nnot json\n'),
            "header": put("h.jsonl", b'{"task": "binary", "options": {}}\n'),
            "gz": put("r.jsonl.gz", b"\x1f\x8b\x08\x00garbage"),
            "tokenizer": put("tokenizer.json", b'{"model": {"type": "BPE"}}'),
            "dir": str(r),
            "missing": str(r / "missing" / "x.txt"),
            "missing_gguf": str(r / "missing.gguf"),
            "new": str(r / "new.jsonl"),
            "surrogate": os.fsdecode(bytes(r / "x") + b"\xff\xfe.txt"),
            "devnull": os.devnull,
            "stdin": "-",
        }
        return self

    def pick(self, rng: random.Random) -> str:
        return self.paths[rng.choice(sorted(self.paths))]


def rand_arg(rng: random.Random) -> str:
    """A random command-line word: numbers, flags, text, surrogate-escaped bytes."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice(["0", "1", "-1", "2.5", "nan", "inf", "-inf", "1e400", "", "0x10",
                           "99999999999999999999999", " 3", "٣"])
    if kind == 1:
        return rng.choice(["--", "-", "-n", "--json", "--bogus", "--prompt", "-h", "--seed",
                           "--method=cd", "--top-p=0"])
    if kind == 2:
        return os.fsdecode(bytes(rng.randrange(256) for _ in range(rng.randint(1, 4))))
    return rand_text(rng, 6)


NUMBERS = {
    "-n": (["1", "2", "3"], ["0", "-1", "x", "1.5", "", "1e3"]),
    "--temperature": (["0", "1", "0.5", "1e-300"], ["nan", "inf", "-1", "x", ""]),
    "--top-p": (["1", "0.5", "0.001"], ["0", "1.5", "nan", "-0.1", "x"]),
    "--seed": (["0", "7", "99999999999999999999999"], ["-1", "1.5", "x"]),
    "--max-new-tokens": (["1", "3", "5"], ["0", "-2", "x", "2.0"]),
    "--max-seconds": (["2", "0.5"], ["0", "-1", "nan", "x"]),
}


def _value(rng: random.Random, name: str, junk: bool = False) -> str:
    valid, bad = NUMBERS[name]
    return rng.choice(bad if junk else valid)


def rand_generate_argv(rng: random.Random, files: Files) -> list[str]:
    """``generate`` with valid arguments (half the cases), else with one wrong part."""
    junk = "" if rng.random() < 0.5 else rng.choice(
        ["prompt", "constraint", "constraint", "number", "number", "flag", "model"])
    p = files.paths
    argv = ["generate"]
    if junk == "prompt":
        argv += rng.choice([[], ["--prompt", "a", "--prompt-file", p["choices"]],
                            ["--prompt-file", files.pick(rng)], ["--prompt", rand_arg(rng)],
                            ["--prompt"]])
    elif rng.random() < 0.7:
        argv.append("--prompt=" + rand_text(rng, 8, surrogates=False))
    else:
        argv += ["--prompt-file", rng.choice([p["choices"], p["empty"], p["names"]])]
    good = {
        "--constraint": [p["choices"], p["names"]],
        "--api-names": [p["names"]],
        "--api-module": ["json"],
        "--regex": [r for r in REGEXES[:8] if r != "a{1000}"],
        "--json-schema": [p["schema"]],
        "--lark": [p["lark"]],
        "--gbnf": [p["gbnf"]],
    }
    if junk == "constraint":
        kinds = rng.sample(sorted(good), rng.choice([1, 1, 2]))
        for name in kinds:
            value = (rng.choice(["zz_fuzz_missing", "", ".", "os..path", rand_text(rng, 4)])
                     if name == "--api-module" else
                     rng.choice(REGEXES) if name == "--regex" and rng.random() < 0.5 else
                     rand_text(rng, 6) if name == "--regex" else files.pick(rng))
            argv += [name, value]
    elif rng.random() < 0.8:
        name = rng.choice(sorted(good))
        argv += [name, rng.choice(good[name])]
    if argv[-2] in ("--constraint", "--prompt-file") or (argv[-1].startswith("--prompt=") and (
            rng.random() < 0.3)):
        argv += ["--terminators", rng.choice(["(", "\n", "b("])]
    argv += ["--method", rng.choice(list(METHODS))]
    numbers = ["--max-new-tokens"] + [k for k in ("-n", "--temperature", "--top-p", "--seed",
                                                  "--max-seconds") if rng.random() < 0.5]
    bad = rng.choice(numbers) if junk == "number" else ""
    for name in numbers:
        argv += [name, _value(rng, name, name == bad)]
    for flag in ("--no-fast-forward", "--json", "--truncate-prompt"):
        if rng.random() < 0.2:
            argv.append(flag)
    if junk == "flag":
        argv += rng.choice([["--share-q"], ["--bogus"], ["--json=1"], ["-n"], ["extra"],
                            ["--backend", "x"], ["--device", "tpu"]])
    elif "--method" in argv and argv[argv.index("--method") + 1] == "adaptrack" and (
            rng.random() < 0.3):
        argv.append("--share-q")
    if junk == "model":
        argv += ["--model", rng.choice([p["missing_gguf"], p["missing"], "/nonexistent/m"])]
        if rng.random() < 0.5:
            argv += ["--backend", rng.choice(["auto", "llamacpp", "transformers"])]
    return argv


def rand_cli_argv(rng: random.Random, files: Files) -> list[str]:
    kind = rng.choices(["generate", "demo", "eval", "report", "bench", "junk"],
                       weights=[50, 12, 12, 12, 8, 6])[0]
    if kind == "generate":
        argv = rand_generate_argv(rng, files)
    elif kind == "demo":
        argv = ["demo"]
        if rng.random() < 0.9:
            argv += ["--problem", rng.choice(["binary", "no_ab", "api_names", "length_bound",
                                              "x", ""])]
        else:  # the model demo, only with a model that does not exist
            argv += ["--model", files.paths["missing_gguf"]]
        argv += ["-n", rng.choice(["1", "5", "30", "0", "-3", "x"])]
        if rng.random() < 0.3:
            argv += ["--seed", rng.choice(["0", "3", "-1", "x", "99999999999999999999999"])]
        if rng.random() < 0.1:
            argv += ["--model", files.paths["missing_gguf"]]
    elif kind == "eval":
        argv = ["eval", rng.choice(["tfv1", "binary", "x"])]
        if rng.random() < 0.9:
            argv += ["-o", files.pick(rng)]
        argv += ["--model", rng.choice(["/nonexistent/m", files.paths["missing_gguf"]])]
        for name, values in (("--methods", ["cd", "cd,exact", "x", "", ",", "cd,,cd"]),
                             ("--settings", ["v1", "v3", ""]), ("-n", ["1", "0", "x"]),
                             ("--limit", ["1", "0"]), ("--temperature", ["1", "nan"]),
                             ("--seed", ["0", "x"]), ("--workers", ["1", "0", "x"])):
            if rng.random() < 0.3:
                argv += [name, rng.choice(values)]
        if rng.random() < 0.5:
            argv.append("--no-report")
    elif kind == "report":
        argv = ["report"]
        if rng.random() < 0.95:
            argv.append(files.pick(rng))
        if rng.random() < 0.2:
            argv += ["--plots", files.pick(rng)]
    elif kind == "bench":
        argv = ["bench", rng.choice(["ff", "ff", "x"])]
        if rng.random() < 0.9:
            argv += ["--data", files.pick(rng)]
        if rng.random() < 0.9:
            argv += ["--tokenizer", rng.choice([files.pick(rng), files.paths["tokenizer"]])]
        if rng.random() < 0.3:
            argv += ["--max-tokens", rng.choice(["0", "4", "-1", "x"])]
        if rng.random() < 0.3:
            argv += ["--limit", rng.choice(["1", "0"])]
    else:
        argv = [rand_arg(rng) for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.3:
            argv.insert(0, rng.choice(["setup", "--version", "-h", "help"]))
            if argv[0] == "setup":
                argv.insert(1, "--bogus")
    # missing or extra words
    if len(argv) > 1 and rng.random() < 0.1:
        del argv[rng.randrange(1, len(argv))]
    if rng.random() < 0.1:
        argv.insert(rng.randint(min(1, len(argv)), len(argv)), rand_arg(rng))
    return argv


def cli_verdict(code: Any, err: str) -> str | None:
    """None when an exit obeys the command line's contract, else what is wrong."""
    if "Traceback" in err:
        return "traceback on stderr"
    if code == 0:
        return None
    if code != 2:
        return f"exit status {code!r}"
    lines = [line for line in err.splitlines() if line.strip()]
    if not lines or (" error: " not in lines[-1] and not lines[-1].startswith("adaptrack: error:")):
        return "exit 2 without a final 'error:' line"
    if not lines[-1].split("error:", 1)[1].strip():
        return "exit 2 with an empty error message"
    return None


def run_cli_case(argv: list[str], stdin: str, findings: Findings, seed: int) -> None:
    from adaptrack.cli import main

    out, err = io.StringIO(), io.StringIO()
    detail = f"seed {seed}: argv = {argv!r}"
    code: Any = None
    try:
        with watchdog(), fake_loader(), warnings.catch_warnings(), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("ignore")
            old_stdin, sys.stdin = sys.stdin, io.StringIO(stdin)
            try:
                code = main(argv)
            finally:
                sys.stdin = old_stdin
    except Refused:
        findings.skipped += 1
        return
    except SystemExit as done:  # main should return a status, not exit
        findings.add(f"SystemExit({done.code!r}) escaped main", detail)
        return
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        why = "hang" if isinstance(exc, Hang) else f"{type(exc).__name__} escaped main"
        findings.add(signature(exc, why), f"{detail}\n{tail(exc)}")
        return
    findings.outcome(f"exit {code}")
    why = cli_verdict(code, err.getvalue())
    if why is not None:
        text = err.getvalue()
        findings.add(f"{why} ({argv[0] if argv else 'no args'})",
                     f"{detail}\nexit {code}; stderr tail:\n{text[-1500:]}")


def test_cli_fuzz(tmp_path: Path) -> None:
    """Random argv through ``adaptrack.cli.main``: exit 0, or 2 with one ``error:`` line."""
    files = Files(tmp_path).make()
    findings = Findings()
    for seed in CLI_SEEDS:
        rng = random.Random(seed)
        argv = rand_cli_argv(rng, files)
        run_cli_case(argv, rand_text(rng, 20), findings, seed)
    assert findings.skipped < len(CLI_SEEDS) // 4
    assert not findings.new(), "contract violations:\n\n" + findings.report()


SUBPROCESS_CASES = [
    ["generate", "--prompt-file", "{latin1}", "--model", "{missing_gguf}"],
    ["report", "{random}"],
    ["demo", "--problem", "binary", "-n", "5"],
    ["generate", "--prompt", "\udcff\udcfe", "--regex", "\udcc3(", "--max-new-tokens", "x"],
]


@pytest.mark.parametrize("template", SUBPROCESS_CASES, ids=lambda a: " ".join(a[:2]))
def test_cli_subprocess(template: list[str], tmp_path: Path) -> None:
    """``python -m adaptrack`` as a user runs it (non-UTF-8 argv and files included): exit 0,
    or 2 with ``adaptrack: error: ...`` last and no traceback. These fail before any model
    load (or run a toy problem)."""
    files = Files(tmp_path).make()
    argv = [a.format(**files.paths) for a in template]
    env = dict(os.environ, HF_HUB_OFFLINE="1", ADAPTRACK_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "adaptrack", *argv], capture_output=True,
                          env=env, timeout=120)
    err = done.stderr.decode("utf-8", "backslashreplace")
    assert cli_verdict(done.returncode, err) is None, (argv, done.returncode, err[-2000:])


# ------------------------------------------------------------------ pinned regressions


def _cli(*argv: str) -> Callable[[], Any]:
    def call() -> Any:
        from adaptrack.cli import main

        err = io.StringIO()
        with fake_loader(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(err):
            code = main(list(argv))
        why = cli_verdict(code, err.getvalue())
        assert why is None, f"{why}: {err.getvalue()[-800:]}"

    return call


CLI_REGRESSIONS: dict[str, Callable[[], Any]] = {
    "cli_api_module_relative": _cli("generate", "--prompt=a", "--api-module", ".",
                                    "--max-new-tokens", "1"),
}


@pytest.mark.parametrize("name", [pinned(n) for n in CLI_REGRESSIONS])
def test_regression(name: str) -> None:
    """Each defect of the command line the fuzz found, as one small input."""
    check_regression(CLI_REGRESSIONS[name])
