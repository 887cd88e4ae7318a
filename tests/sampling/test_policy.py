"""The budget policy (docs/design.md §6): the engine asks it before each model call and
hands the request to its CD fallback on the error it raises, so that a new hand-over rule
is one method of the policy."""

from __future__ import annotations

import adaptrack as at
from adaptrack.errors import CallLimitError
from adaptrack.sampling.engine import Engine
from adaptrack.sampling.exact import Exact
from adaptrack.sampling.policy import BudgetPolicy
from adaptrack.sampling.tree import PrefixTree
from adaptrack.sampling.treeoptions import TreeOptions
from adaptrack.testing import hashed_weights

LETTERS = [chr(ord("a") + i).encode() for i in range(16)]


def letters() -> at.TableLM:
    weights = hashed_weights(len(LETTERS))
    return at.TableLM([*LETTERS, b"<eos>"],
                      lambda prefix: [*weights(prefix), 0.05 if prefix else 0.0],
                      eos=len(LETTERS))


class Early(BudgetPolicy):
    """Hands over once the tree made ``after`` model calls: a rule written once, here."""

    def __init__(self, after: int) -> None:
        super().__init__(fallback_tries=4)
        self.after = after

    def check_search(self, tree: PrefixTree) -> None:
        if tree.lm_calls >= self.after:
            raise CallLimitError(f"early hand-over after {self.after} calls")


def run(policy: BudgetPolicy | None):
    lm = letters()
    tree = PrefixTree([], at.constraints.regex("[a-p]{2}[a-d]?").bind(lm.vocab),
                      TreeOptions(max_new_tokens=4, end="eos"))
    out: dict[int, tuple[int, ...]] = {}
    engine = Engine(lm)
    req = engine.submit(Exact(tree, greedy=False), 4, 0,
                        lambda i, node, _: out.__setitem__(i, node.tokens), policy=policy)
    engine.run()
    return req, out, tree.lm_calls


def test_a_rule_in_the_policy_hands_the_request_to_the_fallback():
    free, free_out, free_calls = run(None)
    assert free.error is None and not free.fallen and len(free_out) == 4
    req, out, calls = run(Early(after=3))
    assert req.error is None and str(req.fell_back) == "early hand-over after 3 calls"
    assert req.fallen == {0, 1, 2, 3} and len(out) == 4
    assert calls < free_calls  # the search stopped at the rule; CD's walks finished it


def test_without_a_fallback_the_rule_is_the_request_error():
    class Strict(Early):
        def __init__(self) -> None:
            super().__init__(after=3)
            self.fallback_tries = None

    req, out, _ = run(Strict())
    assert isinstance(req.error, CallLimitError) and not out
