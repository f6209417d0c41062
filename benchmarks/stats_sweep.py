"""Statistics benchmarks: sweep throughput next to a bare scan, and loading a large vocabulary.

    .venv/bin/python -m benchmarks.stats_sweep --upstream http://127.0.0.1:9200 [--terms 1000000]

1. Indexes SciFact (`title + " " + text`, standard analyzer, 1 shard) into `bmxtest-stats-bench-*`,
   (`--term-vector yes`: with stored term vectors), then times, on the same index: a bare scan of every id (PIT or scroll, no `_source`), a scan that
   also reads the field's text (`_source` of the field: the cheapest way to read every document),
   and the statistics sweep (scan + `_mtermvectors` + exact accumulation) at a few batch sizes.
2. Publishes a synthetic vocabulary of `--terms` terms to a private store index and times loading it
   back (`_mget` of the chunks + decoding), reporting wall time and peak Python memory (tracemalloc),
   plus the decode alone with no network.
Deletes what it created.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import string
import time
import tracemalloc
import uuid

import aiohttp
import numpy as np

from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats import scan, snapshot
from bmx_rerank.stats import store as stats_store
from bmx_rerank.stats.corpus import CorpusStats, terms_array
from bmx_rerank.stats.freshness import IndexMarks
from bmx_rerank.stats.sweep import SweepOptions
from bmx_rerank.upstream import Cluster
from tests.support.data import SCIFACT

CORPUS = SCIFACT / "corpus.jsonl"
FIELD = "body"


async def setup_index(
    session: aiohttp.ClientSession, url: str, name: str, shards: int = 1, term_vector: str = "no"
) -> int:
    """SciFact in a fresh index; `term_vector: yes` stores term vectors at index time (a mapping choice a
    user makes when creating the index: `_mtermvectors` then reads them instead of re-analysing)."""
    mapping = {"type": "text", "analyzer": "standard", "term_vector": term_vector}
    body = {
        "settings": {"number_of_shards": shards, "number_of_replicas": 0},
        "mappings": {"properties": {FIELD: mapping}},
    }
    async with session.put(f"{url}/{name}", json=body) as resp:
        assert resp.status == 200, await resp.text()
    lines = []
    n = 0
    for line in CORPUS.open():
        d = json.loads(line)
        lines.append(json.dumps({"index": {"_id": d["_id"]}}))
        lines.append(json.dumps({FIELD: f"{d['title']} {d['text']}"}))
        n += 1
    hdrs = {"Content-Type": "application/x-ndjson"}
    async with session.post(
        f"{url}/{name}/_bulk?refresh=true", data="\n".join(lines) + "\n", headers=hdrs
    ) as r:
        assert r.status == 200
    return n


async def bare_scan(session: aiohttp.ClientSession, url: str, name: str, page: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    async for refs in scan.scan_ids(Cluster(session, url), name, {}, page):
        n += len(refs)
    return n, time.perf_counter() - t0


async def source_scan(session: aiohttp.ClientSession, url: str, name: str, page: int) -> tuple[int, float]:
    """Every document's field text through search_after on `_doc`-ordered scroll (both engines)."""
    t0 = time.perf_counter()
    body = {"size": page, "_source": [FIELD], "sort": ["_doc"]}
    async with session.post(f"{url}/{name}/_search?scroll=1m", json=body) as r:
        ans = await r.json()
    n = 0
    sid = ans["_scroll_id"]
    while ans["hits"]["hits"]:
        n += len(ans["hits"]["hits"])
        async with session.post(f"{url}/_search/scroll", json={"scroll": "1m", "scroll_id": sid}) as r:
            ans = await r.json()
        sid = ans.get("_scroll_id", sid)
    async with session.delete(f"{url}/_search/scroll", json={"scroll_id": sid}):
        pass
    return n, time.perf_counter() - t0


def synthetic(n_terms: int, seed: int = 7) -> CorpusStats:
    """A vocabulary shaped like a real one: short lowercase terms (Zipf-ish lengths), sorted, unique."""
    rng = random.Random(seed)
    letters = string.ascii_lowercase + "0123456789"
    terms: set[str] = set()
    while len(terms) < n_terms:
        k = min(3 + int(rng.expovariate(1 / 5)), 40)
        terms.add("".join(rng.choices(letters, k=k)))
    ordered = sorted(terms)
    df = np.random.default_rng(seed).zipf(1.6, n_terms).clip(1, 10**6).astype(np.int64)
    entropy = df * 0.2
    return CorpusStats(10**6, 10**8, terms_array(ordered), df, entropy)


