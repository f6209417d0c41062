"""Two versions of the proxy side by side against one engine, interleaved query by query: p50 of a
reranked search (window 100, one client; `passthrough`: the plain size-10 search, not reranked;
`fresh`: first sights of a proxy whose caches are on, each query asked once; `pair`: such a first
sight and its repeat sent at once after it, timed together and apart) through each, next to a
plain search of the window (of 10 for `passthrough`), and
each proxy's CPU per request, and how many answers the two versions gave differently (anything in
the body but the cluster's `took`, or the `X-BMX-Rerank` header).
What changed in the code, apart from what changed in the machine. The two proxies take turns to go
first (whichever goes second is faster).

    .venv/bin/python -m benchmarks.ab_proxies OLD_CHECKOUT NEW_CHECKOUT [--mode warm|first|fresh|pair|passthrough]
        [--window 100] [--queries 120] [--upstream http://127.0.0.1:9200] [--shards 1] [--pin]
        [--fields body] [--dataset scifact] [--caches off,on]

`--pin`: the engine on core 0, the proxies and this client on the others (a sidecar with cores of its
own), instead of every process on every core.

Each checkout runs its own `python -m benchmarks.proxy_latency --serve-child` (statistics swept by that
version; `first`: every cache off) with its own code and the interpreter at CHECKOUT/.venv."""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.proxy_latency import Http, Proxy, index_corpus, pinned, plain, rerank
from tests.support.data import beir_records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkouts", nargs=2)
    parser.add_argument("--mode", choices=("warm", "first", "fresh", "pair", "passthrough"), default="warm")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--queries", type=int, default=120)
    parser.add_argument("--upstream", default="http://127.0.0.1:9200")
    parser.add_argument("--shards", type=int, default=1, help="primary shards of the index")
    parser.add_argument(
        "--dataset", default="scifact", help="the BEIR dataset indexed and asked (../shared/data)"
    )
    parser.add_argument(
        "--caches",
        choices=("off,on", "on,off", "on,on", "off,off"),
        help="each proxy's caches, in the order of the checkouts (`off,on` with one checkout twice: what "
        "the caches cost a first sight); else on for warm and fresh, off for first and passthrough",
    )
    parser.add_argument("--pin", action="store_true", help="the engine on core 0, the rest on the others")
    parser.add_argument(
        "--fields", help="a field every search also asks for in `fields` (a page the page cache never keeps)"
    )
    args = parser.parse_args()
    with pinned(args.upstream) if args.pin else contextlib.nullcontext():
        compare(args)


def compare(args: argparse.Namespace) -> None:
    engine = Http(args.upstream)
    index = f"bmxtest-ab-{uuid.uuid4().hex[:8]}"
    index_corpus(engine, index, beir_records(args.dataset, "corpus.jsonl"), shards=args.shards)
    proxies: list[Proxy] = []
    try:
        cached = args.mode in ("warm", "fresh", "pair")
        caches = [c == "on" for c in args.caches.split(",")] if args.caches else [cached, cached]
        for checkout, on in zip(args.checkouts, caches, strict=True):
            proxies.append(
                Proxy(
                    args.upstream,
                    index,
                    caches=on,
                    workers=1,
                    loop="uvloop",
                    checkout=Path(checkout).resolve(),
                )
            )
        conns = [Http(proxy.url) for proxy in proxies]
        path = f"/{index}/_search"
        queries = [q["text"] for q in beir_records(args.dataset, "queries.jsonl", args.queries)]
        shown = {"fields": [args.fields]} if args.fields else {}
        if args.mode == "warm":
            for q in queries:
                for conn in conns:
                    conn.ok("POST", path, rerank(q, args.window) | shown)
        direct: list[float] = []
        through: list[list[float]] = [[], []]
        apart: list[list[tuple[float, float]]] = [[], []]  # `pair`: the first sight's time, its repeat's
        before = [proxy.cpu() for proxy in proxies]
        differ = 0  # searches the two versions answered with other hits or other scores
        passthrough = args.mode == "passthrough"
        size = 10 if passthrough else args.window
        half = len(queries) // 2
        # each query twice, or (`fresh`) each once: its first sight
        once = args.mode in ("fresh", "pair")
        passes = [queries[:half], queries[half:]] if once else [queries, queries]
        for asked in passes:
            for q in asked:
                start = time.perf_counter()
                engine.ok("POST", path, plain(q, size) | shown)
                direct.append(time.perf_counter() - start)
                answers = []
                # the two in turn first: whichever goes second is faster (an A/A run of one checkout
                # twice, always in the same order: the second 0.16-0.21 ms at p50 and 0.09-0.12 ms of
                # CPU less, benchmarks/RESULTS.md), so each goes first for half the queries
                turn = list(enumerate(conns))
                for k, conn in turn if len(direct) % 2 else turn[::-1]:
                    start = time.perf_counter()
                    answer = _ask(
                        conn, path, (plain(q, 10) if passthrough else rerank(q, args.window)) | shown
                    )
                    if args.mode == "pair":  # its repeat at once, as a user paging back would send it
                        mid = time.perf_counter()
                        repeat = _ask(conn, path, rerank(q, args.window) | shown)
                        apart[k].append((mid - start, time.perf_counter() - mid))
                        assert repeat[1]["hits"] == answer[1]["hits"], "the repeat answered otherwise"
                    through[k].append(time.perf_counter() - start)
                    assert passthrough or answer[1]["_bmx"]["reranked"] is True, answer[1]["_bmx"]
                    answers.append(answer)
                differ += not _same_answer(*answers)
        after = [proxy.cpu() for proxy in proxies]
        base = statistics.median(direct) * 1000
        print(
            f"{args.dataset}, {args.mode}, window {args.window}, {args.shards} shard(s), {len(direct)} searches each"
            f"{', the engine on core 0' if args.pin else ''}; plain size-{size}: {base:.2f} ms"
        )
        for k, checkout in enumerate(args.checkouts):
            p50 = statistics.median(through[k]) * 1000
            cpu = (after[k] - before[k]) * 1000 / len(through[k])
            if args.caches:
                checkout += f" (caches {'on' if caches[k] else 'off'})"
            print(f"  {checkout}: p50 {p50:.2f} ms ({p50 / base:.2f}x), proxy CPU {cpu:.2f} ms/request")
            if apart[k]:
                first, repeat = (statistics.median(t) * 1000 for t in zip(*apart[k], strict=True))
                print(f"    the pair apart: first sight p50 {first:.2f} ms, its repeat p50 {repeat:.2f} ms")
        print(f"  answers that differ between the two (anything but `took`): {differ} of {len(direct)}")
    finally:
        for proxy in proxies:
            proxy.stop()
        engine.call("DELETE", f"/{index}")


Answered = tuple[int, dict[str, Any], str | None]  # status, body, the X-BMX-Rerank header


def _ask(conn: Http, path: str, body: dict[str, Any]) -> Answered:
    """A search through `conn`, with the header that says what the proxy did."""
    conn.conn.request(
        "POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    resp = conn.conn.getresponse()
    raw = resp.read()
    if resp.status >= 300:
        raise RuntimeError(f"POST {path} -> {resp.status}: {raw[:300]!r}")
    return resp.status, json.loads(raw), resp.getheader("X-BMX-Rerank")


def _same_answer(a: Answered, b: Answered) -> bool:
    """The same status, header and body, exactly (hits, their order and every field of each, scores to
    the last bit, totals, aggregations, the marker), but for the cluster's own `took`."""
    return (a[0], a[2], {**a[1], "took": None}) == (b[0], b[2], {**b[1], "took": None})


if __name__ == "__main__":
    main()
