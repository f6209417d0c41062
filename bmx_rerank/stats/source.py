"""Where corpus statistics come from, as the request path sees it: anything with `StatsCache.get`'s shape.

The running server uses `StatsCache` (built and refreshed from the cluster), made per session by
`statistics_source`; tests and fixed deployments inject a `FixedStats` with statistics computed
elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from bmx_rerank import defaults
from bmx_rerank.errors import SearchError
from bmx_rerank.identity import IDENTITY_HEADERS
from bmx_rerank.stats.cache import StatsCache, StatsView
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.stats.lengths import DocLengths
from bmx_rerank.stats.store import DEFAULT_STORE


class StatsSource(Protocol):
    """`get` answers for a search; a source may also answer at once (`cached`, see `StatsCache`), so
    that a window with its statistics in memory starts no task for them."""

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
        view = self.cached(index_expr, field, headers)
        if view is None:
            raise SearchError(
                400, "bmx_statistics_missing_exception", f"no statistics for [{index_expr}] field [{field}]"
            )
        return view

    def cached(self, index_expr: str, field: str, headers: Mapping[str, str]) -> StatsView | None:
        """`get`'s view (None: a pair it has no statistics for, which `get` refuses)."""
        corpus = self.table.get((index_expr, field))
        if corpus is None:
            return None
        return StatsView(
            corpus, estimated=False, stale=False, built_at=None, lengths=self.lengths.get((index_expr, field))
        )


StatsFactory = Callable[..., StatsSource]  # (session, base_url) -> StatsSource


def statistics_source(
    check_interval: float,
    store: str = DEFAULT_STORE,
    timeout: float = defaults.TIMEOUT,
    identity: Sequence[str] = IDENTITY_HEADERS,
    lengths_dir: str | None = None,
) -> StatsFactory:
    """The cluster-backed statistics cache, made per session (each proxy worker makes its own)."""
    return lambda session, base_url: StatsCache(
        session,
        base_url,
        check_interval=check_interval,
        store=store,
        timeout=timeout,
        identity_headers=identity,
        lengths_dir=lengths_dir,
    )
