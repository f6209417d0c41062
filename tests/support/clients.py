"""The official clients: Elasticsearch's or OpenSearch's, synchronous or asynchronous, for one engine."""

from __future__ import annotations

from typing import Any


def official_client(kind: str, url: str, asynchronous: bool) -> Any:
    """The official client of the engine's kind for `url` (imported here: each is an optional extra)."""
    if kind == "elasticsearch":
        from elasticsearch import AsyncElasticsearch, Elasticsearch

        return (AsyncElasticsearch if asynchronous else Elasticsearch)(url)
    from opensearchpy import AsyncOpenSearch, OpenSearch

    return (AsyncOpenSearch if asynchronous else OpenSearch)(url)
