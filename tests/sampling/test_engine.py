"""The engine (docs/design.md §4, walks): many prompts per call, shared-Q methods in
parallel, errors per request, forced chains fed only where a walk entered them.

Statistical checks use fixed seeds and chi-square p-values (p > 0.001 consistent)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from stats import chi_square_p, counts

import adaptrack as at
from adaptrack.constraints import choice
from adaptrack.generate import generate_each
from adaptrack.sampling import PrefixTree, TreeOptions
from adaptrack.sampling.engine import Engine, expand
from adaptrack.sampling.exact import SCHEDULES, Exact
from adaptrack.testing import PROBLEMS, binary, hashed_weights

N = 3000


VOCAB_NO_AB = [b"a", b"b", b"c", b"<eos>"]  # no_ab's model: weights depend on the prompt too


PROMPTS = [[], [0], [2, 1], [1, 1, 1]]

SHARED_Q = [("exact", {}), ("asap", {}), ("adaptrack", {"share_q": True})]
INDEPENDENT = [("cd", {}), ("unconstrained", {}), ("adaptrack", {})]


@pytest.mark.parametrize(("method", "options"), INDEPENDENT + SHARED_Q)
def test_many_prompts_give_each_prompt_its_samples_alone(method: str, options: dict) -> None:
    """A request's walks see only its own tree, Q and random streams: the other prompts of
    the call change which prefixes share a model call, never a sample (exact model)."""
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    kw = dict(method=method, n=12, seed=5, max_new_tokens=max_new, batch_size=4, **options)
    together = at.generate(lm, PROMPTS, constraint, **kw)
    assert isinstance(together, list) and len(together) == len(PROMPTS)
    for prompt, res in zip(PROMPTS, together, strict=True):
        alone = at.generate(lm, prompt, constraint, **kw)
        assert [s.tokens for s in res.samples] == [s.tokens for s in alone.samples]
        assert res.stats["lm_calls"] == alone.stats["lm_calls"]
        assert res.stats["prompt_tokens"] == len(prompt)


def test_many_prompts_share_model_calls() -> None:
    _lm, constraint, max_new = PROBLEMS["no_ab"]()

    batches: list[int] = []

    class Counting(at.TableLM):
        def _next_logprobs(self, prefixes):
            batches.append(len(prefixes))
            return super()._next_logprobs(prefixes)

    counting = Counting(VOCAB_NO_AB, hashed_weights(4, b"no_ab"), eos=3)
    res = at.generate(counting, PROMPTS, constraint, method="cd", n=8, seed=0,
                      max_new_tokens=max_new, fast_forward=False)
    assert max(batches) > 8  # prefixes of several prompts in one call
    assert sum(batches) == sum(r.stats["lm_calls"] for r in res)


def test_independent_samples_do_not_depend_on_the_batch_size() -> None:
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    runs = [at.generate(lm, PROMPTS, constraint, method="cd", n=10, seed=1,
                        max_new_tokens=max_new, batch_size=b, max_batch_tokens=t)
            for b, t in ((1, None), (3, 2), (64, 1024))]
    tokens = [[[s.tokens for s in r.samples] for r in run] for run in runs]
    assert tokens[0] == tokens[1] == tokens[2]


@pytest.mark.parametrize("problem", ["no_ab", "api_names", "binary"])
@pytest.mark.parametrize("parallel", [False, 7, True])
def test_exact_fits_the_target_in_parallel_and_sequentially(problem: str,
                                                            parallel: bool | int) -> None:
    lm, constraint, max_new = PROBLEMS[problem]() if problem != "binary" else binary()
    target = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    res = at.generate(lm, [], constraint, method="exact", n=N, seed=11,
                      max_new_tokens=max_new, parallel=parallel)
    assert all(s.valid for s in res.samples)
    p = chi_square_p(counts(res), target)
    assert p > 1e-3, f"exact, parallel={parallel}, on {problem}: p = {p:.2e}"


@pytest.mark.parametrize(("method", "options"), SHARED_Q)
def test_the_batch_size_changes_no_shared_q_sample(method: str, options: dict) -> None:
    """Walks in flight are ``parallel``'s, not ``batch_size``'s: the batch size only splits
    model calls."""
    lm, constraint, max_new = PROBLEMS["api_names"]()
    kw = dict(method=method, n=40, seed=4, max_new_tokens=max_new, parallel=8, **options)
    runs = [at.generate(lm, [], constraint, batch_size=b, max_batch_tokens=t, **kw)
            for b, t in ((1, None), (5, 3), (64, 1024))]
    assert len({tuple(s.tokens for s in r.samples) for r in runs}) == 1
    sequential = at.generate(lm, [], constraint, **{**kw, "parallel": False})
    assert len(sequential.samples) == 40


def test_exact_parallel_many_prompts_fit_each_target() -> None:
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    results = at.generate(lm, PROMPTS, constraint, method="exact", n=N, seed=3,
                          max_new_tokens=max_new)
    for prompt, res in zip(PROMPTS, results, strict=True):
        target = at.exact_distribution(lm, prompt, constraint, max_new_tokens=max_new)
        p = chi_square_p(counts(res), target)
        assert p > 1e-3, f"prompt {prompt}: p = {p:.2e}"


@pytest.mark.parametrize("schedule", ["fixed", "useful"])
def test_exact_attempts_read_one_q(schedule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a round schedule Q changes only at the end of a round, when no attempt is in
    flight (``ahead`` has one attempt in flight at a time: its tests are below)."""
    monkeypatch.setattr(Exact, "schedule", schedule)
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    tree = PrefixTree([], constraint.bind(lm.vocab), TreeOptions(max_new_tokens=max_new))
    method = Exact(tree, greedy=False)
    in_release = [False]
    opened = []
    open_ = method.Q.open

    def checked_open(node):
        assert in_release[0], "Q changed while attempts were in flight"
        opened.append(node)
        open_(node)

    method.Q.open = checked_open  # type: ignore[method-assign]
    release = method.release

    def checked_release():
        in_release[0] = True
        release()
        in_release[0] = False

    method.release = checked_release  # type: ignore[method-assign]
    done: dict[int, tuple[int, ...]] = {}
    engine = Engine(lm, batch_size=8)
    engine.submit(method, 40, 0, lambda i, node, k: done.__setitem__(i, node.tokens), width=8)
    engine.run()
    assert len(done) == 40 and opened and method.restarts > 0


