"""A memory budget for the bodies and answers the proxy holds in flight, across requests (as
Elasticsearch's in-flight requests circuit breaker): each search reserves what it reads, inflates,
parses and buffers from the cluster, and gives it back when answered. A reservation past the budget is
a 429 `circuit_breaking_exception` instead of growth."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bmx_rerank.errors import SearchError
from bmx_rerank.metrics import Metrics

if TYPE_CHECKING:
    from bmx_rerank.proxy.http import Request

log = logging.getLogger("bmx_rerank.proxy")


class CircuitBreaking(SearchError):
    def __init__(self, wanted: int, used: int, limit: int) -> None:
        super().__init__(
            429,
            "circuit_breaking_exception",
            f"[in_flight_requests] Data too large, data for [<http_request>] would be [{used + wanted}/"
            f"{_mib(used + wanted)}], which is larger than the limit of [{limit}/{_mib(limit)}] "
            "(--max-in-flight)",
        )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}mb"


class InFlight:
    """The proxy's budget (bytes) and what requests hold of it now."""

    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit  # 0: no budget
        self.used = 0
        self.metrics = metrics
        metrics.in_flight_limit.set(limit)
        metrics.in_flight_bytes.set_function(lambda: self.used)  # read when scraped, not set each charge

    def account(self) -> Account:
        return Account(self)

    def _take(self, n: int) -> None:
        if self.limit and self.used + n > self.limit:
            self.metrics.breaker_trips.inc()
            log.warning(
                "in-flight budget exceeded",
                extra={"fields": {"wanted": n, "used": self.used, "limit": self.limit}},
            )
            raise CircuitBreaking(n, self.used, self.limit)
        self.used += n

    def _give(self, n: int) -> None:
        self.used -= n


class Account:
    """What one request holds of the budget; `release` gives it all back (at the end of the request)."""

    def __init__(self, budget: InFlight) -> None:
        self.budget = budget
        self.held = 0

    def charge(self, n: int) -> None:
        if n > 0:
            self.budget._take(n)
            self.held += n

    def release(self) -> None:
        self.budget._give(self.held)
        self.held = 0


def charge(request: Request, n: int) -> None:
    """Charge `n` bytes to the request's account, if it has one (search and msearch requests do)."""
    account = request.account
    if account is not None:
        account.charge(n)
