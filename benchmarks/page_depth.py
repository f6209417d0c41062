"""How deep in the first stage's order a reranked page reaches: what a first sight's likely page (the
first stage's best `AHEAD` pages, searched beside it: `rerank/lean.py`) must hold to spare the page a
fetch after scoring.

For each query, the deepest first-stage (BM25) rank among the reranked page's hits, through a proxy
with its caches off; then how many pages the best k hits of the first stage hold whole, for several k.

    .venv/bin/python -m benchmarks.page_depth [--upstream http://127.0.0.1:9200] [--dataset scifact]
        [--queries 300] [--window 100]
"""

from __future__ import annotations

import argparse
import uuid

from benchmarks.proxy_latency import Http, Proxy, index_corpus, plain, rerank
from bmx_rerank.rerank.lean import AHEAD
from tests.support.data import beir_records

PAGE = 10
DEPTHS = (10, 12, 14, 15, 16, 18, 20, 25, 30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:9200")
    parser.add_argument("--dataset", default="scifact", help="the BEIR dataset indexed and asked")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--window", type=int, default=100)
    args = parser.parse_args()
    engine = Http(args.upstream)
    index = f"bmxtest-depth-{uuid.uuid4().hex[:8]}"
    index_corpus(engine, index, beir_records(args.dataset, "corpus.jsonl"))
    proxy = Proxy(args.upstream, index, caches=False, workers=1, loop="asyncio")
    try:
        through, path = Http(proxy.url), f"/{index}/_search"
        deepest = []
        for q in (r["text"] for r in beir_records(args.dataset, "queries.jsonl", args.queries)):
            order = engine.ok("POST", path, {**plain(q, args.window), "_source": False})["hits"]["hits"]
            rank = {h["_id"]: i + 1 for i, h in enumerate(order)}
            page = through.ok("POST", path, rerank(q, args.window))["hits"]["hits"]
            if len(page) == PAGE:  # a full page (fewer hits: the whole window is the page)
                deepest.append(max(rank[h["_id"]] for h in page))
    finally:
        proxy.stop()
        engine.call("DELETE", f"/{index}")
    print(f"{args.dataset}, window {args.window}, {len(deepest)} full pages of {PAGE}:")
    for k in DEPTHS:
        shipped = "  <- the likely page searched beside a first sight" if k == AHEAD * PAGE else ""
        held = sum(d <= k for d in deepest)
        print(f"  the first stage's best {k:3d} hold the page in {held} of {len(deepest)}{shipped}")


if __name__ == "__main__":
    main()
