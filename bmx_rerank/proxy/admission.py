"""Which searches the proxy reranks, one path for `_search` and for each `_msearch` item: the search's
own `ext.bmx`, else a `--policy` rule, else the configuration applied to the index (`eval --apply`);
within the server's bounds; and only while a rerank slot is free (`--max-concurrent-reranks`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from bmx_rerank.applied import AppliedConfigs
from bmx_rerank.errors import SearchError
from bmx_rerank.metrics import Metrics
from bmx_rerank.policy import Rule
from bmx_rerank.policy import match as match_policy
from bmx_rerank.rerank.plan import Bounds, Plan, bounded_plan


class Admission:
    """Plans searches and counts the reranks running."""

    def __init__(
        self,
        policies: Sequence[Rule],
        bounds: Bounds,
        metrics: Metrics,
        *,
        max_running: int,
        reject: bool,
    ) -> None:
        self.policies = policies
        self.bounds = bounds
        self.metrics = metrics
        self.max_running = max_running
        self.reject = reject  # past `max_running`: a 429 instead of the cluster's own answer
        self.running = 0
        self.applied: AppliedConfigs | None = None  # set while the app runs

    async def plan(
        self,
        index: str | None,
        body: dict[str, Any] | None,
        params: Mapping[str, str],
        headers: Mapping[str, str],
        *,
        skip: str | None = None,
        admit: bool = True,
    ) -> Plan:
        """How to serve one search (`skip`: a reason known up front not to rerank it). With `admit`, a
        rerank past `max_running` is declined as "overloaded" (or rejected); without, the caller
        decides (an `_msearch` asks once for all its items)."""
        policy = await self._policy(index, body, headers)
        plan = bounded_plan(body, params, policy, self.bounds, skip=skip)
        if plan.spec is not None and admit and self.overloaded():
            return self._declined(body, params, policy, "overloaded")
        return plan

    async def decline(
        self, index: str | None, body: Any, params: Mapping[str, str], headers: Mapping[str, str], reason: str
    ) -> Plan:
        """The search as it goes without a rerank (`ext.bmx` checked and removed), saying why."""
        return self._declined(body, params, await self._policy(index, body, headers), reason)

    async def _policy(self, index: str | None, body: Any, headers: Mapping[str, str]) -> Any:
        policy = match_policy(self.policies, index) if index else None
        if policy is None and self.applied is not None:
            policy = await self.applied.policy(index, body, headers)
        return policy

    def _declined(self, body: Any, params: Mapping[str, str], policy: Any, reason: str) -> Plan:
        return replace(bounded_plan(body, params, policy, self.bounds, skip=reason), skipped=reason)

    def overloaded(self) -> bool:
        """True when `max_running` reranks run already; raises the 429 when so configured."""
        if self.running < self.max_running:
            return False
        self.metrics.reranks.labels("overloaded").inc()
        if self.reject:
            raise SearchError(
                429,
                "es_rejected_execution_exception",
                f"rejected: {self.max_running} reranks are running (--max-concurrent-reranks)",
            )
        return True

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """One rerank running."""
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
