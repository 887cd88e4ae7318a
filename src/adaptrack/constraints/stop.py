"""Stop strings: a sequence ends at the token that puts one of them into its text, and its
text is cut before the first of them (as OpenAI's ``stop`` and the Codex paper's sampling cut
it; docs/design.md §2).

The one rule: the text is cut where the earliest-starting stop string begins
(:func:`first_stop`). Everything that ends text at stop strings uses it: the matchers that end
at stop strings (``anything(stop=…)``, ``python(stop=…)``, ``with_stop``, and so the
server's ``stop``) and the evaluation's completions (:func:`cut_text`). The matchers also share
which tokens finish a stop string after a given text; only the text's last ``longest - 1``
bytes decide either, so a matcher keeps just those.

>>> from adaptrack.tokenization.vocab import Vocabulary
>>> vocab = Vocabulary([b"a", b"\\n", b"de", b"f", b"\\ndef", b"<eos>"], eos_ids=[5])
>>> stops = StopStrings((b"\\ndef",), vocab)
>>> stops.cut(b"a\\ndef x", 0), stops.cut(b"a\\nde", 0)
(1, -1)
>>> stops.finishing(b"a\\nde").tolist(), stops.finishing(b"a").tolist()  # "f", or "\\ndef"
([3, 4], [4])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import AnyStr

import numpy as np

from ..cache import LRU
from ..tokenization.vocab import Vocabulary
from .base import show, utf8


def stop_strings(stop: Iterable[str]) -> tuple[bytes, ...]:
    """A constraint's ``stop`` argument checked and encoded: a list of non-empty strings
    (``TypeError`` otherwise; ``ValueError`` for text UTF-8 cannot encode)."""
    try:
        stops = [] if isinstance(stop, str) else list(stop)
    except TypeError:
        stops = [None]  # type: ignore[list-item]
    if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stops):
        raise TypeError(f"stop takes a list of non-empty strings, got {show(stop)}")
    return tuple(utf8(s, "stop") for s in stops)


def first_stop(text: AnyStr, stops: Iterable[AnyStr], since: int = 0) -> int:
    """Where ``text`` (bytes or str) is cut: the start of the earliest-starting stop string
    among those that end after position ``since`` (what is before it was checked already);
    -1: none. Two overlapping stop strings cut at the one that starts first, whichever ends
    first.

    >>> first_stop("xabcd", ["bc", "abcd"]), first_stop(b"xabcd", [b"bc"], since=4)
    (1, -1)
    """
    hits = [i for s in stops if (i := text.find(s, max(0, since - len(s) + 1))) >= 0]
    return min(hits) if hits else -1


def cut_text(text: str, stop: Iterable[str]) -> str:
    """``text`` cut before its first stop string (all of it when it holds none): the text a
    sequence that ended at a stop string stands for.

    >>> cut_text("    return 1\\ndef g(): pass", ["\\ndef", "\\nclass"])
    '    return 1'
    """
    at = first_stop(text, list(stop))
    return text if at < 0 else text[:at]


class StopStrings:
    """The non-empty byte strings ``stops`` over ``vocab``; ``ending``: the tokens that end
    a sequence whatever the text (EOS, terminators), part of every :meth:`finishing` set."""

    def __init__(self, stops: tuple[bytes, ...], vocab: Vocabulary,
                 ending: np.ndarray | None = None) -> None:
        self.stops, self.vocab = stops, vocab
        self.longest = max((len(s) for s in stops), default=0)
        #: Tokens that hold a whole stop string: they finish from any text.
        self.holding = np.asarray(
            [t for t in vocab.text_ids.tolist() if any(s in vocab.bytes_of(t) for s in stops)],
            dtype=np.int64)
        self.ending = (self.holding if ending is None
                       else np.union1d(np.asarray(ending, dtype=np.int64), self.holding))
        self._finishing: LRU[bytes, np.ndarray] = LRU(limit=1024)

    def tail(self, data: bytes) -> bytes:
        """The end of ``data`` that decides what a next token can finish."""
        return data[-(self.longest - 1):] if self.longest > 1 else b""

    def cut(self, data: bytes, since: int) -> int:
        """Where ``data`` is cut by the stop strings that end after its byte ``since``
        (:func:`first_stop`)."""
        return first_stop(data, self.stops, since)

    def final_text(self, data: bytes) -> bytes:
        """``data`` cut before its first stop string."""
        at = self.cut(data, 0)
        return data if at < 0 else data[:at]

    def finishing(self, text: bytes) -> np.ndarray:
        """The tokens that end ``text`` + token: ``ending``, those holding a stop string,
        and those that finish one ``text``'s end began; sorted ids."""
        tail = self.tail(text)
        found = self._finishing.get(tail)
        if found is None:
            parts = [self.ending]
            trie = self.vocab.trie
            for s in self.stops:
                for k in range(1, len(s)):
                    if not tail.endswith(s[:k]):
                        continue
                    node: int | None = 0
                    for b in s[k:]:
                        node = trie.children[node].get(b)  # type: ignore[index]
                        if node is None:
                            break
                    if node is not None:
                        parts.append(trie.subtree(node))
            found = parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))
            self._finishing.put(tail, found)
        return found
