"""Where corpus statistics come from, as the proxy sees it: anything with `StatsCache.get`'s shape.

The running server uses `bmx_rerank.stats.cache.StatsCache` (built and refreshed from the cluster);
tests and fixed deployments inject a `FixedStats` with statistics computed elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from bmx_rerank.errors import SearchError
from bmx_rerank.stats.cache import StatsView
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.stats.lengths import DocLengths


class StatsSource(Protocol):
    async def get(self, index_expr: str, field: str, headers: Mapping[str, str]) -> StatsView: ...


class FixedStats:
    """Exact statistics given up front, per (index expression, field); a missing pair is a 400.

    `lengths` (same keys) are the length tables of the concrete indices behind each pair (concrete
    index name -> `DocLengths`, as a sweep built them). `table` and `lengths` stay mutable so a test
    can add statistics after the proxy started."""

    def __init__(
        self,
        table: Mapping[tuple[str, str], CorpusStats],
        lengths: Mapping[tuple[str, str], Mapping[str, DocLengths]] | None = None,
    ) -> None:
        self.table = dict(table)
        self.lengths = dict(lengths or {})

    async def get(self, index_expr: str, field: str, headers: Mapping[str, str]) -> StatsView:
        corpus = self.table.get((index_expr, field))
        if corpus is None:
            raise SearchError(
                400, "bmx_statistics_missing_exception", f"no statistics for [{index_expr}] field [{field}]"
            )
        return StatsView(
            corpus, estimated=False, stale=False, built_at=None, lengths=self.lengths.get((index_expr, field))
        )


StatsFactory = Callable[..., StatsSource]  # (session, base_url) -> StatsSource
