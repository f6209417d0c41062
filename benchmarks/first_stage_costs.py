"""Engine-side cost of the first-stage variants, one client, interleaved (ES or OpenSearch):
plain size-10/100/1000, size-100 without _source, the same with term-frequency probes
(benchmarks RESULTS, issue 11), a page of 10 by ids, and `_mtermvectors` of 100 hits.

    .venv/bin/python benchmarks/first_stage_costs.py http://127.0.0.1:9200
"""

import statistics
import sys
import time
import uuid

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from proxy_latency import Http, index_corpus, load

url = sys.argv[1]
e = Http(url)
idx = f"bmxtest-costs-{uuid.uuid4().hex[:8]}"
index_corpus(e, idx, load("corpus.jsonl", 0))
qs = [q["text"] for q in load("queries.jsonl", 220)]
T = {
    k: []
    for k in [
        "s10",
        "s100",
        "s100 nosrc",
        "s100 nosrc+probe",
        "ids10",
        "s1000",
        "s1000 nosrc+probe",
        "mtv100",
    ]
}


def t(k, path, body):
    s = time.perf_counter()
    r = e.ok("POST", path, body)
    T[k].append((time.perf_counter() - s) * 1000)
    return r


try:
    for q in qs:
        toks = list(
            dict.fromkeys(
                x["token"] for x in e.ok("POST", f"/{idx}/_analyze", {"field": "body", "text": q})["tokens"]
            )
        )
        orig = {"match": {"body": q}}
        named = [
            {"intervals": {"body": {"match": {"query": x, "analyzer": "keyword"}, "_name": f"_bmx_tf_{i}"}}}
            for i, x in enumerate(toks)
        ]
        wrapped = {"bool": {"must": [orig], "filter": [{"bool": {"should": [*named, {"match_all": {}}]}}]}}
        t("s10", f"/{idx}/_search", {"query": orig, "size": 10})
        r = t("s100", f"/{idx}/_search", {"query": orig, "size": 100})
        t("s100 nosrc", f"/{idx}/_search", {"query": orig, "size": 100, "_source": False})
        t(
            "s100 nosrc+probe",
            f"/{idx}/_search?include_named_queries_score=true",
            {"query": wrapped, "size": 100, "_source": False, "seq_no_primary_term": True},
        )
        ids = [h["_id"] for h in r["hits"]["hits"][:10]]
        t(
            "ids10",
            f"/{idx}/_search",
            {"query": {"bool": {"must": [orig], "filter": [{"ids": {"values": ids}}]}}, "size": 10},
        )
        t("s1000", f"/{idx}/_search", {"query": orig, "size": 1000})
        t(
            "s1000 nosrc+probe",
            f"/{idx}/_search?include_named_queries_score=true",
            {"query": wrapped, "size": 1000, "_source": False, "seq_no_primary_term": True},
        )
        t(
            "mtv100",
            "/_mtermvectors",
            {
                "docs": [
                    {
                        "_index": idx,
                        "_id": h["_id"],
                        "fields": ["body"],
                        "term_statistics": False,
                        "field_statistics": False,
                        "positions": False,
                        "offsets": False,
                    }
                    for h in r["hits"]["hits"]
                ]
            },
        )
    for k, v in T.items():
        v = v[20:]
        print(f"{k:22s} p50 {statistics.median(v):7.2f}")
finally:
    e.call("DELETE", f"/{idx}")
