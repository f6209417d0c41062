"""One deadline per request: a budget for everything a reranked search does (its first stage, the
analysis, term vectors, statistics), instead of a full `--timeout` for each call one after another.

The front end makes one `Deadline` per search and runs the rerank `within` it; every call to the
cluster asks `budget(its own timeout)` for what is left (the deadline travels in a context variable,
so tasks started for the request, such as the statistics lookups, see it too), and the pipeline stops
at the deadline: with the cluster's first-stage answer in hand it answers with it, marked
`skipped; reason=deadline`, else a 504."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

MIN_CALL = 0.001  # seconds: a call made with no budget left still gets a timeout that ends at once


@dataclass(frozen=True)
class Deadline:
    """The moment (monotonic clock) a request must be answered by, and the budget it was given."""

    at: float
    seconds: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def loop_time(self, now: float) -> float:
        """The deadline on an event loop's clock, `now` being the loop's time."""
        return now + self.remaining()


_CURRENT: ContextVar[Deadline | None] = ContextVar("bmx_deadline", default=None)


def current() -> Deadline | None:
    return _CURRENT.get()


@contextlib.contextmanager
def within(deadline: Deadline | None) -> Iterator[Deadline | None]:
    """Run the block (and the tasks it starts) under `deadline` (None: no deadline)."""
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)


def budget(timeout: float | None) -> float | None:
    """A call's timeout: its own (None: none), never past the current request's deadline."""
    deadline = _CURRENT.get()
    if deadline is None:
        return timeout
    left = max(deadline.remaining(), MIN_CALL)
    return left if timeout is None else min(timeout, left)


_TIME_VALUE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(nanos|micros|ms|s|m|h|d)?\s*$")
_UNITS = {"nanos": 1e-9, "micros": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def time_value(value: object) -> float | None:
    """Seconds of an Elasticsearch time value ("500ms", "10s", "1m"; a bare number is milliseconds),
    or None when it is not one (the cluster answers for a bad value itself)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    if isinstance(value, (int, float)):
        return float(value) / 1000 if value > 0 else None
    match = _TIME_VALUE.match(value)
    if match is None:
        return None
    number, unit = float(match.group(1)), match.group(2)
    seconds = number * (_UNITS[unit] if unit else 1e-3)
    return seconds if seconds > 0 else None


def request_budget(configured: float, *limits: float | None, since: float | None = None) -> Deadline | None:
    """The deadline of a request: the configured budget (0: none), lowered by the request's own
    limits (ext.bmx.deadline, the search's `timeout`, a client's `request_timeout`) where given,
    counted from `since` (a `time.monotonic()`; default now)."""
    given = [x for x in limits if x is not None and x > 0]
    seconds = min([configured, *given] if configured > 0 else given, default=None)
    if seconds is None:
        return None
    return Deadline((time.monotonic() if since is None else since) + seconds, seconds)
