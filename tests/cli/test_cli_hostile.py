"""The command line against hostile input (issue 47, docs/security.md): a prompt file
larger than the context holds (a file, stdin, ``/dev/zero``) is refused after reading at
most the bytes that fit; every other reproduction is one ``adaptrack: error:`` line."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

import adaptrack
from adaptrack import cli
from adaptrack.cli import generate as cli_generate
from adaptrack.cli import prompt as cli_prompt
from adaptrack.limits import SLACK_BYTES


class Tiny(adaptrack.TableLM):
    """A toy with a 64-token context of tokens of at most 2 bytes (124 bytes fit with
    --max-new-tokens 2), recording the length of each text it tokenizes."""

    def __init__(self) -> None:
        super().__init__([b"a", b"bb", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
        self.context_length = 64
        self.encoded: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.encoded.append(len(text))
        return super().encode(text)


@pytest.fixture
def tiny(monkeypatch):
    lm = Tiny()
    monkeypatch.setattr(cli_generate, "load_model", lambda *a, **k: lm)
    return lm


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adaptrack: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


GEN = ("generate", "--max-new-tokens", "2", "--method", "unconstrained", "--seed", "0")


def test_a_prompt_file_past_the_context_is_refused_from_its_size(capsys, tiny, tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * 10_000_000)
    code, _, err = run(capsys, *GEN, "--prompt-file", str(big))
    one_error(code, err, "has 10000000 bytes", "at most 124", "--truncate-prompt")
    assert tiny.encoded == []
    fits = tmp_path / "fits.txt"
    fits.write_bytes(b"a" * 62)
    code, _, err = run(capsys, *GEN, "--prompt-file", str(fits))
    assert code == 0, err


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_dev_zero_as_the_prompt_file_is_refused_at_once(capsys, tiny):
    code, _, err = run(capsys, *GEN, "--prompt-file", "/dev/zero")
    one_error(code, err, f"has more than {124 + SLACK_BYTES} bytes", "at most 124")
    assert tiny.encoded == []


def test_stdin_past_the_context_is_refused(capsys, tiny, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a" * 5_000_000)))
    code, _, err = run(capsys, *GEN, "--prompt-file", "-")
    one_error(code, err, f"stdin has more than {124 + SLACK_BYTES} bytes")


def test_truncate_prompt_tokenizes_only_the_end_of_a_file(capsys, tiny, tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * 10_000_000)
    code, out, err = run(capsys, *GEN, "--prompt-file", str(big), "--truncate-prompt",
                         "--json")
    assert code == 0, err
    assert len(json.loads(out)["samples"]) == 1
    assert tiny.encoded == [124 + SLACK_BYTES]  # the bytes that fit and the slack


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_truncating_an_endless_stream_stops_at_its_bound(capsys, tiny, monkeypatch):
    monkeypatch.setattr(cli_prompt, "MAX_STREAM_BYTES", 4 << 20)
    code, _, err = run(capsys, *GEN, "--prompt-file", "/dev/zero", "--truncate-prompt")
    one_error(code, err, "more than 4 MiB")


def test_a_lone_surrogate_in_the_prompt_is_one_line(capsys, tiny):
    one_error(*run(capsys, *GEN, "--prompt", "a\udcffb")[::2], "not valid UTF-8")


def test_an_empty_api_key_is_refused_before_the_model_loads(capsys, monkeypatch):
    monkeypatch.delenv("ADAPTRACK_API_KEY", raising=False)
    one_error(*run(capsys, "serve", "--api-key", "", "--port", "0")[::2], "--api-key is empty")
    one_error(*run(capsys, "serve", "--api-key", "  ", "--port", "0")[::2], "--api-key is empty")
    monkeypatch.setenv("ADAPTRACK_API_KEY", "")
    one_error(*run(capsys, "serve", "--port", "0")[::2], "$ADAPTRACK_API_KEY is empty")


@pytest.mark.parametrize("value,words", [("a.*", "a wildcard is"), (" , ", "is empty")])
def test_allowed_hosts_are_checked_when_parsed(capsys, value, words):
    one_error(*run(capsys, "serve", "--allowed-hosts", value)[::2], "--allowed-hosts", words)


def test_api_module_of_a_missing_module_is_one_line(capsys, tiny):
    one_error(*run(capsys, *GEN, "--prompt", "a", "--api-module", "no_such_module_xyz")[::2],
              "no module named 'no_such_module_xyz'")


def test_report_on_a_line_nested_too_deep_is_one_line(capsys, tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"header": {"task": "binary"}}\n' + "[" * 100_000 + "\n")
    one_error(*run(capsys, "report", str(path))[::2], "line 2 is nested more than 100 levels")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_dev_zero_as_a_constraint_file_is_refused_at_its_cap(capsys, tiny, monkeypatch):
    from adaptrack.cli import common

    monkeypatch.setattr(common, "MAX_TEXT_FILE_BYTES", 1 << 20)
    for option, name in (("--json-schema", "--json-schema"), ("--constraint", "--choices"),
                         ("--lark", "--lark")):
        one_error(*run(capsys, *GEN, "--prompt", "a", option, "/dev/zero")[::2],
                  name, "larger than 1 MiB")
