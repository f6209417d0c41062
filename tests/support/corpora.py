"""Bulk loading of corpora into a real engine (the test vectors' among them), and the exact statistics of
what was loaded."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats.build import build_snapshots
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.upstream import Cluster
from tests.support.data import vectors
from tests.support.engine_client import EngineClient


def bulk(
    engine: EngineClient,
    index: str,
    docs: dict[str, Any],
    refresh: bool = True,
    chunk: int = 0,
    routing: str | None = None,
) -> None:
    """Index `docs` (id -> source) with `_bulk`, `chunk` documents a request (0: all in one), each with
    `routing` if given, refreshed by default so that searches see them; every item must succeed."""
    action = {"_index": index} | ({"routing": routing} if routing is not None else {})
    items = list(docs.items())
    step = chunk or max(len(items), 1)
    for start in range(0, len(items), step):
        lines = "".join(
            json.dumps({"index": {**action, "_id": doc_id}}) + "\n" + json.dumps(source) + "\n"
            for doc_id, source in items[start : start + step]
        )
        answer = engine.ok("POST", "/_bulk", lines, {"refresh": refresh})
        assert answer["errors"] is False, answer


SCIFACT_MAPPINGS = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}


def index_scifact(
    engine: EngineClient,
    index: str,
    records: list[dict[str, Any]],
    shards: int = 1,
    chunk: int = 0,
    mappings: dict[str, Any] = SCIFACT_MAPPINGS,
    settings: dict[str, Any] | None = None,
) -> None:
    """Create `index` (`mappings`: by default `body` with the standard analyzer; `shards` shards, no
    replica, and any other `settings`) and load SciFact `records` (`tests.support.data.scifact_records`)
    into it, `title + " " + text` as `body`."""
    settings = {"number_of_shards": shards, "number_of_replicas": 0, **(settings or {})}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
    docs = {d["_id"]: {"body": f"{d.get('title', '')} {d['text']}"} for d in records}
    bulk(engine, index, docs, chunk=chunk)


async def exact_stats(base: str, index: str, field: str) -> CorpusStats:
    """The exact statistics of `field` in `index`, from one sweep (as `bmx-rerank stats build`)."""
    async with aiohttp.ClientSession() as session:
        return await stats_build.build(Cluster(session, base), index, field, {})


def index_vectors(
    engine: EngineClient, index: str, settings: dict, mappings: dict, field: str = "body"
) -> None:
    """Create `index`, bulk-index the test-vector corpus into `field` and build its statistics."""
    engine.ok("PUT", f"/{index}", {"settings": {"number_of_replicas": 0, **settings}, "mappings": mappings})
    bulk(engine, index, {str(i): {field: " ".join(tokens)} for i, tokens in enumerate(vectors()["corpus"])})

    async def build() -> None:
        async with aiohttp.ClientSession() as session:
            await build_snapshots(Cluster(session, engine.url), index, field, {})

    asyncio.run(build())
