"""Property-based fuzz of ``adaptrack generate``'s arguments (hypothesis), on the toy model
of ``test_cli_fuzz.py``: any mix of flags, values (valid, wrong, surrogate-escaped bytes),
prompt files (a 10 MB file, ``/dev/zero``, binary, missing) and stdin exits 0, or 2 with one
``adaptrack: error:`` line and no traceback; with ``--json`` stdout holds one JSON object
whenever the arguments parsed; the process's peak memory grows by a bounded amount.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import sys
import warnings
from pathlib import Path

import pytest
import test_cli_fuzz
from fuzzing import watchdog
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_cli_fuzz import NUMBERS, REGEXES, Files, cli_verdict, fake_loader

from adaptrack import METHODS

#: The most the process's peak RSS may grow over the fuzz (the prompt files reach 10 MB).
PEAK_GROWTH_BYTES = 300 << 20


@pytest.fixture(autouse=True)
def context(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy model with a context of 256 tokens, as real models have (one without reads
    a prompt file up to 256 MiB, which the toy tokenizes slowly)."""
    toy = test_cli_fuzz._toy_model

    def with_context() -> object:
        lm = toy()
        lm.context_length = 256
        return lm

    monkeypatch.setattr(test_cli_fuzz, "_toy_model", with_context)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    made = Files(tmp_path_factory.mktemp("cli_hypothesis")).make()
    big = made.root / "big.txt"
    big.write_bytes(b"ab " * 3_500_000)
    made.paths["big"] = str(big)
    if os.path.exists("/dev/zero"):
        made.paths["zero"] = "/dev/zero"
    made.start_peak = peak_rss()  # type: ignore[attr-defined]
    return made


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin"
                                                                 else 1024)


WORDS = st.one_of(st.sampled_from(["--json", "--truncate-prompt", "--no-fast-forward",
                                   "--share-q", "--bogus", "-n", "--", "-", ""]),
                  st.text(max_size=6),
                  st.binary(min_size=1, max_size=4).map(os.fsdecode))


@st.composite
def argvs(draw: st.DrawFn, files: Files) -> list[str]:
    argv = ["generate"]
    source = draw(st.sampled_from(["text", "text", "file", "stdin", "none"]))
    if source == "text":
        argv += ["--prompt", draw(st.one_of(st.text(max_size=20), WORDS))]
    elif source == "file":
        argv += ["--prompt-file", files.paths[draw(st.sampled_from(sorted(files.paths)))]]
    elif source == "stdin":
        argv += ["--prompt-file", "-"]
    for name in draw(st.lists(st.sampled_from(sorted(NUMBERS)), max_size=3, unique=True)):
        valid, bad = NUMBERS[name]
        argv += [name, draw(st.sampled_from(valid + bad))]
    if draw(st.booleans()):
        argv += ["--method", draw(st.sampled_from([*METHODS, "x"]))]
    if draw(st.booleans()):
        option = draw(st.sampled_from(["--regex", "--constraint", "--json-schema", "--lark",
                                       "--api-module"]))
        value = (draw(st.sampled_from(REGEXES)) if option == "--regex" else
                 draw(st.sampled_from(["json", "zz_missing_mod", "."]))
                 if option == "--api-module" else  # the 10 MB file is a prompt's
                 files.paths[draw(st.sampled_from(sorted(set(files.paths) - {"big"})))])
        argv += [option, value]
    argv += draw(st.lists(WORDS, max_size=2))
    if "--max-new-tokens" not in argv:
        argv += ["--max-new-tokens", "3"]
    return argv


@settings(max_examples=int(os.environ.get("ADAPTRACK_FUZZ_EXAMPLES", "150")), deadline=None,
          derandomize="ADAPTRACK_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_generate_arguments_exit_0_or_one_error_line(files, data):
    from adaptrack.cli import main

    argv = data.draw(argvs(files))
    stdin = data.draw(st.sampled_from(["", "ab", "ab " * 2_000_000, "a\udcff"]))
    out, err = io.StringIO(), io.StringIO()
    with watchdog(), fake_loader(), warnings.catch_warnings(), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.simplefilter("ignore")
        old, sys.stdin = sys.stdin, io.StringIO(stdin)
        try:
            code = main(argv)
        finally:
            sys.stdin = old
    text = err.getvalue()
    why = cli_verdict(code, text)
    assert why is None, (why, argv, text[-1500:])
    event(f"exit {code}")
    parsed = "usage" not in text and not any(w in text for w in (
        "argument", "unrecognized", "expected one", "not allowed with", "applies to"))
    if "--json" in argv and parsed and code in (0, 2) and out.getvalue().strip():
        json.loads(out.getvalue().strip().splitlines()[-1])  # one JSON object, error or not
    if "--json" in argv and code == 2 and re.search(
            r"error: (--prompt-file \S+: |cannot read prompt file)", text):
        assert out.getvalue().strip(), (argv, text)  # a prompt file's refusal is JSON too


def test_the_fuzz_kept_memory_bounded(files: Files) -> None:
    """Runs after the property above (file order): peak RSS grew by less than
    :data:`PEAK_GROWTH_BYTES` since the module's first test."""
    assert peak_rss() - files.start_peak < PEAK_GROWTH_BYTES  # type: ignore[attr-defined]


def test_big_files_are_in_the_fuzz(files: Files) -> None:
    assert Path(files.paths["big"]).stat().st_size > 10_000_000
