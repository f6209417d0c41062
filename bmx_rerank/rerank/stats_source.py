"""Where corpus statistics come from, as the proxy sees it: anything with `StatsCache.get`'s shape.

The running server uses `bmx_rerank.statistics.StatsCache` (built and refreshed from the cluster);
tests and fixed deployments inject a `FixedStats` with statistics computed elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from bmx_rerank.corpus import CorpusStats
from bmx_rerank.errors import SearchError


class StatsViewLike(Protocol):
    corpus: CorpusStats
    estimated: bool
    stale: bool
    built_at: str | None


class StatsSource(Protocol):
    async def get(self, index_expr: str, field: str, headers: Mapping[str, str]) -> StatsViewLike: ...


@dataclass(frozen=True)
class FixedView:
    corpus: CorpusStats
    estimated: bool = False
    stale: bool = False
    built_at: str | None = None


class FixedStats:
    """Statistics given up front, per (index expression, field); a missing pair is a 400."""

    def __init__(self, table: Mapping[tuple[str, str], CorpusStats]) -> None:
        self.table = dict(table)

    async def get(self, index_expr: str, field: str, headers: Mapping[str, str]) -> FixedView:
        corpus = self.table.get((index_expr, field))
        if corpus is None:
            raise SearchError(
                400, "bmx_statistics_missing_exception", f"no statistics for [{index_expr}] field [{field}]"
            )
        return FixedView(corpus)


StatsFactory = Callable[..., StatsSource]  # (session, base_url) -> StatsSource
