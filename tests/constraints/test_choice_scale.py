"""API-name constraints at scale: ``choice`` against a brute-force reference, ``api_names``,
``from_module`` and the TensorFlow API list.

The reference decodes every token's bytes and tests them against the string set, straight
from the definition (docs/design.md §2): token ``t`` is valid after text ``s`` iff ``s + t`` is a
prefix of some string, or (with terminators) ``s + t[:k]`` is a complete string and
``t[k]`` is a terminator for some ``k`` (then ``t`` finishes the sequence); EOS is valid
(and finishing) iff ``s`` is complete and there are no terminators; special tokens never.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator, Sequence

import pytest

import adaptrack as at
from adaptrack.constraints.api import API_TERMINATORS, ApiNames, api_names, from_module
from adaptrack.constraints.base import DONE
from adaptrack.constraints.choice import Choice
from adaptrack.errors import AdaptrackError, ModuleImportError
from adaptrack.eval import tfapi, wheels
from adaptrack.tokenization.vocab import Vocabulary

# --- the reference -------------------------------------------------------------------------


class Reference:
    """Valid / finishing tokens of a string set, by decoding every token (no tries)."""

    def __init__(self, strings: Sequence[bytes], terminators: bytes, vocab: Vocabulary):
        self.complete = set(strings)
        self.prefixes = {s[:i] for s in strings for i in range(len(s) + 1)}
        self.term = set(terminators)
        self.vocab = vocab

    def classify(self, text: bytes, token: int) -> str:
        """'invalid', 'valid' (the sequence goes on) or 'finish'."""
        if self.vocab.is_eos(token):
            return "finish" if text in self.complete and not self.term else "invalid"
        data = self.vocab.bytes_of(token)
        if not data:  # special tokens, ids past the tokenizer
            return "invalid"
        if text + data in self.prefixes:
            return "valid"
        for k in range(len(data)):
            if data[k] in self.term and text + data[:k] in self.complete:
                return "finish"
            if text + data[: k + 1] not in self.prefixes:
                break  # no longer prefix can be a complete string either
        return "invalid"

    def masks(self, text: bytes) -> tuple[list[int], list[int]]:
        valid, finishing = [], []
        for tok in range(self.vocab.size):
            kind = self.classify(text, tok)
            if kind != "invalid":
                valid.append(tok)
            if kind == "finish":
                finishing.append(tok)
        return valid, finishing


def node_of(c: Choice, text: bytes) -> int | None:
    node = 0
    for b in text:
        node = c.children[node].get(b)
        if node is None:
            return None
    return node


def check_state(c: Choice, matcher, ref: Reference, text: bytes, tokens: Sequence[int]) -> None:
    """allowed/finishing at ``text`` equal the reference; advance agrees on ``tokens``."""
    state = node_of(c, text)
    assert state is not None
    valid, finishing = ref.masks(text)
    got_valid, got_fin = matcher.allowed(state), matcher.finishing(state)
    assert got_valid.tolist() == valid, text  # sorted, no duplicates
    assert got_fin.tolist() == finishing, text
    for tok in tokens:
        kind, after = ref.classify(text, tok), matcher.advance(state, tok)
        if kind == "invalid":
            assert after is None, (text, tok)
        elif kind == "finish":
            assert after is DONE, (text, tok)
        else:
            assert after == node_of(c, text + ref.vocab.bytes_of(tok)), (text, tok)


def texts_to_check(strings: Sequence[bytes], rng: random.Random, count: int) -> list[bytes]:
    """The empty text, complete strings and random proper prefixes of the strings."""
    out = [b""]
    for _ in range(count):
        s = rng.choice(strings)
        out.append(s if rng.random() < 0.3 else s[: rng.randrange(len(s) + 1)])
    return out


# --- random vocabularies and string sets ---------------------------------------------------

LETTERS = "abc_"
#: Bytes the random tokens are made of: name bytes, terminators of every kind, UTF-8 of "é"
#: (bytes >= 0x80 continue a Unicode identifier, never terminate one).
TOKEN_BYTES = b"abc_.(" + b" )\n\x00" + "é".encode()


def random_names(rng: random.Random, count: int, unicode: bool) -> list[str]:
    letters = LETTERS + ("é" if unicode else "")
    names: set[str] = set()
    length = 1
    while len(names) < count:
        for _ in range(4 * count):
            parts = []
            for _ in range(rng.choice([1, 1, 2, 3])):
                part = "".join(rng.choice(letters) for _ in range(rng.randint(1, length)))
                parts.append(part)
            names.add(".".join(parts))
            if len(names) >= count:
                break
        length += 1
    return sorted(names)


def random_vocab(rng: random.Random, size: int) -> Vocabulary:
    tokens: list[bytes | None] = [bytes([b]) for b in TOKEN_BYTES]
    seen = set(tokens)
    while len(tokens) < size:
        data = bytes(rng.choice(TOKEN_BYTES) for _ in range(rng.randint(2, 6)))
        if data not in seen:
            seen.add(data)
            tokens.append(data)
    tokens += [None, None]  # special tokens; the second is EOS
    rng.shuffle(tokens)
    eos = [i for i, t in enumerate(tokens) if t is None][1]
    return Vocabulary(tokens, eos_ids=[eos], size=len(tokens) + 3)  # padded past the tokenizer


SIZES = [1, 2, 3, 10, 50, 200, 1000, 2000]
TERMINATOR_SETS = {"none": None, "paren": b"(", "api": API_TERMINATORS}


@pytest.mark.parametrize("term", list(TERMINATOR_SETS))
@pytest.mark.parametrize("seed", range(8))
def test_masks_and_advance_match_the_reference_on_random_vocabularies(seed, term):
    rng = random.Random(f"{seed}-{term}")
    names = random_names(rng, SIZES[seed], unicode=seed % 2 == 1)
    vocab = random_vocab(rng, rng.choice([60, 300]))
    prefix = rng.choice([".", "", "tf."])
    terminators = TERMINATOR_SETS[term]
    c = api_names(names, prefix=prefix, terminators=terminators)
    ref = Reference(c.strings, c.terminators, vocab)
    matcher = c.bind(vocab)
    for text in texts_to_check(c.strings, rng, 25):
        check_state(c, matcher, ref, text, range(vocab.size))


@pytest.mark.parametrize("seed", range(6))
def test_random_token_sequences_are_accepted_exactly_when_the_reference_says(seed):
    rng = random.Random(seed)
    c = api_names(random_names(rng, SIZES[seed + 2], unicode=True))
    vocab = random_vocab(rng, 120)
    ref, matcher = Reference(c.strings, c.terminators, vocab), c.bind(vocab)
    ended = 0
    for _ in range(300):
        state, text, seq, outcome = matcher.start(), b"", [], "open"
        for _ in range(8):
            # Mostly allowed tokens (a walk towards completion), sometimes any token.
            pool = matcher.allowed(state).tolist()
            tok = rng.randrange(vocab.size) if rng.random() < 0.2 or not pool else \
                rng.choice(pool)
            seq.append(tok)
            kind = ref.classify(text, tok)
            state = matcher.advance(state, tok)
            if kind == "invalid":
                assert state is None
                outcome = "invalid"
                break
            if kind == "finish":
                assert state is DONE
                outcome = "finished"
                break
            text += vocab.bytes_of(tok)
            assert state == node_of(c, text)
        assert matcher.accepts(seq) == (outcome == "finished")
        ended += outcome == "finished"
    assert ended > 10
    assert matcher.allowed(DONE).tolist() == [] and matcher.advance(DONE, 0) is None


@pytest.mark.parametrize("seed", range(20))
def test_random_non_prefixes_have_no_state(seed):
    """Text that is no prefix of a string is reached by no token sequence."""
    rng = random.Random(seed)
    c = api_names(random_names(rng, 30, unicode=False), prefix="")
    vocab = random_vocab(rng, 60)
    ref, matcher = Reference(c.strings, c.terminators, vocab), c.bind(vocab)
    text = b"".join(rng.choice([b"a", b"b", b"c", b"_", b"."]) for _ in range(rng.randint(1, 6)))
    # Walk it with single-byte tokens: it dies exactly where it leaves the prefixes.
    state, so_far = matcher.start(), b""
    single = {vocab.bytes_of(t): t for t in range(vocab.size) if len(vocab.bytes_of(t)) == 1}
    for b in text:
        tok = single[bytes([b])]
        want = ref.classify(so_far, tok)
        state = matcher.advance(state, tok)
        assert (state is None) == (want == "invalid")
        if state is None:
            assert so_far + bytes([b]) not in ref.prefixes
            break
        so_far += bytes([b])


def test_tokens_after_a_terminator_may_hold_anything():
    vocab = Vocabulary([b".", b"ab", b"ab(x", b"ab(\xff\xfe", b"(", b"ab.", b"\xc3\xa9(", None],
                       eos_ids=[7])
    c = api_names(["ab", "abé"])
    m = c.bind(vocab)
    s = m.advance(m.start(), 0)
    assert m.allowed(s).tolist() == [1, 2, 3]  # "ab." leads nowhere: no "ab.x" name
    assert m.finishing(s).tolist() == [2, 3]
    after_ab = m.advance(s, 1)
    assert m.allowed(after_ab).tolist() == [4, 6]  # "(" ends "ab"; "é(" ends "abé"
    assert m.finishing(after_ab).tolist() == [4, 6]
    assert m.advance(after_ab, 7) is None  # EOS: names end with a terminator


def test_generate_cuts_the_text_after_the_terminator_with_the_full_ascii_set():
    vocab = [b".", b"sum", b"sum(x", b"max", b"max) +", b"ma", b"x\n", b" ", b"th.max", b"<eos>"]
    lm = at.TableLM(vocab, lambda p: [1.0] * len(vocab), eos=len(vocab) - 1)
    c = api_names(["sum", "max", "math.max"])
    seen = set()
    for method in ("cd", "adaptrack", "exact"):
        res = at.generate(lm, [], c, method=method, n=30, seed=1, max_new_tokens=6)
        for s in res.samples:
            assert s.complete and s.valid, s
            assert s.text[0] == "." and s.text[-1] in "() \n", s.text
            assert s.text[1:-1] in {"sum", "max", "math.max"}, s.text
            seen.add(s.text)
    assert {".sum(", ".max)", ".max\n", ".sum "} <= seen  # "sum(x", "max) +", "x\n" cut


# --- the default model's vocabulary ----------------------------------------------------------


def test_tensorflow_names_on_the_default_vocabulary_match_the_reference(default_vocab):
    names = tfapi.tensorflow_api_names()
    c = api_names(names)
    ref, matcher = Reference(c.strings, c.terminators, default_vocab), c.bind(default_vocab)
    rng = random.Random(0)
    texts = [b"", b".", b".math", b".math.", b".compat.v1.", b".math.reduce_sum",
             b".compat.v1.nn.rnn_cell.", b".nn.relu", *texts_to_check(c.strings, rng, 8)]
    t0 = time.perf_counter()
    sample = rng.sample(range(default_vocab.size), 3000)
    for i, text in enumerate(texts):
        valid = ref.masks(text)[0]
        # advance on every valid token, the first token ids (specials) and a random sample
        check_state(c, matcher, ref, text, valid + list(range(20)) + (sample if i < 4 else []))
    assert time.perf_counter() - t0 < 30
    # The accepting node ".math" allows "(", " (", ".", ... and every token starting with a
    # terminator: two thirds of the vocabulary.
    assert len(matcher.allowed(node_of(c, b".math"))) > 30_000


# --- api_names -----------------------------------------------------------------------------


def test_api_terminators_are_every_ascii_byte_that_cannot_continue_a_dotted_name():
    assert len(API_TERMINATORS) == 64
    for b in range(256):
        ch = bytes([b])
        continues = ch.isalnum() or ch in b"_." or b >= 0x80
        assert (b in API_TERMINATORS) == (not continues), ch


@pytest.mark.parametrize("bad", ["", "a..b", "1a", "a.b-c", "a b", ".a", "a.", "a.2"])
def test_api_names_rejects_bad_names_naming_them(bad):
    with pytest.raises(ValueError, match="empty" if not bad else re.escape(repr(bad))):
        api_names(["fine", bad])


def test_api_names_prefix_and_terminators():
    c = api_names(["a.b"], prefix="tf.")
    assert c.strings == [b"tf.a.b"] and c.terminators == API_TERMINATORS
    assert api_names(["a"], terminators=None).terminators == b""
    with pytest.raises(ValueError, match="terminator"):
        api_names(["a"], prefix="x(")
    assert api_names(["é.ñ"]).strings == [".é.ñ".encode()]


# --- from_module ---------------------------------------------------------------------------


def test_from_module_on_the_standard_library():
    import json

    js = from_module(json)
    assert isinstance(js, ApiNames) and js.module == "json" and js.errors == []
    assert {"dumps", "loads", "JSONDecodeError", "decoder.JSONDecoder", "encoder"} <= set(js.names)
    assert "decoder.c_scanstring" not in js.names  # json.decoder declares __all__
    assert not any(part.startswith("_") for n in js.names for part in n.split("."))
    assert js.names == sorted(set(js.names))
    assert all("." not in n for n in from_module("json", max_depth=0).names)
    email = from_module("email")
    assert {"message_from_string", "mime.text.MIMEText", "utils.formataddr"} <= set(email.names)
    assert "utils.os" not in email.names  # a foreign module is not API
    xml = from_module("xml")
    assert {"etree.ElementTree.parse", "dom.minidom.parseString", "sax.parse"} <= set(xml.names)
    assert xml.errors == []


def test_from_module_on_numpy():
    pytest.importorskip("numpy")
    c = from_module("numpy")
    assert {"linalg.norm", "random.default_rng", "fft.fft", "zeros", "ndarray"} <= set(c.names)
    assert "linalg.tests" not in c.names
    assert all(isinstance(e, tuple) and len(e) == 2 and "\n" not in e[1] for e in c.errors)
    lm = at.TableLM([b".", b"linalg", b".norm", b"(", b"norm(x", b"<eos>"],
                    lambda p: [1] * 6, eos=5)
    m = c.bind(lm.vocab)
    assert m.accepts([0, 1, 2, 3]) and m.accepts([0, 1, 0, 4])
    assert not m.accepts([0, 1, 2, 5])


@pytest.fixture
def fake_package(tmp_path, monkeypatch) -> Iterator[str]:
    name = f"fakepkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    files = {
        "__init__.py": "import os\nfrom . import good\nfrom .good import helper\n"
                       "VALUE = 3\n_private = 1\n",
        "good.py": f"from . import cyc\nimport {name} as parent\n\ndef helper():\n    pass\n",
        "cyc.py": f"import {name}.good as back\nfrom {name} import good\nCYC = 1\n",
        "broken.py": "raise RuntimeError('boom on import\\nsecond line')\n",
        "exits.py": "import sys\nsys.exit(3)\n",
        "withall.py": "import json\n__all__ = ['a', 'missing']\na = 1\nb = 2\n",
        "_hidden.py": "raise RuntimeError('private modules are not imported')\n",
        "tests/__init__.py": "raise RuntimeError('test suites are not imported')\n",
        "sub/__init__.py": "X = 1\n",
        "sub/deeper/__init__.py": "Y = 2\n",
        "sub/deeper/deepest/__init__.py": "Z = 3\n",
        "sub/deeper/deepest/bottom/__init__.py": "W = 4\n",
        "slow.py": "import time\ntime.sleep(0.6)\nS = 1\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def test_from_module_on_a_package_with_broken_submodules_and_cycles(fake_package):
    name = fake_package
    c = from_module(name, time_limit=60)
    names = set(c.names)
    # Importing good imported cyc, which made it an attribute of the package: its first
    # (shortest) path is "cyc", and "good.cyc" is an alias (listed, not entered again).
    assert {"VALUE", "helper", "good", "good.helper", "good.cyc", "cyc.CYC", "cyc.back",
            "cyc.good", "sub.X", "sub.deeper.Y", "sub.deeper.deepest",
            "sub.deeper.deepest.Z", "sub.deeper.deepest.bottom", "withall.a", "slow.S",
            "good.parent"} <= names
    assert "sub.deeper.deepest.bottom.W" not in names  # past max_depth=3
    assert "good.cyc.CYC" not in names
    assert not names & {"os", "_private", "withall.b", "withall.json", "broken", "exits",
                        "tests", "_hidden"}
    errors = dict(c.errors)
    assert errors[f"{name}.broken"] == "RuntimeError: boom on import"
    assert errors[f"{name}.exits"] == "SystemExit: 3"
    assert f"{name}.withall.missing" in errors
    assert len(c.errors) == 3
    shallow = from_module(name, max_depth=1, time_limit=60)
    assert "sub.deeper" in shallow.names and "sub.deeper.Y" not in shallow.names
    # The constraint works like any other.
    lm = at.TableLM([b".", b"cyc", b".CYC", b")", b"good", b"<eos>"], lambda p: [1] * 6, eos=5)
    assert c.bind(lm.vocab).accepts([0, 1, 2, 3])
    assert not c.bind(lm.vocab).accepts([0, 4, 0, 1, 2, 3])


def test_from_module_stops_at_the_time_limit_and_keeps_what_it_found(fake_package):
    t0 = time.perf_counter()
    c = from_module(fake_package, time_limit=0.3)
    assert time.perf_counter() - t0 < 3
    assert {"VALUE", "good", "slow"} <= set(c.names)  # listed before the limit
    assert any("time limit" in msg for _, msg in c.errors), c.errors
    assert not any(n.startswith("sub.") for n in c.names)  # "slow" took the time


def test_from_module_raises_for_a_missing_root_module():
    with pytest.raises(ModuleImportError, match="no module named 'no_such_module_anywhere_1234'"):
        from_module("no_such_module_anywhere_1234")
    with pytest.raises(TypeError):
        from_module(3)  # type: ignore[arg-type]


# --- the TensorFlow API list -----------------------------------------------------------------


def test_shipped_tensorflow_list():
    path = tfapi.data_file("2.16.1")
    assert path.is_file(), "src/adaptrack/eval/data/tf-2.16.1-api.txt must ship"
    names = tfapi.tensorflow_api_names("2.16.1")
    assert names == sorted(set(names)) and len(names) > 10_000
    assert {"math.reduce_sum", "reduce_sum", "nn.relu", "compat.v1.placeholder",
            "compat.v1.Session", "compat.v2.math.add", "linalg.matmul"} <= set(names)
    assert not any(p.startswith("_") for n in names for p in n.split("."))
    non_compat = [n for n in names if not n.startswith("compat.")]
    assert 3000 < len(non_compat) < 3500
    api_names(names)  # all valid dotted names


def test_tensorflow_list_matches_the_wheel():
    """The shipped list is what the builder reads from the wheel (downloaded once, ~4 s)."""
    wheel = tfapi.wheel_path("2.16.1")
    assert tfapi.api_from_wheel(wheel) == tfapi.tensorflow_api_names("2.16.1")


def test_api_from_wheel_reads_the_generated_modules(tmp_path):
    wheel = tmp_path / "tensorflow_cpu-9.9.9-cp311-cp311-manylinux2014_x86_64.whl"
    api = "tensorflow/_api/v2"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("tensorflow/__init__.py",
                   "import sys as _sys\n"
                   "from tensorflow._api.v2 import math\n"
                   "from tensorflow._api.v2 import compat\n"
                   "from tensorflow._api.v2 import __internal__\n"
                   "from tensorflow.python.ops.math_ops import add # line: 3\n"
                   "from tensorflow.python.ops.gen_math_ops import floor_mod as floormod\n"
                   "from tensorflow.python.ops import _hidden\n"
                   "setattr(_sys.modules[__name__], 'keras', None)\n")
        z.writestr(f"{api}/__init__.py", "")
        z.writestr(f"{api}/math/__init__.py",
                   "from . import special\n"
                   "from tensorflow.x import reduce_sum, reduce_max as rmax\n")
        z.writestr(f"{api}/math/special/__init__.py",
                   "from tensorflow.x import bessel_i0\nfrom tensorflow._api.v2 import math\n")
        z.writestr(f"{api}/compat/__init__.py", "from tensorflow._api.v2.compat import v1\n")
        z.writestr(f"{api}/compat/v1/__init__.py",
                   "from tensorflow._api.v2 import math\nfrom tensorflow.y import placeholder\n")
        z.writestr(f"{api}/__internal__/__init__.py", "from tensorflow.z import secret\n")
    assert tfapi.api_from_wheel(wheel) == [
        "add", "compat", "compat.v1", "compat.v1.math", "compat.v1.placeholder", "floormod",
        "math", "math.reduce_sum", "math.rmax", "math.special", "math.special.bessel_i0",
        "math.special.math",
    ]
    bad = tmp_path / "not-tf.whl"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("other/__init__.py", "")
    with pytest.raises(tfapi.TensorflowApiError, match="no generated API modules"):
        tfapi.api_from_wheel(bad)


def test_a_failed_download_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAPTRACK_CACHE", str(tmp_path))

    def fail(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching "
                                           "distribution found for tensorflow-cpu==0.0.1")

    monkeypatch.setattr(wheels.subprocess, "run", fail)
    with pytest.raises(tfapi.TensorflowApiError, match="No matching distribution") as info:
        tfapi.tensorflow_api("0.0.1")
    assert isinstance(info.value, AdaptrackError)
    assert "pip download" in str(info.value) and "--only-binary=:all:" in str(info.value)
    with pytest.raises(tfapi.TensorflowApiError, match="No matching distribution"):
        tfapi.tensorflow_api_names("0.0.1")  # not shipped: built, and the build fails


# --- argument types and min_new_tokens ----------------------------------------------------


def test_choice_takes_a_list_of_strings():
    with pytest.raises(TypeError, match=r"single string 'ab': pass \['ab'\]"):
        at.constraints.choice("ab")
    with pytest.raises(TypeError, match=r"got 1 \(int\) among them"):
        at.constraints.choice([1, 2])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"got None \(NoneType\)"):
        at.constraints.choice(["a", None])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="choice needs at least one string"):
        at.constraints.choice([])
    with pytest.raises(TypeError, match="list of strings, got int"):
        at.constraints.choice(5)  # type: ignore[arg-type]
    assert at.constraints.choice(iter(["b", b"a"])).strings == [b"a", b"b"]
    with pytest.raises(TypeError, match=r"single string 'norm': pass \['norm'\]"):
        api_names("norm")
    with pytest.raises(TypeError, match=r"API names must be strings, got 3 \(int\)"):
        api_names(["a", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="api_names needs at least one name"):
        api_names([])


def shortest_complete(m, max_len: int) -> int | None:
    """Breadth first over the matcher's states: the fewest tokens of a complete sequence."""
    layer, seen, depth = {m.start()}, {m.start()}, 0
    while layer and depth < max_len:
        depth += 1
        if any(len(m.finishing(s)) for s in layer):
            return depth
        nxt = {m.advance(s, t) for s in layer for t in m.allowed(s).tolist()}
        layer = {s for s in nxt if s is not None and s is not DONE} - seen
        seen |= layer
    return None


@pytest.mark.parametrize("term", list(TERMINATOR_SETS))
@pytest.mark.parametrize("seed", range(6))
def test_min_new_tokens_is_the_fewest_tokens_of_a_complete_sequence(seed, term):
    rng = random.Random(f"min-{seed}-{term}")
    for _ in range(4):
        names = random_names(rng, rng.choice([1, 2, 5, 20]), unicode=seed % 2 == 1)
        vocab = random_vocab(rng, rng.choice([40, 120]))
        c = api_names(names, prefix=rng.choice([".", ""]), terminators=TERMINATOR_SETS[term])
        m = c.bind(vocab)
        want = shortest_complete(m, 64)
        assert want is not None
        assert m.min_new_tokens() == want, (names, want)


def test_min_new_tokens_when_nothing_finishes():
    vocab = Vocabulary([b"a", b"b"])  # no EOS: a choice without terminators cannot end
    assert at.constraints.choice(["ab"]).bind(vocab).min_new_tokens() > 10**9
    assert at.constraints.choice(["ab"], terminators="c").bind(vocab).min_new_tokens() > 10**9
    assert at.constraints.choice(["a"], terminators="b").bind(vocab).min_new_tokens() == 2
