"""Toy problems for stop strings, shared by the constraints' and the server's tests: the
tricky case (a stop string across a token boundary, another overlapping it) and a regex whose
texts go on after the stop string."""

from __future__ import annotations

import adaptrack as at
from adaptrack.constraints import with_stop
from adaptrack.constraints.stop import cut_text

# The tricky case: "abcd" spans the boundary of the tokens "xa" and "bcd", and "bc" overlaps
# it, ending first; the text is cut where the earliest-starting stop string begins.
TRICKY_VOCAB = ["xa", "bcd", "e", "<eos>"]
TRICKY_STOPS = ["bc", "abcd"]


def tricky_lm() -> at.TableLM:
    """After "e" (the prompt) writes "xa", "bcd", "e", "xa", … almost surely."""
    def weights(prefix: tuple[int, ...]) -> list[float]:
        w = [1e-3] * 4
        w[(prefix[-1] + 1) % 3] = 1.0
        return w
    return at.TableLM(TRICKY_VOCAB, weights, eos=3)


#: A regex whose texts go on after the stop string "b" (STOP_PROMPT is "a").
STOP_REGEX, STOP_PROMPT = "a{0,3}b[ab]{0,2}", [0]


def stop_toy() -> at.TableLM:
    """EOS is likely right after "b" only when no "a" came before it (after the prompt):
    ending at "b" and ending at EOS after it are different targets."""
    def weights(prefix: tuple[int, ...]) -> list[float]:
        if prefix[-1] == 1:  # after "b"
            return [1, 1, 9 if len(prefix) == 2 else 0.1]
        return [1, 1, 0.1]
    return at.TableLM(["a", "b", "<eos>"], weights, eos=2)


def stop_targets(lm: at.TableLM) -> tuple[dict[str, float], dict[str, float]]:
    """The texts' distribution (end="eos", max_new_tokens=8) when the stop string "b" ends
    the sequence, and when the constraint is sampled and its text cut after (the rule the
    server had); every sequence of the first ends at "b"."""
    regex = at.constraints.regex(STOP_REGEX)
    new: dict[str, float] = {}
    for s, p in at.exact_distribution(lm, STOP_PROMPT, with_stop(regex, ["b"]),
                                      max_new_tokens=8, end="eos").items():
        assert s[-1] == 1
        new[lm.vocab.decode(s[:-1]).decode()] = new.get(lm.vocab.decode(s[:-1]).decode(),
                                                        0) + p
    old: dict[str, float] = {}
    for s, p in at.exact_distribution(lm, STOP_PROMPT, regex, max_new_tokens=8,
                                      end="eos").items():
        text = cut_text(lm.vocab.decode(s).decode(), ["b"])
        old[text] = old.get(text, 0) + p
    return new, old