async def load_bench(session: aiohttp.ClientSession, url: str, n_terms: int, store: str) -> dict[str, float]:
    stats = synthetic(n_terms)
    marks = IndexMarks("bmxtest-stats-bench-vocab", "u", ())
    info = stats_build.snapshot_info(
        "bmxtest-stats-bench-vocab", FIELD, stats, marks, stats.n_docs, True, 0.0, "build", exact_units=True
    )
    # exact sums as a real build stores them: entropy in 2^-112 units, whose low ~100 bits are as
    # good as random in real data (sums of many contributions), so they do not compress
    rng = random.Random(3)
    units = [int(e * (1 << 112)) + (rng.getrandbits(96) << 8) for e in stats.entropy.tolist()]
    t0 = time.perf_counter()
    chunks = snapshot.encode_chunks(stats)
    encode_s = time.perf_counter() - t0
    stored_mb = sum(len(c["blob"]) for c in chunks) / 1e6
    exact_mb = sum(len(c["blob"]) for c in snapshot.encode_units(units, snapshot.CHUNK_TERMS)) / 1e6
    t0 = time.perf_counter()
    await stats_store.publish(Cluster(session, url), {}, info, stats, store, units)
    publish_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    back = snapshot.decode_chunks(info, chunks)
    decode_s = time.perf_counter() - t0
    assert back.same_as(stats)
    del back
    tracemalloc.start()  # memory in a separate run: tracing slows allocation several fold
    back = snapshot.decode_chunks(info, chunks)
    _, decode_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del back

    async def load_once() -> CorpusStats:
        (got,) = (
            await stats_store.read_pointers(Cluster(session, url), {}, [(info.index, FIELD)], store)
        ).values()
        return await stats_store.load(Cluster(session, url), {}, got, store)

    t0 = time.perf_counter()
    loaded = await load_once()
    load_s = time.perf_counter() - t0
    assert loaded.same_as(stats)
    del loaded
    tracemalloc.start()
    loaded = await load_once()
    current, load_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t0 = time.perf_counter()
    probe = [stats.terms[i] for i in range(0, n_terms, max(1, n_terms // 1000))]
    loaded.term_stats(probe)
    lookup_us = (time.perf_counter() - t0) / len(probe) * 1e6
    return {
        "terms": n_terms,
        "chunks": len(chunks),
        "stored_MB": round(stored_mb, 1),
        "exact_sums_MB (refresh only)": round(exact_mb, 1),
        "encode_s": round(encode_s, 2),
        "publish_s": round(publish_s, 2),
        "decode_only_s": round(decode_s, 2),
        "decode_peak_MB": round(decode_peak / 1e6, 1),
        "load_from_cluster_s": round(load_s, 2),
        "load_peak_MB": round(load_peak / 1e6, 1),
        "resident_stats_MB": round(current / 1e6, 1),
        "lookup_us_per_term": round(lookup_us, 2),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", default="http://127.0.0.1:9200")
    parser.add_argument("--terms", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--slices", default="1", help="e.g. 1,2,4: also sweep in that many processes")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--variants", default="100x2,200x2,200x4,500x2", help="batch x concurrency")
    parser.add_argument("--term-vector", choices=("no", "yes"), default="no", help="the field's mapping")
    args = parser.parse_args()
    url = args.upstream.rstrip("/")
    tag = uuid.uuid4().hex[:8]
    name, store = f"bmxtest-stats-bench-{tag}", f"bmxtest-stats-bench-store-{tag}"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/_nodes/_local?filter_path=nodes.*.version") as r:
            (node,) = (await r.json())["nodes"].values()
            engine = "elasticsearch" if r.headers.get("X-elastic-product") else "opensearch"
        print(f"engine: {engine} {node['version']}")
        try:
            n = await setup_index(session, url, name, args.shards, args.term_vector)
            print(f"field mapping: term_vector {args.term_vector}")
            best: dict[str, float] = {}
            for _ in range(args.repeat):
                for label, fn in (("bare id scan", bare_scan), ("scan with _source", source_scan)):
                    got, secs = await fn(session, url, name, 1000)
                    assert got == n
                    best[label] = max(best.get(label, 0.0), n / secs)
                variants = [tuple(int(x) for x in v.split("x")) for v in args.variants.split(",")]
                for slices in (int(x) for x in args.slices.split(",")):
                    for batch, conc in variants:
                        t0 = time.perf_counter()
                        results = await stats_build.sweep_all(
                            Cluster(session, url), name, FIELD, {}, SweepOptions(batch, conc, slices)
                        )
                        secs = time.perf_counter() - t0
                        assert sum(r.stats.n_docs for r in results.values()) == n
                        label = f"sweep {slices} slice(s) batch={batch} concurrency={conc}"
                        best[label] = max(best.get(label, 0.0), n / secs)
            base = best["bare id scan"]
            src = best["scan with _source"]
            print(f"{n} docs, best of {args.repeat}:")
            for label, rate in best.items():
                print(
                    f"  {label:<36} {rate:>9,.0f} docs/s  {rate / base:6.1%} of bare  {rate / src:6.1%} of _source scan"
                )
            if args.terms:
                print("load:", json.dumps(await load_bench(session, url, args.terms, store)))
        finally:
            for idx in (name, store):
                async with session.delete(f"{url}/{idx}"):
                    pass


if __name__ == "__main__":
    asyncio.run(main())
