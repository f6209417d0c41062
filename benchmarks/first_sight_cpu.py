"""The proxy's own CPU on a rerank, replayed in process and counted in instructions (deterministic on
a shared machine, where wall-clock timings are not).

    .venv/bin/python -m benchmarks.first_sight_cpu record OUT [--upstream URL] [--mode first|warm]
        [--window 100] [--shards 1] [--queries 50]
    .venv/bin/python -m benchmarks.first_sight_cpu replay OUT [--repeats 3] [--check] [--fresh-caches]
    .venv/bin/python -m benchmarks.first_sight_cpu count OUT [--repeats 3] [--fresh-caches]   # valgrind
    .venv/bin/python -m benchmarks.first_sight_cpu cold OUT [--repeats 5]

`record` indexes SciFact into a fresh index, sweeps its statistics and length table, and reranks each
query through an in-process `Reranker` (as the proxy makes it: `first`, every cache off, each search a
first sight; `warm`, caches on, each query once before) against the engine, keeping every answer the
cluster gave (the first stage, the page fetch, the sidecar's own calls) by its request, and the body
each rerank answered. `replay` does the same reranks again with no engine: the cluster is a stub
answering from the recording (a request not recorded fails: the requests did not change either), the
first stage's answer decoded as the proxy decodes it, the reranked body serialized as the proxy
serializes it (`--fresh-caches`: first sights of a proxy whose caches are on, emptied before each pass
over the queries); one pass goes before the `--repeats` measured ones. `--check` compares every
answer with the recorded one, byte for byte. `count` runs `replay` under callgrind, counting the
measured passes alone (imports, the recording's setup and the first pass do not count), and prints
the instructions per rerank. `cold` times each replayed rerank alone (its plan, the rerank, its answer
serialized), three ways taking turns: back to back; after a walk over 64 MiB, twice the machine's
last-level cache, so that it starts as a search does on a proxy whose caches the cluster's own work
evicted while it waited; after 3 ms asleep, as a proxy idles while the cluster searches. It prints
each way's p50, and that of the plan alone, the first step a request runs."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import pickle
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

ROOT = Path(__file__).resolve().parents[1]
HEADERS: dict[str, str] = {}  # an anonymous caller, as a client without credentials
FOREVER = 1e9  # seconds: no entry of a time-bounded cache expires during a (slow, valgrind) replay
Key = tuple[str, str, bytes]  # (method, path with its query, body)


@dataclass
class Recording:
    """What one `record` run kept: the cluster's answers by request and each rerank's answer."""

    mode: str
    window: int
    shards: int
    index: str
    queries: list[str]
    corpus: Any  # CorpusStats of `body`
    lengths: dict[str, Any] | None  # concrete index -> DocLengths
    # concrete index -> the routing shard count its sweep proved (none in a recording made before)
    routing: dict[str, int] = field(default_factory=dict)
    answers: dict[Key, tuple[int, bytes] | BaseException] = field(default_factory=dict)
    expected: list[bytes] = field(default_factory=list)  # each rerank's body, in order
    # `first`: each rerank's body with the caches on (what a replay with `fresh` caches compares with)
    expected_fresh: list[bytes] = field(default_factory=list)


def _key(method: str, path: str, body: Any) -> Key:
    raw = body if isinstance(body, bytes) else b"" if body is None else orjson.dumps(body)
    return (method, path, raw)


def _search_path(index: str, params: Mapping[str, str], what: str = "_search") -> str:
    return f"/{index}/{what}" + ("?" + urlencode(dict(params)) if params else "")


def reranker(cluster: Any, rec: Recording, *, caches: bool | None = None) -> Any:
    """A `Reranker` as the proxy makes it (`proxy/app.py`), with the benchmark's caches: `first`, every
    cache off (as `benchmarks/proxy_latency.py` serves first sights), `warm` the defaults (`caches`:
    on or off whatever the mode)."""
    from cachetools import TTLCache

    from benchmarks.proxy_latency import stats_source
    from bmx_rerank.metrics import Metrics
    from bmx_rerank.rerank import analysis, lean, probing, tf_probe
    from bmx_rerank.rerank.pipeline import Reranker
    from bmx_rerank.rerank.term_vector_cache import TermVectorCache

    first = rec.mode == "first" if caches is None else not caches
    out = Reranker(
        cluster,
        stats_source(rec.index, rec.corpus, rec.lengths, rec.routing, rec.shards),
        Metrics(),
        cache=TermVectorCache(0 if first else 256 << 20),
        lengths=tf_probe.LengthCache(0 if first else 1_000_000),
        analyses=analysis.AnalysisCache(0 if first else 10_000, ttl=FOREVER),
        probes="auto",
        pages=lean.PageCache(0 if first else 64 << 20),
    )
    out.analysis._analyzers = TTLCache(analysis.ANALYZER_CACHE, FOREVER)
    out.prober.seen = TTLCache(probing.SEEN_WINDOWS, FOREVER)
    return out


def _decode(payload: bytes) -> Any:
    from bmx_rerank.proxy.bodies import loads

    return loads(payload)


def front_end(rec: Recording, send: Any) -> tuple[Any, Any]:
    """The proxy's `first_stage` and `msearch` (`proxy/search.py`) over `send(key) -> (status, bytes)`."""
    from bmx_rerank.rerank.pipeline import Answer

    async def first_stage(
        body: dict[str, Any] | None, params: Mapping[str, str], *, undecoded: bool = False
    ) -> Answer:
        status, payload = await send(_key("POST", _search_path(rec.index, params), body))
        if undecoded and status < 300:
            return Answer(status, None, payload, payload)
        data = _decode(payload) if status < 300 else None
        return Answer(status, data if isinstance(data, dict) else None, payload)

    async def msearch(body: bytes, params: Mapping[str, str]) -> Answer:  # decoded by the rerank
        status, payload = await send(_key("POST", _search_path(rec.index, params, "_msearch"), body))
        return Answer(status, None, payload, payload)

    return first_stage, msearch


