"""One call per key at a time: concurrent callers of a key share the call under way.

A cache miss that many searches hit at once (an expired statistics view, an applied configuration, an
LLM's augmentation of one query) costs the cluster or the LLM one call, not one per search."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """The calls under way, by key; each is forgotten as soon as it ends (its result is the caller's
    to cache)."""

    def __init__(self) -> None:
        self._running: dict[K, asyncio.Future[V]] = {}

    def start(self, key: K, call: Callable[[], Awaitable[V]]) -> asyncio.Future[V]:
        """The call of `key` under way, else `call()` started as a task (nobody need await it)."""
        task = self._running.get(key)
        if task is None:
            task = asyncio.ensure_future(call())
            self._running[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        return task

    async def run(self, key: K, call: Callable[[], Awaitable[V]]) -> V:
        """The result of the call of `key` (joined, or started); a waiter cancelled meanwhile does not
        cancel it for the others."""
        return await asyncio.shield(self.start(key, call))

    async def settled(self) -> None:
        """Wait for every call under way (tests, shutdown); their failures are their waiters'."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    def __len__(self) -> int:
        return len(self._running)

    def _finished(self, key: K, task: asyncio.Future[V]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        if not task.cancelled():
            task.exception()  # retrieved: a failure nobody waited for (a background call) is not logged
