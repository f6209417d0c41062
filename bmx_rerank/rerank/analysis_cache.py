"""Analysed query tokens remembered for a while, so a repeated query costs no `_analyze` round trip.

Needed since the first stage waits for the tokens (its term-frequency probes are made of them).
Keyed by (caller, index, analyzer or field, text): a caller never gets tokens analysed with another's
credentials, and an analyzer change (a mapping update, a reopened index) is seen within `ttl`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cachetools import TTLCache

AnalysisKey = tuple[str, str, str, str]


class AnalysisCache:
    """A bounded TTL map from `AnalysisKey` to the tokens `_analyze` gave."""

    def __init__(self, capacity: int = 10_000, ttl: float = 60.0) -> None:
        self.capacity = capacity
        self._items: TTLCache[AnalysisKey, tuple[str, ...]] = TTLCache(maxsize=max(1, capacity), ttl=ttl)

    async def tokens(self, key: AnalysisKey, analyze: Callable[[], Awaitable[list[str]]]) -> list[str]:
        """The cached tokens of `key`, else `analyze()`'s (remembered when it succeeds)."""
        if self.capacity > 0:
            found = self._items.get(key)
            if found is not None:
                return list(found)
        tokens = await analyze()
        if self.capacity > 0:
            self._items[key] = tuple(tokens)
        return tokens

    def __len__(self) -> int:
        return len(self._items)
