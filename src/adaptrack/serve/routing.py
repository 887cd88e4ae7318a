"""Prefix-aware routing for ``adaptrack serve --replicas N``: which replica a request goes
to, so that requests sharing a prompt prefix meet the replica that already holds its prefix
tree (a repeated request samples from it) and its KV states (a later turn of a chat starts
with the earlier turn's prompt).

The router remembers, for recent requests, the first :data:`PREFIX_BYTES` bytes of their
prompt text (:func:`routing_text`) and the replica that served them, in a sorted list: the
remembered text sharing the longest prefix with a new one is one of its two neighbours in
that order (a binary search, no tree). A request prefers the replica of its longest match
when the match covers at least :data:`MIN_MATCH` of its text, then the others in an order
drawn from a hash of its text (rendezvous hashing: the same text, the same order,
whatever the order of the replicas). It goes to the first of them whose requests in flight
stay under a bound, :data:`BALANCE` times an even share of all those in flight (consistent
hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam, 2018, as in HAProxy's
``hash-balance-factor``): one request after another keeps its replica, a burst of requests
sharing a prefix spreads over the replicas instead of queueing on one. Ray Serve's
``PrefixCacheAffinityRouter`` has the same aim; it needs Ray's LLM extra and a tree actor.

>>> r = PrefixRouter(["replica-0", "replica-1"])
>>> first = r.route(b"You are a helpful assistant. Say hi.")
>>> r.done(first)
>>> r.route(b"You are a helpful assistant. Say bye.") == first
True
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import threading
from collections import OrderedDict
from typing import Any

#: Bytes of a prompt's text the router compares (a longer shared prefix adds nothing to
#: the choice); also what it remembers per request.
PREFIX_BYTES = 2048
#: Requests remembered (about PREFIX_BYTES each, the oldest forgotten first).
REMEMBERED = 4096
#: The share of a request's text a remembered prefix must cover to pull it to its replica
#: (Ray's PrefixCacheAffinityRouter uses 0.1 too): below it, the hash order decides.
MIN_MATCH = 0.1
#: How far above an even share of the requests in flight a replica may go before the next
#: one in the request's order takes it (HAProxy's hash-balance-factor 125).
BALANCE = 1.25


def routing_text(kind: str, body: bytes) -> bytes:
    """The text a request is routed by: the prompt of a completion, the roles and contents
    of a chat's messages in order (so a chat's next turn starts with this turn's text), at
    most :data:`PREFIX_BYTES` bytes; empty for a body that is not such JSON (the replica
    answers its 400).

    >>> routing_text("chat", b'{"messages": [{"role": "user", "content": "hi"}]}')
    b'user\\nhi\\n'
    >>> routing_text("completion", b'{"prompt": [1, 2]}')
    b'[1, 2]'
    """
    try:
        payload = json.loads(body)
    except ValueError:
        return b""
    if not isinstance(payload, dict):
        return b""
    if kind == "chat":
        messages = payload.get("messages")
        text = "".join(f"{m.get('role', '')}\n{_content(m.get('content'))}\n"
                       for m in messages if isinstance(m, dict)) if isinstance(messages,
                                                                                list) else ""
    else:
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch: routed by its first prompt
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return text.encode("utf-8", "replace")[:PREFIX_BYTES]


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _shared(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # bytes compare in C: halving beats a Python loop over bytes
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixRouter:
    """Chooses a replica (by name) for each request; thread-safe.

    :meth:`route` names the replica and counts the request as in flight there until
    :meth:`done`.

    >>> r = PrefixRouter(["a", "b"])
    >>> x = r.route(b"same prompt")
    >>> y = r.route(b"same prompt")  # 1 in flight on x, under ceil(1.25 x 2 / 2) = 2
    >>> x == y, r.in_flight[x]
    (True, 2)
    >>> z = r.route(b"same prompt")  # 2 on x, not under ceil(1.25 x 3 / 2): the other
    >>> z != x
    True
    """

    def __init__(self, names: list[str], remembered: int = REMEMBERED) -> None:
        if not names:
            raise ValueError("a router needs at least one replica")
        self.names, self.remembered = list(names), remembered
        self.in_flight = dict.fromkeys(self.names, 0)
        self._lock = threading.Lock()
        self._sorted: list[bytes] = []  # remembered texts in byte order
        self._owner: OrderedDict[bytes, str] = OrderedDict()  # text -> replica, oldest first

    def route(self, text: bytes, exclude: frozenset[str] = frozenset()) -> str:
        """The replica for a request whose :func:`routing_text` is ``text`` (none of
        ``exclude``, unless every replica is), counted in flight there."""
        with self._lock:
            names = [n for n in self.names if n not in exclude] or self.names
            order = sorted(names, key=lambda n: _rank(text, n))
            owner, shared = self._match(text)
            if owner in order and shared >= max(1, MIN_MATCH * len(text)):
                order.remove(owner)
                order.insert(0, owner)
            bound = math.ceil(BALANCE * (sum(self.in_flight.values()) + 1) / len(self.names))
            choice = next((n for n in order if self.in_flight[n] < bound),
                          min(order, key=lambda n: self.in_flight[n]))
            self.in_flight[choice] += 1
            self._remember(text, choice)
            return choice

    def done(self, name: str) -> None:
        """A request routed to ``name`` has ended."""
        with self._lock:
            self.in_flight[name] -= 1

    def _match(self, text: bytes) -> tuple[str | None, int]:
        """The replica of the remembered text sharing the longest prefix with ``text``."""
        i = bisect.bisect_left(self._sorted, text)
        best: tuple[str | None, int] = (None, 0)
        for j in (i - 1, i):
            if 0 <= j < len(self._sorted):
                shared = _shared(self._sorted[j], text)
                if shared > best[1]:
                    best = (self._owner[self._sorted[j]], shared)
        return best

    def _remember(self, text: bytes, name: str) -> None:
        if not text:
            return
        if text in self._owner:
            self._owner.move_to_end(text)
        else:
            bisect.insort(self._sorted, text)
            if len(self._owner) >= self.remembered:
                old, _ = self._owner.popitem(last=False)
                del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._owner[text] = name


def _rank(text: bytes, name: str) -> bytes:
    """A tie-break between replicas that depends on the text (rendezvous hashing)."""
    return hashlib.blake2b(name.encode() + b"\0" + text, digest_size=8).digest()
