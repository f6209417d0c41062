"""Ranking quality on BEIR datasets: the engine's own BM25 vs the proxy's exact BM25 and BMX, one run.

Indexes `title + " " + text` of a dataset from `../shared/data/beir/`, builds exact statistics, starts
the proxy in-process, and asks every test query three ways: straight to the engine (its BM25, with
shard-local statistics), and through the proxy with `ext.bmx` in `bm25` and `bmx` mode (the proxy
reranks the engine's top `--window`; the three take turns going first, as
the proxy caches term vectors). Reports nDCG@10 (BEIR protocol: a hit whose id equals the query id
is dropped) and the ratio of each to the engine's.

With `--fields` (`title` and `text` indexed as separate fields, statistics per field), it compares the
engine's `multi_match` BM25 over both fields with multi-field BMX through the proxy, for `best_fields`
and `most_fields` (the same `multi_match` sent with `ext.bmx.fields`, so the proxy scores each field
with its own statistics and folds them as the query type does).

Run (engines from `bmx-rerank engine start ...`):
  .venv/bin/python -m benchmarks.quality --upstream http://127.0.0.1:9200 --dataset scifact
  .venv/bin/python -m benchmarks.quality --upstream http://127.0.0.1:9201 --dataset nfcorpus --analyzer english
  .venv/bin/python -m benchmarks.quality --upstream http://127.0.0.1:9200 --dataset scifact --fields
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bmx_rerank.proxy import ProxyConfig, make_app, start_server
from bmx_rerank.stats.build import build_snapshots
from bmx_rerank.stats.source import statistics_source
from bmx_rerank.stats.store import DEFAULT_STORE
from bmx_rerank.upstream import Cluster, request_json
from tests.support.data import BEIR

DATA = BEIR
FIELD = "text"
FIELDS = ("title", "text")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    for line in path.read_text().splitlines()[1:]:
        qid, did, score = line.split("\t")
        qrels[qid][did] = int(score)
    return dict(qrels)


def ndcg_at_10(ranked: list[str], rels: dict[str, int]) -> float:
    """nDCG@10 with linear gains (as pytrec_eval, which BEIR uses)."""
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted((r for r in rels.values() if r > 0), reverse=True)[:10]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


async def index_corpus(
    session, upstream: str, index: str, docs, shards: int, analyzer: str, separate: bool = False
) -> None:
    """Index `title + " " + text` into FIELD, or (`separate`) title and text as fields of their own."""
    await session.delete(f"{upstream}/{index}")
    names = FIELDS if separate else (FIELD,)
    mapping = {
        "settings": {"number_of_shards": shards, "number_of_replicas": 0},
        "mappings": {"properties": {f: {"type": "text", "analyzer": analyzer} for f in names}},
    }
    await request_json(session, "PUT", f"{upstream}/{index}", mapping)
    for start in range(0, len(docs), 2000):
        lines = []
        for d in docs[start : start + 2000]:
            lines.append(orjson.dumps({"index": {"_index": index, "_id": d["_id"]}}))
            source = (
                {"title": d.get("title", ""), "text": d["text"]}
                if separate
                else {FIELD: f"{d.get('title', '')} {d['text']}"}
            )
            lines.append(orjson.dumps(source))
        async with session.post(
            f"{upstream}/_bulk",
            data=b"\n".join(lines) + b"\n",
            headers={"Content-Type": "application/x-ndjson"},
        ) as resp:
            answer = orjson.loads(await resp.read())
            assert resp.status == 200 and not answer.get("errors"), "bulk indexing failed"
    await request_json(session, "POST", f"{upstream}/{index}/_refresh")


async def ranking(
    session, url: str, index: str, query: str, window: int, bmx: dict | None, kind: str | None = None
) -> list[str]:
    """The ids the engine (bmx None) or the proxy ranks first; `kind` a multi_match type over FIELDS."""
    body: dict[str, Any] = {"size": window if bmx is None else 10, "_source": False}
    if kind is None:
        body["query"] = {"match": {FIELD: query}}
        target = {"field": FIELD}
    else:
        body["query"] = {"multi_match": {"query": query, "fields": list(FIELDS), "type": kind}}
        target = {"fields": list(FIELDS)}
    if bmx is not None:
        body["ext"] = {"bmx": {**target, "window_size": window, **bmx}}
    answer = await request_json(session, "POST", f"{url}/{index}/_search", body)
    return [h["_id"] for h in answer["hits"]["hits"]]


async def run(argv: list[str] | None = None) -> dict[str, float]:
    """One run; prints the table and returns nDCG@10 per variant (`--docs`/`--queries` cut it down
    for the small version CI runs)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--dataset", default="scifact", choices=["scifact", "nfcorpus"])
    ap.add_argument("--analyzer", default="standard")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--fields", action="store_true", help="title and text as separate fields, multi_match")
    ap.add_argument("--docs", type=int, default=None, help="index only the first N documents")
    ap.add_argument("--queries", type=int, default=None, help="ask only the first N test queries")
    ap.add_argument("--index", default=None, help="index name (default bmxbench-<dataset>-...)")
    ap.add_argument("--store", default=DEFAULT_STORE, help="statistics store index")
    args = ap.parse_args(argv)
    root = DATA / args.dataset
    queries = {q["_id"]: q["text"] for q in read_jsonl(root / "queries.jsonl")}
    qrels = dict(list(read_qrels(root / "qrels" / "test.tsv").items())[: args.queries])
    docs = read_jsonl(root / "corpus.jsonl")
    if args.docs is not None:  # the judged documents of the queries asked, then the first others
        judged = {d for rels in qrels.values() for d in rels}
        docs = [d for d in docs if d["_id"] in judged] + [d for d in docs if d["_id"] not in judged]
        docs = docs[: max(args.docs, len(judged))]
    index = args.index or (
        f"bmxbench-{args.dataset}-{args.analyzer}-{args.shards}{'-fields' if args.fields else ''}"
    )
    upstream = args.upstream.rstrip("/")
    async with aiohttp.ClientSession() as session:
        await index_corpus(session, upstream, index, docs, args.shards, args.analyzer, args.fields)
        for name in FIELDS if args.fields else (FIELD,):
            await build_snapshots(Cluster(session, upstream), index, name, {}, store=args.store)
        stats = statistics_source(60.0, args.store)
        runner, proxy = await start_server(make_app(ProxyConfig(upstream=upstream), stats))
        variants: dict[str, tuple[str, dict | None, str | None]] = {
            "engine BM25": (upstream, None, None),
            "proxy BM25, exact statistics": (proxy, {"mode": "bm25"}, None),
            "proxy BMX": (proxy, {"mode": "bmx"}, None),
        }
        if args.fields:
            variants = {
                f"{who} {kind}": (url, bmx, kind)
                for kind in ("best_fields", "most_fields")
                for who, url, bmx in (
                    ("engine BM25 multi_match", upstream, None),
                    ("proxy BM25 multi-field, exact statistics", proxy, {"mode": "bm25"}),
                    ("proxy BMX multi-field", proxy, {"mode": "bmx"}),
                )
            }
        totals = dict.fromkeys(variants, 0.0)
        seconds = dict.fromkeys(variants, 0.0)
        try:
            names = list(variants)
            for turn, (qid, rels) in enumerate(qrels.items()):
                # Rotate the order so no variant always pays the cold term-vector cache.
                for name in names[turn % len(names) :] + names[: turn % len(names)]:
                    url, bmx, kind = variants[name]
                    start = time.perf_counter()
                    ranked = await ranking(session, url, index, queries[qid], args.window, bmx, kind)
                    seconds[name] += time.perf_counter() - start
                    totals[name] += ndcg_at_10([d for d in ranked if d != qid], rels)
        finally:
            await runner.cleanup()
            await session.delete(f"{upstream}/{index}")
    n = len(qrels)
    layout = "title and text as separate fields" if args.fields else "title + text in one field"
    print(
        f"{args.dataset}: {len(docs)} docs, {n} test queries, analyzer {args.analyzer}, "
        f"{args.shards} shard(s), window {args.window}, {layout}, upstream {upstream}"
    )
    print("| ranking | nDCG@10 x 100 | ratio to engine BM25 | mean ms/query |")
    print("|---|---|---|---|")
    for name in variants:
        base = totals[_baseline(name, args.fields)] / n
        score = totals[name] / n
        ratio = f"{score / base:.4f}" if base > 0 else "-"
        print(f"| {name} | {100 * score:.2f} | {ratio} | {1000 * seconds[name] / n:.1f} |")
    return {name: totals[name] / n for name in variants}


def _baseline(name: str, fields: bool) -> str:
    """The engine row a variant is compared with: the same multi_match type with --fields."""
    if not fields:
        return "engine BM25"
    return "engine BM25 multi_match " + name.rsplit(" ", 1)[1]


if __name__ == "__main__":
    asyncio.run(run())
