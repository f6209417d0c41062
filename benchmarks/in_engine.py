"""BMX scored inside OpenSearch by a Painless `rescore`, next to the proxy's first sight and the engine's
own `rescore`: issue 18's in-engine lever, measured.

Indexes SciFact (or `--dataset`; `title + text` as `body`, standard analyzer) with a `token_count`
sub-field `body.len`, so that a script reads each document's length from doc values, and builds the
exact statistics of `body` with one sweep. Each query's tokens (the index's `_analyze`; those no
document holds dropped, as BMX does) become the parameters of one Painless script: for each distinct
term its IDF x (alpha + 1), its tokens' count (each weighs 1) and entropy share, and alpha, avgdl,
alpha x mean entropy, beta and m. The script reads tf with `termFreq`, which OpenSearch 2.10+ gives a
`script_score`.

A `rescore` window is per shard: over several shards each reranks its own best N, up to N x shards
hits, where the proxy reranks the best N of the index. So the script can also keep to the global
window: a first search that reads no stored field gives the N-th best first-stage score, and the
rescore, wrapping the caller's query, scores 0 for a hit below it. Hits tied at the cutoff all stay
in, so the searches whose cutoff ties with the next hit are counted apart: a product would serve
those its own way.

First every query's page is compared with the proxy's (exact BMX over the global window), in both
forms: pages unlike, pages alike but for the order of hits of equal score (the engine breaks a tie by
shard and document, the proxy by the first stage's order), and over the pages alike the largest
relative gap between scores (the engine answers float32). Then one client asks, interleaved query by
query: plain size-10, the engine's `rescore` (window N, a `match`), the Painless BMX rescore (window
N), the same over the global window (both searches), the proxy's first sight (window N, every cache
off) and warm (caches on, each query seen before), and three `serve --in-engine` proxies: every cache
off (first sight); caches on and each query seen ENGINE_SIGHTS times (the sight after: the sidecar's
rerank, which keeps the window); caches on and each query seen once more (warm: the window the
sidecar kept; those pages are checked too). p50 in ms. Then a query log where queries repeat
(`--log` searches, Zipf `--zipf`), one at a time to `rescore` and to three new proxies: the mean ms a
search (`query_log`). Last, `--clients` connections in a closed loop for `--duration` seconds ask the
engine's rescore, the Painless one, and the sidecar's warm rerank and `--in-engine`'s first sights and
warm reranks through their proxies: requests a second, and each one's share of the rescore's.

Needs OpenSearch with lang-painless and mapper-extras, as `bmx-rerank engine start opensearch` installs
them (the integ-test zip lacks both; Elasticsearch publishes neither to Maven Central).

    .venv/bin/python -m benchmarks.in_engine [--upstream http://127.0.0.1:9201] [--queries 220]
        [--window 100] [--shards 1] [--docs 0] [--clients 8] [--duration 3] [--dataset scifact]
        [--log 2000] [--zipf 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.proxy_latency import (
    WARMUP,
    Http,
    Proxy,
    closed_loop,
    in_engine_lacks,
    index_corpus,
    interleaved,
    plain,
    rerank,
    rescore,
)
from bmx_rerank import scoring
from bmx_rerank.rerank import in_engine
from bmx_rerank.rerank.pipeline import ENGINE_SIGHTS
from bmx_rerank.stats.corpus import CorpusStats
from tests.support.corpora import exact_stats
from tests.support.data import beir_records

FIELD = "body"
# BMX's score of one document: `serve --in-engine`'s script over several shards, which reads the
# parameters `script_params` makes. A document whose first-stage score (`_score`: the rescore query wraps
# the caller's) is below the cutoff lies outside the global window and scores 0 (`in_engine.CUTOFF`).
SCRIPT = in_engine.CUTOFF + in_engine.SCRIPT


class Unsupported(Exception):
    """The cluster has no `token_count` (mapper-extras) or no scripts with term statistics (lang-painless,
    OpenSearch 2.10+)."""


def script_params(stats: CorpusStats, tokens: list[str]) -> dict[str, Any] | None:
    """The script's parameters for a query's analyzed tokens, as `serve --in-engine` makes them (None:
    no document holds any of them)."""
    return in_engine.script_params(stats, tokens, scoring.Request(), FIELD, 1.0)


def painless(q: str, window: int, params: dict[str, Any], cutoff: float | None = None) -> dict:
    """The caller's search with BMX as its rescore: the window's scores replaced, not added to. Each
    shard rescores its own best `window`; with a `cutoff` (`global_cutoff`) only those of the global
    window score above 0."""
    script = {"source": SCRIPT, "params": {**params, "cutoff": cutoff or 0.0}}
    inner = {"match_all": {}} if cutoff is None else plain(q, 0)["query"]
    rescore_query = {"script_score": {"query": inner, "script": script}}
    weights = {"query_weight": 0.0, "rescore_query_weight": 1.0}
    return {
        **plain(q, 10),
        "rescore": {"window_size": window, "query": {**weights, "rescore_query": rescore_query}},
    }


def global_cutoff(engine: Http, index: str, q: str, window: int) -> tuple[float, bool]:
    """The first-stage score of the global window's last hit (0 when no hit follows it), and whether
    the next hit ties with it (then the window's edge is the cluster's tie-break, which no cutoff can
    draw: `serve --in-engine` leaves that search to the sidecar), read as the product reads it
    (`in_engine.window_edge`). One search that reads no stored field, as the proxy's lean first stage
    does."""
    body = {**plain(q, 2), "from": window - 1, "_source": False, "stored_fields": "_none_"}
    cutoff, why = in_engine.window_edge(
        engine.ok("POST", f"/{index}/_search", {**body, "track_total_hits": False})
    )
    return (0.0 if cutoff is None else cutoff), why == "edge_tied"


def in_window(engine: Http, index: str, q: str, window: int, params: dict[str, Any]) -> tuple[dict, bool]:
    """BMX over the global window inside the engine: its cutoff, then the rescore that keeps to it;
    and whether the cutoff was tied."""
    cutoff, tied = global_cutoff(engine, index, q, window)
    return engine.ok("POST", f"/{index}/_search", painless(q, window, params, cutoff)), tied


def compare(proxy_hits: list[dict], engine_hits: list[dict]) -> tuple[str, float]:
    """How two pages compare: "same" ids in the same order, "ties" (the same hits with the same scores,
    but hits of equal score in another order: the engine breaks a tie by shard and document, the proxy
    by the first stage's order) or "unlike"; and, unless unlike, the scores' largest relative gap."""

    def groups(hits: list[dict]) -> list[tuple[float, frozenset[str]]]:
        by_score: dict[float, set[str]] = {}
        for hit in hits:  # in order of score: equal float32 scores make one group
            by_score.setdefault(float(np.float32(hit["_score"])), set()).add(hit["_id"])
        return [(score, frozenset(ids)) for score, ids in by_score.items()]

    gaps = [
        abs(a["_score"] - b["_score"]) / max(abs(a["_score"]), 1e-12)
        for a, b in zip(proxy_hits, engine_hits, strict=False)
    ]
    if [h["_id"] for h in proxy_hits] == [h["_id"] for h in engine_hits]:
        return "same", max(gaps, default=0.0)
    if groups(proxy_hits) == groups(engine_hits):
        return "ties", max(gaps, default=0.0)
    return "unlike", 0.0


def run(
    upstream: str,
    queries: list[str],
    docs: list[dict],
    window: int,
    shards: int,
    clients: int,
    seconds: float,
    log: int = 0,
    zipf: float = 1.0,
) -> dict[str, Any]:
    """Index `docs`, compare every query's pages with the proxy's, then time each way of asking."""
    engine = Http(upstream)
    index = f"bmxtest-in-engine-{uuid.uuid4().hex[:8]}"
    proxies: list[Proxy] = []
    try:
        if missing := in_engine_lacks(engine):
            raise Unsupported(f"the cluster lacks {', '.join(missing)} (token_count, scripts)")
        index_corpus(engine, index, docs, shards, lengths=True)
        try:
            probe = {"source": f"termFreq('{FIELD}', 'a') + doc['{FIELD}.len'].value"}
            engine.ok(
                "POST",
                f"/{index}/_search",
                {"size": 1, "query": {"script_score": {"query": {"match_all": {}}, "script": probe}}},
            )
        except RuntimeError as exc:  # Http.ok's refusal: no `termFreq` (OpenSearch before 2.10)
            raise Unsupported(str(exc)) from None
        stats = asyncio.run(exact_stats(upstream, index, FIELD))
        asked = []
        for q in queries:
            tokens = [
                t["token"]
                for t in engine.ok("POST", f"/{index}/_analyze", {"field": FIELD, "text": q})["tokens"]
            ]
            params = script_params(stats, tokens)
            if params is not None:
                asked.append((q, params))
        proxy = Proxy(upstream, index, caches=False, workers=1, loop="uvloop")
        proxies.append(proxy)
        first_sight = Proxy(upstream, index, caches=False, workers=1, loop="uvloop", in_engine=True)
        proxies.append(first_sight)
        warm = Proxy(upstream, index, caches=True, workers=1, loop="uvloop", in_engine=True)
        proxies.append(warm)
        keeping = Proxy(upstream, index, caches=True, workers=1, loop="uvloop", in_engine=True)
        proxies.append(keeping)
        through, scored, warmed = Http(proxy.url), Http(first_sight.url), Http(warm.url)
        keeps = Http(keeping.url)
        sidecar_warm = Proxy(upstream, index, caches=True, workers=1, loop="uvloop")  # its own warm rerank
        proxies.append(sidecar_warm)
        rewarmed = Http(sidecar_warm.url)
        served_unlike = 0  # pages `serve --in-engine` answers unlike the proxy's own rerank
        differ, worst, tied = {"per shard": 0, "global": 0}, 0.0, 0
        reordered = dict.fromkeys(differ, 0)
        for q, params in asked:
            page = through.ok("POST", f"/{index}/_search", rerank(q, window))["hits"]["hits"]
            served = scored.ok("POST", f"/{index}/_search", rerank(q, window))
            alike, gap = compare(page, served["hits"]["hits"])
            kept, at_edge = in_window(engine, index, q, window, params)
            tied += at_edge
            # over several shards a window whose edge ties with the next hit is the sidecar's
            from_engine = served["_bmx"]["tf"] == "engine"
            served_unlike += alike == "unlike" or from_engine != (shards == 1 or not at_edge)
            worst = max(worst, gap)
            for kind, answer in (
                ("per shard", engine.ok("POST", f"/{index}/_search", painless(q, window, params))),
                *((("global", kept),) if not at_edge else ()),  # a tie would go the proxy's way
            ):
                alike, gap = compare(page, answer["hits"]["hits"])
                differ[kind] += alike == "unlike"
                reordered[kind] += alike == "ties"
                worst = max(worst, gap)
        ways: dict[str, Callable[[str, dict[str, Any]], object]] = {
            "plain size-10": lambda q, _: engine.ok("POST", f"/{index}/_search", plain(q, 10)),
            "rescore N": lambda q, _: engine.ok("POST", f"/{index}/_search", rescore(q, window)),
            "painless BMX rescore N": lambda q, p: engine.ok(
                "POST", f"/{index}/_search", painless(q, window, p)
            ),
            "the same, global window": lambda q, p: in_window(engine, index, q, window, p),
            "proxy first sight N": lambda q, _: through.ok("POST", f"/{index}/_search", rerank(q, window)),
            "proxy warm N": lambda q, _: rewarmed.ok("POST", f"/{index}/_search", rerank(q, window)),
            "proxy --in-engine first sight N": lambda q, _: scored.ok(
                "POST", f"/{index}/_search", rerank(q, window)
            ),
            "proxy --in-engine sight that keeps N": lambda q, _: keeps.ok(
                "POST", f"/{index}/_search", rerank(q, window)
            ),
            "proxy --in-engine warm N": lambda q, _: warmed.ok(
                "POST", f"/{index}/_search", rerank(q, window)
            ),
        }
        # With its caches on, `--in-engine` leaves a window asked for more than ENGINE_SIGHTS times to
        # the sidecar, which keeps it. The proxy timed on the sight that keeps it has seen every query
        # ENGINE_SIGHTS times (the engine scored it); the warm one once more (the sidecar, which kept
        # it): each of its pages is checked again.
        warm_unlike = 0
        for q, _ in asked:
            rewarmed.ok("POST", f"/{index}/_search", rerank(q, window))
            for _ in range(ENGINE_SIGHTS):
                for ask in (keeps, warmed):
                    ask.ok("POST", f"/{index}/_search", rerank(q, window))
            warmed.ok("POST", f"/{index}/_search", rerank(q, window))
            answer = warmed.ok("POST", f"/{index}/_search", rerank(q, window))
            page = through.ok("POST", f"/{index}/_search", rerank(q, window))["hits"]["hits"]
            alike, _ = compare(page, answer["hits"]["hits"])
            warm_unlike += alike == "unlike" or (shards == 1 and answer["_bmx"]["tf"] != "window")
        times = interleaved({way: lambda a, ask=ask: ask(*a) for way, ask in ways.items()}, asked, WARMUP)
        logged = query_log(upstream, index, asked, window, log, zipf) if log else {}
        throughput = {}
        if clients > 1:  # a closed loop of `clients` connections, each way alone
            for way, url, make in (
                ("rescore N", upstream, lambda q, _: rescore(q, window)),
                ("painless BMX rescore N", upstream, lambda q, p: painless(q, window, p)),
                ("proxy warm N", sidecar_warm.url, lambda q, _: rerank(q, window)),
                ("proxy --in-engine first sight N", first_sight.url, lambda q, _: rerank(q, window)),
                ("proxy --in-engine warm N", warm.url, lambda q, _: rerank(q, window)),
            ):
                bodies = [json.dumps(make(q, p)).encode() for q, p in asked]
                loop = closed_loop(url, f"/{index}/_search", bodies, clients, seconds)
                throughput[way] = asyncio.run(loop)["rps"]
        p50 = {way: statistics.median(t) for way, t in times.items()}
        return {
            "asked": len(asked),
            "differ": differ,
            "reordered": reordered,
            "tied": tied,
            "worst": worst,
            "served_unlike": served_unlike,
            "warm_unlike": warm_unlike,
            "p50": p50,
            "log": logged,
            "rps": throughput,
        }
    finally:
        for running in proxies:
            running.stop()
        engine.call("DELETE", f"/{index}")


def query_log(
    upstream: str, index: str, asked: list[tuple[str, dict[str, Any]]], window: int, length: int, zipf: float
) -> dict[str, Any]:
    """A query log where queries repeat: `length` searches drawn from `asked` with Zipf weights
    (rank^-zipf, in a shuffled order), sent one at a time to the engine's `rescore` and to three new
    proxies, each with its caches empty: the sidecar's rerank, `--in-engine` with its caches on (a
    window kept by the sidecar after ENGINE_SIGHTS sights of the engine's) and with them off (every
    window the engine's). The mean ms a search, each way (a log's cost is its sum, not its median)."""
    rng = np.random.default_rng(18)
    order = rng.permutation(len(asked))
    weights = 1.0 / np.arange(1, len(asked) + 1) ** zipf
    drawn = [asked[order[i]][0] for i in rng.choice(len(asked), size=length, p=weights / weights.sum())]
    proxies = [
        Proxy(upstream, index, caches=True, workers=1, loop="uvloop"),
        Proxy(upstream, index, caches=True, workers=1, loop="uvloop", in_engine=True),
        Proxy(upstream, index, caches=False, workers=1, loop="uvloop", in_engine=True),
    ]
    try:
        path = f"/{index}/_search"
        engine, sidecar, in_engine_kept, in_engine_only = (Http(upstream), *(Http(p.url) for p in proxies))
        ways = {
            "rescore N": lambda q: engine.ok("POST", path, rescore(q, window)),
            "proxy": lambda q: sidecar.ok("POST", path, rerank(q, window)),
            "proxy --in-engine": lambda q: in_engine_kept.ok("POST", path, rerank(q, window)),
            "proxy --in-engine, caches off": lambda q: in_engine_only.ok("POST", path, rerank(q, window)),
        }
        times = interleaved(ways, drawn)
    finally:
        for running in proxies:
            running.stop()
    return {
        "searches": length,
        "queries": len(set(drawn)),
        "mean": {way: statistics.fmean(t) for way, t in times.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:9201")
    parser.add_argument("--queries", type=int, default=220, help=f"the first {WARMUP} are warm-up")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--docs", type=int, default=0, help="0: the whole corpus")
    parser.add_argument(
        "--dataset", default="scifact", help="the BEIR dataset indexed and asked (../shared/data)"
    )
    parser.add_argument("--clients", type=int, default=8, help="the closed loop's connections (1: none)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of each closed loop")
    parser.add_argument("--log", type=int, default=2000, help="searches in the query log (0: none)")
    parser.add_argument("--zipf", type=float, default=1.0, help="the query log's Zipf exponent")
    args = parser.parse_args(argv)
    queries = [q["text"] for q in beir_records(args.dataset, "queries.jsonl", args.queries)]
    try:
        docs = beir_records(args.dataset, "corpus.jsonl", args.docs)
        result = run(
            args.upstream,
            queries,
            docs,
            args.window,
            args.shards,
            args.clients,
            args.duration,
            args.log,
            args.zipf,
        )
    except Unsupported as exc:
        print(f"needs OpenSearch with mapper-extras and lang-painless: {exc}", file=sys.stderr)
        return 2
    p50 = result["p50"]
    print(
        f"{args.upstream}, {args.dataset}, {args.shards} shard(s), window {args.window}, {result['asked']} queries"
    )
    differ = result["differ"]
    print(
        f"pages unlike the proxy's: {differ['per shard']} of {result['asked']} (each shard's window), "
        f"{differ['global']} of {result['asked'] - result['tied']} (the global window, its cutoff untied); "
        f"largest relative score gap {result['worst']:.1e}"
    )
    print(
        f"pages `serve --in-engine` answers unlike the proxy's own rerank, or (but at a tied edge) "
        f"not from the engine: "
        f"{result['served_unlike']} of {result['asked']}"
    )
    print(
        f"warm pages of `serve --in-engine` unlike the proxy's own rerank, or not from a window the "
        f"sidecar kept: {result['warm_unlike']} of {result['asked']}"
    )
    again = result["reordered"]
    print(
        f"pages alike but for the order of hits of equal score: {again['per shard']} (each shard's "
        f"window), {again['global']} (the global window)"
    )
    print("| way of asking | p50 ms | / engine rescore |\n|---|---|---|")
    for way in p50:
        print(f"| {way} | {p50[way]:.2f} | {p50[way] / p50['rescore N']:.2f}x |")
    if result["log"]:
        logged, mean = result["log"], result["log"]["mean"]
        print(
            f"a query log of {logged['searches']} searches over {logged['queries']} queries "
            f"(Zipf {args.zipf}), caches empty at its start:"
        )
        print("| way of asking | mean ms | / engine rescore |\n|---|---|---|")
        for way in mean:
            print(f"| {way} | {mean[way]:.2f} | {mean[way] / mean['rescore N']:.2f}x |")
    if result["rps"]:
        rps = result["rps"]
        print(
            f"{args.clients} clients: rescore N {rps['rescore N']:.0f} req/s, painless BMX rescore N "
            f"{rps['painless BMX rescore N']:.0f} req/s "
            f"({100 * rps['painless BMX rescore N'] / rps['rescore N']:.0f} % of rescore)"
        )
        print(f"| {args.clients} clients, way of asking | req/s | / engine rescore |\n|---|---|---|")
        for way, each in rps.items():
            print(f"| {way} | {each:.0f} | {100 * each / rps['rescore N']:.0f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
