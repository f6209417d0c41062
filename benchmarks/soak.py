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

`--faults`: the proxy reaches the engine through a fault injector (tests/support/faults.py) that, in
the second half of every tenth of the run, in turn slows every call (0.2 s), freezes the node (every
call held until the freeze ends, at most 5 s) or resets every third sidecar read (`_mtermvectors`,
`_analyze`: idempotent, retried). `--hostile`: beside the clients, a gzip bomb every half second, slow
senders trickling a request head a byte a second, and idle hoarders holding 2,000 connections (the
proxy runs with `--header-timeout 5 --max-connections 1500`). Then a fallback is reported, not an
error; an error is a 5xx, a broken connection, or a write not acknowledged; every acknowledged write is
read back from the engine at the end (`writes_lost`); p99 is given for requests that ran while a fault
was on and while none was.

    .venv/bin/python -m benchmarks.soak --engine http://127.0.0.1:9200 --seconds 180 --clients 32
    .venv/bin/python -m benchmarks.soak --seconds 600 --clients 32 --faults --hostile
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.support.bombs import GZIP_JSON, gzip_bomb
from tests.support.faults import FaultInjector, Rule
from tests.support.proxy_process import BIN, Proxy, serve
from tests.support.proxy_thread import LoopThread
from tests.support.serving import serve_app

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
    lenient: bool = False  # with faults: a fallback is reported, not an error
    fallbacks: int = 0
    sidecar_5xx: int = 0
    acked: list[str] = field(default_factory=list)  # ids of acknowledged writes
    during_fault: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k, _ in MIX})
    fault_on: str | None = None  # the fault on now (set by the schedule)
    faults_run: list[str] = field(default_factory=list)
    hostile: Counter[str] = field(default_factory=Counter)

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
        fault = stats.fault_on
        try:
            async with session.request(
                method, url + path, data=data, headers={"Content-Type": ctype}
            ) as resp:
                payload = await resp.read()
                if resp.status >= 500:
                    stats.sidecar_5xx += 1
                if resp.status >= 300:
                    stats.error(f"{kind} {resp.status}: {payload[:120]!r}")
                    continue
                if kind == "reranked" and resp.headers.get("X-BMX-Rerank") != "bmx":
                    if not stats.lenient:
                        stats.error(f"reranked marked {resp.headers.get('X-BMX-Rerank')}: {payload[-300:]!r}")
                        continue
                    stats.fallbacks += 1
                if kind == "write":
                    if path.endswith("_bulk"):
                        items = json.loads(payload)["items"]
                        stats.acked += [
                            i["index"]["_id"] for i in items if i["index"].get("status", 500) < 300
                        ]
                        if json.loads(payload)["errors"]:
                            stats.error("bulk item errors")
                            continue
                    else:
                        stats.acked.append(path.rsplit("/", 1)[1])
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            stats.error(f"{kind} {exc.__class__.__name__}: {str(exc)[:80]}")
            continue
        took = time.perf_counter() - start
        stats.latencies[kind].append(took)
        if fault is not None or stats.fault_on is not None:
            stats.during_fault[kind].append(took)


async def sample_rss(proxy: Proxy, t0: float, deadline: float, stats: Stats) -> None:
    while time.monotonic() < deadline:
        stats.samples.append((time.monotonic() - t0, proxy.rss_kib()))
        await asyncio.sleep(1.0)
    stats.samples.append((time.monotonic() - t0, proxy.rss_kib()))


FAULTS = ("slow", "frozen", "reset")
FREEZE = 5.0  # seconds a frozen node holds every call, at most (under --timeout and --deadline)


def fault_rules(kind: str, until: float) -> list[Rule]:
    if kind == "slow":
        return [Rule(".", "delay:0.2")]
    if kind == "frozen":
        return [Rule(".", f"until:{until}")]
    return [Rule("_mtermvectors|_analyze", "reset", every=3)]  # idempotent sidecar reads, retried


