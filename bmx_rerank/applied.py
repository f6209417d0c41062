"""Applied configurations: the rerank parameters `bmx-rerank eval --apply` chose for an index, stored
in the cluster next to its statistics, acting as that index's policy in every proxy and client wrapper.

One document `config|{index}` in the statistics store (`bmx-stats`), kind `config`: `info.rerank`
(False when the engine's own ranking won: searches then pass through untouched), `info.bmx` (the
winning `ext.bmx`, field included) and `info.evidence` (what it was chosen on). Precedence, highest
first: a request's own `ext.bmx`, a command-line `--policy`, the applied configuration.

A running proxy reads it with the caller's credentials, remembers it `ttl` seconds per index (shared
by callers: it is the index's setting, like its mapping, and says nothing about documents), and so
picks up a new one without a restart. A failed read (no right to read the store, cluster down) is not
remembered and means "no configuration": it never fails the search."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
from cachetools import TTLCache

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.rerank.spec import RerankSpec, parse_spec
from bmx_rerank.singleflight import SingleFlight
from bmx_rerank.stats.store import DEFAULT_STORE, ensure_store, now_iso
from bmx_rerank.upstream import Cluster

log = logging.getLogger("bmx_rerank.applied")

DEFAULT_TTL = 5.0  # seconds an index's configuration is remembered
# Share of the proxy's --timeout the lookup may take: it runs before the search itself, so a stalled
# cluster must not make a plain search wait twice the timeout (it answers 504 within timeout + 1 s).
LOOKUP_SHARE = 0.25
MAX_INDICES = 4096  # indices whose configuration is remembered at once


def config_id(index: str) -> str:
    return f"config|{index}"


def _doc_path(store: str, index: str) -> str:
    return f"/{quote(store)}/_doc/{quote(config_id(index), safe='')}"


async def write_config(
    cluster: Cluster,
    index: str,
    bmx: Mapping[str, Any] | None,
    evidence: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    store: str = DEFAULT_STORE,
) -> dict[str, Any]:
    """Store `bmx` (an `ext.bmx` object; None: the engine's ranking won) as the index's configuration."""
    if bmx is not None:
        parse_spec(dict(bmx), where="applied")  # never store what a proxy could not use
    info = {"index": index, "rerank": bmx is not None, "bmx": dict(bmx or {}), "evidence": dict(evidence)}
    doc = {"kind": "config", "key": index, "created_at": now_iso(), "info": info}
    await ensure_store(cluster, headers or {}, store)
    await cluster.request("PUT", _doc_path(store, index) + "?refresh=true", doc, headers)
    return doc


async def read_config(
    cluster: Cluster, index: str, headers: Mapping[str, str] | None = None, store: str = DEFAULT_STORE
) -> dict[str, Any] | None:
    """The stored configuration document's `info` of an index, or None when there is none."""
    try:
        answer = await cluster.request("GET", _doc_path(store, index), None, headers)
    except UpstreamError as exc:
        if exc.status == 404:  # no store yet, or no configuration for this index
            return None
        raise
    if not answer or not answer.get("found"):
        return None
    return answer.get("_source", {}).get("info")


async def delete_config(
    cluster: Cluster, index: str, headers: Mapping[str, str] | None = None, store: str = DEFAULT_STORE
) -> bool:
    try:
        await cluster.request("DELETE", _doc_path(store, index) + "?refresh=true", None, headers)
    except UpstreamError as exc:
        if exc.status == 404:
            return False
        raise
    return True


_ENGINE = object()  # cached marker: the engine's ranking won, pass through


class AppliedConfigs:
    """Per-index applied configurations for the request path, remembered `ttl` seconds."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        ttl: float = DEFAULT_TTL,
        store: str = DEFAULT_STORE,
        widen_default: bool = True,
        timeout: float | None = 10.0,
    ) -> None:
        # the lookup's share of the timeout (`LOOKUP_SHARE`)
        self.cluster = Cluster(
            session, base_url, None if timeout is None else max(0.1, timeout * LOOKUP_SHARE)
        )
        self.store = store
        self.widen_default = widen_default
        self.enabled = ttl > 0
        self._cache: TTLCache[str, Any] = TTLCache(maxsize=MAX_INDICES, ttl=max(ttl, 1e-9))
        self._reading: SingleFlight[str, Any] = SingleFlight()

    async def policy(self, index: str | None, body: Any, headers: Mapping[str, str]) -> RerankSpec | None:
        """The applied spec for a search on `index` without `ext.bmx`, or None (no configuration, the
        engine won, the body has its own `ext.bmx`, or the path names several indices or a pattern)."""
        if not self.enabled or not index or any(c in index for c in "*,") or index.startswith("_"):
            return None
        if isinstance(body, Mapping) and isinstance(body.get("ext"), Mapping) and "bmx" in body["ext"]:
            return None
        cached = self._cache.get(index)
        if cached is None:
            # One read per index at a time: concurrent searches when the entry expires share it.
            cached = await self._reading.run(index, lambda: self._read(index, headers))
            if cached is None:
                return None
        return None if cached is _ENGINE else cached

    async def _read(self, index: str, headers: Mapping[str, str]) -> Any:
        try:
            info = await read_config(self.cluster, index, headers, self.store)
        except SearchError as exc:
            log.info("applied configuration not readable", extra={"fields": {"error": exc.type}})
            if exc.status in (502, 504):  # the cluster is down or slow for everyone: not every search
                self._cache[index] = _ENGINE  # waits for it again within ttl
            return None
        spec = self._spec(index, info)
        self._cache[index] = spec
        return spec

    def _spec(self, index: str, info: Mapping[str, Any] | None) -> Any:
        if not info or not info.get("rerank"):
            return _ENGINE
        try:
            return parse_spec(info.get("bmx"), widen_default=self.widen_default, where="applied")
        except SearchError as exc:
            log.warning(
                "applied configuration unusable", extra={"fields": {"index": index, "reason": exc.reason}}
            )
            return _ENGINE
