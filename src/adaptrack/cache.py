"""One bounded least-recently-used map, for every cache in the package.

Masks of a constraint, KV states of a backend, expansions of the prefix tree and the
tokenizer's encodings are all kept the same way: by recency of use, up to a budget in
bytes (``size`` gives each value's bytes) or in entries (no ``size``: each entry counts 1).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A map that drops its least recently used entries once it holds more than ``limit``.

    ``limit`` counts bytes when ``size`` is given (``size(value)`` is the value's bytes),
    else entries. ``keep_one``: never drop the entry just stored, even when it alone is over
    the limit (a cache whose caller reads the value right back). ``on_evict(key, value)`` is
    called for each dropped entry. ``evictions`` counts them.

    >>> cache = LRU(limit=2)
    >>> cache.put("a", 1); cache.put("b", 2); cache.get("a")
    1
    >>> cache.put("c", 3)  # "b" is the least recently used
    >>> sorted(cache.keys()), cache.evictions
    (['a', 'c'], 1)
    >>> sized = LRU(limit=10, size=len)
    >>> sized.put("x", b"123456"); sized.put("y", b"123456"); list(sized.keys()), sized.used
    (['y'], 6)
    """

    def __init__(
        self,
        limit: int,
        size: Callable[[V], int] | None = None,
        *,
        keep_one: bool = False,
        on_evict: Callable[[K, V], None] | None = None,
    ) -> None:
        if limit < 0:
            raise ValueError(f"a cache limit must be >= 0, got {limit}")
        self.limit, self.keep_one, self.on_evict = limit, keep_one, on_evict
        self._size = size
        # A plain dict keeps insertion order, and moving a key to the end is a pop and a
        # put: iterating an OrderedDict costs ~60x more (1.7 ms for 1 024 entries), which a
        # backend's scan of its kept KV states pays every forward pass.
        self._items: dict[K, V] = {}
        self.used = 0  # bytes (or entries) held now
        self.evictions = 0

    def _cost(self, value: V) -> int:
        return self._size(value) if self._size is not None else 1

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key`` (now the most recently used), or ``default``."""
        value = self._items.pop(key, None)
        if value is None:
            return default
        self._items[key] = value
        return value

    def peek(self, key: K) -> V | None:
        """The value of ``key`` without counting it as used."""
        return self._items.get(key)

    def put(self, key: K, value: V, *, trim: bool = True) -> None:
        """Store ``value`` as the most recently used; drop old entries past the limit
        (``trim=False`` defers that to a later :meth:`trim`)."""
        old = self._items.pop(key, None)
        if old is not None:
            self.used -= self._cost(old)
        self._items[key] = value
        self.used += self._cost(value)
        if trim:
            self.trim()

    def pop(self, key: K) -> V | None:
        """Remove ``key`` without calling ``on_evict``; its value, or None."""
        value = self._items.pop(key, None)
        if value is not None:
            self.used -= self._cost(value)
        return value

    def trim(self, protected: Collection[K] = ()) -> None:
        """Drop least recently used entries, except ``protected`` ones, until within the
        limit."""
        if self.used <= self.limit:
            return
        newest = next(reversed(self._items)) if self.keep_one else None
        # Oldest first, lazily: a full cache drops one or two entries per put, so copying
        # every key each time would make a put cost the cache's size.
        dropped = []
        excess = self.used - self.limit
        for key, value in self._items.items():
            if excess <= 0:
                break
            if key is newest or key in protected:
                continue
            dropped.append((key, value))
            excess -= self._cost(value)
        for key, value in dropped:
            del self._items[key]
            self.used -= self._cost(value)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(key, value)

    def clear(self) -> None:
        self._items.clear()
        self.used = 0

    def keys(self) -> Iterator[K]:
        return iter(list(self._items))

    def items(self) -> Iterator[tuple[K, V]]:
        """Entries from least to most recently used (a snapshot: safe to mutate while
        iterating)."""
        return iter(list(self._items.items()))

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
