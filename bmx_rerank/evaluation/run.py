"""Running configurations: every query asked the way a client would ask, through the real pipeline.

The engine's own ranking is a plain `match` search straight to the cluster; every other configuration
is the same search with its `ext.bmx`, sent through the proxy app running in this process, so what is
measured is exactly what `bmx-rerank serve` serves (plan, widening, statistics, augmentation, paging).
Applied configurations are ignored here (`applied_ttl=0`): each run says its own `ext.bmx`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp

from bmx_rerank.evaluation.configs import Candidate
from bmx_rerank.proxy import ProxyConfig, make_app, start_server
from bmx_rerank.stats.source import statistics_source
from bmx_rerank.stats.store import DEFAULT_STORE
from bmx_rerank.upstream import Cluster, index_path

Run = dict[str, dict[str, float]]  # query id -> {doc id: score}, the shape ir-measures reads


@dataclass
class Runs:
    """Per configuration: the ranking of each query, and how many reranks fell back (never silent)."""

    runs: dict[str, Run] = field(default_factory=dict)
    fallbacks: dict[str, int] = field(default_factory=dict)
    estimated: dict[str, int] = field(default_factory=dict)  # reranks without exact statistics


def search_body(
    field_name: str | Sequence[str], text: str, size: int, bmx: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The search a client sends: a `match` on the field (a `multi_match` over several), `size` hits (at
    most the window when reranked)."""
    names = [field_name] if isinstance(field_name, str) else list(field_name)
    query = (
        {"match": {names[0]: text}} if len(names) == 1 else {"multi_match": {"query": text, "fields": names}}
    )
    body: dict[str, Any] = {"query": query, "_source": False}
    if bmx is None:
        body["size"] = size
    else:
        body["size"] = min(size, int(bmx.get("window_size", 100)))
        body["ext"] = {"bmx": dict(bmx)}
    return body


def ranking(answer: Mapping[str, Any], qid: str, drop_self: bool) -> dict[str, float]:
    """Served order as scores (n, n-1, ...), so measuring keeps the served order exactly (no tie
    reordering by id); a hit whose id is the query's is dropped under the BEIR protocol."""
    ids = [str(h["_id"]) for h in answer.get("hits", {}).get("hits", [])]
    if drop_self:
        ids = [d for d in ids if d != qid]
    return {d: float(len(ids) - i) for i, d in enumerate(ids)}


async def run_all(
    upstream: str,
    index: str,
    field_name: str | Sequence[str],
    queries: Mapping[str, str],
    candidates: Sequence[Candidate],
    *,
    size: int = 100,
    headers: Mapping[str, str] | None = None,
    concurrency: int = 4,
    drop_self: bool = True,
    progress: Callable[[int], None] | None = None,
    stats_factory: Callable[..., Any] | None = None,
    store: str = DEFAULT_STORE,
) -> Runs:
    """Every query under every candidate; `progress(n)` after each n searches. `store`: where the
    statistics are kept (`stats build --store`, `serve --stats-index`)."""
    upstream = upstream.rstrip("/")
    config = ProxyConfig(upstream=upstream, applied_ttl=0, stats_index=store)
    app = make_app(config, stats_factory or statistics_source(60.0, store))
    runner, proxy = await start_server(app)
    names = [c.name for c in candidates]
    out = Runs({n: {} for n in names}, dict.fromkeys(names, 0), dict.fromkeys(names, 0))
    gate = asyncio.Semaphore(concurrency)
    try:
        async with aiohttp.ClientSession() as session:
            engine, through_proxy = Cluster(session, upstream), Cluster(session, proxy)
            await _has_fields(engine, index, field_name, headers)

            async def one(qid: str, text: str) -> None:
                async with gate:
                    # Candidates take turns per query so none always meets a cold term-vector cache.
                    for c in candidates:
                        answer = await (engine if c.is_engine else through_proxy).request(
                            "POST", f"/{index}/_search", search_body(field_name, text, size, c.bmx), headers
                        )
                        marker = answer.get("_bmx") or {}
                        if marker.get("fallback"):
                            out.fallbacks[c.name] += 1
                        if marker.get("estimated"):
                            out.estimated[c.name] += 1
                        out.runs[c.name][qid] = ranking(answer, qid, drop_self)
                        if progress is not None:
                            progress(1)

            await asyncio.gather(*(one(qid, text) for qid, text in queries.items()))
    finally:
        await runner.cleanup()
    return out


async def _has_fields(
    cluster: Cluster, index: str, field_name: str | Sequence[str], headers: Mapping[str, str] | None
) -> None:
    """ValueError for a field the index does not have: its every search would find nothing."""
    names = [field_name] if isinstance(field_name, str) else list(field_name)
    fields = ",".join(quote(n, safe="") for n in names)
    caps = await cluster.request("GET", f"/{index_path(index)}/_field_caps?fields={fields}", None, headers)
    missing = [n for n in names if n not in (caps.get("fields") or {})]
    if missing:
        raise ValueError(f"[{index}] has no field {', '.join(f'[{n}]' for n in missing)}")
