"""The demo: the bundled sample corpus in a local engine, searched with BM25 and through the proxy with BMX.

Pieces the `bmx-rerank demo` command strings together: load the corpus, ask the same queries of the
engine and of the proxy, and print both rankings side by side.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import aiohttp
import orjson

from bmx_rerank.upstream import request_json

INDEX = "bmx-demo-python-docs"
FIELD = "content"
QUERIES = (
    "parse a json string into an object",
    "read lines from a text file",
    "compress data with gzip",
    "random integer in a range",
    "current date and time",
    "copy a directory tree",
    "send an email message",
    "split a string into a list of words",
)
MAPPING = {
    "settings": {"number_of_shards": 2, "number_of_replicas": 0},
    "mappings": {
        "properties": {
            "title": {"type": "keyword"},
            FIELD: {"type": "text", "analyzer": "standard"},
        }
    },
}


def sample_corpus() -> list[dict[str, str]]:
    """The bundled corpus: Python standard-library docstrings (PSF License, see data/)."""
    text = resources.files("bmx_rerank").joinpath("data/python_docs.jsonl").read_text("utf-8")
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def searchable(doc: dict[str, str]) -> dict[str, str]:
    """The indexed form: the dotted name split into words (`json.loads` -> `json loads`) plus the text."""
    words = re.sub(r"[._]+", " ", doc["title"])
    return {"title": doc["title"], FIELD: f"{words} {doc['text']}"}


def bulk_body(docs: Sequence[dict[str, str]], index: str = INDEX) -> bytes:
    """An NDJSON `_bulk` body indexing `docs` under their `_id`."""
    lines: list[bytes] = []
    for doc in docs:
        lines.append(orjson.dumps({"index": {"_index": index, "_id": doc["_id"]}}))
        lines.append(orjson.dumps(searchable(doc)))
    return b"\n".join(lines) + b"\n"


async def load_corpus(session: aiohttp.ClientSession, base_url: str, index: str = INDEX) -> int:
    """(Re)create `index` holding the sample corpus unless it already holds all of it; returns its size."""
    docs = sample_corpus()
    async with session.head(f"{base_url}/{index}") as exists:
        present = exists.status == 200
    if present:
        count = await request_json(session, "GET", f"{base_url}/{index}/_count")
        if count["count"] == len(docs):
            return len(docs)
        await request_json(session, "DELETE", f"{base_url}/{index}")
    await request_json(session, "PUT", f"{base_url}/{index}", MAPPING)
    async with session.post(
        f"{base_url}/_bulk?refresh=true",
        data=bulk_body(docs, index),
        headers={"Content-Type": "application/x-ndjson"},
    ) as resp:
        answer = orjson.loads(await resp.read())
    if resp.status >= 400 or answer.get("errors"):
        raise RuntimeError(f"bulk indexing of the demo corpus failed (HTTP {resp.status})")
    return len(docs)


@dataclass(frozen=True)
class Hit:
    title: str
    score: float


def search_body(query: str, size: int, bmx: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plain `match` search a user would send; with `bmx`, the same search asking for a rerank."""
    body: dict[str, Any] = {"size": size, "query": {"match": {FIELD: query}}, "_source": ["title"]}
    if bmx is not None:
        body["ext"] = {"bmx": {"field": FIELD, **bmx}}
    return body


async def top_hits(
    session: aiohttp.ClientSession,
    base_url: str,
    body: dict[str, Any],
    headers: Mapping[str, str] | None = None,
    index: str = INDEX,
) -> list[Hit]:
    answer = await request_json(session, "POST", f"{base_url}/{index}/_search", body, headers)
    return [Hit(h["_source"]["title"], float(h["_score"])) for h in answer["hits"]["hits"]]


def side_by_side(query: str, columns: Sequence[tuple[str, Sequence[Hit]]], width: int = 60) -> str:
    """One query's rankings in columns, rank by rank: score, then title."""
    rows = [f"query: {query!r}", "  ".join(f"{name:<{width}}" for name, _ in columns).rstrip()]
    depth = max((len(hits) for _, hits in columns), default=0)
    for rank in range(depth):
        cells = []
        for _, hits in columns:
            hit = hits[rank] if rank < len(hits) else None
            cell = f"{rank + 1:>2}. {hit.score:6.2f}  {hit.title}" if hit else ""
            cells.append(f"{cell[:width]:<{width}}")
        rows.append("  ".join(cells).rstrip())
    return "\n".join(rows)
