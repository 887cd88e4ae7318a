"""TFv1Real: the paper's rules (split, drop, deduplicate), the builder, and the task."""

from __future__ import annotations

import io
import socket
import tarfile
import zipfile

import pytest

import adaptrack as at
from adaptrack.eval import report, runner, tfv1, tfv1real
from adaptrack.eval.tfv1real import RealProblem, split

CALL = "x = tf.compat.v1.placeholder(tf.float32)\n"

# -- split: the first tf.compat.v1 in code, dropped or kept -------------------------------


def test_split_at_the_first_call_in_code():
    src = "import tensorflow as tf\n\n\ndef f():\n    " + CALL
    assert split(src) == ("import tensorflow as tf\n\n\ndef f():\n    x = tf",
                          ".compat.v1.placeholder")
    assert split("y = tf.compat.v1.train.AdamOptimizer(0.1)\n" + CALL) == (
        "y = tf", ".compat.v1.train.AdamOptimizer")
    # Line ends are normalized, so the prompt does not depend on the file's platform.
    assert split("import tensorflow as tf\r\n" + CALL) == (
        "import tensorflow as tf\nx = tf", ".compat.v1.placeholder")


@pytest.mark.parametrize("before", [
    "# tf.compat.v1 is deprecated\n",                       # a comment
    '"""Uses tf.compat.v1.placeholder()."""\n',             # a module docstring
    "def g():\n    '''tf.compat.v1.Session'''\n",           # a function's docstring
    "s = 'tf.compat.v1.x'\n",                               # a string
    'msg = f"{tf.compat.v1.x()} done"\n',                   # an f-string, field included
    "b = br'tf.compat.v1'\n",                               # a bytes literal
    "y = mytf.compat.v1.x(1)\n",                            # another name ending in tf
])
def test_drop_a_file_with_tf_compat_v1_before_the_split(before):
    assert split(before + CALL) == "earlier"


@pytest.mark.parametrize("source", [
    "s = tf.compat.v1.Session\n",                 # an attribute, not a call
    "v = tf.compat.v1\n",                         # the module itself
    "f = tf.compat.v1(3)\n",                      # no name under compat.v1
    "x = tf.compat.v1.placeholder (1)\n",         # not written as name(
    "x = tf.compat.v1.layers[0](1)\n",            # a subscript before the call
])
def test_keep_only_a_call_of_a_name_under_compat_v1(source):
    assert split(source + CALL) == "not_call"


@pytest.mark.parametrize("source", [
    "import tensorflow as tf\n",                              # no occurrence at all
    "# only tf.compat.v1.placeholder( in a comment\n",
    '"""tf.compat.v1.placeholder(x)"""\n',
    "x = tf.compat .v1.placeholder(1)\n",                     # not written together
    "import tensorflow.compat.v1 as tf1\nx = tf1.placeholder(1)\n",
])
def test_no_split_without_tf_compat_v1_in_code(source):
    assert split(source) == "none"


def test_a_file_that_stops_tokenizing_before_the_split_is_unreadable():
    assert split('s = """never closed\n' + CALL) == "unreadable"
    assert split("if x:\n        a = 1\n    b = 2\n" + CALL) == "unreadable"
    # An error after the split does not matter: the prompt ends before it.
    assert split(CALL + 's = """never closed\n') == ("x = tf", ".compat.v1.placeholder")


# -- provenance and duplicates ---------------------------------------------------------------


def test_license_from_metadata():
    lic = tfv1real.license_of
    assert lic("License-Expression: MIT\nLicense: whatever\n") == "MIT"
    assert lic("License: Apache 2.0\n") == "Apache 2.0"
    classifier = "Classifier: License :: OSI Approved :: BSD License\n"
    # A license field that holds the whole text, or says nothing, gives way to classifiers.
    full = "License: Copyright 2020\n        Permission is hereby granted, free of charge\n"
    assert lic(full + classifier) == "BSD License"
    assert lic("License: UNKNOWN\n" + classifier) == "BSD License"
    assert lic("Name: x\n") == "unknown"


def _wheel(files: dict[str, str], metadata: str = "Name: p\nLicense: MIT\n") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("p-1.dist-info/METADATA", metadata)
    return buf.getvalue()


