"""Bad input at scale: the generator of tests/unit/test_fuzz_proxy.py (tests/support/fuzz_strategies)
for `--examples` requests, plus the fixed raw-HTTP, deep-nesting, extreme-parameter and gzip-bomb cases, against the real
proxy app with a fake cluster behind it, both in a child process whose peak RSS (VmHWM) is reported.

Counts every answer by status; a problem is a 5xx the sidecar made itself (the fake cluster tags its
own answers), a rejection of the sidecar's not in Elasticsearch's error shape, no answer at all, or a
reranked 200 with a non-finite score. Exit status 1 when there is any.

    .venv/bin/python -m benchmarks.fuzz --examples 10000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from collections import Counter

from hypothesis import HealthCheck, Phase, given, settings

from tests.support.fuzz_strategies import requests
from tests.support.fuzzing import RAW_HTTP, Raw, Servers, bmx_body, gzip_bomb, nest, problems, running, send
from tests.support.proxy_process import proc_status

EXTREMES = [
    {"alpha": 1e308},
    {"beta": 1e308},
    {"k1": 1e308, "mode": "bm25"},
    {"window_size": 10**9},
    {"augment": {"queries": ["t0"] * 5000, "weights": [0.5] * 5000}},
    {"augment": {"queries": ["t0"], "weights": [1e308]}},
]


def child(port_out: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    with running() as servers:
        port_out.put(servers.proxy_port)
        stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    ports: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    stop = ctx.Event()
    proc = ctx.Process(target=child, args=(ports, stop), daemon=True)
    proc.start()
    servers = Servers(proxy_port=ports.get(timeout=60))
    start_rss = proc_status(proc.pid)["VmRSS"]
    statuses: Counter[int] = Counter()
    found: list[str] = []
    sent = 0

    def check(raw: Raw | None, answer_of: Raw | bytes) -> None:
        nonlocal sent
        sent += 1
        answer = send(servers, answer_of)
        statuses[answer.status] += 1
        for problem in problems(raw, answer):
            found.append(f"{problem} <- {raw.describe() if raw else repr(answer_of[:120])}")

    t0 = time.perf_counter()
    for wire in RAW_HTTP.values():
        check(None, wire.encode("latin-1"))
    for where in ("bmx", "query", "objects", "bare"):
        for depth in (254, 600, 1000, 5000, 20000):
            raw = Raw("POST", "/docs/_search", (("Content-Type", "application/json"),), nest(depth, where))
            check(raw, raw)
    for bmx in EXTREMES:
        raw = Raw("POST", "/docs/_search", (("Content-Type", "application/json"),), bmx_body(**bmx))
        check(raw, raw)
    for inflated in (64 << 20, 400 << 20):
        headers = (("Content-Type", "application/json"), ("Content-Encoding", "gzip"))
        raw = Raw("POST", "/docs/_search", headers, gzip_bomb(inflated))
        check(raw, raw)

    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=args.seed == 0,
    )
    @given(raw=requests())
    def generated(raw: Raw) -> None:
        check(raw, raw)

    generated()
    seconds = time.perf_counter() - t0
    mem = proc_status(proc.pid)
    stop.set()
    proc.join(30)
    report = {
        "requests": sent,
        "seconds": round(seconds, 1),
        "statuses": dict(sorted(statuses.items())),
        "problems": len(found),
        "proxy_rss_start_mib": round(start_rss / 1024, 1),
        "proxy_rss_end_mib": round(mem["VmRSS"] / 1024, 1),
        "proxy_rss_peak_mib": round(mem["VmHWM"] / 1024, 1),
    }
    print(json.dumps(report, indent=2))
    for line in found[:40]:
        print(line)
    sidecar_5xx = sum(1 for f in found if f.startswith("sidecar answered 5"))
    shape = sum(1 for f in found if "not in Elasticsearch's error shape" in f)
    print(
        f"\n| requests | of them generated | sidecar 5xx | rejections not in ES shape | other problems | "
        f"statuses | proxy RSS start → end (peak) MiB | s |\n|---|---|---|---|---|---|---|---|\n"
        f"| {sent:,} | {args.examples:,} | {sidecar_5xx} | {shape} | {len(found) - sidecar_5xx - shape} | "
        f"{' '.join(f'{k}:{v}' for k, v in sorted(statuses.items()))} | {report['proxy_rss_start_mib']} → "
        f"{report['proxy_rss_end_mib']} ({report['proxy_rss_peak_mib']}) | {seconds:.0f} |"
    )
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
