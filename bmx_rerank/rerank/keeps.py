"""What a rerank keeps for next time (a window kept whole, its page's documents), put in the caches
while a later search waits for the cluster instead of before this one's answer.

At one client a proxy answers a search, reads the next and sends its first stage, then waits ~1-3 ms
for the cluster with nothing to do: the puts run there (`Keeps.sent`), on the core the cluster's search
thread leaves free, not on either answer's path. What is waiting is bounded (`KEEPS`, run at once past
it) and never waits longer than `IDLE` (a proxy with no next search runs it then). Nothing waiting is
lost or changes: each put carries its own keys (caller, versions) and the bytes or arrays it had when
its rerank made them. A window waiting to be kept counts as kept (`holds`), so that its caller's
repeat is planned as a repeat; that repeat runs what waits once its own first stage is on the wire,
before it reads a cache."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

log = logging.getLogger("bmx_rerank.proxy")

# Puts waiting at most (each holds one rerank's arrays or page documents until it runs): past it they
# run at once. A busy proxy runs them at each first stage it sends; this bounds a burst of answers.
KEEPS = 64
# Seconds a put waits for a later search at most: a proxy with no next search keeps it then (a client
# sending back to back sends its next search within a fraction of a millisecond)
IDLE = 0.002

T = TypeVar("T")


class Keeps:
    """Cache puts waiting for a search to be on the wire (`sent`), or `IDLE` seconds."""

    def __init__(self, bound: int = KEEPS, idle: float = IDLE) -> None:
        self.bound = bound
        self.idle = idle
        self._work: deque[tuple[Callable[[], None], Hashable | None]] = deque()
        self._windows: Counter[Hashable] = Counter()  # windows waiting to be kept, by their key
        # the `IDLE` timer, and the loop it runs on (a loop closed under it never runs it)
        self._timer: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None

    def __len__(self) -> int:
        return len(self._work)

    def add(self, work: Callable[[], None], window: Hashable | None = None) -> None:
        """`work` to run later (at once where no loop runs, or `bound` are waiting); `window`: the key of
        the window it keeps, which `holds` until then."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.bound <= 0:
            work()
            return
        self._work.append((work, window))
        if window is not None:
            self._windows[window] += 1
        if len(self._work) >= self.bound:
            self.run()
        elif self._timer is None or self._timer[0] is not loop:
            self._timer = (loop, loop.call_later(self.idle, self.run))

    def holds(self, window: Hashable) -> bool:
        """Whether a window waits to be kept under this key."""
        return window in self._windows

    def sent(self, search: Awaitable[T]) -> Awaitable[T]:
        """`search` (a first stage about to be awaited), with what waits run once it is on the wire:
        its task writes its request in its first step, and the puts run in the loop's next callback,
        while the cluster answers. As it is where nothing waits."""
        if not self._work:
            return search
        task = asyncio.ensure_future(search)
        asyncio.get_running_loop().call_soon(self.run)
        return task

    def run(self) -> None:
        """Every put waiting, in the order they came. One that fails is logged and left out: a cache
        then misses what it would have kept, nothing more."""
        if self._timer is not None:
            self._timer[1].cancel()
            self._timer = None
        while self._work:
            work, window = self._work.popleft()
            try:
                work()
            except Exception as exc:  # a put's own bug must not fail the search it runs beside
                log.warning("a cache put failed", extra={"fields": {"error": _name(exc)}})
            finally:
                if window is not None:
                    self._windows[window] -= 1
                    if self._windows[window] <= 0:
                        del self._windows[window]


def _name(exc: BaseException) -> Any:
    return f"{exc.__class__.__name__}: {exc}"[:300]
