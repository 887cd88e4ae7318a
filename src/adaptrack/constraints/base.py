"""The constraint interface.

A :class:`Constraint` describes a language independently of any model; ``bind(vocab)``
gives a :class:`Matcher` that works on that model's token ids. Matcher states are
immutable values stored in the prefix tree, so moving between branches costs nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager

import numpy as np

from ..cache import LRU
from ..tokenization.vocab import Vocabulary

State = Hashable


class _Done:
    """The state after the sequence finished (EOS, or a token holding a terminator)."""

    def __repr__(self) -> str:
        return "DONE"


DONE: State = _Done()


def show(value: object, limit: int = 60) -> str:
    """``repr(value)`` for an error message: one line, cut to ``limit`` characters.

    >>> print(show("x" * 100, limit=8))
    'xxxxxxx...
    """
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def utf8(text: str, what: str) -> bytes:
    """``text`` encoded as UTF-8; a lone surrogate (which UTF-8 cannot encode) is a ValueError
    that names ``what`` and the string.

    >>> utf8("é", "choice")
    b'\\xc3\\xa9'
    >>> utf8("a\\ud800", "choice")
    Traceback (most recent call last):
    ...
    ValueError: choice takes text encodable as UTF-8, got 'a\\ud800' (a lone surrogate at index 1)
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{what} takes text encodable as UTF-8, got {show(text)} (a lone "
                         f"surrogate at index {err.start})") from None


def terminator_bytes(terminators: str | bytes | Iterable[str] | None) -> bytes:
    """Normalize a terminator spec ("(", b"(\\n", ["(", " "]) to a sorted byte string.

    Each byte of the UTF-8 text is a terminator. Anything but a string, bytes, an iterable of
    those, or ``None`` is a TypeError, and text UTF-8 cannot encode a ValueError.

    >>> terminator_bytes(["(", b" ", ")"])
    b' ()'
    >>> terminator_bytes(5)
    Traceback (most recent call last):
    ...
    TypeError: terminators takes a string, bytes, a list of them or None, got 5 (int)
    """
    if terminators is None:
        return b""
    if isinstance(terminators, str):
        data = utf8(terminators, "terminators")
    elif isinstance(terminators, bytes | bytearray):
        data = bytes(terminators)
    else:
        try:
            items = list(terminators)
        except TypeError:
            raise TypeError("terminators takes a string, bytes, a list of them or None, got "
                            f"{terminators!r} ({type(terminators).__name__})") from None
        parts = []
        for item in items:
            if isinstance(item, str):
                parts.append(utf8(item, "terminators"))
            elif isinstance(item, bytes | bytearray):
                parts.append(bytes(item))
            else:
                # bytes(3) would be three zero bytes, never what a caller meant.
                raise TypeError("terminators takes strings or bytes, got "
                                f"{item!r} ({type(item).__name__}) among them")
        data = b"".join(parts)
    return bytes(sorted(set(data)))


