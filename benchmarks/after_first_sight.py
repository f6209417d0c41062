"""What a search pays for coming right after a first sight, as `proxy_latency`'s "rerank warm" row does
(its one-client loop sends each query's first sight, then the same search again, then a third time).

For each SciFact query, one client, in turn: the engine's `rescore` (window 100), a first sight through
a proxy with its caches on, the lean first stage straight to the engine (what the proxy then sends it
for the repeat), the repeat through the proxy, the same lean stage straight to the engine again, the
third time through the proxy. A lean stage sent right after a first sight, against the same one sent
after a repeat, is what the engine's part of the repeat pays for following a first sight.

    .venv/bin/python -m benchmarks.after_first_sight http://127.0.0.1:9201 [QUERIES]

QUERIES (default 220), the first 20 unmeasured.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid

from benchmarks.proxy_latency import Http, Proxy, index_corpus, rerank, rescore
from bmx_rerank.rerank.lean import lean_body
from tests.support.data import scifact_records

WARMUP = 20


def main() -> None:
    url, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 220
    engine = Http(url)
    index = f"bmxtest-proxy-bench-{uuid.uuid4().hex[:8]}"
    index_corpus(engine, index, scifact_records("corpus.jsonl", 0))
    proxy = Proxy(url, index, caches=True, workers=1, loop="uvloop")
    warm, path = Http(proxy.url), f"/{index}/_search"
    times: dict[str, list[float]] = {}

    def timed(kind: str, conn: Http, body: dict) -> None:
        start = time.perf_counter()
        conn.ok("POST", path, body)
        times.setdefault(kind, []).append((time.perf_counter() - start) * 1000)

    try:
        for q in (q["text"] for q in scifact_records("queries.jsonl", n)):
            lean = lean_body({"query": {"match": {"body": q}}, "size": 100})
            timed("engine rescore w100", engine, rescore(q, 100))
            timed("first sight (proxy)", warm, rerank(q, 100))
            timed("lean stage after a first sight (engine)", engine, lean)
            timed("the repeat (proxy)", warm, rerank(q, 100))
            timed("lean stage after a repeat (engine)", engine, lean)
            timed("a third time (proxy)", warm, rerank(q, 100))
        for kind, samples in times.items():
            print(f"{kind:42s} p50 {statistics.median(samples[WARMUP:]):6.2f} ms")
    finally:
        proxy.stop()
        engine.call("DELETE", f"/{index}")


if __name__ == "__main__":
    main()
