"""How often a first sight's even shares fall short on real data: a BEIR dataset indexed over N shards
(routed by `_id`), each query's window searched on each shard whole, and each shard's hits cut to
what a first sight asks it for (`shards.shard_sizes`) at several margins (`EVEN_SPREAD`, in standard
deviations of a shard's count were its hits spread by chance); a window whose cut shares do not hold
it (`shards.hold_window`, as the proxy checks) costs the shards' searches again. Windows with fewer
hits than their size are left out (every shard sends all it has). No proxy; the engine alone. Last,
how often first sights short that often would mark the index uneven by chance (`shards.ShortShares`:
then its first sights ask every shard for the whole window for ten minutes), simulated.

    .venv/bin/python -m benchmarks.shard_shares [--upstream http://127.0.0.1:9200] [--dataset scifact]
        [--shards 3] [--window 100] [--queries 0]
    .venv/bin/python -m benchmarks.shard_shares --upstream URL --index YOURS --field FIELD \
        --queries-file QUERIES.jsonl [--window 100]     # an index of your own, as it is
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import numpy as np
import orjson

from benchmarks.proxy_latency import Http, index_corpus
from bmx_rerank.rerank import shards
from tests.support.data import beir_records

SPREADS = (2.5, 3.0, 3.5, 4.0, 5.0)
SIMULATED = 10_000_000  # first sights simulated for how often the index would be marked uneven by chance


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:9200")
    parser.add_argument("--dataset", default="scifact", help="a BEIR dataset of ../shared/data")
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--queries", type=int, default=0, help="the first N queries (0: all)")
    parser.add_argument(
        "--index",
        help="an index of your own, searched as it is (its shards, its routing), instead of the dataset's "
        "corpus indexed anew; with --field and the dataset's queries or --queries-file",
    )
    parser.add_argument("--field", default="body", help="the field a `match` query searches")
    parser.add_argument("--queries-file", help="queries, one JSON object with a `text` a line (BEIR)")
    args = parser.parse_args()
    engine = Http(args.upstream)
    if args.queries_file:
        with open(args.queries_file) as fh:
            texts = [orjson.loads(line)["text"] for line in fh if line.strip()]
        texts = texts[: args.queries or None]
    else:
        texts = [q["text"] for q in beir_records(args.dataset, "queries.jsonl", args.queries)]
    if args.index:
        index = args.index
        found = engine.ok("GET", f"/{index}/_settings")  # by its concrete name (an alias's index's)
        if len(found) != 1:
            parser.error(f"--index names {len(found)} indices; one (or an alias of one) is searched")
        args.shards = int(next(iter(found.values()))["settings"]["index"]["number_of_shards"])
        windows = list(shard_windows(engine, index, args, texts))
    else:
        index = f"bmxtest-shares-{uuid.uuid4().hex[:8]}"
        index_corpus(engine, index, beir_records(args.dataset, "corpus.jsonl"), shards=args.shards)
        try:
            windows = list(shard_windows(engine, index, args, texts))
        finally:
            engine.call("DELETE", f"/{index}")
    asked, short = {}, {}
    for spread in SPREADS:
        sizes = shards.shard_sizes({"size": args.window}, None, args.shards, spread)
        assert sizes is not None
        asked[spread] = sizes[0]
        short[spread] = sum(not shards.hold_window(cut(w, sizes), sizes, args.window) for w in windows)
    print(
        f"{args.index or args.dataset}, {args.shards} shards, window {args.window}: {len(windows)} full"
        f" windows of {len(texts)} queries"
    )
    print("| spread (deviations) | hits asked of each shard | windows whose shares fall short |")
    print("|---|---|---|")
    for spread in SPREADS:
        mark = " (shipped)" if spread == shards.EVEN_SPREAD else ""
        share = short[spread] / max(1, len(windows))
        print(f"| {spread}{mark} | {asked[spread]} | {short[spread]} ({share:.2%}) |")
    rate = short[shards.EVEN_SPREAD] / max(1, len(windows))
    marked = marked_by_chance(rate)
    print(
        f"first sights short this often ({rate:.2%}) mark the index uneven "
        f"({shards.UNEVEN_SHORTS} of its last {shards.UNEVEN_OF}) "
        + (f"once in {marked:,.0f} first sights" if marked else f"never in {SIMULATED:,} first sights")
        + " (simulated)"
    )


def marked_by_chance(rate: float) -> float | None:
    """How many first sights, each short with probability `rate` on its own, go by for each time the
    index is marked uneven: `UNEVEN_SHORTS` short among the last `UNEVEN_OF` since it was last marked
    (`shards.ShortShares`, whose record starts over at a mark). A simulation of `SIMULATED` first
    sights (or as many as 10,000 marks take), scanned a chunk at a time; None if never marked."""
    draws = np.random.default_rng(0).random(SIMULATED) < rate
    total = np.concatenate([[0], np.cumsum(draws)])  # total[j]: shorts among the first j
    since = scanned = marks = 0  # the first sight the record starts at; how far scanned; marks
    while scanned < SIMULATED and marks < 10_000:  # (enough marks to say how often)
        seen = np.arange(scanned + 1, min(SIMULATED, scanned + 4096) + 1)  # after each of these
        last = total[seen] - total[np.maximum(since, seen - shards.UNEVEN_OF)]
        over = np.flatnonzero(last >= shards.UNEVEN_SHORTS)
        if over.size:
            marks += 1
            since = scanned = int(seen[over[0]])
        else:
            scanned = int(seen[-1])
    return scanned / marks if marks else None


def shard_windows(engine: Http, index: str, args: argparse.Namespace, texts: list[str]) -> Any:
    """Each query's answers of each shard, asked for the whole window: those of full windows."""
    for text in texts:
        body = {"query": {"match": {args.field: text}}, "size": args.window, "_source": False}
        answers = [
            engine.ok("POST", f"/{index}/_search?preference=_shards:{i}", body) for i in range(args.shards)
        ]
        if sum(len(a["hits"]["hits"]) for a in answers) >= args.window:
            yield answers


def cut(answers: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """Each shard's answer as if asked for `sizes[i]` hits: its first ones."""
    return [{"hits": {"hits": a["hits"]["hits"][:n]}} for a, n in zip(answers, sizes, strict=True)]


if __name__ == "__main__":
    main()