async def schedule(injector: FaultInjector, lt: LoopThread, t0: float, seconds: float, stats: Stats) -> None:
    """The second half of every tenth of the run: slow, frozen, reset, in turn."""
    period = seconds / 10
    for k in range(10):
        start = t0 + k * period + period / 2
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        kind = FAULTS[k % len(FAULTS)]
        length = min(period / 2, FREEZE) if kind == "frozen" else period / 2
        rules = fault_rules(kind, time.monotonic() + length)
        lt.loop.call_soon_threadsafe(injector.rules.__setitem__, slice(None), rules)
        stats.fault_on = kind
        stats.faults_run.append(kind)
        await asyncio.sleep(length)
        lt.loop.call_soon_threadsafe(injector.rules.clear)
        stats.fault_on = None


BOMB = gzip_bomb(32 << 20)


async def bombs(url: str, index: str, deadline: float, stats: Stats) -> None:
    """A gzip bomb asking for a rerank every half second: a 4xx (400 unreadable, 429 budget), never a 5xx."""
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.post(f"{url}/{index}/_search", data=BOMB, headers=GZIP_JSON) as resp:
                    await resp.read()
                    stats.hostile[f"bomb {resp.status}"] += 1
                    if resp.status >= 500:
                        stats.sidecar_5xx += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                stats.hostile[f"bomb {exc.__class__.__name__}"] += 1
            await asyncio.sleep(0.5)


async def slow_sender(host: str, port: int, deadline: float, stats: Stats) -> None:
    """A request head a byte a second: the proxy closes it (`--header-timeout`)."""
    head = b"GET /_bmx/health HTTP/1.1\r\nHost: x\r\n\r\n"
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(1)
            continue
        try:
            for byte in head:
                if time.monotonic() > deadline:
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1.0)
            else:
                stats.hostile["slow sender answered"] += 1
        except (ConnectionError, OSError):
            stats.hostile["slow sender closed"] += 1
        finally:
            writer.close()


async def hoarders(host: str, port: int, n: int, deadline: float, stats: Stats) -> None:
    """`n` idle connections, each reopened when the proxy closes it."""

    async def hold() -> None:
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                stats.hostile["hoarder refused"] += 1
                await asyncio.sleep(1)
                continue
            stats.hostile["hoarder opened"] += 1
            try:
                left = deadline - time.monotonic()
                if left > 0 and await asyncio.wait_for(reader.read(1), left) == b"":
                    stats.hostile["hoarder closed by the proxy"] += 1
            except (asyncio.TimeoutError, ConnectionError):
                pass
            finally:
                writer.close()
            await asyncio.sleep(0.5)

    await asyncio.gather(*(hold() for _ in range(n)))


async def load(
    proxy: Proxy,
    index: str,
    seconds: float,
    clients: int,
    injector: tuple[FaultInjector, LoopThread] | None = None,
    hostile: bool = False,
) -> Stats:
    stats = Stats(lenient=injector is not None or hostile)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        t0 = time.monotonic()
        deadline = t0 + seconds
        extra = []
        if injector is not None:
            extra.append(schedule(*injector, t0, seconds, stats))
        if hostile:
            host, port = proxy.url.removeprefix("http://").split(":")
            extra.append(bombs(proxy.url, index, deadline, stats))
            extra += [slow_sender(host, int(port), deadline, stats) for _ in range(4)]
            extra.append(hoarders(host, int(port), HOARDED, deadline, stats))
        await asyncio.gather(
            sample_rss(proxy, t0, deadline, stats),
            *(client(session, proxy.url, index, deadline, seed, stats) for seed in range(clients)),
            *extra,
        )
    return stats


HOARDED = 2000
HOSTILE_ARGS = ["--header-timeout", "5", "--max-connections", "1500"]


def lost_writes(engine: str, index: str, ids: list[str]) -> int:
    """How many acknowledged writes the engine does not have (read back directly, after a refresh)."""
    import urllib.request

    def call(method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            engine + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())

    call("POST", f"/{index}/_refresh")
    missing = 0
    for start in range(0, len(ids), 1000):
        docs = call("POST", f"/{index}/_mget", {"ids": ids[start : start + 1000]})["docs"]
        missing += sum(1 for d in docs if not d.get("found"))
    return missing


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
    sidecar_5xx: int = 0
    fallbacks: int = 0
    writes_acked: int = 0
    writes_lost: int = 0
    faults: list[str] = field(default_factory=list)
    p99_during_faults_ms: dict[str, float] = field(default_factory=dict)
    hostile: dict[str, int] = field(default_factory=dict)


