"""What a pause before each search costs: the same searches asked after a pause of 0, 2, 10, 50 ms (or
`--pauses`), straight to the engine and through the proxy, at one client.

`proxy_latency` times each row right after other rows' requests, so the engine is always busy and each
proxy has just served (or has long been idle for) something else. A user at low load sends searches
with pauses between them: both the engine and the proxy then wake up for each one. Indexes SciFact
(one shard, as `proxy_latency`), starts a proxy with its caches (every window kept first: each
reranked search here is a repeat) and the protocol relay (the floor of a Python hop). Then for each
pause, query by query, in turn: plain size-10 direct, through the relay, passed through the proxy, the
engine's `rescore` (window 100) and the proxy's warm rerank (window 100), each after the pause. p50 in
ms, and the ratios the targets read.

    .venv/bin/python -m benchmarks.idle_gaps [--upstream http://127.0.0.1:9201] [--queries 140]
        [--pauses 0,2,10,50,0] [--docs 0]
"""

from __future__ import annotations

import argparse
import statistics
import uuid

from benchmarks.proxy_latency import WARMUP, Http, Proxy, index_corpus, interleaved, plain, rerank, rescore
from tests.support.data import scifact_records


def run(upstream: str, queries: list[str], docs: list[dict], pauses: list[float]) -> list[dict[str, float]]:
    """p50 (ms) of each way of asking, one dict a pause (in `pauses`' order), with the pause's ms."""
    engine = Http(upstream)
    index = f"bmxtest-idle-{uuid.uuid4().hex[:8]}"
    index_corpus(engine, index, docs)
    proxies = [
        Proxy(upstream, index, caches=True, workers=1, loop="uvloop"),
        Proxy(upstream, index, caches=False, workers=1, loop="uvloop", relay="protocol"),
    ]
    try:
        proxy, relay = (Http(p.url) for p in proxies)
        path = f"/{index}/_search"
        for q in queries:  # every window kept: the reranks timed are repeats
            for _ in range(3):
                proxy.ok("POST", path, rerank(q, 100))

        def repeat(q: str) -> None:
            answer = proxy.ok("POST", path, rerank(q, 100))
            assert answer["_bmx"]["tf"] == "window", answer["_bmx"]  # the window kept

        ways = {
            "plain": lambda q: engine.ok("POST", path, plain(q, 10)),
            "relay": lambda q: relay.ok("POST", path, plain(q, 10)),
            "passthrough": lambda q: proxy.ok("POST", path, plain(q, 10)),
            "rescore": lambda q: engine.ok("POST", path, rescore(q, 100)),
            "warm": repeat,
        }
        found = []
        for pause in pauses:
            times = interleaved(ways, queries, WARMUP, pause)
            found.append({"pause": pause, **{way: statistics.median(t) for way, t in times.items()}})
        return found
    finally:
        for running in proxies:
            running.stop()
        engine.call("DELETE", f"/{index}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:9201")
    parser.add_argument("--queries", type=int, default=140, help=f"the first {WARMUP} are not timed")
    parser.add_argument("--pauses", default="0,2,10,50,0", help="ms before each search")
    parser.add_argument("--docs", type=int, default=0, help="0: the whole corpus")
    args = parser.parse_args(argv)
    queries = [q["text"] for q in scifact_records("queries.jsonl", args.queries)]
    pauses = [float(p) for p in args.pauses.split(",")]
    rows = run(args.upstream, queries, scifact_records("corpus.jsonl", args.docs), pauses)
    print(f"{len(queries) - WARMUP} searches each way and pause, one client, p50 ms")
    print(
        "| pause | plain | relay | passthrough | rescore w100 | warm w100 | warm / rescore | passthrough - plain "
        "| relay - plain |\n|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['pause']:g} ms | {r['plain']:.2f} | {r['relay']:.2f} | {r['passthrough']:.2f} "
            f"| {r['rescore']:.2f} | {r['warm']:.2f} | {r['warm'] / r['rescore']:.2f}x "
            f"| {r['passthrough'] - r['plain']:+.2f} | {r['relay'] - r['plain']:+.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
