"""The forced chains of one prefix tree (docs/design.md §2, fast-forward; §4, forced chains):
which tokens are forced after a prefix, which prefixes feed theirs in one model call, and
what such a call gives every prefix along the chain. The mechanism that finds the tokens is
:func:`~adaptrack.sampling.fastforward.forced_tokens`."""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from ..constraints.base import Matcher
from ..errors import TokenizerError
from ..tokenization.tokenizer import Tokenizer
from .expansion import Expansion
from .fastforward import FastForward, forced_tokens
from .nodes import Node


class Chains:
    """The forced chains of the prefixes of ``prompt`` under ``matcher`` within
    ``max_new_tokens``, as ``fast_forward`` says (None: no chains). ``force``: a forced
    token is the only valid one at its position (the target conditioned on canonical
    tokenization), else chains are only prefilled (the target unchanged; docs/design.md §2).
    Forced bytes become the canonical tokens of ``fast_forward.tokenizer``, else of
    ``tokenizer``, the model's (:meth:`Tokenizer.for_model`). Counts ``sequences`` fed, the
    ``tokens`` in them and the prefixes whose forced bytes the tokenizer cannot encode
    (``unencodable``).

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> m = at.constraints.choice(["ab"]).bind(lm.vocab)
    >>> chains = Chains((), m, FastForward(), max_new_tokens=4,
    ...                 tokenizer=Tokenizer.for_model(lm))
    >>> root = Node(None, None, m.start(), False, 0.0)
    >>> chains.pending(root), chains.force
    ((0, 1), True)
    """

    def __init__(self, prompt: tuple[int, ...], matcher: Matcher,
                 fast_forward: FastForward | None, *, max_new_tokens: int,
                 tokenizer: Tokenizer | None = None) -> None:
        self.prompt, self.matcher, self.max_new_tokens = prompt, matcher, max_new_tokens
        self.fast_forward = fast_forward
        self.force = fast_forward is not None and fast_forward.force is not False
        if fast_forward is not None:
            found = fast_forward.tokenizer or tokenizer
            if found is None:
                raise ValueError("fast-forward needs the model's tokenizer: pass "
                                 "tokenizer=Tokenizer.for_model(lm), or give FastForward one")
            self._tokenizer = found
        self.sequences = 0  # forced chains fed (one model call each)
        self.tokens = 0  # tokens in them
        self.unencodable = 0  # prefixes whose forced bytes the tokenizer cannot encode

    def pending(self, node: Node) -> tuple[int, ...]:
        """The forced tokens to feed from ``node`` on (computed once per node; docs/design.md
        §2, fast-forward target), at most as many as the length limit leaves."""
        if node.pending is None:
            ff = self.fast_forward
            tokens: tuple[int, ...] = ()
            if ff is not None and not node.complete and node.depth < self.max_new_tokens:
                room = self.max_new_tokens - node.depth
                keep = self._tokenizer.context_tokens
                recent = (self.prompt + node.tokens)[-keep:] if keep else ()
                # Bytes enough for ``room`` tokens after the recipe holds back up to
                # ``max_tokens`` of them and an incomplete character: the constraint need
                # not walk a forced string further than the sequence can reach.
                limit = (room + ff.max_tokens) * self._tokenizer.max_token_len + 3
                try:
                    found, _ = forced_tokens(self._tokenizer, self.matcher, node.state, recent,
                                             max_tokens=ff.max_tokens,
                                             conservative=ff.conservative, limit=limit)
                except TokenizerError:
                    # The forced bytes have no canonical tokenization (docs/design.md §2
                    # defines chains by it): this prefix gets no chain, counted. Errors of
                    # the constraint itself are not caught: they are the caller's.
                    self.unencodable += 1
                    found = []
                tokens = tuple(found[:room])
            node.pending = tokens
        return node.pending

    def split(self, todo: list[Node], *, eager: bool = True,
              always: Collection[int] = ()) -> tuple[list[Node], list[Node]]:
        """``(plain, heads)``: the prefixes of ``todo`` that need one distribution each, and
        the chain heads that feed their forced tokens in one call each. ``eager=False``
        feeds a chain only once a walk has stepped into it (``PrefixTree.plan``), except
        at the prefixes whose ids are in ``always``."""
        plain: list[Node] = []
        heads: list[Node] = []
        for node in todo:
            if self.pending(node) and (eager or id(node) in always or _inside_chain(node)):
                heads.append(node)
            else:
                plain.append(node)
        return plain, heads

    def store(self, heads: list[Node], found: list[np.ndarray],
              keep: Callable[[Node, np.ndarray], Expansion],
              child: Callable[[Node, int], Node]) -> None:
        """Give every prefix along each head's chain its expansion from the one call that
        fed it (``found``: a row per position, and one after the chain), so Q sees each
        forced token's probability exactly. ``keep(node, row)`` gives a node its expansion
        from a row (and returns it), ``child(node, token)`` steps into the chain."""
        self.sequences += len(heads)
        for node, rows in zip(heads, found, strict=True):
            chain = node.pending or ()
            self.tokens += len(chain)
            self._follow(node, chain, rows, keep, child)

    def _follow(self, node: Node, chain: tuple[int, ...], rows: np.ndarray,
                keep: Callable[[Node, np.ndarray], Expansion],
                child: Callable[[Node, int], Node]) -> None:
        for i, tok in enumerate(chain):
            exp = node.expansion if node.expansion is not None else keep(node, rows[i])
            if not exp.is_valid(tok):
                return  # p = 0, or not finishing at the length limit: a dead end here
            node = child(node, tok)
        if node.expansion is None and node.depth < self.max_new_tokens:
            self.pending(node)
            keep(node, rows[len(chain)])


def _inside_chain(node: Node) -> bool:
    """Whether a walk stepped from a chain's head into its forced tokens to reach ``node``
    (rather than ``node`` starting a chain of its own)."""
    parent = node.parent
    return node.in_chain and parent is not None and len(parent.pending or ()) > 1