def soak(
    engine: str, seconds: float, clients: int, n_docs: int, faults: bool = False, hostile: bool = False
) -> Report:
    tag = uuid.uuid4().hex[:8]
    index, store = f"bmxtest-soak-{tag}", f"bmxtest-soak-stats-{tag}"
    import urllib.request

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the hoarders' connections
    lt = injector = irunner = None
    try:
        setup_index(engine, index, store, n_docs)
        upstream = engine
        if faults:
            lt, injector = LoopThread(), FaultInjector(engine)
            irunner, upstream = lt.run(serve_app(injector.app()))
        # The caches bounded small, so they are full after the warm-up (the term-vector cache's own LRU
        # of windows seen once too: 1 MiB, where writes give the windows new versions all the time): the
        # RSS growth after that measures leaks, not a bounded cache filling.
        caches = ["--page-cache-bytes", "4MiB", "--cache-bytes", "32MiB"]
        args = [*(HOSTILE_ARGS if hostile else []), *caches]
        with serve(upstream, args, env={"BMX_STATS_INDEX": store}) as proxy:
            fds_before = proxy.open_fds()
            pair = (injector, lt) if injector is not None and lt is not None else None
            stats = asyncio.run(load(proxy, index, seconds, clients, pair, hostile))
            time.sleep(1.0)
            fds_after = proxy.open_fds()
            peak = proxy.peak_kib()
        lost = lost_writes(engine, index, stats.acked)
    finally:
        if lt is not None:
            assert injector is not None
            lt.loop.call_soon_threadsafe(injector.release)
            if irunner is not None:
                lt.run(irunner.cleanup())
            lt.close()
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
        sidecar_5xx=stats.sidecar_5xx,
        fallbacks=stats.fallbacks,
        writes_acked=len(stats.acked),
        writes_lost=lost,
        faults=stats.faults_run,
        p99_during_faults_ms={k: round(pct(v, 0.99), 1) for k, v in stats.during_fault.items()},
        hostile=dict(stats.hostile),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", default="http://127.0.0.1:9200")
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--docs", type=int, default=5_000)
    parser.add_argument("--faults", action="store_true", help="slow, frozen and reset on a schedule")
    parser.add_argument("--hostile", action="store_true", help="gzip bombs, slow senders, idle hoarders")
    args = parser.parse_args()
    r = soak(args.engine, args.seconds, args.clients, args.docs, args.faults, args.hostile)
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
    if args.faults or args.hostile:
        print(
            f"\n| s | clients | requests | sidecar 5xx | errors | fallbacks | writes acked / lost | "
            f"p99 ms reranked / plain / write (during faults) | RSS warm → end (peak) MiB | fds start → end |\n"
            f"|---|---|---|---|---|---|---|---|---|---|\n"
            f"| {r.seconds:.0f} | {r.clients} | {r.requests:,} | {r.sidecar_5xx} | {sum(r.errors.values())} | "
            f"{r.fallbacks} | {r.writes_acked:,} / {r.writes_lost} | {r.p99_ms['reranked']} / "
            f"{r.p99_ms['plain']} / {r.p99_ms['write']} ({r.p99_during_faults_ms['reranked']} / "
            f"{r.p99_during_faults_ms['plain']} / {r.p99_during_faults_ms['write']}) | {r.rss_warm_mib} → "
            f"{r.rss_end_mib} ({r.rss_peak_mib}) | {r.fds_before} → {r.fds_after} |"
        )
        sys.exit(0 if r.sidecar_5xx == 0 and r.writes_lost == 0 else 1)
    sys.exit(0 if not r.errors and r.rss_growth_pct < 10 else 1)


if __name__ == "__main__":
    main()
