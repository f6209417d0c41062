"""A bounded soak: `bmx-rerank serve` in its own process under load from this one, mixing reranked
searches, plain (passthrough) searches and writes into the index being searched, for a fixed time.

Setup: a fresh index of `--docs` generated documents (Zipf-distributed words), an exact statistics
snapshot in a store index of its own (`bmx-rerank stats build`), the proxy started with that store.
Load: `--clients` concurrent keep-alive connections (aiohttp), each request drawn at random:
  55 % reranked search (ext.bmx, window 100, size 10; random 1-3 word queries)
  30 % plain search through the proxy (passthrough)
  15 % writes: single-document PUT, or a `_bulk` of 10 (refresh=false)
An error is any non-2xx answer, a broken connection, or a reranked search not marked reranked
(a fallback counts as an error). The proxy's RSS is sampled every second; growth is measured from the
end of the warm-up (the first third of the run: the term-vector cache fills with the corpus) to the end.

    .venv/bin/python -m benchmarks.soak --engine http://127.0.0.1:9200 --seconds 180 --clients 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.support.proxy_process import BIN, Proxy, serve

VOCAB = [f"w{i}" for i in range(2000)]
WEIGHTS = [1.0 / (i + 1) for i in range(len(VOCAB))]  # Zipf
MIX = (("reranked", 0.55), ("plain", 0.30), ("write", 0.15))


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(VOCAB, WEIGHTS, k=n))


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k, _ in MIX})
    errors: dict[str, int] = field(default_factory=dict)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, RSS KiB)

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


def setup_index(engine: str, index: str, store: str, n_docs: int) -> None:
    import urllib.request

    def call(method: str, path: str, body: bytes, ctype: str = "application/json") -> Any:
        req = urllib.request.Request(engine + path, data=body, method=method, headers={"Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=300) as resp:
            return json.loads(resp.read())

    mappings = {"properties": {"body": {"type": "text"}}}
    settings = {"number_of_shards": 1, "number_of_replicas": 0}
    call("PUT", f"/{index}", json.dumps({"settings": settings, "mappings": mappings}).encode())
    rng = random.Random(1)
    for start in range(0, n_docs, 2000):
        lines = []
        for i in range(start, min(n_docs, start + 2000)):
            lines += [
                json.dumps({"index": {"_id": f"s{i}"}}),
                json.dumps({"body": words(rng, rng.randint(5, 80))}),
            ]
        answer = call(
            "POST", f"/{index}/_bulk?refresh=true", ("\n".join(lines) + "\n").encode(), "application/x-ndjson"
        )
        assert not answer["errors"]
    subprocess.run(
        [str(BIN), "stats", "build", index, "--field", "body", "--upstream", engine],
        check=True,
        env={**os.environ, "BMX_STATS_INDEX": store},
        capture_output=True,
    )


async def client(
    session: aiohttp.ClientSession, url: str, index: str, deadline: float, seed: int, stats: Stats
) -> None:
    rng = random.Random(seed)
    kinds, weights = zip(*MIX, strict=True)
    n = 0
    while time.monotonic() < deadline:
        kind = rng.choices(kinds, weights)[0]
        n += 1
        if kind == "reranked":
            body: Any = {
                "size": 10,
                "query": {"match": {"body": words(rng, rng.randint(1, 3))}},
                "ext": {"bmx": {"field": "body", "window_size": 100}},
            }
            method, path, data, ctype = "POST", f"/{index}/_search", json.dumps(body), "application/json"
        elif kind == "plain":
            body = {"size": 10, "query": {"match": {"body": words(rng, rng.randint(1, 3))}}}
            method, path, data, ctype = "POST", f"/{index}/_search", json.dumps(body), "application/json"
        elif rng.random() < 0.5:
            doc = json.dumps({"body": words(rng, rng.randint(5, 80))})
            method, path, data, ctype = "PUT", f"/{index}/_doc/c{seed}-{n}", doc, "application/json"
        else:
            lines = []
            for k in range(10):
                lines += [
                    json.dumps({"index": {"_id": f"b{seed}-{n}-{k}"}}),
                    json.dumps({"body": words(rng, 20)}),
                ]
            method, path, data, ctype = (
                "POST",
                f"/{index}/_bulk",
                "\n".join(lines) + "\n",
                "application/x-ndjson",
            )
        start = time.perf_counter()
        try:
            async with session.request(
                method, url + path, data=data, headers={"Content-Type": ctype}
            ) as resp:
                payload = await resp.read()
                if resp.status >= 300:
                    stats.error(f"{kind} {resp.status}: {payload[:120]!r}")
                    continue
                if kind == "reranked" and resp.headers.get("X-BMX-Rerank") != "bmx":
                    stats.error(f"reranked marked {resp.headers.get('X-BMX-Rerank')}: {payload[-300:]!r}")
                    continue
                if kind == "write" and path.endswith("_bulk") and json.loads(payload)["errors"]:
                    stats.error("bulk item errors")
                    continue
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            stats.error(f"{kind} {exc.__class__.__name__}")
            continue
        stats.latencies[kind].append(time.perf_counter() - start)


async def sample_rss(proxy: Proxy, t0: float, deadline: float, stats: Stats) -> None:
    while time.monotonic() < deadline:
        stats.samples.append((time.monotonic() - t0, proxy.rss_kib()))
        await asyncio.sleep(1.0)
    stats.samples.append((time.monotonic() - t0, proxy.rss_kib()))


async def load(proxy: Proxy, index: str, seconds: float, clients: int) -> Stats:
    stats = Stats()
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        t0 = time.monotonic()
        deadline = t0 + seconds
        await asyncio.gather(
            sample_rss(proxy, t0, deadline, stats),
            *(client(session, proxy.url, index, deadline, seed, stats) for seed in range(clients)),
        )
    return stats


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))] * 1000 if ordered else float("nan")


@dataclass
class Report:
    seconds: float
    clients: int
    requests: int
    errors: dict[str, int]
    rps: float
    p50_ms: dict[str, float]
    p99_ms: dict[str, float]
    counts: dict[str, int]
    rss_warm_mib: float
    rss_end_mib: float
    rss_peak_mib: float
    rss_growth_pct: float
    rss_timeline_mib: list[float]  # every tenth of the run
    fds_before: int
    fds_after: int


def soak(engine: str, seconds: float, clients: int, n_docs: int) -> Report:
    tag = uuid.uuid4().hex[:8]
    index, store = f"bmxtest-soak-{tag}", f"bmxtest-soak-stats-{tag}"
    import urllib.request

    try:
        setup_index(engine, index, store, n_docs)
        with serve(engine, env={"BMX_STATS_INDEX": store}) as proxy:
            fds_before = proxy.open_fds()
            stats = asyncio.run(load(proxy, index, seconds, clients))
            time.sleep(1.0)
            fds_after = proxy.open_fds()
            peak = proxy.peak_kib()
    finally:
        for name in (index, store):
            urllib.request.urlopen(urllib.request.Request(f"{engine}/{name}", method="DELETE"), timeout=60)
    warm_at = seconds / 3
    warm = next(kib for t, kib in stats.samples if t >= warm_at)
    end = stats.samples[-1][1]
    done = sum(len(v) for v in stats.latencies.values())
    return Report(
        seconds=seconds,
        clients=clients,
        requests=done + sum(stats.errors.values()),
        errors=stats.errors,
        rps=done / seconds,
        p50_ms={k: round(pct(v, 0.5), 1) for k, v in stats.latencies.items()},
        p99_ms={k: round(pct(v, 0.99), 1) for k, v in stats.latencies.items()},
        counts={k: len(v) for k, v in stats.latencies.items()},
        rss_warm_mib=round(warm / 1024, 1),
        rss_end_mib=round(end / 1024, 1),
        rss_peak_mib=round(peak / 1024, 1),
        rss_growth_pct=round(100 * (end - warm) / warm, 1),
        rss_timeline_mib=[
            round(next(kib for t, kib in stats.samples if t >= seconds * k / 10) / 1024, 1) for k in range(10)
        ]
        + [round(end / 1024, 1)],
        fds_before=fds_before,
        fds_after=fds_after,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", default="http://127.0.0.1:9200")
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--docs", type=int, default=5_000)
    args = parser.parse_args()
    r = soak(args.engine, args.seconds, args.clients, args.docs)
    print(json.dumps(r.__dict__, indent=2))
    print(
        f"\n| engine | s | clients | requests (reranked / plain / write) | errors | req/s | "
        f"p50 / p99 ms reranked | plain | write | RSS warm → end (peak) MiB | growth |\n"
        f"|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"| {args.engine} | {r.seconds:.0f} | {r.clients} | {r.requests:,} ({r.counts['reranked']:,} / "
        f"{r.counts['plain']:,} / {r.counts['write']:,}) | {sum(r.errors.values())} | {r.rps:.0f} | "
        f"{r.p50_ms['reranked']} / {r.p99_ms['reranked']} | {r.p50_ms['plain']} / {r.p99_ms['plain']} | "
        f"{r.p50_ms['write']} / {r.p99_ms['write']} | {r.rss_warm_mib} → {r.rss_end_mib} ({r.rss_peak_mib}) | "
        f"{r.rss_growth_pct} % |"
    )
    sys.exit(0 if not r.errors and r.rss_growth_pct < 10 else 1)


if __name__ == "__main__":
    main()
