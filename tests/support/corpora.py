"""Bulk loading of corpora into a real engine, and the exact statistics of what was loaded."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats.corpus import CorpusStats
from tests.support.engine_client import EngineClient


def bulk(
    engine: EngineClient, index: str, docs: dict[str, Any], refresh: bool = True, chunk: int = 0
) -> None:
    """Index `docs` (id -> source) with `_bulk`, `chunk` documents a request (0: all in one), refreshed
    by default so that searches see them; every item must succeed."""
    items = list(docs.items())
    step = chunk or max(len(items), 1)
    for start in range(0, len(items), step):
        lines = "".join(
            json.dumps({"index": {"_index": index, "_id": doc_id}}) + "\n" + json.dumps(source) + "\n"
            for doc_id, source in items[start : start + step]
        )
        answer = engine.ok("POST", "/_bulk", lines, {"refresh": refresh})
        assert answer["errors"] is False, answer


async def exact_stats(base: str, index: str, field: str) -> CorpusStats:
    """The exact statistics of `field` in `index`, from one sweep (as `bmx-rerank stats build`)."""
    async with aiohttp.ClientSession() as session:
        return await stats_build.build(session, base, index, field, {})
