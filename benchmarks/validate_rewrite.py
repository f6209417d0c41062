"""Letting the cluster parse: what `_validate/query?rewrite=true` would cost, and how exact it is.

Planning could hand `query_string` (and fuzzy expansions) to the cluster's own parser: the rewritten
Lucene query names analyzed `field:term` pairs. This measures that option on SciFact (title + text,
3 shards) for each engine, one request at a time, interleaved per query:
  search            the query_string search itself (size 10), the first stage the rewrite would join
  rewrite           `_validate/query?rewrite=true` of the same query_string
  rewrite fuzzy     `_validate/query?rewrite=true` of a `match` with `fuzziness: AUTO` on `text`
  rewrite fuzzy all the same with `all_shards=true` (every shard's expansions)
and, for exactness, how many fuzzy queries expand to other terms on one shard than on all of them (one
shard is what the rewrite inspects by default). Prints Markdown tables.

    .venv/bin/python -m benchmarks.validate_rewrite [--engines es,os] [--queries 100] [--docs 0]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics as pystats
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from tests.support.data import SCIFACT

ENGINES = {"es": "http://127.0.0.1:9200", "os": "http://127.0.0.1:9201"}
TERM = re.compile(r"\btext:([^\s()^~]+)")


def call(url: str, method: str, path: str, body: Any = None, ndjson: str | None = None) -> Any:
    data = ndjson.encode() if ndjson is not None else (None if body is None else json.dumps(body).encode())
    ctype = "application/x-ndjson" if ndjson is not None else "application/json"
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=120) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def index_corpus(url: str, root: Path, docs: int) -> str:
    name = f"bmxtest-rewrite-{uuid.uuid4().hex[:10]}"
    mappings = {"properties": {"title": {"type": "text"}, "text": {"type": "text"}}}
    settings = {"number_of_shards": 3, "number_of_replicas": 0}
    call(url, "PUT", f"/{name}", {"settings": settings, "mappings": mappings})
    lines: list[str] = []
    with (root / "corpus.jsonl").open() as f:
        for i, line in enumerate(f):
            if docs and i >= docs:
                break
            doc = json.loads(line)
            lines += [
                json.dumps({"index": {"_id": doc["_id"]}}),
                json.dumps({"title": doc["title"], "text": doc["text"]}),
            ]
            if len(lines) >= 2000:
                call(url, "POST", f"/{name}/_bulk", ndjson="\n".join(lines) + "\n")
                lines = []
    if lines:
        call(url, "POST", f"/{name}/_bulk", ndjson="\n".join(lines) + "\n")
    call(url, "POST", f"/{name}/_refresh")
    return name


def queries(root: Path, n: int) -> list[str]:
    with (root / "queries.jsonl").open() as f:
        texts = [json.loads(line)["text"] for line in f]
    # Plain words only: the subset both the pure reading and the cluster's parser take.
    plain = [re.sub(r"[^\w\s]", " ", t) for t in texts]
    return plain[:n]


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - start) * 1000, out


def run(url: str, root: Path, n_queries: int, docs: int) -> dict[str, Any]:
    index = index_corpus(url, root, docs)
    times: dict[str, list[float]] = {
        k: [] for k in ("search", "rewrite", "rewrite fuzzy", "rewrite fuzzy all")
    }
    differ = 0
    answers: dict[str, Any] = {}
    try:
        for text in queries(root, n_queries):
            qs = {"query": {"query_string": {"query": text, "fields": ["title", "text"]}}}
            fuzzy = {"query": {"match": {"text": {"query": text, "fuzziness": "AUTO"}}}}
            rewrite = f"/{index}/_validate/query?rewrite=true"
            for name, path, body in (
                ("search", f"/{index}/_search", {**qs, "size": 10}),
                ("rewrite", rewrite, qs),
                ("rewrite fuzzy", rewrite, fuzzy),
                ("rewrite fuzzy all", rewrite + "&all_shards=true", fuzzy),
            ):
                ms, answers[name] = timed(call, url, "POST", path, body)
                times[name].append(ms)
            one, every = answers["rewrite fuzzy"], answers["rewrite fuzzy all"]
            one_terms = {t for e in one["explanations"] for t in TERM.findall(e.get("explanation", ""))}
            all_terms = {t for e in every["explanations"] for t in TERM.findall(e.get("explanation", ""))}
            differ += one_terms != all_terms
    finally:
        call(url, "DELETE", f"/{index}")
    return {"times": times, "differ": differ, "queries": n_queries}


def table(kind: str, result: dict[str, Any]) -> str:
    base = pystats.median(result["times"]["search"])
    rows = [f"| {kind} | what | p50 ms | mean ms | p50 / search |", "|---|---|---|---|---|"]
    for name, values in result["times"].items():
        p50 = pystats.median(values)
        rows.append(f"| | {name} | {p50:.2f} | {pystats.fmean(values):.2f} | {p50 / base:.2f} |")
    rows.append(
        f"| | fuzzy expansions differ, one shard vs all | {result['differ']} of {result['queries']} queries | | |"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--engines", default="es,os")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--docs", type=int, default=0, help="index only the first N documents (0: all)")
    parser.add_argument("--es-url", default=ENGINES["es"])
    parser.add_argument("--os-url", default=ENGINES["os"])
    parser.add_argument("--data", type=Path, default=SCIFACT)
    args = parser.parse_args(argv)
    urls = {"es": args.es_url, "os": args.os_url}
    out = {}
    for kind in args.engines.split(","):
        out[kind] = run(urls[kind], args.data, args.queries, args.docs)
        print(table(kind, out[kind]), flush=True)
    return out


if __name__ == "__main__":
    main()