async def rerank_all(
    rec: Recording,
    rr: Any,
    first_stage: Any,
    msearch: Any,
    passes: int,
    *,
    fresh: bool = False,
    before: Callable[[], Any] | None = None,
    times: list[tuple[float, float]] | None = None,
) -> list[bytes]:
    """Each query reranked `passes` times over (the proxy's planning, the rerank, the answer's bytes);
    `fresh`: the caches emptied before each pass (first sights of a proxy whose caches are on);
    `before`: run (awaited) before each rerank, untimed; `times`: each rerank's seconds, with its plan's."""
    from benchmarks.proxy_latency import rerank
    from bmx_rerank.rerank.plan import Bounds, bounded_plan

    bounds = Bounds()
    out = []
    for _ in range(passes):
        if fresh:
            _empty(rr)
        if rec.mode == "first":  # a first sight's window is one the proxy never saw split over shards
            rr.splits.clear()
        for q in rec.queries:
            body = orjson.loads(orjson.dumps(rerank(q, rec.window)))  # as the proxy parses the request
            if before is not None:
                await before()
            start = time.perf_counter()
            plan = bounded_plan(body, {}, None, bounds)
            planned = time.perf_counter()
            outcome = await rr.rerank(rec.index, plan, HEADERS, first_stage, msearch)
            assert outcome.body is not None, "not reranked"
            out.append(orjson.dumps(outcome.body, option=orjson.OPT_SERIALIZE_NUMPY))
            if times is not None:
                times.append((time.perf_counter() - start, planned - start))
    return out


def _empty(rr: Any) -> None:
    """The reranker's caches of windows, documents and pages emptied (what it knows of the cluster kept)."""
    from cachetools import TTLCache

    from bmx_rerank.rerank import lean, probing, tf_probe
    from bmx_rerank.rerank.term_vector_cache import TermVectorCache

    rr.frequencies.cache = TermVectorCache(rr.frequencies.cache.max_bytes)
    rr.frequencies.lengths = tf_probe.LengthCache(rr.frequencies.lengths.capacity)
    rr.pages = lean.PageCache(rr.pages.max_bytes)
    rr.prober.seen = TTLCache(probing.SEEN_WINDOWS, FOREVER)


# ---- recording ------------------------------------------------------------------------------------------


def record(args: argparse.Namespace) -> None:
    from benchmarks.proxy_latency import Http, index_corpus, sweep_stats
    from tests.support.data import scifact_records

    engine = Http(args.upstream)
    index = f"bmxtest-cpu-{uuid.uuid4().hex[:8]}"
    index_corpus(engine, index, scifact_records("corpus.jsonl", 0), shards=args.shards)
    try:
        corpus, lengths, routing = sweep_stats(args.upstream, index)
        queries = [q["text"] for q in scifact_records("queries.jsonl", 0)][: args.queries]
        rec = Recording(args.mode, args.window, args.shards, index, queries, corpus, lengths, routing)
        asyncio.run(_record(rec, args.upstream))
    finally:
        engine.call("DELETE", f"/{index}")
    Path(args.out).write_bytes(pickle.dumps(vars(rec)))  # no class of `__main__` in it
    print(f"{len(rec.expected)} reranks, {len(rec.answers)} answers recorded in {args.out}")