def _sdist(files: dict[str, str], metadata: str = "Name: p\nLicense: BSD\n") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, text in {**files, "PKG-INFO": metadata}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"p-1/{name}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_read_wheels_and_sdists():
    files, meta = tfv1real.read_dist_bytes(_sdist({"p/a.py": CALL, "README": "x"}),
                                           "p-1.tar.gz")
    assert files == {"p/a.py": CALL.encode()} and "License: BSD" in meta
    files, meta = tfv1real.read_dist_bytes(_wheel({"p/a.py": CALL}), "p-1-py3-none-any.whl")
    assert list(files) == ["p/a.py"] and "License: MIT" in meta
    with pytest.raises(tfv1real.TFv1RealDataError, match="cannot read"):
        tfv1real.read_dist_bytes(b"not a zip", "p-1-py3-none-any.whl")


HEADER = "".join(f"# Licensed under the Apache License, line {i}\n" for i in range(13))
BODY = "import tensorflow as tf\nimport numpy as np\n\n\nclass T(tf.test.TestCase):\n" + \
    "".join(f"    def test_{i}(self):\n        self.assertEqual({i}, {i})\n" for i in range(3))


def _problem(package, prompt, oracle=".compat.v1.placeholder", path="a.py"):
    return RealProblem(package, "1", path, "MIT", prompt, {"v2": oracle})


def test_duplicates_exact_and_near():
    a = _problem("a", HEADER + BODY + "x = tf")
    same_but_spaces = _problem("b", HEADER + BODY.replace("\n\n", "\n \n") + "x  = tf")
    other_header = _problem("c", HEADER.replace("Apache", "MIT") + BODY + "x = tf")
    edited = _problem("d", HEADER + BODY.replace("test_2", "test_two") + "x = tf")
    other_oracle = _problem("e", HEADER + BODY + "x = tf", oracle=".compat.v1.Session")
    kept, exact, near = tfv1real.deduplicate([a, same_but_spaces, other_header, edited,
                                              other_oracle])
    assert [p.package for p in kept] == ["a", "e"]
    assert (exact, near) == (1, 2)
    assert kept[0].duplicates == ("b==1/a.py", "c==1/a.py", "d==1/a.py")


def test_files_that_share_only_a_license_header_are_not_duplicates():
    # The 13 license lines would make these 0.6 alike; without comments they share 3 of 11.
    one = _problem("a", HEADER + "import tensorflow as tf\nimport numpy as np\n"
                   "def f(a, b):\n    c = a + b\n    d = c * 2\n    return tf")
    two = _problem("b", HEADER + "import tensorflow as tf\nimport numpy as np\n"
                   "def g(x):\n    y = x - 1\n    z = y ** 2\n    return tf")
    assert not tfv1real.near_duplicate(one.prompt, two.prompt)
    assert len(tfv1real.deduplicate([one, two])[0]) == 2


# -- the builder on synthetic packages --------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAPTRACK_CACHE", str(tmp_path))
    return tmp_path


def _put(cache, requirement, name, data):
    where = cache / "dists" / requirement.replace("==", "-")
    where.mkdir(parents=True)
    (where / name).write_bytes(data)


def _chars(text):
    return list(text)  # a tokenizer: one token per character


def test_build_applies_every_rule_and_caches(cache):
    long_file = "import tensorflow as tf\n" + "# filler\n" * 40 + CALL
    _put(cache, "alpha==1", "alpha-1-py3-none-any.whl", _wheel({
        "alpha/ok.py": "import tensorflow as tf\n" + CALL,
        "alpha/comment.py": "# tf.compat.v1\n" + CALL,
        "alpha/attr.py": "s = tf.compat.v1.Session\n",
        "alpha/long.py": long_file,
        "alpha/none.py": "import os\n",
        "alpha/data.json": CALL}, "Name: alpha\nLicense: MIT\n"))
    _put(cache, "beta==2", "beta-2.tar.gz", _sdist({
        "beta/copy.py": "import tensorflow as tf\n" + CALL,        # alpha's ok.py again
        "beta/own.py": "import tensorflow as tf\ny = tf.compat.v1.Session()\n"},
        "Name: beta\nLicense-Expression: BSD-3-Clause\n"))
    built = tfv1real.build(["alpha==1", "beta==2"], _chars, "chars", max_tokens=200,
                           download=False)
    assert [(p.id, p.oracle["v2"], p.license) for p in built.problems] == [
        ("alpha==1/alpha/ok.py", ".compat.v1.placeholder", "MIT"),
        ("beta==2/beta/own.py", ".compat.v1.Session", "BSD-3-Clause")]
    ok = built.problems[0]
    assert ok.prompt == "import tensorflow as tf\nx = tf" and ok.prompt_tokens == len(ok.prompt)
    assert ok.duplicates == ("beta==2/beta/copy.py",)
    alpha = built.stats[0]
    assert (alpha.python_files, alpha.split, alpha.too_long, alpha.kept) == (5, 2, 1, 1)
    assert alpha.reasons == {"earlier": 1, "none": 1, "not_call": 1}
    summary = built.summary()
    assert summary["problems"] == 2 and summary["exact_duplicates"] == 1
    assert summary["tfv1_oracles"] == 1  # placeholder is a TFv1 API; Session, a class, is not
    # The second build reads the cache: no dists needed.
    for p in (cache / "dists").rglob("*.*"):
        p.unlink()
    assert tfv1real.build(["alpha==1", "beta==2"], _chars, "chars", max_tokens=200,
                          download=False).problems == built.problems
    # Another tokenizer (or list) is another build.
    with pytest.raises(tfv1real.TFv1RealDataError, match="alpha==1 is not in"):
        tfv1real.build(["alpha==1", "beta==2"], _chars, "other", download=False)


