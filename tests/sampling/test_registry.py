"""A method declares itself (docs/design.md §4, methods): one class and one registry line
make it usable through ``generate``, with the search budget and fallback a searching method
gets and the other methods' options refused."""

from __future__ import annotations

import numpy as np
import pytest

import adaptrack as at
from adaptrack.sampling.base import Method, Walk
from adaptrack.sampling.methods import METHODS, register
from adaptrack.testing import hashed_weights


class Lowest(Method):
    """Each step takes the valid token with the lowest id: a toy, deterministic walk."""

    name = "lowest"
    searches = True

    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        node = self.tree.root
        while not node.complete:
            exp = yield from self.expand(node)
            self.used(seen, node)
            if len(exp.ids) == 0:
                raise self.empty_language()
            node = self.tree.child(node, int(exp.ids.min()))
        return node


@pytest.fixture
def lowest():
    register(Lowest)
    try:
        yield Lowest
    finally:
        del METHODS[Lowest.name]


def letters() -> at.TableLM:
    return at.TableLM([b"a", b"b", b"c", b"<eos>"], hashed_weights(4), eos=3)


def test_a_registered_method_samples_through_generate(lowest):
    res = at.generate(letters(), [], at.constraints.regex("[a-c]{2}b?"), method="lowest", n=3,
                      seed=0, max_new_tokens=4, end="eos")
    assert [s.tokens for s in res.samples] == [(0, 0, 1, 3)] * 3  # "aab": b before EOS
    assert all(s.valid and not s.fallback for s in res.samples)
    assert at.SamplingOptions(method="lowest").max_calls == 3 * 64  # a search's budget


def test_a_registered_search_falls_back_to_cd_past_its_budget(lowest):
    with pytest.warns(at.SearchFallbackWarning):
        res = at.generate(letters(), [], at.constraints.regex("[a-c]{2}b?"), method="lowest",
                          n=2, seed=0, max_new_tokens=4, end="eos", search_budget=1 / 64)
    assert [s.fallback for s in res.samples] == [True, True]
    assert all(s.valid for s in res.samples)


def test_a_registered_method_refuses_another_methods_options(lowest):
    with pytest.raises(ValueError, match="apply to method='adaptrack' only"):
        at.SamplingOptions(method="lowest", share_q=True)
    with pytest.raises(ValueError, match="a method named 'lowest' is already registered"):
        register(Lowest)
