"""Where a reranked search's time goes: the proxy's own metrics (time per upstream call) and a
pyinstrument profile of the proxy process (the measured requests alone), for warm or first-sight reranks of one window size, or for searches passed through.

    .venv/bin/python -m benchmarks.profile_rerank --upstream http://127.0.0.1:9200 --window 100 \
        --mode warm|first|passthrough [--requests 200] [--repeats 1] [--shards 1] [--fields body]
        [--in-engine] [--profile-out /tmp/profile.txt]

Indexes SciFact into a fresh `bmxtest-proxy-prof-*` index (as benchmarks/proxy_latency.py does), runs
the proxy in a child process under pyinstrument, sends `--requests` reranks one at a time (warm: each
query `--repeats` times before, unmeasured; first: every cache off) and prints, per request: the whole rerank as
the proxy timed it, each upstream call, and the proxy's own time (the rest); then the profile's top.
`--in-engine`: the index has `serve --in-engine`'s length sub-field and the proxy scores there where it
can (OpenSearch with painless and token_count)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from benchmarks.proxy_latency import (
    Http,
    _no_analysis_cache,
    cache_option,
    engine_cpu,
    index_corpus,
    process_cpu,
    rerank,
    shard_count,
    stats_source,
    sweep_stats,
)
from tests.support.data import scifact_records
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[1]
# counters printed as they are: how windows went lean, first stages probed from guessed tokens, and
# where frequencies came from
COUNTED = ("bmx_lean_windows_total", "bmx_token_guesses_total", "bmx_tf_windows_total", "bmx_in_engine_total")


def child(upstream: str, index: str, port: int, caches: bool, out: str) -> None:
    from bmx_rerank.proxy import ProxyConfig, make_app
    from bmx_rerank.proxy.server import ConnectionLimits, serve_forever

    # the length table too, mapped (keyed by version on one shard) as the statistics cache serves it
    stats = stats_source(index, *sweep_stats(upstream, index), shard_count(upstream, index))
    in_engine = os.environ.get("BMX_RERANK_IN_ENGINE") == "1"  # as `serve` reads it
    options = cache_option(caches == "1" if isinstance(caches, str) else caches)
    app = make_app(ProxyConfig(upstream=upstream, in_engine=in_engine, **options), lambda s, b: stats)
    if not caches:
        app.on_startup.append(_no_analysis_cache)
    import uvloop

    uvloop.install()
    profiler = None
    if out:  # else no profiler: the proxy's own CPU per request, undisturbed
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)

        async def start(_app) -> None:  # on SIGUSR1, sent once the unmeasured warm-up is done
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, profiler.start)

        app.on_startup.append(start)
    print("ready", flush=True)
    serve_forever(app, "127.0.0.1", port, limits=ConnectionLimits())
    if profiler is not None:
        if profiler.is_running:
            profiler.stop()
        Path(out).write_text(profiler.output_text(unicode=False, color=False, show_all=False))


def metric_sums(text: str) -> dict[str, tuple[float, float]]:
    """(sum seconds, count) of each timed series of the proxy's metrics."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = re.match(r'bmx_(upstream|rerank)_seconds_(sum|count)(?:\{call="(\w+)"\})? ([0-9.e+-]+)', line)
        if m:
            key = m.group(3) or "whole rerank"
            out.setdefault(key, [0.0, 0.0])["sum count".split().index(m.group(2))] = float(m.group(4))
    return {k: (v[0], v[1]) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:9200")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--shards", type=int, default=1, help="primary shards of the SciFact index")
    parser.add_argument("--mode", choices=("warm", "first", "passthrough"), default="warm")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--repeats", type=int, default=1, help="warm: times each query goes before it is measured"
    )
    parser.add_argument(
        "--in-engine", action="store_true", help="serve --in-engine, the index's length sub-field"
    )
    parser.add_argument("--profile-out", default="/tmp/bmx-rerank-profile.txt", help='"": no profiler')
    parser.add_argument(
        "--fields", help="a field every search also asks for in `fields` (a page the page cache never keeps)"
    )
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        upstream, index, port, caches, out = args.child
        child(upstream, index, int(port), caches == "1", out)
        return
    engine = Http(args.upstream)
    index = f"bmxtest-proxy-prof-{uuid.uuid4().hex[:8]}"
    index_corpus(
        engine, index, scifact_records("corpus.jsonl", 0), shards=args.shards, lengths=args.in_engine
    )
    queries = [q["text"] for q in scifact_records("queries.jsonl", 0)][: args.requests]
    port = free_port()
    caches = "1" if args.mode == "warm" else "0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.profile_rerank", "--child", args.upstream, index, str(port)]
        + [caches, args.profile_out],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "BMX_RERANK_IN_ENGINE": "1" if args.in_engine else "0"},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        proxy = Http(f"http://127.0.0.1:{port}")
        path = f"/{index}/_search"

        shown = {"fields": [args.fields]} if args.fields else {}

        def ask(q: str) -> dict:
            if args.mode == "passthrough":  # the same search without ext.bmx: forwarded untouched
                return {"query": {"match": {"body": q}}, "size": 10} | shown
            return rerank(q, args.window) | shown

        if args.mode != "first":
            for _ in range(args.repeats):
                for q in queries:
                    proxy.ok("POST", path, ask(q))
        before = metric_sums(proxy.ok_text("GET", "/_bmx/metrics"))
        if args.profile_out:  # the profile covers the measured requests alone
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
        cpu_before = (process_cpu(proc.pid), engine_cpu(args.upstream), time.process_time())
        kernel_before = process_cpu(proc.pid, kernel=True)
        start = time.perf_counter()
        for q in queries:
            proxy.ok("POST", path, ask(q))
        wall = (time.perf_counter() - start) / len(queries) * 1000
        cpu_after = (process_cpu(proc.pid), engine_cpu(args.upstream), time.process_time())
        kernel = (process_cpu(proc.pid, kernel=True) - kernel_before) * 1000 / len(queries)
        text = proxy.ok_text("GET", "/_bmx/metrics")
        after = metric_sums(text)
        counts = [line for line in text.splitlines() if line.startswith(COUNTED)]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        engine.call("DELETE", f"/{index}")
    n = len(queries)
    print(f"{args.mode} reranks, window {args.window}, {n} requests, load average {os.getloadavg()[0]:.1f}")
    print(f"client-side mean: {wall:.2f} ms/request")
    cpu = [(b - a) * 1000 / n for a, b in zip(cpu_before, cpu_after, strict=True)]
    print(
        f"CPU per request: proxy {cpu[0]:.2f} ms{' (under the profiler)' if args.profile_out else ''} "
        f"({kernel:.2f} ms of it in the kernel), "
        f"engine {cpu[1]:.2f} ms, "
        f"client {cpu[2]:.2f} ms"
    )
    whole = (after["whole rerank"][0] - before.get("whole rerank", (0, 0))[0]) * 1000 / n
    print(f"proxy-timed rerank (first stage included): {whole:.2f} ms/request")
    for key, (total, count) in sorted(after.items()):
        if key == "whole rerank":
            continue
        t0, c0 = before.get(key, (0.0, 0.0))
        if count - c0:
            print(f"  upstream {key:<12} {(total - t0) * 1000 / n:7.2f} ms/request ({int(count - c0)} calls)")
    for line in counts:  # since the proxy started, the unmeasured requests included
        print(f"  {line}")
    if args.profile_out:
        print(f"profile of the proxy process: {args.profile_out}")


if __name__ == "__main__":
    main()
