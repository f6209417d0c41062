"""Load a BEIR dataset into an index and build its exact statistics, ready for `bmx-rerank eval`.

Indexes `title + " " + text` of `../shared/data/beir/NAME` into one text field (the layout of
benchmarks/quality.py), then `stats build`. Prints the `bmx-rerank eval` command to run next.

  .venv/bin/python benchmarks/load_beir.py --upstream http://127.0.0.1:9200 --dataset scifact
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import aiohttp
import orjson

from bmx_rerank.stats.build import build_snapshots
from bmx_rerank.upstream import request_json

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "beir"
FIELD = "text"


async def load(
    upstream: str, index: str, corpus: Path, analyzer: str, limit_docs: set[str] | None = None
) -> int:
    docs = [orjson.loads(line) for line in corpus.read_bytes().splitlines() if line.strip()]
    if limit_docs is not None:
        docs = [d for d in docs if d["_id"] in limit_docs]
    async with aiohttp.ClientSession() as session:
        await session.delete(f"{upstream}/{index}")
        mapping = {
            "settings": {"number_of_shards": 1, "number_of_replicas": 0},
            "mappings": {"properties": {FIELD: {"type": "text", "analyzer": analyzer}}},
        }
        await request_json(session, "PUT", f"{upstream}/{index}", mapping)
        for start in range(0, len(docs), 2000):
            lines = []
            for d in docs[start : start + 2000]:
                lines.append(orjson.dumps({"index": {"_index": index, "_id": d["_id"]}}))
                lines.append(orjson.dumps({FIELD: f"{d.get('title', '')} {d['text']}"}))
            async with session.post(
                f"{upstream}/_bulk",
                data=b"\n".join(lines) + b"\n",
                headers={"Content-Type": "application/x-ndjson"},
            ) as resp:
                answer = orjson.loads(await resp.read())
                if resp.status != 200 or answer.get("errors"):
                    raise SystemExit(f"bulk indexing into {index} failed")
        await request_json(session, "POST", f"{upstream}/{index}/_refresh")
        await build_snapshots(session, upstream, index, FIELD, {})
    return len(docs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--index")
    ap.add_argument("--analyzer", default="standard")
    args = ap.parse_args()
    root = DATA / args.dataset
    index = args.index or f"bmxeval-{args.dataset}"
    upstream = args.upstream.rstrip("/")
    n = asyncio.run(load(upstream, index, root / "corpus.jsonl", args.analyzer))
    print(f"{index}: {n} documents, statistics built. Next:")
    print(
        f"  .venv/bin/bmx-rerank eval {index} --field {FIELD} --queries {root}/queries.jsonl "
        f"--qrels {root}/qrels/test.tsv --upstream {upstream}"
    )


if __name__ == "__main__":
    main()
