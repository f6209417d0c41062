"""A real two-node cluster loses a node under load, behind the proxy: nothing acknowledged is lost, every
request is answered in the cluster's shape, and reranked rankings stay exact before, during and after.

The cluster: two processes of one distribution (`bmx_rerank.testing.cluster`), node 0 master-eligible
and data, node 1 data-only. Node 1 is the one killed (`kill -9`): it can never be the elected master, so
the cluster keeps its master and goes on serving; with two master-eligible nodes, one of them would be
alone in the voting configuration and losing it would stop the cluster, which is a test of the
cluster, not of the proxy. Two indices of 2 shards and 1 replica, whose primaries are all put on node 1
before their replicas are added on node 0: when node 1 dies, every primary dies with it, and every write
acknowledged before lives on only in a replica promoted on node 0.
  - `search`: 300 generated documents (60 words, Zipf-distributed), exact statistics built into a store
    index of its own; reranked searches ask for a window covering every match, so the ranking does not
    depend on which copy of a shard answered the first stage, and each answer is compared with BMX
    computed here from the documents' words (tests/support/naive.py), to 1e-6.
  - `writes`: what the writers send, `_bulk` of 20 documents and single `PUT /_doc/{id}`.
The proxy (`bmx-rerank serve`, a separate process) has both nodes as `--upstream`. Writer and searcher
threads run for `--seconds`; node 1 is killed at `--kill-at` of the run. Afterwards every acknowledged
write (HTTP 2xx, and for a bulk the item's own 2xx) is read back by id through the proxy (`_mget`) and
its `_source` compared; every answer that is not 2xx must be in Elasticsearch's error shape.

    .venv/bin/python -m benchmarks.two_nodes --engine elasticsearch --seconds 60
    .venv/bin/python -m benchmarks.two_nodes --engine opensearch --version 2.19.3 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.writes import Client
from bmx_rerank.stats.build import build_snapshots
from bmx_rerank.testing.cluster import ClusterRequest, LocalCluster, local_cluster
from bmx_rerank.testing.kinds import DEFAULT_VERSIONS
from bmx_rerank.upstream import Cluster
from tests.support import naive
from tests.support.fuzzing import es_error_shape
from tests.support.proxy_process import serve

VOCAB = [f"w{i}" for i in range(60)]
ZIPF = [1.0 / (i + 1) for i in range(len(VOCAB))]
N_DOCS = 300
WINDOW = N_DOCS  # every match: the ranking cannot depend on which shard copy answered
N_QUERIES = 24
TOLERANCE = 1e-6
BULK = 20
NDJSON = {"Content-Type": "application/x-ndjson"}


def corpus(seed: int = 19) -> dict[str, str]:
    rng = random.Random(seed)
    return {f"s{i}": " ".join(rng.choices(VOCAB, ZIPF, k=rng.randint(3, 20))) for i in range(N_DOCS)}


def queries(seed: int = 23) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.sample(VOCAB[:30], rng.randint(1, 3))) for _ in range(N_QUERIES)]


def reference(docs: dict[str, str], texts: list[str]) -> dict[str, dict[str, float]]:
    """Each query's BMX score for every document holding one of its words, from the words themselves
    (the standard analyzer's tokens of `w12 w3` are `w12`, `w3`)."""
    tokens = {i: text.split() for i, text in docs.items()}
    stats = naive.corpus_stats(list(tokens.values()))
    out = {}
    for text in texts:
        words = text.split()
        out[text] = {i: naive.bmx_from(stats, t, words) for i, t in tokens.items() if set(t) & set(words)}
    return out


def exact(answer: dict[str, Any], expected: dict[str, float]) -> str | None:
    """None when a reranked answer holds exactly the expected documents, each scored as expected to
    1e-6, in order of score (ties in any order); else what differs. A partial answer (the cluster's own
    shard failures, in `_shards`) is checked on the hits it holds."""
    if answer.get("_bmx", {}).get("reranked") is not True:
        return f"not reranked: {answer.get('_bmx')}"
    hits = [(h["_id"], h["_score"]) for h in answer["hits"]["hits"]]
    ids, want = {i for i, _ in hits}, set(expected)
    if not (ids <= want if partial(answer) else ids == want):
        return f"{len(hits)} hits, {len(want)} expected, {len(ids ^ want)} differ"
    worst = max((abs(s - expected[i]) for i, s in hits), default=0.0)
    if worst > TOLERANCE:
        return f"a score off by {worst:.3g}"
    if any(a[1] < b[1] for a, b in zip(hits, hits[1:], strict=False)):
        return "not in order of score"
    return None


def partial(answer: dict[str, Any]) -> list[str]:
    """The types of the shard failures an answer reports (the cluster's own partial results)."""
    failures = answer.get("_shards", {}).get("failures", [])
    return [f.get("reason", {}).get("type", "?") for f in failures]


@dataclass
class Report:
    engine: str
    version: str
    seconds: float
    cluster_start_s: float = 0.0
    primaries_on_killed_node: int = 0
    killed_at_s: float = 0.0  # since the load began
    node_gone_after_s: float = 0.0  # from the signal until every process of the node was gone
    node_left_after_s: float = 0.0  # from the signal until the cluster counted one node
    requests: int = 0
    answers: Counter[str] = field(default_factory=Counter)  # "write 201", "search 200", ...
    no_answer: int = 0  # a connection the proxy closed without an answer
    not_es_shaped: list[str] = field(default_factory=list)
    errors: list[tuple[str, int, str, str]] = field(default_factory=list)  # (kind, status, type, phase)
    # Searches the cluster answered in part (shard failures in `_shards`): (failure types, phase).
    partial: list[tuple[str, str]] = field(default_factory=list)
    writes_acked: int = 0
    writes_unanswered: int = 0  # documents of writes not answered 2xx: their fate is unknown to the client
    bulk_items_failed: int = 0
    writes_lost: int = 0
    writes_altered: int = 0
    reranked: Counter[str] = field(default_factory=Counter)  # phase -> reranked answers checked
    inexact: list[str] = field(default_factory=list)
    exact_before: bool = False
    exact_after: bool = False

    @property
    def sidecar_5xx(self) -> int:
        return sum(n for key, n in self.answers.items() if int(key.split()[1]) >= 500)


class Load:
    """Writer and searcher threads against the proxy until `stop`; every answer counted."""

    def __init__(self, url: str, expected: dict[str, dict[str, float]], report: Report) -> None:
        self.client = Client(url)
        self.expected = expected
        self.report = report
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.now = "before"  # then "dying" (signalled, not gone yet), "during", "after" (set by `run`)
        self.t0 = time.monotonic()
        self.written: dict[str, dict[str, Any]] = {}  # acknowledged: id -> _source

    def send(
        self, kind: str, method: str, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[dict[str, Any] | None, str]:
        """(the answer's JSON when 2xx, else None; when the request ran), counted; an error must be in the
        cluster's shape. When: "before" the kill; "at the kill" (in flight: sent before the node's
        processes were gone, answered after the signal); "during" (sent after, until the cluster counted
        one node); "after"."""
        sent = self.now
        try:
            status, raw = self.client.raw(method, path, body, headers)
        except OSError as exc:
            status, raw = 0, repr(exc).encode()
        phase = "at the kill" if sent == "dying" or sent == "before" != self.now else sent
        with self.lock:
            self.report.requests += 1
            if status == 0:
                self.report.no_answer += 1
                self.report.errors.append((kind, 0, raw.decode(), phase))
                return None, phase
            self.report.answers[f"{kind} {status}"] += 1
            if status < 300:
                return json.loads(raw), phase
            shape = es_error_shape(raw, status)
            if shape is not None:
                self.report.not_es_shaped.append(f"{kind} {status} ({phase}): {shape}")
                return None, phase
            self.report.errors.append((kind, status, json.loads(raw)["error"]["type"], phase))
            return None, phase

    def writer(self, w: int) -> None:
        rng = random.Random(w)
        n = 0
        while not self.stop.is_set():
            n += 1
            if n % 2:
                docs = {
                    f"b{w}-{n}-{k}": {"body": " ".join(rng.choices(VOCAB, k=8)), "w": w} for k in range(BULK)
                }
                lines = "".join(
                    json.dumps({"index": {"_id": i}}) + "\n" + json.dumps(d) + "\n" for i, d in docs.items()
                )
                answer, _ = self.send("write", "POST", "/writes/_bulk", lines.encode(), NDJSON)
                if answer is None:
                    with self.lock:
                        self.report.writes_unanswered += len(docs)
                    continue
                for item in answer["items"]:
                    result = item["index"]
                    with self.lock:
                        if result["status"] < 300:
                            self.written[result["_id"]] = docs[result["_id"]]
                        else:
                            self.report.bulk_items_failed += 1
            else:
                doc_id, doc = f"p{w}-{n}", {"body": " ".join(rng.choices(VOCAB, k=8)), "w": w}
                answer, _ = self.send("write", "PUT", f"/writes/_doc/{doc_id}", json.dumps(doc).encode())
                with self.lock:
                    if answer is None:
                        self.report.writes_unanswered += 1
                    else:
                        self.written[doc_id] = doc

    def searcher(self, s: int) -> None:
        rng = random.Random(100 + s)
        texts = list(self.expected)
        while not self.stop.is_set():
            self.search(rng.choice(texts))

    def search(self, text: str, label: str | None = None) -> bool:
        """One reranked search, checked against the expected scores; True when exact (and whole, for a
        labelled check, which runs on a settled cluster)."""
        answer, phase = self.send("search", "POST", "/search/_search", search_body(text))
        problem = "no 2xx answer" if answer is None else exact(answer, self.expected[text])
        if label and answer is not None and partial(answer):
            problem = problem or f"partial: {partial(answer)}"
        with self.lock:
            self.report.reranked[label or phase] += 1
            if answer is not None and partial(answer):
                self.report.partial.append((",".join(partial(answer)), phase))
            if problem is not None:
                self.report.inexact.append(f"{label or phase} [{text}]: {problem}")
        return problem is None


def search_body(text: str) -> bytes:
    body = {
        "query": {"match": {"body": text}},
        "size": WINDOW,
        "_source": False,
        "ext": {"bmx": {"field": "body", "window_size": WINDOW}},
    }
    return json.dumps(body).encode()


def check_all(load: Load, label: str) -> bool:
    """Every query once, one at a time: True when each answer is whole and exact."""
    return all([load.search(text, label) for text in load.expected])


def prepare(cluster: LocalCluster, report: Report) -> dict[str, dict[str, float]]:
    """Both indices with every primary on node 1 and a replica on node 0, the corpus and its exact
    statistics; the expected scores of each query."""
    admin = Client(cluster.urls[0])
    victim = cluster.members[1].name
    docs = corpus()
    for index in ("search", "writes"):
        settings = {
            "number_of_shards": 2,
            "number_of_replicas": 0,
            "routing.allocation.require._name": victim,
        }
        mappings = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}
        status, answer = admin.call(
            "PUT", f"/{index}", json.dumps({"settings": settings, "mappings": mappings}).encode()
        )
        assert status == 200, answer
    lines = "".join(
        json.dumps({"index": {"_id": i}}) + "\n" + json.dumps({"body": t}) + "\n" for i, t in docs.items()
    )
    status, answer = admin.call("POST", "/search/_bulk?refresh=true", lines.encode(), NDJSON)
    assert status == 200 and not answer["errors"], answer
    spread = {"index.routing.allocation.require._name": None, "index.number_of_replicas": 1}
    status, answer = admin.call("PUT", "/search,writes/_settings", json.dumps(spread).encode())
    assert status == 200, answer

    async def build() -> None:
        async with aiohttp.ClientSession() as session:
            await build_snapshots(Cluster(session, cluster.urls[0]), "search", "body", {})

    asyncio.run(build())
    status, answer = admin.call(
        "GET", "/_cluster/health?wait_for_status=green&wait_for_no_relocating_shards=true&timeout=60s"
    )
    assert status == 200 and answer["status"] == "green", answer
    status, shards = admin.call("GET", "/_cat/shards/search,writes?format=json&h=index,shard,prirep,node")
    report.primaries_on_killed_node = sum(1 for s in shards if s["prirep"] == "p" and s["node"] == victim)
    return reference(docs, queries())


def read_back(load: Load) -> tuple[int, int]:
    """(lost, altered): each acknowledged write read by id through the proxy (`_mget`, realtime)."""
    lost = altered = 0
    ids = sorted(load.written)
    for start in range(0, len(ids), 500):
        batch = ids[start : start + 500]
        status, answer = load.client.call("POST", "/writes/_mget", json.dumps({"ids": batch}).encode())
        assert status == 200, answer
        for doc in answer["docs"]:
            if not doc.get("found"):
                lost += 1
            elif doc["_source"] != load.written[doc["_id"]]:
                altered += 1
    return lost, altered


def run(
    kind: str,
    version: str,
    seconds: float = 60.0,
    kill_at: float = 0.4,
    writers: int = 3,
    searchers: int = 3,
    say: Any = None,
) -> Report:
    """The whole run (see the module doc); the cluster and the proxy are gone when it returns."""
    report = Report(kind, version, seconds)
    say = say or (lambda _message: None)
    started = time.monotonic()
    with local_cluster(ClusterRequest(kind, version), say) as cluster:  # type: ignore[arg-type]
        report.cluster_start_s = round(time.monotonic() - started, 1)
        expected = prepare(cluster, report)
        with (
            tempfile.TemporaryDirectory() as tmp,
            serve(",".join(cluster.urls), log=Path(tmp) / "proxy.log") as proxy,
        ):
            load = Load(proxy.url, expected, report)
            report.exact_before = check_all(load, "check before")
            threads = [threading.Thread(target=load.writer, args=(w,)) for w in range(writers)]
            threads += [threading.Thread(target=load.searcher, args=(s,)) for s in range(searchers)]
            load.t0 = time.monotonic()
            for t in threads:
                t.start()
            try:
                time.sleep(seconds * kill_at)
                say(
                    f"kill -9 {cluster.members[1].name} (data-only, {report.primaries_on_killed_node} primaries)"
                )
                killed = time.monotonic()
                load.now = "dying"
                cluster.members[1].kill()  # returns when every process of the node is gone
                load.now = "during"
                report.node_gone_after_s = round(time.monotonic() - killed, 2)
                report.killed_at_s = round(killed - load.t0, 1)
                cluster.wait_for_nodes(1)
                report.node_left_after_s = round(time.monotonic() - killed, 2)
                load.now = "after"
                time.sleep(max(0.0, load.t0 + seconds - time.monotonic()))
            finally:
                load.stop.set()
                for t in threads:
                    t.join(120)
            report.exact_after = check_all(load, "check after")
            report.writes_acked = len(load.written)
            report.writes_lost, report.writes_altered = read_back(load)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=("elasticsearch", "opensearch"), default="elasticsearch")
    parser.add_argument("--version", help="default: the launcher's (8.19.21, 2.19.3)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--kill-at", type=float, default=0.4, help="fraction of the run")
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--searchers", type=int, default=3)
    args = parser.parse_args()
    version = args.version or DEFAULT_VERSIONS[args.engine]
    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    report = run(args.engine, version, args.seconds, args.kill_at, args.writers, args.searchers, say)
    out = dict(vars(report))
    out["sidecar_5xx"] = report.sidecar_5xx
    print(json.dumps(out, indent=2, default=str))
    answered = sum(report.answers.values())
    statuses = ", ".join(f"{k}: {n}" for k, n in sorted(report.answers.items()))
    print(
        "\n| engine | requests | answered (by status) | not in ES's shape / no answer | writes acknowledged | "
        "lost / altered | reranked checked (exact; partial) | exact before / after |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| {report.engine} {report.version} | {report.requests:,} | {answered:,} ({statuses}) | "
        f"{len(report.not_es_shaped)} / {report.no_answer} | {report.writes_acked:,} | "
        f"{report.writes_lost} / {report.writes_altered} | {sum(report.reranked.values()):,} "
        f"({sum(report.reranked.values()) - len(report.inexact):,}; {len(report.partial)}) | "
        f"{report.exact_before} / {report.exact_after} |"
    )
    ok = (
        report.writes_lost == report.writes_altered == 0
        and report.exact_before
        and report.exact_after
        and not report.inexact
        and not report.not_es_shaped
        and report.no_answer == 0
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
