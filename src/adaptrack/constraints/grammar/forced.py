"""Forced bytes of a grammar: the bytes every valid continuation of a state starts with.

They are walked on a second llguidance matcher of the same grammar, over a tokenizer of
one token per byte (:func:`~.tokenizer.byte_tokenizer`), moved the same way as the token
matcher (a cursor, :mod:`.cursor`) by the bytes of a state's tokens: its masks have 257
bits, and its lexer (whose states llguidance caps and the copies of a matcher share) is not
the token matcher's.
"""

from __future__ import annotations

from llguidance import LLMatcher

from ...cache import LRU
from ...errors import GrammarError
from ...tokenization.vocab import Vocabulary
from .compiler import CompiledGrammar
from .cursor import Spent, Track, dead_end, matcher_failure


class ForcedBytes:
    """The forced bytes of one matcher's states (see
    :meth:`~.matcher.GrammarMatcher.forced_bytes`): its own byte cursor (made on first use,
    with up to ``checkpoints`` checkpoints), the forced bytes found so far in ``compiled``
    (by state: ``(bytes, whether a limit cut them)``)."""

    def __init__(self, compiled: CompiledGrammar, vocab: Vocabulary, checkpoints: int) -> None:
        self.compiled, self.vocab, self.kind = compiled, vocab, compiled.grammar.kind
        self.checkpoints = checkpoints
        self.found: LRU[tuple[int, ...], tuple[bytes, bool]] = compiled.forced
        self.track: Track | None = None
        self._eos = 0

    @property
    def restarts(self) -> int:
        return 0 if self.track is None else self.track.restarts

    def get(self, key: tuple[int, ...], limit: int | None) -> bytes:
        """The forced bytes at the state ``key``, at most ``limit``."""
        found = self.found.get(key)
        if found is None and key:
            parent = self.found.peek(key[:-1])
            data = self.vocab.bytes_of(key[-1])
            if parent is not None and len(data) < len(parent[0]) and parent[0].startswith(data):
                found = parent[0][len(data):], parent[1]
        if found is not None and (not found[1] or (limit is not None and len(found[0]) >= limit)):
            self.found.put(key, found)
            return found[0] if limit is None else found[0][:limit]
        track = self._track()

        def walk(matcher: LLMatcher) -> tuple[bytes, bool]:
            try:
                return self._walk(track, matcher, limit)
            except GrammarError as err:  # the byte matcher's lexer, spent: start it again
                raise Spent(err) from None

        found = track.run(key, walk)
        self.found.put(key, found)
        return found[0]

    def _track(self) -> Track:
        """The byte cursor, made on first use."""
        if self.track is None:
            compiled = self.compiled
            self._eos = compiled.byte_tokenizer().eos_token
            offset = self._eos + 1
            bytes_of = self.vocab.bytes_of

            def ids(tokens: tuple[int, ...]) -> list[int]:
                return [offset + b for t in tokens for b in bytes_of(t)]

            self.track = Track(compiled.renew_bytes, ids, self.checkpoints, self.kind,
                                root=compiled.byte_root())
        return self.track

    def _walk(self, track: Track, matcher: LLMatcher, limit: int | None) -> tuple[bytes, bool]:
        """The forced bytes at the state of ``matcher``, ``track``'s cursor (at most
        ``limit``), and whether the limit cut them."""
        if limit is None:
            # Forcing changes a matcher for good: on a copy.
            copy = matcher.deep_copy()
            found = bytes(copy.compute_ff_bytes())
            if copy.is_error():
                raise matcher_failure(self.kind, copy)
            return found, False
        eos = self._eos
        # Mask bits: token references below the EOS, the EOS ("accepting"), then the bytes
        # (0xFF last: special). A byte is forced where its bit is the only one set.
        head, shift, top = eos >> 3, eos & 7, 1 << 256
        below, low = bytes(head), (1 << shift) - 1
        out = bytearray()
        walker = matcher
        while len(out) < limit:
            raw = walker.compute_bitmask()
            if (head and not raw.startswith(below)) or raw[head] & low:
                break
            bits = int.from_bytes(raw[head:], "little") >> shift
            if bits & (bits - 1) or not 1 < bits < top:
                break
            b = bits.bit_length() - 2
            if walker is matcher:  # consuming changes a matcher for good: on a copy
                walker = matcher.deep_copy()
            out.append(b)
            if not walker.consume_token(eos + 1 + b):
                raise matcher_failure(self.kind, walker)
        else:
            return bytes(out), True
        if walker.is_error():
            if not dead_end(walker):
                raise matcher_failure(self.kind, walker)
            if walker is matcher:  # a dead end (nothing forced): the cursor is spent
                track.reset()
        return bytes(out), False