@pytest.mark.parametrize(("method", "options"), SHARED_Q)
def test_shared_q_in_parallel_is_reproducible(method: str, options: dict) -> None:
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    kw = dict(method=method, n=30, seed=2, max_new_tokens=max_new, parallel=True, **options)
    a = at.generate(lm, [], constraint, **kw)
    b = at.generate(lm, [], constraint, **kw)
    assert [s.tokens for s in a.samples] == [s.tokens for s in b.samples]
    assert all(s.valid for s in a.samples)


def test_a_failing_request_does_not_stop_the_others() -> None:
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    good = dict(constraint=constraint, method="cd", n=5, seed=0, max_new_tokens=max_new)
    out = generate_each(lm, [dict(good, prompt=[0]),
                             dict(good, prompt=[1], method="exact", n=50, max_nodes=3,
                                  fallback=None),
                             dict(good, prompt=[2])])
    assert isinstance(out[1], at.TreeLimitError)
    assert isinstance(out[1].partial, at.GenerationResult)
    alone = at.generate(lm, [2], constraint, method="cd", n=5, seed=0, max_new_tokens=max_new)
    assert [s.tokens for s in out[2].samples] == [s.tokens for s in alone.samples]
    with pytest.raises(at.TreeLimitError) as info:
        at.generate(lm, [[0], [1]], constraint, method="exact", n=50, max_nodes=3, seed=0,
                    max_new_tokens=max_new, fallback=None)
    assert len(info.value.results) == 2


