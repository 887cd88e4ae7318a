"""The bounded cache of expansions and the lockstep driver change costs, never samples."""

from __future__ import annotations

import pytest

import adaptrack as at
from adaptrack.testing import PROBLEMS

CASES = [
    ("unconstrained", {}),
    ("cd", {}),
    ("asap", {}),
    ("adaptrack", {}),
    ("adaptrack", {"share_q": True}),
    ("exact", {}),
]


@pytest.mark.parametrize(("method", "options"), CASES)
@pytest.mark.parametrize("problem", ["binary", "no_ab", "api_names"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_eviction_never_changes_samples(method, options, problem, temperature):
    lm, constraint, max_new = PROBLEMS[problem]()
    prompt: list[int] = []
    kwargs = dict(method=method, n=30, seed=3, max_new_tokens=max_new,
                  temperature=temperature, **options)
    roomy = at.generate(lm, prompt, constraint, **kwargs)
    tight = at.generate(lm, prompt, constraint, max_cache_bytes=0, **kwargs)
    assert [s.tokens for s in tight.samples] == [s.tokens for s in roomy.samples]
    assert [s.lm_requests for s in tight.samples] == [s.lm_requests for s in roomy.samples]
    assert tight.stats["lm_calls"] >= roomy.stats["lm_calls"]
    assert roomy.stats["evictions"] == 0


def test_eviction_happens_and_costs_calls():
    lm, constraint, max_new = PROBLEMS["no_ab"]()
    prompt: list[int] = []
    res = at.generate(lm, prompt, constraint, method="cd", n=200, seed=0,
                      max_new_tokens=max_new, max_cache_bytes=0)
    roomy = at.generate(lm, prompt, constraint, method="cd", n=200, seed=0,
                        max_new_tokens=max_new)
    assert res.stats["evictions"] > 0
    assert res.stats["lm_calls"] > roomy.stats["lm_calls"]


@pytest.mark.parametrize("batch_size", [1, 4, 64])
def test_lockstep_batches_model_calls_and_keeps_every_sample(batch_size):
    calls = []

    class Counting(at.TableLM):
        def _next_logprobs(self, prefixes):
            calls.append(len(prefixes))
            return super()._next_logprobs(prefixes)

    lm = Counting([b"0", b"1", b"<eos>"], lambda prefix: [1, 2, 1], eos=2)
    seen = []
    res = at.generate(lm, [], None, method="unconstrained", n=20, seed=1, max_new_tokens=8,
                      batch_size=batch_size, on_sample=seen.append)
    assert len(res.samples) == len(seen) == 20
    assert sorted(s.tokens for s in seen) == sorted(s.tokens for s in res.samples)
    assert max(calls) <= batch_size
    if batch_size > 1:
        assert max(calls) > 1  # walks waiting together share a call


def test_bad_batch_size_and_cache_bound():
    lm, constraint, _ = PROBLEMS["binary"]()
    prompt: list[int] = []
    with pytest.raises(ValueError, match="batch_size"):
        at.generate(lm, prompt, constraint, batch_size=0)
    with pytest.raises(ValueError, match="max_cache_bytes"):
        at.generate(lm, prompt, constraint, max_cache_bytes=-1)
