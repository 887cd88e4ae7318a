"""The sampling options declared once (``adaptrack.options``): checked when made, taken by
every entry point, and spelled on the command line by flags made from the fields."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import random

import numpy as np
import pytest

import adaptrack as at
from adaptrack import cli
from adaptrack.cli import generate as cli_generate
from adaptrack.cli.common import add_sampling_arguments, sampling_argv, sampling_options
from adaptrack.generate import prepare
from adaptrack.options import MAX_SECONDS, METHODS, SamplingOptions
from adaptrack.sampling.engine import Engine
from adaptrack.sampling.treeoptions import TreeOptions
from adaptrack.serve.preprocess import parse

LM = at.TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
BITS = at.constraints.choice(["00000"] + [f"1{i:04b}" for i in range(16)])
FIELDS = [f.name for f in dataclasses.fields(SamplingOptions)]


# -- checked once, when made --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"method": "greedy"}, ValueError, r"unknown method 'greedy'; choose one of"),
        ({"method": "cd", "max_backtrack": 2}, ValueError, r"apply to method='adaptrack' only"),
        ({"method": "exact", "min_backtrack_prob": 0.5}, ValueError, r"'adaptrack' only"),
        ({"n": 0}, ValueError, r"n must be at least 1, got 0"),
        ({"n": 10**8}, ValueError, r"n must be at most 10_000_000"),
        ({"n": 1.0}, TypeError, r"n must be an int, got 1\.0 \(float\)"),
        ({"temperature": -1}, ValueError, r"temperature must be >= 0 and finite"),
        ({"top_p": 0.0}, ValueError, r"top_p must be in \(0, 1\], got 0\.0"),
        ({"max_new_tokens": 0}, ValueError, r"max_new_tokens must be at least 1"),
        ({"seed": -1}, ValueError, r"seed must be >= 0, got -1"),
        ({"allow_truncated": None}, TypeError, r"allow_truncated must be True or False"),
        ({"parallel": 0}, ValueError, r"parallel must be at least 1, got 0"),
        ({"parallel": "on"}, TypeError, r"parallel must be an int"),
        ({"max_cache_bytes": -1}, ValueError, r"max_cache_bytes must be >= 0"),
        ({"min_backtrack_prob": 1.5}, ValueError, r"min_backtrack_prob must be in \[0, 1\]"),
        ({"max_seconds": -1}, ValueError, r"max_seconds must be > 0 or None"),
        ({"end": "stop"}, ValueError, r"end must be one of 'leave', 'eos'"),
        ({"fallback": "none"}, ValueError, r"fallback must be 'cd' or None"),
        ({"fast_forward": None}, TypeError, r"fast_forward must be True, False or FastForward"),
    ],
)
def test_bad_values_are_refused_by_name(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        SamplingOptions(**kwargs)


def test_values_are_stored_as_plain_numbers_and_frozen():
    opts = SamplingOptions(n=np.int64(3), temperature=1, top_p=np.float32(0.5),
                           max_seconds=float("inf"), seed=np.uint8(7))
    assert (opts.n, opts.temperature, opts.top_p, opts.max_seconds, opts.seed) == (
        3, 1.0, 0.5, None, 7)
    assert [type(v) for v in (opts.n, opts.temperature, opts.top_p, opts.seed)] == [
        int, float, float, int]
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.n = 4  # type: ignore[misc]
    assert hash(opts) == hash(SamplingOptions(n=3, top_p=0.5, max_seconds=None, seed=7))
    with pytest.raises(ValueError, match="top_p"):  # a changed copy is checked as well
        dataclasses.replace(opts, top_p=2)


def test_positional_values_are_refused():
    with pytest.raises(TypeError):
        SamplingOptions("cd")  # type: ignore[misc]


def test_chains_follow_the_method():
    assert SamplingOptions(method="cd").chains().force is True
    assert SamplingOptions(method="exact").chains().force is False
    assert SamplingOptions(method="cd").chains(forces=False).force is False
    assert SamplingOptions(fast_forward=False).chains() is None
    own = at.FastForward(max_tokens=2, force=True)
    assert SamplingOptions(method="exact", fast_forward=own).chains() is own


def test_a_trees_options_are_the_calls():
    # What a prefix tree shares with a call is the call's, defaults included (declared once,
    # in TreeOptions; a tree built directly has no time budget); unconstrained sampling
    # walks without the length rule, the chains and the end policy.
    shared = ({f.name for f in dataclasses.fields(TreeOptions)} & set(FIELDS)) - {"fast_forward"}
    assert shared >= {"temperature", "top_p", "max_new_tokens", "max_nodes", "end"}
    given = SamplingOptions(method="exact", temperature=0.5, top_p=0.9, max_new_tokens=7,
                            max_nodes=11, max_cache_bytes=13, max_opened_bytes=17,
                            max_seconds=19.0, allow_truncated=True, end="eos")
    for o in (SamplingOptions(), given):
        t = o.tree_options()
        assert {n: getattr(t, n) for n in shared} == {n: getattr(o, n) for n in shared}
        assert t.fast_forward == o.chains() and t.restrict_length and t.max_calls is None
    free = given.tree_options(constrained=False)
    assert (free.fast_forward, free.restrict_length, free.end) == (None, False, "eos")
    tree, call = TreeOptions(), SamplingOptions()
    assert [n for n in shared if getattr(tree, n) != getattr(call, n)] == ["max_seconds"]


# -- the entry points build it or take it -------------------------------------------------


def test_generate_takes_options_or_keywords_alike():
    kw = dict(method="exact", n=3, seed=0, temperature=0.7, max_nodes=500)
    by_keywords = at.generate(LM, [], BITS, **kw)
    by_options = at.generate(LM, [], BITS, options=SamplingOptions(**kw))
    assert by_options.texts == by_keywords.texts
    assert [s.logprob for s in by_options.samples] == [s.logprob for s in by_keywords.samples]


def test_options_and_a_changed_keyword_are_refused():
    with pytest.raises(TypeError, match=r"generate\(\) got options= and the keyword option "
                                        r"n=2"):
        at.generate(LM, [], BITS, n=2, options=SamplingOptions(n=3))
    with pytest.raises(TypeError, match="options must be a SamplingOptions"):
        at.generate(LM, [], BITS, options={"n": 3})
    # A keyword at its default is no conflict: the options decide.
    assert len(at.generate(LM, [], BITS, n=1, options=SamplingOptions(n=3, seed=0)).samples) == 3


def test_generate_each_prepare_and_exact_distribution_take_options():
    opts = SamplingOptions(method="cd", n=2, seed=0)
    each = at.generate_each(LM, [dict(prompt=[], constraint=BITS, options=opts),
                                 dict(prompt=[], constraint=BITS, method="cd", n=2, seed=0)])
    assert each[0].texts == each[1].texts
    call = prepare(LM, [], BITS, options=opts)
    engine = Engine(LM)
    req = call.submit(engine, batch_size=8)
    engine.run()
    assert call.outcome(req).texts == each[0].texts
    with pytest.raises(TypeError, match=r"prepare\(\) got an unknown argument"):
        prepare(LM, [], BITS, batch_size=4)
    dist = at.exact_distribution(LM, [], BITS, options=SamplingOptions(max_new_tokens=6))
    assert dist == at.exact_distribution(LM, [], BITS, max_new_tokens=6)
    with pytest.raises(ValueError, match="temperature > 0"):
        at.exact_distribution(LM, [], BITS, options=SamplingOptions(temperature=0))


def test_unknown_keyword_names_the_entry_point():
    with pytest.raises(TypeError, match=r"generate\(\) got an unknown argument"):
        at.generate_each(LM, [dict(prompt=[], constraint=BITS, top_k=3)])


# -- the command line: one flag per field, read back into the same object -------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_sampling_arguments(parser)
    return parser


def _parse(argv: list[str]) -> SamplingOptions:
    return sampling_options(_parser().parse_args(argv))


def test_every_field_has_a_flag():
    dests = {a.dest for a in _parser()._actions}
    assert set(FIELDS) <= dests
    helps = {a.dest: a.help for a in _parser()._actions}
    assert all(helps[name] for name in FIELDS)


def test_no_flags_give_the_library_defaults():
    assert _parse([]) == SamplingOptions()
    assert _parse([]).max_seconds == MAX_SECONDS


def test_flags_of_before_keep_their_spelling_and_default():
    actions = {s: a for a in _parser()._actions for s in a.option_strings}
    before = {"--method": "adaptrack", "-n": 1, "--temperature": 1.0, "--top-p": 1.0,
              "--seed": None, "--max-new-tokens": 64, "--end": "leave", "--fallback": "cd",
              "--truncate-prompt": False, "--share-q": False, "--no-fast-forward": True}
    assert {flag: actions[flag].default for flag in before} == before
    assert actions["--method"].choices == list(METHODS)


def _random_options(rng: random.Random) -> SamplingOptions:
    method = rng.choice(list(METHODS))
    adaptrack = method == "adaptrack"
    return SamplingOptions(
        method=method, n=rng.randint(1, 50), temperature=rng.choice([0.0, 0.3, 1.0, 1.7]),
        top_p=rng.choice([0.1, 0.95, 1.0]), seed=rng.choice([None, 0, 12345]),
        max_new_tokens=rng.randint(1, 300), truncate_prompt=rng.random() < 0.5,
        allow_truncated=rng.random() < 0.5, end=rng.choice(["leave", "eos"]),
        fast_forward=rng.random() < 0.5, share_q=adaptrack and rng.random() < 0.5,
        max_backtrack=rng.choice([None, 0, 3]) if adaptrack else None,
        min_backtrack_prob=rng.choice([0.0, 0.25, 1.0]) if adaptrack else 0.0,
        parallel=rng.choice([None, True, False, 1, 7]), max_nodes=rng.randint(1, 10**6),
        max_cache_bytes=rng.choice([0, 1 << 20, 1 << 30]),
        max_opened_bytes=rng.choice([0, 123456789]),
        max_seconds=rng.choice([None, 0.25, 600.0, 3600.0]), fallback=rng.choice(["cd", None]))


def test_flags_round_trip():
    rng = random.Random(0)
    for _ in range(300):
        opts = _random_options(rng)
        argv = sampling_argv(opts)
        back = _parse(argv)
        assert back == opts, argv
        assert type(back.parallel) is type(opts.parallel), argv  # True == 1, other walks


def test_fast_forward_options_have_no_spelling():
    with pytest.raises(ValueError, match="no command-line spelling"):
        sampling_argv(SamplingOptions(fast_forward=at.FastForward(max_tokens=2)))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--parallel", "0"], "--parallel: must be auto, on, off or a number >= 1"),
        (["--min-backtrack-prob", "2"], "--min-backtrack-prob: must be in [0, 1]"),
        (["--max-nodes", "0"], "--max-nodes: must be at least 1"),
        (["--max-opened-bytes", "-1"], "--max-opened-bytes: must be >= 0"),
        (["--method", "exact", "--max-backtrack", "3"],
         "--max-backtrack applies to --method adaptrack only"),
    ],
)
def test_new_flags_are_checked_before_loading(capsys, monkeypatch, argv, fragment):
    loads = []
    monkeypatch.setattr(cli_generate, "load_model", lambda *a, **k: loads.append(a))
    code = cli.main(["generate", "--prompt", "a", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and fragment in err, err
    assert loads == []


def test_the_command_passes_the_parsed_options(capsys, monkeypatch):
    seen = []

    def fake(lm, prompt, constraint, *, on_sample, options):
        seen.append(options)
        return at.GenerationResult([], {})

    monkeypatch.setattr(cli_generate, "load_model", lambda *a, **k: LM)
    monkeypatch.setattr(cli_generate, "generate", fake)
    opts = SamplingOptions(method="exact", n=4, parallel=8, allow_truncated=True,
                           max_nodes=99, max_seconds=None, fallback=None)
    assert cli.main(["generate", "--prompt", "0", *sampling_argv(opts)]) == 0
    assert seen == [opts]


# -- the server builds the same object from its request ------------------------------------


def test_the_server_request_becomes_sampling_options():
    opts = parse(b'{"prompt": "01", "n": 2, "temperature": 0.5, "max_tokens": 6, '
                 b'"decoding_method": "exact", "end": "eos", "fallback": "none", '
                 b'"fast_forward": false}', "completion", LM)
    assert opts.sampling == SamplingOptions(method="exact", n=2, temperature=0.5,
                                            max_new_tokens=6, end="eos", fallback=None,
                                            fast_forward=False)
    assert (opts.n, opts.method, opts.max_tokens) == (2, "exact", 6)


@pytest.mark.parametrize("entry", [at.generate, prepare, at.exact_distribution])
def test_entry_points_restate_no_option_default(entry):
    # The defaults live in SamplingOptions alone: an entry point takes options= or
    # **overrides checked by it, never a keyword with a default of its own for an option.
    names = {f.name for f in dataclasses.fields(SamplingOptions)}
    params = inspect.signature(entry).parameters.values()
    restated = [p.name for p in params if p.name in names]
    assert restated == []
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def test_unknown_keyword_lists_the_options():
    with pytest.raises(TypeError, match=r"generate\(\) got an unknown argument 'top_k'; the "
                                        r"sampling options are method, n, "):
        at.generate(LM, [], BITS, top_k=3)
    with pytest.raises(TypeError, match="positional argument"):
        at.generate(LM, [], BITS, "cd")  # the options are keywords only