def test_package_lists(tmp_path):
    assert len(tfv1real.read_packages()) == 36
    path = tmp_path / "p.txt"
    path.write_text("# mine\nlarq==0.11.0  kfac==0.2.3\nlarq==0.11.0\n")
    assert tfv1real.read_packages(path) == ("larq==0.11.0", "kfac==0.2.3")
    path.write_text("larq\n")
    with pytest.raises(ValueError, match="line 1 has 'larq'; each entry is name==version"):
        tfv1real.read_packages(path)
    with pytest.raises(ValueError, match="cannot read"):
        tfv1real.read_packages(tmp_path / "missing.txt")


# -- the builder on PyPI (two small packages of the default list) -----------------------------

SMALL = ("tensorflow-recommenders==0.3.0", "tfjs-graph-converter==1.4.2")


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


def test_build_from_pypi():
    try:
        paths = [tfv1real.cached_dist(r) for r in SMALL]
    except tfv1real.TFv1RealDataError as err:
        if _pypi_reachable():
            raise
        pytest.skip(f"PyPI is unreachable: {err}")
    assert [p.suffix for p in paths] == [".whl", ".whl"]
    name, encode = tfv1real.model_tokenizer()
    built = tfv1real.build(SMALL, encode, name)
    assert [(s.python_files, s.split, s.kept, s.license) for s in built.stats] == [
        (23, 3, 3, "Apache 2.0"), (12, 2, 2, "MIT License")]
    for p in built.problems:
        assert p.prompt.endswith("tf") and p.oracle["v2"].startswith(".compat.v1.")
        assert 0 < p.prompt_tokens == len(encode(p.prompt)) <= tfv1real.MAX_PROMPT_TOKENS
        assert p.package in ("tensorflow-recommenders", "tfjs-graph-converter")


# -- the task ---------------------------------------------------------------------------------

VOCAB = [b"\n"] + [bytes([b]) for b in range(32, 127)] + [b"<eos>"]


def _intents(intents: dict[str, str]) -> at.TableLM:
    """After each prompt the model wants that prompt's intent, then "("."""
    lm = at.TableLM(VOCAB, lambda p: [1] * 97, eos=96)
    starts = {tuple(lm.encode(p)): i for p, i in intents.items()}

    def next_probs(prefix):
        start, intent = next((s, i) for s, i in starts.items() if prefix[:len(s)] == s)
        text = b"".join(VOCAB[t] for t in prefix[len(start):]).decode()
        w = [1.0] * 97
        nxt = intent[len(text)] if intent.startswith(text) and len(text) < len(intent) else "("
        w[VOCAB.index(nxt.encode())] = 3000.0  # strong: exact greedy picks the oracle
        return w

    lm.next_probs = next_probs
    return lm


PROBLEMS = [RealProblem("p", "1", "a.py", "MIT", "import tensorflow as tf\nx = tf",
                        {"v2": ".compat.v1.placeholder"}, 9),
            RealProblem("q", "2", "b.py", "MIT", "import tensorflow as tf\ns = tf",
                        {"v2": ".compat.v1.losses.log_loss"}, 9)]


def _task(**options):
    task = tfv1real.TFv1RealTask(packages=("p==1", "q==2"), max_new_tokens=40, **options)
    task._built = tfv1real.ProblemSet(PROBLEMS, ("p==1", "q==2"), "chars", [])
    task._lm = _intents({p.prompt: p.oracle["v2"] for p in PROBLEMS})
    return task


