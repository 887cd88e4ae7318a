"""The prefix tree (``adaptrack.sampling.tree``): one expansion per prefix and one node per
token, the model's distribution at the temperature over the valid tokens, the length limit,
and the budgets (prefixes, bytes, time; docs/design.md §4, §6). The tests drive the tree as
the engine does: they call ``expand`` themselves."""

from __future__ import annotations

import math

import pytest

import adaptrack as at
from adaptrack.errors import SearchTimeoutError, TreeLimitError
from adaptrack.sampling.engine import expand, expand_many
from adaptrack.sampling.qtable import QTable
from adaptrack.sampling.tree import PrefixTree
from adaptrack.sampling.treeoptions import TreeOptions

# Tokens a, b, EOS at odds 2 : 1 : 1 after every prefix.
VOCAB = [b"a", b"b", b"<eos>"]
A, B, EOS = 0, 1, 2


LM = at.TableLM(VOCAB, lambda prefix: [2, 1, 1], eos=EOS)


def tree_of(strings: list[str], **options) -> PrefixTree:
    """The tree of ``strings`` under ``LM``, with ``options`` (TreeOptions')."""
    return PrefixTree([], at.constraints.choice(strings).bind(LM.vocab), TreeOptions(**options))


class Asked(at.TableLM):
    """A TableLM that records the rows of each ``next_logprobs`` call."""

    def __init__(self) -> None:
        super().__init__(VOCAB, lambda prefix: [2, 1, 1], eos=EOS)
        self.asked: list[list[tuple[int, ...]]] = []

    def next_logprobs(self, prefixes):
        self.asked.append([tuple(p) for p in prefixes])
        return super().next_logprobs(prefixes)


def test_a_prefix_is_expanded_once_and_each_child_made_once() -> None:
    tree = tree_of(["ab", "b", "ba"])
    first = expand(LM, tree, tree.root)
    assert expand(LM, tree, tree.root) is first and tree.lm_calls == 1
    a = tree.child(tree.root, A)
    assert tree.child(tree.root, A) is a and tree.num_nodes == 2
    assert (a.tokens, a.depth, a.parent) == ((A,), 1, tree.root)
    assert a.logprob == pytest.approx(math.log(0.5))  # log P(a | prompt)
    b = tree.child(tree.root, B)
    expand_many(LM, tree, [a, b])
    assert EOS in b.expansion.ids and EOS not in a.expansion.ids  # "b" is a string, "a" not
    assert tree.child(b, EOS).complete and not b.complete  # a text ends with its end token


def test_several_prefixes_are_expanded_by_one_model_call() -> None:
    lm = Asked()
    tree = PrefixTree([7], at.constraints.choice(["ab", "ba"]).bind(lm.vocab))
    expand(lm, tree, tree.root)
    a, b = tree.child(tree.root, A), tree.child(tree.root, B)
    expand_many(lm, tree, [a, b, a])
    assert lm.asked == [[(7,)], [(7, A), (7, B)]]  # the prompt, then both prefixes at once
    assert tree.lm_calls == 3 and a.expansion.ids.tolist() == [B]


@pytest.mark.parametrize(("temperature", "p_a", "p_b"), [
    (1.0, 2 / 4, 1 / 4),
    (0.5, 4 / 6, 1 / 6),  # probabilities squared, then normalized: 4 : 1 : 1
    (0.0, 2 / 4, 1 / 4),  # greedy keeps the model's own distribution; methods take argmaxes
])
def test_the_expansion_is_the_model_at_the_temperature_over_the_valid_tokens(
        temperature: float, p_a: float, p_b: float) -> None:
    tree = tree_of(["a", "b"], temperature=temperature, end="eos")
    exp = expand(LM, tree, tree.root)
    assert exp.ids.tolist() == [A, B]  # EOS is not valid at the root: "" is not a string
    assert exp.p.tolist() == pytest.approx([p_a, p_b])


