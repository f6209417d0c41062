"""Nothing written through the proxy is lost or altered.

The same writes go to two fresh indices: one straight to the engine, one through `bmx-rerank serve` (a
separate process). Phase 1 indexes most documents with `_bulk` (every 4th batch gzip-compressed),
phase 2 the rest with single `PUT /_doc/{id}`, phase 3 changes a share of them with `POST /_update/{id}`,
bulk `update` actions and bulk `delete`s. Requests within a phase run concurrently (`--workers`); each
document is touched once per phase, so the final state does not depend on their order. Then both
indices are read back (scroll) and compared: count, the set of ids, and the sha256 of every `_source`
(canonical JSON), plus the per-item statuses of every write. Documents hold unicode (CJK, emoji,
escapes, control characters), large integers, floats, nested objects and arrays.

    .venv/bin/python -m benchmarks.writes --engine http://127.0.0.1:9200 --docs 100000
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import http.client
import json
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tests.support.proxy_process import serve

BATCH = 1000
ALPHABET = 'abcdefghij ÄÖü ß é 中文字 😀🚀 "quoted" back\\slash tab\t nl\n \u0001 \u2028 <tag> &amp; \''


def make_doc(rng: random.Random, i: int) -> dict[str, Any]:
    words = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(5, 120)))
    return {
        "body": words,
        "n": i,
        "big": rng.randint(-(2**53), 2**53),
        "f": rng.uniform(-1e6, 1e6),
        "tiny": rng.random() * 1e-300,
        "flag": rng.random() < 0.5,
        "none": None,
        "tags": [rng.choice(["x", "y", "zé", "😀"]) for _ in range(rng.randint(0, 4))],
        "nested": {"a": {"b": [i, str(i), {"c": rng.random()}]}, "empty": {}},
    }


@dataclass
class Plan:
    """Every write of the run, as request bodies with the index left out of them (it is in the path)."""

    bulk: list[bytes]  # phase 1: NDJSON bodies of index/create actions
    singles: list[tuple[str, bytes]]  # phase 2: (id, source) for PUT /_doc/{id}
    updates: list[tuple[str, bytes]]  # phase 3: (id, partial-update body) for POST /_update/{id}
    bulk_changes: list[bytes]  # phase 3: bulk update and delete actions
    expected: int  # documents left at the end


def plan(n_docs: int, seed: int = 7) -> Plan:
    rng = random.Random(seed)
    ids = [f"d{i:07d}" for i in range(n_docs)]
    docs = {doc_id: make_doc(rng, i) for i, doc_id in enumerate(ids)}
    n_single = max(1, n_docs // 20)
    by_bulk, by_put = ids[:-n_single], ids[-n_single:]
    bulk = []
    for start in range(0, len(by_bulk), BATCH):
        lines = []
        for k, doc_id in enumerate(by_bulk[start : start + BATCH]):
            action = "create" if k % 10 == 0 else "index"
            lines += [
                json.dumps({action: {"_id": doc_id}}),
                json.dumps(docs[doc_id], ensure_ascii=k % 2 == 0),
            ]
        bulk.append(("\n".join(lines) + "\n").encode())
    singles = [(doc_id, json.dumps(docs[doc_id], ensure_ascii=False).encode()) for doc_id in by_put]
    touched = rng.sample(ids, max(3, n_docs // 10))
    third = len(touched) // 3
    updates = [
        (doc_id, json.dumps({"doc": {"body": f"updated {doc_id} ✓", "nested": {"u": 1}}}).encode())
        for doc_id in touched[:third]
    ]
    changes = []
    deleted = 0
    for start in range(third, len(touched), BATCH):
        lines = []
        for k, doc_id in enumerate(touched[start : start + BATCH]):
            if k % 2:
                deleted += 1
                lines.append(json.dumps({"delete": {"_id": doc_id}}))
            else:
                lines += [
                    json.dumps({"update": {"_id": doc_id}}),
                    json.dumps({"doc": {"f": -1.5, "tags": []}}),
                ]
        changes.append(("\n".join(lines) + "\n").encode())
    return Plan(bulk, singles, updates, changes, n_docs - deleted)


class Client:
    """One persistent HTTP/1.1 connection per thread."""

    def __init__(self, url: str) -> None:
        self.parts = urlsplit(url)
        self.local = threading.local()

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None):
        """(status, the answer's JSON value or None)."""
        status, raw = self.raw(method, path, body, headers)
        return status, json.loads(raw) if raw else None

    def raw(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """(status, the answer's bytes); a broken connection raises (and is opened anew next time)."""
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(
                self.parts.hostname, self.parts.port, timeout=300
            )
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
        except (http.client.HTTPException, OSError):
            self.local.conn = None
            raise
        return resp.status, raw


def _bulk_statuses(answer: dict[str, Any]) -> list[tuple[str, int]]:
    return [(next(iter(item)), next(iter(item.values()))["status"]) for item in answer["items"]]


def write_all(client: Client, index: str, p: Plan, workers: int) -> tuple[list[Any], dict[str, float]]:
    """Send every write of the plan to `index`; return what each write answered and each phase's seconds."""
    ndjson = {"Content-Type": "application/x-ndjson"}
    gz = {**ndjson, "Content-Encoding": "gzip"}

    def bulk(k_body: tuple[int, bytes]) -> Any:
        k, body = k_body
        data, headers = (gzip.compress(body), gz) if k % 4 == 3 else (body, ndjson)
        status, answer = client.call("POST", f"/{index}/_bulk", data, headers)
        assert status == 200 and not answer["errors"], (status, str(answer)[:300])
        return ("bulk", status, _bulk_statuses(answer))

    def put(item: tuple[str, bytes]) -> Any:
        status, answer = client.call("PUT", f"/{index}/_doc/{item[0]}", item[1])
        return ("put", status, answer.get("result") if isinstance(answer, dict) else answer)

    def update(item: tuple[str, bytes]) -> Any:
        status, answer = client.call("POST", f"/{index}/_update/{item[0]}", item[1])
        return ("update", status, answer.get("result") if isinstance(answer, dict) else answer)

    def phase(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(fn, items))

    seconds: dict[str, float] = {}
    out: list[Any] = []
    for name, fn, items in [
        ("bulk", bulk, list(enumerate(p.bulk))),
        ("put", put, p.singles),
        ("update", update, p.updates),
        ("bulk_changes", bulk, list(enumerate(p.bulk_changes))),
    ]:
        start = time.perf_counter()
        out += phase(fn, items)
        seconds[name] = time.perf_counter() - start
    client.call("POST", f"/{index}/_refresh")
    return out, seconds


def digests(client: Client, index: str) -> dict[str, str]:
    """sha256 of every document's _source (canonical JSON), by id, read with a scroll."""
    out: dict[str, str] = {}
    body = json.dumps({"size": 5000, "sort": ["_doc"], "query": {"match_all": {}}}).encode()
    status, answer = client.call("POST", f"/{index}/_search?scroll=2m", body)
    assert status == 200, answer
    while answer["hits"]["hits"]:
        for hit in answer["hits"]["hits"]:
            canon = json.dumps(hit["_source"], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
            out[hit["_id"]] = hashlib.sha256(canon.encode()).hexdigest()
        scroll = json.dumps({"scroll": "2m", "scroll_id": answer["_scroll_id"]}).encode()
        status, answer = client.call("POST", "/_search/scroll", scroll)
        assert status == 200, answer
    client.call("DELETE", "/_search/scroll", json.dumps({"scroll_id": answer["_scroll_id"]}).encode())
    return out


@dataclass
class Outcome:
    docs_planned: int
    expected: int
    count_direct: int
    count_proxied: int
    missing: int  # ids direct has and the proxied index lacks
    extra: int
    differing: int  # same id, different _source
    answers_differing: int  # writes whose per-item statuses/results differ
    total_sha256_direct: str
    total_sha256_proxied: str
    seconds_direct: dict[str, float]
    seconds_proxied: dict[str, float]

    @property
    def identical(self) -> bool:
        return (
            self.count_direct == self.count_proxied == self.expected
            and not (self.missing or self.extra or self.differing or self.answers_differing)
            and self.total_sha256_direct == self.total_sha256_proxied
        )


def _total(d: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{k} {v}\n" for k, v in sorted(d.items())).encode()).hexdigest()


def run(engine: str, proxy: str, n_docs: int, workers: int = 4) -> Outcome:
    """Write the plan directly and through `proxy`, read both back, compare."""
    p = plan(n_docs)
    direct, via = Client(engine), Client(proxy)
    tag = uuid.uuid4().hex[:8]
    a, b = f"bmxtest-writes-direct-{tag}", f"bmxtest-writes-proxied-{tag}"
    # dynamic: false: values of mixed types in one array are kept in _source, not mapped
    mappings = {"dynamic": False, "properties": {"body": {"type": "text"}, "n": {"type": "long"}}}
    settings = json.dumps(
        {"settings": {"number_of_shards": 2, "number_of_replicas": 0}, "mappings": mappings}
    ).encode()
    try:
        for name in (a, b):
            assert direct.call("PUT", f"/{name}", settings)[0] == 200
        answers_a, secs_a = write_all(direct, a, p, workers)
        answers_b, secs_b = write_all(via, b, p, workers)
        da, db = digests(direct, a), digests(direct, b)
        count = {name: direct.call("GET", f"/{name}/_count")[1]["count"] for name in (a, b)}
        return Outcome(
            docs_planned=n_docs,
            expected=p.expected,
            count_direct=count[a],
            count_proxied=count[b],
            missing=len(da.keys() - db.keys()),
            extra=len(db.keys() - da.keys()),
            differing=sum(1 for k in da.keys() & db.keys() if da[k] != db[k]),
            answers_differing=sum(1 for x, y in zip(answers_a, answers_b, strict=True) if x != y),
            total_sha256_direct=_total(da),
            total_sha256_proxied=_total(db),
            seconds_direct=secs_a,
            seconds_proxied=secs_b,
        )
    finally:
        for name in (a, b):
            direct.call("DELETE", f"/{name}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", default="http://127.0.0.1:9200")
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    with serve(args.engine) as proxy:
        out = run(args.engine, proxy.url, args.docs, args.workers)
        rss = proxy.rss_kib() / 1024
        peak = proxy.peak_kib() / 1024
    print(json.dumps({**out.__dict__, "identical": out.identical}, indent=2))
    total_a, total_b = sum(out.seconds_direct.values()), sum(out.seconds_proxied.values())
    print(
        f"\n| engine | docs written | expected: count direct / proxied | ids missing / extra | _source differing | "
        f"write answers differing | sha256 (all _source) equal | s direct / proxied | proxy RSS end / peak MiB |\n"
        f"|---|---|---|---|---|---|---|---|---|\n"
        f"| {args.engine} | {out.docs_planned:,} | {out.expected:,}: {out.count_direct:,} / {out.count_proxied:,} | "
        f"{out.missing} / {out.extra} | {out.differing} | {out.answers_differing} | "
        f"{out.total_sha256_direct == out.total_sha256_proxied} (`{out.total_sha256_direct[:12]}`) | "
        f"{total_a:.1f} / {total_b:.1f} | {rss:.0f} / {peak:.0f} |"
    )
    sys.exit(0 if out.identical else 1)


if __name__ == "__main__":
    main()