def test_a_model_error_lands_on_the_request_that_caused_it() -> None:
    _lm, constraint, max_new = PROBLEMS["no_ab"]()

    class Failing(at.TableLM):
        def _next_logprobs(self, prefixes):
            if any(p[:1] == (1,) for p in prefixes):
                raise at.ModelOutputError("the model failed on prompt [1]")
            return super()._next_logprobs(prefixes)

    bad = Failing(VOCAB_NO_AB, hashed_weights(4, b"no_ab"), eos=3)
    kw = dict(constraint=constraint, method="cd", n=6, seed=0, max_new_tokens=max_new)
    out = generate_each(bad, [dict(kw, prompt=[0]), dict(kw, prompt=[1]), dict(kw, prompt=[2])])
    assert isinstance(out[1], at.ModelOutputError)
    assert all(isinstance(o, at.GenerationResult) and len(o.samples) == 6
               for o in (out[0], out[2]))


# A forced chain after "a": "bcd" (single-letter tokens: nothing is held back), which the
# model makes unlikely, so that AdapTrack's walks open "a" and backtrack away from it.
CHAIN_VOCAB = [b"a", b"b", b"c", b"d", b"x", b"y", b"<eos>"]


class ChainLM(at.TableLM):
    def __init__(self) -> None:
        def weights(prefix):
            if prefix[-1:] == (0,):
                return [1000, 1, 1000, 1000, 1000, 1000, 1000]  # P(b | a) is tiny
            return [3, 1, 1, 1, 1, 1, 1]

        super().__init__(CHAIN_VOCAB, weights, eos=6)
        self.fed: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # chains fed
        self.passes = 0  # batched model calls

    def next_logprobs(self, prefixes):
        self.passes += 1
        return super().next_logprobs(prefixes)

    def logprobs_along_many(self, requests):
        self.passes += 1
        return super().logprobs_along_many(requests)

    def _logprobs_along_many(self, requests):
        self.fed += [(p, toks) for p, toks in requests if toks]  # (p, ()): a plain prefix
        return super()._logprobs_along_many(requests)


@pytest.mark.parametrize(("method", "options"), [("adaptrack", {}),
                                                 ("adaptrack", {"share_q": True}),
                                                 ("exact", {})])
def test_no_chain_is_fed_in_a_branch_no_walk_entered(method: str, options: dict) -> None:
    lm = ChainLM()
    c = choice(["abcd", "x", "y"])
    res = at.generate(lm, [], c, method=method, n=20, seed=0, max_new_tokens=6, **options)
    assert {s.text for s in res.samples} <= {"abcd", "x", "y"}
    # Every chain fed starts after the forced token a walk stepped into ("ab"), never at
    # the head "a" that walks opened and left.
    assert all(prefix == (0, 1) for prefix, _ in lm.fed), lm.fed
    entered = sum(s.text == "abcd" for s in res.samples)
    assert len(lm.fed) == res.stats["ff_sequences"] <= max(entered, 1)
    assert res.stats["forced_tokens"] == 2 * res.stats["ff_sequences"]


def test_cd_feeds_a_chain_at_its_head() -> None:
    """CD always steps into a chain: the head's call feeds it whole (one call)."""
    lm = ChainLM()
    res = at.generate(lm, [], choice(["abcd", "x"]), method="cd", n=200, seed=0,
                      max_new_tokens=6)
    assert any(s.text == "abcd" for s in res.samples)
    assert lm.fed == [((0,), (1, 2, 3))]


def test_plain_prefixes_and_chains_share_a_model_call() -> None:
    """A step with a plain prefix (prompt [4]: "x" or "y" next) and a chain (prompt [0]:
    "bcd" forced) makes one model call, not one for each kind."""
    lm = ChainLM()
    kw = dict(method="cd", n=1, seed=0, max_new_tokens=6)
    out = generate_each(lm, [dict(kw, prompt=[0], constraint=choice(["abcd"])),
                             dict(kw, prompt=[4], constraint=choice(["x", "y"]))])
    assert [r.texts for r in out] == [["abcd"], [out[1].texts[0]]]
    assert lm.fed == [((0,), (0, 1, 2, 3))]
    # step 1: the chain "abcd" with its end, and "x"/"y" after [4]; step 2: EOS after it
    assert lm.passes == 2