async def _record(rec: Recording, upstream: str) -> None:
    import aiohttp

    from bmx_rerank.errors import UpstreamError
    from bmx_rerank.upstream import Cluster

    class Recorder(Cluster):
        async def request(self, method, path, body=None, headers=None, decode=orjson.loads, *, retried=False):
            key = _key(method, path, body)
            if key not in rec.answers:  # a request asked again is answered as the first time
                raw: list[bytes] = []

                def keep(payload: bytes) -> Any:
                    raw.append(payload)
                    return decode(payload)

                try:
                    await super().request(method, path, body, headers, keep, retried=retried)
                    rec.answers[key] = (200, raw[-1])
                except UpstreamError as exc:
                    rec.answers[key] = exc
            return decode(_answered(rec, key)[1])

        async def post_ndjson(self, path, lines, headers, error_type):
            key = _key("POST", path, b"\n".join(lines) + b"\n")
            if key not in rec.answers:
                try:
                    rec.answers[key] = (
                        200,
                        orjson.dumps(await super().post_ndjson(path, lines, headers, error_type)),
                    )
                except UpstreamError as exc:
                    rec.answers[key] = exc
            return orjson.loads(_answered(rec, key)[1])

    async with aiohttp.ClientSession() as session:

        async def send(key: Key) -> tuple[int, bytes]:
            method, path, body = key
            ctype = "application/x-ndjson" if path.split("?")[0].endswith("_msearch") else "application/json"
            if key not in rec.answers:
                async with session.request(
                    method, upstream + path, data=body, headers={"Content-Type": ctype}
                ) as resp:
                    rec.answers[key] = (resp.status, await resp.read())
            return _answered(rec, key)

        first_stage, msearch = front_end(rec, send)
        rr = reranker(Recorder(session, upstream), rec)
        if rec.mode == "warm":  # each query once, so that what is recorded is its repeat
            await rerank_all(rec, rr, first_stage, msearch, 1)
        rec.expected = await rerank_all(rec, rr, first_stage, msearch, 1)
        if rec.mode == "first":  # and with the caches on, as `replay --fresh-caches` asks
            rr = reranker(Recorder(session, upstream), rec, caches=True)
            rec.expected_fresh = await rerank_all(rec, rr, first_stage, msearch, 1, fresh=True)


def _answered(rec: Recording, key: Key) -> tuple[int, bytes]:
    """The recorded answer to a request (raised, when it was an error)."""
    found = rec.answers.get(key)
    if found is None:
        raise AssertionError(f"not recorded: {key[0]} {key[1]} {key[2][:300]!r}")
    if isinstance(found, BaseException):
        raise found
    return found


# ---- replaying ------------------------------------------------------------------------------------------


async def _replay(rec: Recording, passes: int, fresh: bool, *, instrument: bool = False) -> list[bytes]:
    rr, first_stage, msearch = _replayer(rec, fresh)
    # one pass first, not measured: `warm` needs its windows seen once; every mode its imports done
    # and what the proxy learns once of a cluster (the field's analyzer, the probes' parameter) learned
    await rerank_all(rec, rr, first_stage, msearch, 1, fresh=fresh)
    _callgrind("on" if instrument else None)
    got = await rerank_all(rec, rr, first_stage, msearch, passes, fresh=fresh)
    _callgrind("off" if instrument else None)
    return got


def _replayer(rec: Recording, fresh: bool) -> tuple[Any, Any, Any]:
    """A reranker (`fresh`: its caches on) and the proxy's front end over a cluster that answers from
    the recording."""
    from bmx_rerank.upstream import Cluster

    class Stub(Cluster):
        async def request(self, method, path, body=None, headers=None, decode=orjson.loads, *, retried=False):
            return decode(_answered(rec, _key(method, path, body))[1])

        async def post_ndjson(self, path, lines, headers, error_type):
            return orjson.loads(_answered(rec, _key("POST", path, b"\n".join(lines) + b"\n"))[1])

    async def send(key: Key) -> tuple[int, bytes]:
        return _answered(rec, key)

    first_stage, msearch = front_end(rec, send)
    rr = reranker(Stub(None, "http://recorded"), rec, caches=True if fresh else None)  # type: ignore[arg-type]
    return rr, first_stage, msearch


def _callgrind(state: str | None) -> None:
    """Turn callgrind's counting of this process on or off (`callgrind_control -i`)."""
    if state is not None:
        subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True)


def _run() -> Callable[[Any], Any]:
    """What runs a coroutine as the proxy's loop would (uvloop where installed), its collector set as
    the proxy's app sets it."""
    gc.set_threshold(10_000, *gc.get_threshold()[1:])
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


