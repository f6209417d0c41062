"""Latency of a reranked search through the proxy next to the same search straight to the engine.

For each engine: index SciFact (title + text, standard analyzer) into a fresh `bmxtest-proxy-bench-*`
index, start the proxy in a child process (exact statistics from a sweep held in memory, as the
statistics cache holds a loaded snapshot), then for each query send, one at a time and interleaved:
  direct        match query, size 10, straight to the engine
  direct w100   the same with size 100 (what the proxy's first stage asks for)
  passthrough   the direct request through the proxy, no ext.bmx
  rerank cold   ext.bmx window 100, size 10, term-vector cache empty for these documents
  rerank warm   the same again (term vectors from the cache)
Prints a Markdown table: p50 / p95 / mean in ms and the p50 ratio to `direct`.

    .venv/bin/python benchmarks/proxy_latency.py [--engines es,os] [--queries 200] [--docs 0]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics as pystats
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
SCIFACT = ROOT.parent / "shared" / "data" / "beir" / "scifact"
ENGINES = {"es": "http://127.0.0.1:9200", "os": "http://127.0.0.1:9201"}


class Http:
    """One persistent HTTP/1.1 connection (the way a client library keeps one)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)

    def call(
        self, method: str, path: str, body: object = None, ndjson: str | None = None
    ) -> tuple[int, dict]:
        data = (
            ndjson.encode() if ndjson is not None else (None if body is None else json.dumps(body).encode())
        )
        ctype = "application/x-ndjson" if ndjson is not None else "application/json"
        self.conn.request(method, path, body=data, headers={"Content-Type": ctype})
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw else {})

    def ok(self, method: str, path: str, body: object = None, ndjson: str | None = None) -> dict:
        status, answer = self.call(method, path, body, ndjson)
        if status >= 300:
            raise RuntimeError(f"{method} {path} -> {status}: {str(answer)[:300]}")
        return answer


def load(name: str, limit: int) -> list[dict]:
    out = []
    with open(SCIFACT / name) as fh:
        for line in fh:
            out.append(json.loads(line))
            if limit and len(out) >= limit:
                break
    return out


def index_corpus(engine: Http, index: str, docs: list[dict]) -> None:
    mappings = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}
    settings = {"number_of_shards": 1, "number_of_replicas": 0}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
    for start in range(0, len(docs), 1000):
        lines = []
        for doc in docs[start : start + 1000]:
            lines.append(json.dumps({"index": {"_index": index, "_id": doc["_id"]}}))
            lines.append(json.dumps({"body": f"{doc.get('title', '')} {doc['text']}"}))
        answer = engine.ok("POST", "/_bulk", ndjson="\n".join(lines) + "\n")
        assert not answer["errors"]
    engine.ok("POST", f"/{index}/_refresh")


def serve_child(upstream: str, index: str, port: int) -> None:
    """The proxy process: exact statistics swept once, then served from memory."""
    sys.path.insert(0, str(ROOT))
    import aiohttp
    from aiohttp import web

    from bmx_rerank.proxy import ProxyConfig, make_app
    from bmx_rerank.rerank.stats_source import FixedStats
    from bmx_rerank.stats import build as stats_build

    async def sweep():
        async with aiohttp.ClientSession() as session:
            return await stats_build.build(session, upstream, index, "body", {})

    stats = FixedStats({(index, "body"): asyncio.run(sweep())})
    app = make_app(ProxyConfig(upstream=upstream), lambda session, base: stats)
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, auto_decompress=False, access_log=None)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summary(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return pystats.median(ordered), p95, pystats.fmean(ordered)


def run_engine(name: str, url: str, docs: list[dict], queries: list[str]) -> list[tuple]:
    engine = Http(url)
    index = f"bmxtest-proxy-bench-{uuid.uuid4().hex[:8]}"
    index_corpus(engine, index, docs)
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve-child", url, index, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        proxy = None
        for _ in range(100):
            try:
                proxy = Http(f"http://127.0.0.1:{port}")
                proxy.call("GET", "/_bmx/health")
                break
            except OSError:
                time.sleep(0.1)
        assert proxy is not None
        times: dict[str, list[float]] = {
            k: [] for k in ("direct", "direct w100", "passthrough", "rerank cold", "rerank warm")
        }

        def timed(kind: str, conn: Http, body: dict) -> dict:
            start = time.perf_counter()
            answer = conn.ok("POST", f"/{index}/_search", body)
            times[kind].append((time.perf_counter() - start) * 1000)
            return answer

        # warm-up: JIT, caches, connections (not recorded; other queries than the measured ones)
        for q in queries[:20]:
            engine.ok("POST", f"/{index}/_search", {"query": {"match": {"body": q}}, "size": 100})
        for q in queries[20:]:
            plain = {"query": {"match": {"body": q}}, "size": 10}
            ext = {**plain, "ext": {"bmx": {"field": "body", "window_size": 100}}}
            timed("direct", engine, plain)
            timed("direct w100", engine, {**plain, "size": 100})
            timed("passthrough", proxy, plain)
            answer = timed("rerank cold", proxy, ext)
            assert answer["_bmx"]["reranked"] is True, answer["_bmx"]
            timed("rerank warm", proxy, ext)
        base = summary(times["direct"])[0]
        return [(name, kind, len(v), *summary(v), summary(v)[0] / base) for kind, v in times.items()]
    finally:
        child.terminate()
        child.wait(10)
        engine.call("DELETE", f"/{index}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="es,os")
    parser.add_argument("--queries", type=int, default=220, help="first 20 are warm-up")
    parser.add_argument("--docs", type=int, default=0, help="0: the whole corpus")
    parser.add_argument(
        "--serve-child", nargs=3, metavar=("UPSTREAM", "INDEX", "PORT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_child:
        upstream, index, port = args.serve_child
        serve_child(upstream, index, int(port))
        return
    docs = load("corpus.jsonl", args.docs)
    queries = [q["text"] for q in load("queries.jsonl", args.queries)]
    rows = []
    for name in args.engines.split(","):
        rows += run_engine(name, ENGINES[name], docs, queries)
    print(f"{len(docs)} documents, {len(queries) - 20} measured queries, sequential, {os.cpu_count()} cores")
    print("| engine | request | n | p50 ms | p95 ms | mean ms | p50 / direct |")
    print("|---|---|---|---|---|---|---|")
    for name, kind, n, p50, p95, mean, ratio in rows:
        print(f"| {name} | {kind} | {n} | {p50:.2f} | {p95:.2f} | {mean:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