def test_arguments_are_checked() -> None:
    lm, constraint, _max_new = PROBLEMS["no_ab"]()
    with pytest.raises(TypeError, match="parallel"):
        at.generate(lm, [], constraint, method="exact", parallel=1.5)
    with pytest.raises(ValueError, match="parallel"):
        at.generate(lm, [], constraint, method="exact", parallel=0)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        at.generate(lm, [], constraint, method="cd", max_batch_tokens=0)
    with pytest.raises(TypeError, match="unknown argument"):
        generate_each(lm, [dict(prompt=[], constraint=constraint, colour="red")])


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_shared_q_methods_in_parallel_stay_closer_than_cd(problem: str) -> None:
    """ASAp and AdapTrack with ``share_q`` in parallel are not exact (docs/methods.md: their early
    samples see a Q that other walks in flight have not refined yet); they stay far closer
    to the target than CD, and every sample is valid."""
    lm, constraint, max_new = PROBLEMS[problem]()
    target = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    kw = dict(n=N, seed=13, max_new_tokens=max_new)
    cd = at.metrics.kl_divergence(counts(at.generate(lm, [], constraint, method="cd", **kw)),
                                  target)
    for method, options in SHARED_Q[1:]:
        res = at.generate(lm, [], constraint, method=method, parallel=16, **kw, **options)
        assert all(s.valid for s in res.samples)
        assert at.metrics.kl_divergence(counts(res), target) < cd, (method, problem)


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s != "ahead"])  # in rounds
def test_exact_rounds_follow_their_schedule(schedule: str) -> None:
    """A round runs at most the attempts its schedule allows, computed from earlier rounds
    only; the root is open before any attempt unless ``fixed`` (the rounds before)."""
    lm, bits, max_new = binary()
    tree = PrefixTree([], bits.bind(lm.vocab), TreeOptions(max_new_tokens=max_new, end="eos"))

    class Scheduled(Exact):
        pass

    Scheduled.schedule, Scheduled.open_root = schedule, schedule != "fixed"
    method = Scheduled(tree, greedy=False)
    # (attempts, allowed, useful, slots waiting, root open)
    rounds: list[tuple[int, int, int, int, bool]] = []
    release = method.release

    def recorded() -> None:
        rounds.append((method._ended, method._width, method._count_useful(), method._asking,
                       method.Q.is_open(tree.root)))
        release()

    method.release = recorded  # type: ignore[method-assign]
    engine = Engine(lm, batch_size=8)
    done: dict[int, tuple[int, ...]] = {}
    engine.submit(method, 200, 1, lambda i, node, k: done.__setitem__(i, node.tokens), width=32)
    engine.run()
    assert len(done) == 200
    tried = [r for r in rounds if r[0]]
    assert all(attempts <= (32 if schedule == "fixed" else allowed)
               for attempts, allowed, _, _, _ in tried)
    if schedule != "fixed":
        assert rounds[0][0] == 0  # the root's own round: no attempt yet
        assert all(is_open for *_, is_open in tried)
    if schedule == "useful":
        assert tried[0][0] == 16  # half the 32 slots
        for (_, _, useful, waiting, _), (_, allowed, *_) in itertools.pairwise(tried):
            assert allowed == min(max(2 * useful, (waiting + 1) // 2, 1), 32)


def test_exact_schedule_wastes_fewer_attempts_than_fixed_rounds() -> None:
    """On the binary problem (most of the model's strings invalid), rounds of 32 attempts on
    a coarse Q reject more often than the default schedule (seeded runs: 203 against 138)."""
    lm, bits, max_new = binary()
    rejected = {}
    for schedule in ("fixed", Exact.schedule):

        class Scheduled(Exact):
            pass

        Scheduled.schedule, Scheduled.open_root = schedule, schedule != "fixed"
        total = 0
        for seed in range(3):
            tree = PrefixTree([], bits.bind(lm.vocab),
                              TreeOptions(max_new_tokens=max_new, end="eos"))
            method = Scheduled(tree, greedy=False)
            engine = Engine(lm)
            engine.submit(method, 500, seed, lambda i, node, k: None, width=32)
            engine.run()
            total += method.restarts
        rejected[schedule] = total
    assert rejected[Exact.schedule] * 1.3 < rejected["fixed"], rejected


def _ahead_run(problem: str, lookahead: int, cache: int, n: int = 40
               ) -> tuple[dict[int, tuple[int, ...]], int, int, int]:
    """``exact`` under the ``ahead`` schedule: the samples, rejections, forward passes and
    evictions of one seeded run with ``lookahead`` attempts followed at once."""
    lm, constraint, max_new = PROBLEMS[problem]()

    class Ahead(Exact):
        schedule = "ahead"

    Ahead.lookahead = lookahead
    tree = PrefixTree([], constraint.bind(lm.vocab),
                      TreeOptions(max_new_tokens=max_new, end="eos", max_cache_bytes=cache))
    method = Ahead(tree, greedy=False)
    passes = 0
    call = lm.next_logprobs

    def counted(prefixes):  # type: ignore[no-untyped-def]
        nonlocal passes
        passes += 1
        return call(prefixes)

    lm.next_logprobs = counted  # type: ignore[method-assign]
    engine, out = Engine(lm), {}
    req = engine.submit(method, n, 3, lambda i, node, k: out.__setitem__(i, node.tokens),
                        width=32)
    assert (req.width, method.width) == (1, 32)  # one walk at a time; 32 bounds its lookahead
    engine.run()
    assert req.error is None and len(out) == n
    return out, method.restarts, passes, tree.evictions


@pytest.mark.parametrize("problem", ["no_ab", "api_names"])
def test_exact_ahead_samples_depend_on_neither_lookahead_nor_cache(problem: str) -> None:
    """Under ``ahead`` a slot's attempts run one at a time, each on its own stream and on the
    Q every earlier one left: how many attempts it follows ahead and which expansions the
    cache keeps change the model's passes, never a sample or a rejection (exact model);
    following ahead takes fewer passes."""
    one, rejected, passes, _ = _ahead_run(problem, 1, 1 << 30)
    assert rejected > 0  # the problem makes attempts fail: there is something to follow
    for lookahead, cache in [(4, 1 << 30), (8, 1 << 30), (32, 1 << 30), (8, 0)]:
        out, r, p, evicted = _ahead_run(problem, lookahead, cache)
        assert (out, r) == (one, rejected), (lookahead, cache)
        assert p < passes or cache == 0, (lookahead, p, passes)
        assert evicted > 0 or cache > 0


def test_exact_ahead_draws_are_formula_3_and_keep_their_token() -> None:
    """A step of the ``ahead`` schedule picks each token with P_Q(u|x) at an opened prefix
    and with P(u|x) at another (an invalid one as a whole: -1); where Q kept the proposal's
    token, the opened prefix picks it again with the same key (chi-square over 20 000
    random keys; the keeping is exact, per key)."""
    from adaptrack.sampling.expansion import Expansion
    from adaptrack.sampling.races import BLOCK
    from adaptrack.sampling.races import Draws as _Draws

    rng = np.random.default_rng(0)
    for size in (12, 3 * BLOCK + 5):  # one block; several
        probs = rng.dirichlet(np.ones(size))
        ids = np.sort(rng.choice(size, size * 2 // 3, replace=False))  # the others invalid
        exp = Expansion(probs, ids)
        q = np.ones(len(ids))
        q[[1, 4]] = [0.05, 0.0]  # one child nearly dead, one dead
        w = exp.p * q
        opened, proposal = _Draws(exp, w), _Draws(exp)
        keys = rng.integers(0, 2**63, size=20_000)
        got = np.array([opened.pick(int(k)) for k in keys])
        proposed = np.array([proposal.pick(int(k)) for k in keys])
        target = w / w.sum()
        assert (target[got] > 0).all()  # never a dead child
        p_q = {j: float(t) for j, t in enumerate(target) if t > 0}
        p = {j: float(t) for j, t in enumerate(exp.p)} | {-1: 1 - float(exp.p.sum())}
        for picks, law in ((got, p_q), (proposed, p)):
            found = dict(zip(*np.unique(picks, return_counts=True), strict=True))
            assert chi_square_p(found, law) > 1e-3
        kept = (proposed >= 0) & ~np.isin(proposed, [1, 4])
        if size <= BLOCK:
            assert (got[kept] == proposed[kept]).all()
        else:  # a fall inside the winner's block may move the block's race
            assert (got[kept] == proposed[kept]).mean() > 0.99


def test_exact_unknown_schedule_is_an_error() -> None:
    lm, bits, max_new = binary()

    class Odd(Exact):
        schedule = "sometimes"

    with pytest.raises(ValueError, match="unknown schedule 'sometimes'"):
        Odd(PrefixTree([], bits.bind(lm.vocab), TreeOptions(max_new_tokens=max_new)), greedy=False)


@pytest.mark.parametrize("problem", ["no_ab", "binary"])
def test_exact_several_attempts_for_one_sample_fit_the_target(problem: str) -> None:
    """With one sample (n = 1) and room for more walks, a round runs several attempts for it
    and keeps the first accepted: each call's sample, on its own fresh Q, is an exact draw."""
    lm, constraint, max_new = PROBLEMS[problem]() if problem != "binary" else binary()
    target = at.exact_distribution(lm, [], constraint, max_new_tokens=max_new)
    out = generate_each(lm, [dict(prompt=[], constraint=constraint, method="exact", n=1,
                                  seed=k, max_new_tokens=max_new) for k in range(N // 2)])
    seen: dict[tuple[int, ...], int] = {}
    for res in out:
        assert isinstance(res, at.GenerationResult) and res.samples[0].valid
        seen[res.samples[0].tokens] = seen.get(res.samples[0].tokens, 0) + 1
    assert sum(res.stats["restarts"] > 1 for res in out) > N // 40  # Q was coarse for many
    p = chi_square_p(seen, target)
    assert p > 1e-3, f"exact, n = 1, on {problem}: p = {p:.2e}"


def test_a_walk_waits_again_for_an_expansion_the_cache_dropped():
    """The engine is the one caller of the model: a walk whose prefix lost its expansion
    while it waited asks for it again; neither the tree nor Q calls the model for it."""
    from adaptrack.sampling import QTable
    from adaptrack.sampling.cd import ConstrainedDecoding

    lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    tree = PrefixTree([], at.constraints.choice(["b", "ab"]).bind(lm.vocab))
    wait = ConstrainedDecoding(tree, greedy=True).expand(tree.root)
    assert next(wait) is tree.root
    expand(lm, tree, tree.root)  # the driver's call ...
    tree.root.expansion = None  # ... and an eviction before the walk resumes
    assert next(wait) is tree.root and tree.lm_calls == 1  # it waits again
    with pytest.raises(RuntimeError, match="before its expansion"):
        tree.child(tree.root, 1)
    with pytest.raises(RuntimeError, match="did not wait"):
        QTable(tree).open(tree.root)
    expand(lm, tree, tree.root)
    with pytest.raises(StopIteration) as done:
        next(wait)
    assert done.value.value is tree.root.expansion and tree.lm_calls == 2


class _PassCounter(at.TableLM):
    """A TableLM that counts its forward passes (``calls`` counts rows)."""

    passes = 0

    def next_logprobs(self, prefixes):
        self.passes += 1
        return super().next_logprobs(prefixes)

    def logprobs_along_many(self, reqs):
        self.passes += 1
        return super().logprobs_along_many(reqs)


def test_forward_passes_count_the_passes_a_request_waited_for():
    """A request alone waits for every pass the model made; the n walks of a search share
    passes, so it waits for fewer passes than it made model calls."""
    lm = _PassCounter([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    words = at.constraints.choice(["aaaa", "abab", "bbbb", "baba"])
    for method, n in (("cd", 1), ("adaptrack", 4), ("exact", 4)):
        before = lm.passes
        res = at.generate(lm, [], words, method=method, n=n, seed=0, max_new_tokens=6)
        assert res.stats["forward_passes"] == lm.passes - before > 0
    assert res.stats["forward_passes"] < res.stats["lm_calls"]
