"""How often a first sight's even shares fall short on real data: a BEIR dataset indexed over N shards
(routed by `_id`), each query's window searched on each shard whole, and each shard's hits cut to
what a first sight asks it for (`shards.shard_sizes`) at several margins (`EVEN_SPREAD`, in standard
deviations of a shard's count were its hits spread by chance); a window whose cut shares do not hold
it (`shards.hold_window`, as the proxy checks) costs the shards' searches again. Windows with fewer
hits than their size are left out (every shard sends all it has). No proxy; the engine alone.

    .venv/bin/python -m benchmarks.shard_shares [--upstream http://127.0.0.1:9200] [--dataset scifact]
        [--shards 3] [--window 100] [--queries 0]
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from benchmarks.proxy_latency import Http, index_corpus
from bmx_rerank.rerank import shards
from tests.support.data import beir_records

SPREADS = (2.5, 3.0, 3.5, 4.0, 5.0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:9200")
    parser.add_argument("--dataset", default="scifact", help="a BEIR dataset of ../shared/data")
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--queries", type=int, default=0, help="the first N queries (0: all)")
    args = parser.parse_args()
    engine = Http(args.upstream)
    index = f"bmxtest-shares-{uuid.uuid4().hex[:8]}"
    index_corpus(engine, index, beir_records(args.dataset, "corpus.jsonl"), shards=args.shards)
    try:
        windows = list(shard_windows(engine, index, args))
    finally:
        engine.call("DELETE", f"/{index}")
    short = {spread: 0 for spread in SPREADS}
    asked = {}
    for spread in SPREADS:
        sizes = sizes_at(spread, args.window, args.shards)
        asked[spread] = sizes[0]
        short[spread] = sum(not shards.hold_window(cut(w, sizes), sizes, args.window) for w in windows)
    print(
        f"{args.dataset}, {args.shards} shards, window {args.window}: {len(windows)} full windows"
        f" of {len(beir_records(args.dataset, 'queries.jsonl', args.queries))} queries"
    )
    print("| spread (deviations) | hits asked of each shard | windows whose shares fall short |")
    print("|---|---|---|")
    for spread in SPREADS:
        mark = " (shipped)" if spread == shards.EVEN_SPREAD else ""
        share = short[spread] / max(1, len(windows))
        print(f"| {spread}{mark} | {asked[spread]} | {short[spread]} ({share:.2%}) |")


def shard_windows(engine: Http, index: str, args: argparse.Namespace) -> Any:
    """Each query's answers of each shard, asked for the whole window: those of full windows."""
    for query in beir_records(args.dataset, "queries.jsonl", args.queries):
        body = {"query": {"match": {"body": query["text"]}}, "size": args.window, "_source": False}
        answers = [
            engine.ok("POST", f"/{index}/_search?preference=_shards:{i}", body) for i in range(args.shards)
        ]
        if sum(len(a["hits"]["hits"]) for a in answers) >= args.window:
            yield answers


def sizes_at(spread: float, window: int, count: int) -> list[int]:
    """What a first sight asks each shard for, were `EVEN_SPREAD` `spread`."""
    shipped = shards.EVEN_SPREAD
    shards.EVEN_SPREAD = spread
    try:
        sizes = shards.shard_sizes({"size": window}, None, count)
    finally:
        shards.EVEN_SPREAD = shipped
    assert sizes is not None
    return sizes


def cut(answers: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """Each shard's answer as if asked for `sizes[i]` hits: its first ones."""
    return [{"hits": {"hits": a["hits"]["hits"][:n]}} for a, n in zip(answers, sizes, strict=True)]


if __name__ == "__main__":
    main()
