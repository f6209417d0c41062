"""A BEIR collection in an index: `title + " " + text` of each document in one text field, with exact
statistics built, as the paper's protocol reads it (used by the demo's evaluation and the benchmarks)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import orjson

from bmx_rerank.stats.build import build_snapshots
from bmx_rerank.upstream import Cluster

FIELD = "text"
TITLE = "title"


def shared_dataset(name: str) -> Path | None:
    """Where a shared BEIR dataset lies: $BMX_BEIR_DIR/NAME, else ../shared/data/beir/NAME beside a
    checkout (or the working directory); None when absent (the datasets are not shipped)."""
    roots = [os.environ.get("BMX_BEIR_DIR")]
    roots += [
        str(p / "shared" / "data" / "beir") for p in (Path(__file__).resolve().parents[3], Path.cwd().parent)
    ]
    for root in roots:
        if root and (Path(root) / name / "corpus.jsonl").is_file():
            return Path(root) / name
    return None


async def load_beir(
    cluster: Cluster,
    index: str,
    root: Path,
    *,
    analyzer: str = "standard",
    shards: int = 1,
    headers: Mapping[str, str] | None = None,
    separate: bool = False,
) -> int:
    """(Re)create `index` with the collection under `root` unless it already holds all of it, build its
    statistics; returns the number of documents. `separate`: the title in a field of its own (TITLE)
    beside the text (FIELD), statistics for both."""
    fields = (TITLE, FIELD) if separate else (FIELD,)
    docs = [orjson.loads(line) for line in (root / "corpus.jsonl").read_bytes().splitlines() if line.strip()]
    async with cluster.session.head(f"{cluster.base_url}/{index}", headers=headers) as exists:
        present = exists.status == 200
    if present:
        count = await cluster.request("GET", f"/{index}/_count", None, headers)
        if count["count"] == len(docs):
            for name in fields:
                await build_snapshots(cluster, index, name, headers or {})
            return len(docs)
        await cluster.request("DELETE", f"/{index}", None, headers)
    mapping = {
        "settings": {"number_of_shards": shards, "number_of_replicas": 0},
        "mappings": {"properties": {f: {"type": "text", "analyzer": analyzer} for f in fields}},
    }
    await cluster.request("PUT", f"/{index}", mapping, headers)
    for start in range(0, len(docs), 2000):
        lines = []
        for d in docs[start : start + 2000]:
            lines.append(orjson.dumps({"index": {"_index": index, "_id": d["_id"]}}))
            if separate:
                lines.append(orjson.dumps({TITLE: d.get("title", ""), FIELD: d["text"]}))
            else:
                lines.append(orjson.dumps({FIELD: f"{d.get('title', '')} {d['text']}"}))
        async with cluster.session.post(
            f"{cluster.base_url}/_bulk",
            data=b"\n".join(lines) + b"\n",
            headers={**(headers or {}), "Content-Type": "application/x-ndjson"},
        ) as resp:
            answer = orjson.loads(await resp.read())
            if resp.status != 200 or answer.get("errors"):
                raise RuntimeError(f"bulk indexing into {index} failed (HTTP {resp.status})")
    await cluster.request("POST", f"/{index}/_refresh", None, headers)
    for name in fields:
        await build_snapshots(cluster, index, name, headers or {})
    return len(docs)
