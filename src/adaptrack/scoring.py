"""``score``: the model's log-probability of texts after a prompt, through the engine's
one batched call (docs/design.md §4, §5): the demo's intents, an evaluation's oracle mass."""

from __future__ import annotations

from collections.abc import Sequence

from .lm.base import LanguageModel
from .sampling.engine import score_tokens


def score(lm: LanguageModel, prompt: str | Sequence[int], texts: Sequence[str]) -> list[float]:
    """log P(text | prompt) under ``lm`` for each of ``texts``, in one model call. A text is
    read as the canonical tokenization of prompt + text past the prompt's tokens, or of the
    text alone where the two merge at the boundary (or ``prompt`` is token ids).

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> [round(lp, 3) for lp in at.score(lm, "", ["a", "ab", ""])]   # .5, .5 x .25, 1
    [-0.693, -2.079, 0.0]
    """
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"texts must be a list of strings, got {texts!r:.60}")
    if isinstance(prompt, str):
        head = lm.encode(prompt)
        tails = []
        for text in texts:
            full = lm.encode(prompt + text)
            tails.append(full[len(head):] if full[:len(head)] == head else lm.text_tokens(text))
    else:
        head = [int(t) for t in prompt]
        tails = [lm.text_tokens(text) for text in texts]
    return score_tokens(lm, head, tails)