def replay(args: argparse.Namespace) -> None:
    rec = _load(args.recording)
    run = _run()
    if args.fresh_caches and rec.mode != "first":
        raise SystemExit("--fresh-caches replays first sights")
    got = run(_replay(rec, args.repeats, args.fresh_caches, instrument=args.instrument))
    if args.check:
        expected = rec.expected_fresh if args.fresh_caches else rec.expected
        differ = sum(a != b for a, b in zip(got, expected * args.repeats, strict=True))
        print(f"{_what(rec, args.fresh_caches)}: answers that differ {differ} of {len(got)}")
        if differ:
            sys.exit(1)


EVICTED = 64 << 20  # bytes walked before a "cold" rerank: twice the 32 MiB last-level cache here
ASLEEP = 0.003  # seconds asleep before an "idle" rerank: about what a first stage takes the cluster


def cold(args: argparse.Namespace) -> None:
    import numpy as np

    rec = _load(args.recording)
    walked = np.ones(EVICTED // 8)

    async def evict() -> None:
        walked.sum()

    async def sleep() -> None:
        time.sleep(ASLEEP)  # the whole process asleep, as when the loop waits for the cluster

    ways: dict[str, Callable[[], Any] | None] = {
        "back to back": None,
        f"after {EVICTED >> 20} MiB walked": evict,
        f"after {ASLEEP * 1000:g} ms asleep": sleep,
    }

    async def go() -> dict[str, list[tuple[float, float]]]:
        rr, first_stage, msearch = _replayer(rec, False)
        await rerank_all(rec, rr, first_stage, msearch, 1)  # unmeasured, as `replay`'s first pass
        times: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
        for _ in range(args.repeats):  # the ways take turns, a pass each
            for way, before in ways.items():
                await rerank_all(rec, rr, first_stage, msearch, 1, before=before, times=times[way])
        return times

    for way, spans in _run()(go()).items():
        whole, plan = (statistics.median(x) * 1000 for x in zip(*spans, strict=True))
        print(f"{_what(rec, False)}, {way}: a rerank p50 {whole:.3f} ms, its plan {plan:.3f} ms")


def _load(path: str) -> Recording:
    return Recording(**pickle.loads(Path(path).read_bytes()))


def count(args: argparse.Namespace) -> None:
    rec = _load(args.recording)
    total = _instructions(args.recording, args.repeats, args.fresh_caches)
    reranks = args.repeats * len(rec.queries)
    print(
        f"{_what(rec, args.fresh_caches)}, {len(rec.queries)} queries x {args.repeats}: "
        f"{total / reranks:,.0f} instructions a rerank ({total:,} in all)"
    )


def _what(rec: Recording, fresh: bool) -> str:
    caches = " (caches on, emptied each pass)" if fresh else ""
    return f"{rec.mode}{caches}, window {rec.window}, {rec.shards} shard(s)"


def _instructions(recording: str, repeats: int, fresh: bool) -> int:
    """Instructions of a `replay`'s measured passes under callgrind (counting only while `replay
    --instrument` turns it on; hash seed fixed)."""
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null"]
    argv += [sys.executable, "-m", "benchmarks.first_sight_cpu", "replay", recording, "--instrument"]
    argv += ["--repeats", str(repeats), *(["--fresh-caches"] if fresh else [])]
    done = subprocess.run(
        argv, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True
    )
    return int(re.search(r"Collected : (\d+)", done.stderr).group(1))  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out")
    rec.add_argument("--upstream", default="http://127.0.0.1:9200")
    rec.add_argument("--mode", choices=("first", "warm"), default="first")
    rec.add_argument("--window", type=int, default=100)
    rec.add_argument("--shards", type=int, default=1)
    rec.add_argument("--queries", type=int, default=50)
    rep = sub.add_parser("replay")
    rep.add_argument("recording")
    rep.add_argument("--repeats", type=int, default=1)
    rep.add_argument("--check", action="store_true", help="every answer as recorded, byte for byte")
    rep.add_argument("--fresh-caches", action="store_true", help="first: caches on, emptied each pass")
    rep.add_argument("--instrument", action="store_true", help="under callgrind: count the passes alone")
    cnt = sub.add_parser("count")
    cnt.add_argument("recording")
    cnt.add_argument("--repeats", type=int, default=3, help="passes over the queries counted")
    cnt.add_argument("--fresh-caches", action="store_true", help="first: caches on, emptied each pass")
    cld = sub.add_parser("cold")
    cld.add_argument("recording")
    cld.add_argument("--repeats", type=int, default=5, help="passes over the queries, each way")
    args = parser.parse_args()
    {"record": record, "replay": replay, "count": count, "cold": cold}[args.command](args)


if __name__ == "__main__":
    main()
