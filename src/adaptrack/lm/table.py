"""TableLM: an exact small model given by a Python function, for tests and toy problems."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..errors import ModelOutputError
from ..tokenization.vocab import Vocabulary
from .base import LanguageModel, Prefix


class TableLM(LanguageModel):
    """A model whose next-token distribution is ``next_probs(prefix_ids)``.

    ``vocab`` lists each token's bytes (``str`` is UTF-8 encoded); the entries at the ``eos``
    ids are special and never matched as text. ``next_probs`` receives the full prefix
    (prompt ids included) and returns one non-negative weight per token; weights are
    normalized, so they need not sum to 1.

    >>> lm = TableLM([b"0", b"1", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
    >>> lm.encode("10")
    [1, 0]
    >>> [round(float(p), 3) for p in np.exp(lm.next_logprobs([(1, 0)])[0])]
    [0.333, 0.333, 0.333]
    """

    #: Declared, not timed, so that what a test sees does not depend on the machine: a
    #: table stands for a model whose rows are free (a GPU's), and a search runs at its
    #: widest; ``exact``'s samples are the same at every width.
    row_cost = 0.0

    def __init__(
        self,
        vocab: Sequence[bytes | str],
        next_probs: Callable[[Prefix], Sequence[float]],
        eos: int | Iterable[int] | None = None,
    ) -> None:
        eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        token_bytes: list[bytes | None] = [
            None if i in eos_ids else _token_bytes(i, t) for i, t in enumerate(vocab)
        ]
        self.vocab = Vocabulary(token_bytes, eos_ids)
        self.next_probs = next_probs
        self.calls = 0

    def encode(self, text: str) -> list[int]:
        """Greedy longest-match tokenization of ``text`` (special tokens never match)."""
        try:
            return self.vocab.longest_match(text.encode())
        except ValueError as err:
            raise ValueError(f"TableLM {err}") from None

    def _next_logprobs(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        out = np.empty((len(prefixes), self.vocab.size))
        for row, prefix in enumerate(prefixes):
            found = self.next_probs(tuple(prefix))
            try:
                w = np.asarray(found, dtype=np.float64)
            except (TypeError, ValueError):
                raise ModelOutputError(
                    f"next_probs({tuple(prefix)}) must return {self.vocab.size} numbers; got "
                    f"{found!r:.80}") from None
            ok = w.shape == (self.vocab.size,) and np.all(np.isfinite(w)) and np.all(w >= 0)
            if not ok or not w.sum() > 0:
                raise ModelOutputError(
                    f"next_probs({tuple(prefix)}) must return {self.vocab.size} non-negative "
                    f"finite weights with a positive sum; got {w.tolist()[:8]}"
                )
            with np.errstate(divide="ignore"):
                out[row] = np.log(w / w.sum())
        return out


def _token_bytes(i: int, token: object) -> bytes:
    if isinstance(token, str):
        try:
            return token.encode()
        except UnicodeEncodeError:
            raise ValueError(f"TableLM vocab[{i}] = {token!r} is not encodable as UTF-8") from None
    if isinstance(token, bytes | bytearray):
        return bytes(token)
    raise TypeError(f"TableLM vocab[{i}] must be bytes or str, got {token!r:.60} "
                    f"({type(token).__name__})")