def test_tfv1real_task_records_and_report(tmp_path):
    task = _task(n=3)
    assert task.group == 4  # one problem's jobs: unconstrained + 3 methods in v2
    path = tmp_path / "real.jsonl"
    records = runner.run(task, path)
    assert len(records) == 8
    for r in records:
        p = task.lookup(r["problem"])
        assert r["oracle"] == p.oracle and r["greedy"] == p.oracle["v2"]
        assert r["setting"] == (None if r["method"] == "unconstrained" else "v2")
    header, _ = runner.read_results(path)
    assert header["task"] == "tfv1real" and header["packages"] == ["p==1", "q==2"]
    assert header["tokenizer"] == "chars" and header["max_prompt_tokens"] == 3584
    assert runner.run(task, path) == records  # resumed: nothing redone
    text = report.report(path)
    assert text.startswith("# TFv1Real: 2 problems, n = 3")
    assert "## Exact match (Table 2)" in text
    assert "| Constrained decoding | 100.00% |" in text
    assert "Problems from 2 PyPI packages" in text


def test_tfv1real_sweeps(tmp_path):
    task = _task(n=2, temperature=[0.5, 1.0], max_backtrack=[0, None])
    assert task.group == 2 * (1 + 1 + 2 + 1)
    records = runner.run(task, tmp_path / "sweep.jsonl")
    assert len(records) == 2 * task.group
    text = report.report(tmp_path / "sweep.jsonl")
    assert text.startswith("# TFv1Real: 2 problems")
    assert "## EM@k against temperature (Figure 5)" in text
    assert "## EM@k against max_backtrack (Figure 7)" in text


def test_each_group_is_one_problem_and_its_prompt_is_evaluated_first():
    task = _task(n=2)
    seen = []
    task.prepare = lambda prompts: seen.append(prompts)  # type: ignore[method-assign]
    jobs = task.jobs()
    groups = [jobs[i:i + task.group] for i in range(0, len(jobs), task.group)]
    assert [{j["problem"] for j in g} for g in groups] == [{p.id} for p in
                                                           task.problem_list()]
    for g in groups:
        task.run_many(g)
    assert seen == [[p.prompt] for p in task.problem_list()]


@pytest.fixture(scope="module")
def small_lm():
    return at.load_model(backend="transformers", device="cpu")


def test_the_prompt_is_evaluated_once_per_problem(small_lm):
    """The transformers backend keeps the KV of what it evaluated; after ``prepare`` every
    greedy and sampled call of the problem's methods starts from the prompt's KV, so the
    prompt's tokens go through the model once, not once per call (four here)."""
    prompt = ("import tensorflow as tf\n\n\ndef build(inputs, units):\n"
              + "".join(f"    h{i} = inputs * {i} + units\n" for i in range(20))
              + "    x = tf")
    task = tfv1real.TFv1RealTask(packages=("p==1",), methods=("cd", "adaptrack"), n=2,
                                 max_new_tokens=16)
    problem = RealProblem("p", "1", "a.py", "MIT", prompt, {"v2": ".compat.v1.placeholder"})
    task._built = tfv1real.ProblemSet([problem], ("p==1",), "default", [])
    task._lm = small_lm
    small_lm.clear_cache()
    prompt_tokens = len(small_lm.encode(prompt))
    before = small_lm.fed_tokens
    records = task.run_many(task.jobs())
    assert all("error" not in r for r in records)
    fed = small_lm.fed_tokens - before
    assert prompt_tokens > 200 and fed < 1.5 * prompt_tokens, (fed, prompt_tokens)


def test_oracles_the_v2_constraint_lacks_are_reported(tmp_path):
    rows = [{"key": f"{p}|cd|v2", "problem": p, "method": "cd", "setting": "v2",
             "oracle": {"v2": o}, "greedy": o, "samples": [o], "lm_requests": [1],
             "lm_calls": 1, "seconds": 0.1}
            for p, o in (("a", ".compat.v1.placeholder"), ("b", ".compat.v1.layers.dense"))]
    header = {"task": "tfv1real", "packages": ["p==1"], "tf_version": "2.16.1"}
    assert "1 problem calls a name that TensorFlow 2.16.1" in report.tfv1_report(header, rows)
    assert ".compat.v1.layers.dense"[1:] not in tfv1.setting_names("v2")