def test_at_the_length_limit_only_finishing_tokens_are_valid_and_nothing_is_asked_past_it():
    tree = tree_of(["a", "aa"], max_new_tokens=2, end="eos")
    expand(LM, tree, tree.root)
    a = tree.child(tree.root, A)
    assert expand(LM, tree, a).ids.tolist() == [EOS]  # "aa" would need EOS past the limit
    end = tree.child(a, EOS)
    calls = tree.lm_calls
    assert end.complete and len(expand(LM, tree, end).ids) == 0 and tree.lm_calls == calls
    truncated = tree_of(["aa"], max_new_tokens=1, allow_truncated=True, end="eos")
    expand(LM, truncated, truncated.root)
    cut = truncated.child(truncated.root, A)
    assert cut.complete and cut.truncated  # "a" ends the sample: a valid prefix at the limit


def test_a_token_the_expansion_does_not_allow_is_refused() -> None:
    tree = tree_of(["a"])
    expand(LM, tree, tree.root)
    with pytest.raises(ValueError, match="token 1 is not valid after"):
        tree.child(tree.root, B)
    with pytest.raises(ValueError, match="end must be one of 'leave', 'eos'"):
        tree_of(["a"], end="stop")


def test_max_nodes_bounds_the_prefixes() -> None:
    tree = tree_of(["a", "b"], max_nodes=2)
    expand(LM, tree, tree.root)
    tree.child(tree.root, A)
    with pytest.raises(TreeLimitError, match="max_nodes=2"):
        tree.child(tree.root, B)
    assert tree.num_nodes == 2


def test_max_seconds_is_checked_before_a_model_call() -> None:
    tree = tree_of(["a", "b"], max_seconds=60.0)
    tree.started -= 61.0  # as if the search had run a minute: no clock in the test
    with pytest.raises(SearchTimeoutError, match="max_seconds=60"):
        expand(LM, tree, tree.root)
    assert tree.lm_calls == 0


def test_a_dropped_expansion_is_asked_again_and_an_opened_one_is_kept() -> None:
    tree = tree_of(["aa", "ab", "ba"], max_cache_bytes=1)  # room for no expansion but the last
    expand(LM, tree, tree.root)
    a = tree.child(tree.root, A)
    expand(LM, tree, a)
    assert tree.root.expansion is None and tree.evictions == 1  # a's call dropped the root's
    expand(LM, tree, tree.root)
    assert tree.lm_calls == 3  # the root asked again
    QTable(tree).open(tree.root)  # opened: pinned, out of the droppable cache
    expand(LM, tree, tree.child(tree.root, B))
    assert tree.root.opened and tree.root.expansion is not None
    assert tree.opened_bytes == tree.root.expansion.nbytes


def test_opened_expansions_are_bounded_in_bytes() -> None:
    tree = tree_of(["a", "b"], max_opened_bytes=1)
    expand(LM, tree, tree.root)
    with pytest.raises(TreeLimitError, match="max_opened_bytes=1"):
        QTable(tree).open(tree.root)


def test_a_mask_shared_by_every_prefix_is_counted_once() -> None:
    width = 1000
    # An empty token (no bytes, not EOS) is never valid: the mask is not the whole vocabulary.
    lm = at.TableLM([f"t{i}".encode() for i in range(width)] + [b"<eos>", b""],
                 lambda prefix: [1.0] * (width + 2), eos=width)
    tree = PrefixTree([], at.constraints.Anything().bind(lm.vocab), TreeOptions(max_new_tokens=8))
    q, node = QTable(tree), tree.root
    for _ in range(5):
        expand(lm, tree, node)  # the test is the driver: it asks the model
        q.open(node)
        node = tree.child(node, 0)
    valid = len(tree.root.expansion.ids)  # every token but the empty one
    assert valid == width + 1
    assert tree.opened_bytes == 5 * valid * 8 + valid * 4  # p per prefix, int32 ids once