class Matcher(ABC):
    """A constraint bound to a vocabulary.

    ``allowed(state)`` lists the valid next tokens (EOS included where the text so far is
    accepted), ``finishing(state)`` the subset that completes the sequence, and
    ``advance(state, token)`` returns the next state, ``None`` for an invalid token (that is
    the lazy per-token check) or :data:`DONE` once the sequence is complete.
    """

    vocab: Vocabulary
    #: Bytes that end a sequence where the text is accepted; the text after the first one in
    #: the last token is cut off. Empty: sequences end with EOS.
    terminators: bytes = b""
    #: True when ``allowed``/``finishing`` list candidates only and each must still pass
    #: ``advance`` (Python predicates): the prefix tree then checks them in probability order
    #: with the validity-aware top-p cutoff instead of taking the mask as it is.
    lazy: bool = False

    @abstractmethod
    def start(self) -> State: ...

    @abstractmethod
    def allowed(self, state: State) -> np.ndarray:
        """Sorted ids of the valid next tokens."""

    @abstractmethod
    def finishing(self, state: State) -> np.ndarray:
        """Sorted ids of the valid next tokens that complete the sequence."""

    @abstractmethod
    def advance(self, state: State, token: int) -> State | None: ...

    def is_complete(self, state: State) -> bool:
        return state is DONE

    def forced_bytes(self, state: State, limit: int | None = None) -> bytes:
        """Bytes every valid continuation starts with (fast-forward uses them), at most
        ``limit`` of them (a caller that can use only so many need not pay for more)."""
        return b""

    def leaving(self, state: State) -> np.ndarray:
        """Sorted ids of the tokens with which the model *leaves* the text at ``state``
        (the ``leave`` end policy, docs/design.md §2): where the text is accepted (an EOS id
        is among ``finishing``), every token but EOS whose first byte starts no valid
        continuation, special tokens included; empty elsewhere. Lazy matchers (predicates,
        ``python()``) list candidates, not a mask, so for them only EOS ends a text.

        >>> from adaptrack.constraints import choice
        >>> from adaptrack.tokenization.vocab import Vocabulary
        >>> m = choice(["a", "ab"]).bind(Vocabulary([b"a", b"b", b"c", b"<e>"], eos_ids=[3]))
        >>> after_a = m.advance(m.start(), 0)
        >>> m.leaving(m.start()).tolist(), m.leaving(after_a).tolist()  # b continues "a"
        ([], [0, 2])
        """
        if self.lazy:
            return _NONE
        cache: LRU[State, np.ndarray] | None = self.__dict__.get("_leaving")
        if cache is None:
            # By bytes: at an accepted state nearly the whole vocabulary leaves.
            cache = self.__dict__["_leaving"] = LRU(1 << 25, lambda a: a.nbytes + 64)
        found = cache.get(state)
        if found is None:
            found = _leaving(self.vocab, self.allowed(state), self.finishing(state))
            cache.put(state, found)
        return found

    def closing(self, state: State) -> np.ndarray:
        """Sorted ids of the valid next tokens after which the sequence may be complete one
        token later: the finishing ones and those after which a finishing token is valid. The
        prefix tree takes these alone at the second-to-last position (docs/design.md §2), so
        that a search does not open one dead last position per token a text could go on
        with. A superset is allowed (what it lists in excess dies one position later); this
        default, ``allowed(state)``, knows nothing.

        >>> from adaptrack.constraints import choice
        >>> from adaptrack.tokenization.vocab import Vocabulary
        >>> m = choice(["ab", "aab"]).bind(Vocabulary([b"a", b"b", b"<e>"], eos_ids=[2]))
        >>> m.closing(m.start()).tolist()  # the default: every allowed token
        [0]
        """
        return self.allowed(state)

    def within(self, state: State, tokens: int) -> np.ndarray:
        """Sorted ids of the valid next tokens after which the sequence may be complete
        within ``tokens - 1`` more tokens, the end token (EOS, or the token carrying a
        terminator or stop string) included: at ``tokens`` 1 :meth:`finishing`, at 2
        :meth:`closing`, and beyond a superset of the exact set, whatever the matcher can
        rule out before any model call (a JSON text that cannot close its strings, required
        keys and brackets in time, docs/design.md §2). The prefix tree takes these alone
        where ``tokens`` are left within ``max_new_tokens``. This default knows nothing
        beyond the last two positions.

        >>> from adaptrack.constraints import choice
        >>> from adaptrack.tokenization.vocab import Vocabulary
        >>> m = choice(["ab", "aab"]).bind(Vocabulary([b"a", b"b", b"<e>"], eos_ids=[2]))
        >>> m.within(m.start(), 3).tolist(), m.within(m.start(), 1).tolist()
        ([0], [])
        """
        if tokens <= 0:
            return _NONE
        if tokens == 1:
            return self.finishing(state)
        if tokens == 2:
            return self.closing(state)
        return self.allowed(state)

    def min_new_tokens(self) -> int:
        """A lower bound on the number of tokens (EOS or the terminator's token included) of
        any complete sequence from :meth:`start`; ``generate`` refuses a ``max_new_tokens``
        below it up front (docs/design.md §6). 1 knows nothing."""
        return 1

    def final_text(self, data: bytes) -> bytes:
        """The text a complete sequence's bytes ``data`` stand for (a constraint with stop
        strings cuts them off); ``generate`` applies it to ``Sample.text``."""
        return data

    def stats(self) -> dict[str, float]:
        """Counters ``generate`` adds to its stats (checks made, timeouts, …)."""
        return {}

    @contextmanager
    def checking(self) -> Iterator[None]:
        """Context for a scan of many ``advance`` checks (a lazy matcher may set up once)."""
        yield

    def accepts(self, tokens: Iterable[int]) -> bool:
        """Whether ``tokens`` form a complete, valid sequence (a check for any method's output)."""
        state = self.start()
        for tok in tokens:
            if state is None or state is DONE:
                return False
            state = self.advance(state, tok)
        return state is DONE


_NONE = np.empty(0, dtype=np.int64)


def _leaving(vocab: Vocabulary, allowed: np.ndarray, finishing: np.ndarray) -> np.ndarray:
    """:meth:`Matcher.leaving` from a state's masks: the tokens whose first byte no allowed
    token starts with, where EOS may end the text. A token whose first bytes continue the
    text and a later one does not is neither (invalid: the whole-token version of the
    policy, docs/design.md §2)."""
    if not len(vocab.eos_ids) or not np.isin(vocab.eos_ids, finishing).any():
        return _NONE
    first = vocab.first_bytes
    goes_on = np.zeros(257, dtype=bool)  # index 256 (-1): special tokens never go on
    goes_on[first[allowed]] = True
    goes_on[256] = False
    out = ~goes_on[first]
    out[vocab.eos_ids] = False
    return np.flatnonzero(out)


class Constraint(ABC):
    """A language of byte strings, independent of any model."""

    @abstractmethod
    def bind(self, vocab: Vocabulary) -> Matcher: ...

