"""Engine-side cost of the first-stage variants, one client, interleaved (ES or OpenSearch): plain
size-10/100/1000, size-100 without _source, the term-frequency probes in the placement the proxy uses
(`tf_probe.with_probes`: a `should` branch that never matches) and in the earlier one (a `filter` with
`match_all`), with and without `_source`, a page of 10 by ids, and `_mtermvectors` of 100 hits.
The lean first stage as the proxy sends it (no stored field; `rerank/lean.py`) with and without the
probes (and with them placed as before: the caller's query a `must`), what the probes' cost is made
of (their branch with the canary alone, with as many named `match_all` as probes: the names and the
answer's size, and with `term` probes: the same postings without positions), the page of 10 it then
fetches by `_seq_no`, the engine's own `rescore` (window 100), and the
probed lean stage carrying its page as a `top_hits` aggregation of the best 20 (`_source`): a way to
save the page fetch's round trip, measured and not taken (benchmarks/RESULTS.md). The search of a
first sight's likely page beside its first stage (`lean.beside`: the query's best 20 with `_source`
and versions) alone, and sent with the probed lean stage at once on a second connection: the stage's
own answer, and both.
Each probed answer is checked against the plain one: the same ids and scores, and the probes reported.

    .venv/bin/python -m benchmarks.first_stage_costs http://127.0.0.1:9200 [QUERIES]

QUERIES (default 220) SciFact queries, the first 20 unmeasured.
"""

import statistics
import sys
import threading
import time
import uuid

from benchmarks.proxy_latency import Http, index_corpus
from bmx_rerank.rerank import tf_probe
from bmx_rerank.rerank.lean import lean_body, page_body
from tests.support.data import scifact_records

WARMUP = 20


def old_placement(query: dict, probe: tf_probe.Probe) -> dict:
    """The probes as the proxy placed them first: scored by the query phase as a filter."""
    named = [
        {"intervals": {f: {"match": {"query": t, "analyzer": "keyword"}, "_name": f"{tf_probe.PREFIX}{i}"}}}
        for i, (f, t) in enumerate(probe.pairs)
    ]
    return {"bool": {"must": [query], "filter": [{"bool": {"should": [*named, {"match_all": {}}]}}]}}


def must_placement(body: dict, probe: tf_probe.Probe) -> dict:
    """The probes as the proxy placed them until the branch that never matches went beside the caller's
    query (`tf_probe.with_probes`): the caller's query a `must`, the branch an optional `should`."""
    now = tf_probe.with_probes(body, probe)["query"]["bool"]["should"]
    return {**body, "query": {"bool": {"must": [now[0]], "should": [now[1]]}}}


def term_probes(probe: tf_probe.Probe) -> list[dict]:
    """The probes as `term` queries: the same postings read without their positions (a BM25 score, so
    no term frequency can be read back from it)."""
    return [
        {"term": {f: {"value": t, "_name": f"{tf_probe.PREFIX}{i}"}}} for i, (f, t) in enumerate(probe.pairs)
    ]


def main() -> None:
    url, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 220
    e, beside = Http(url), Http(url)
    idx = f"bmxtest-costs-{uuid.uuid4().hex[:8]}"
    index_corpus(e, idx, scifact_records("corpus.jsonl", 0))
    times: dict[str, list[float]] = {}
    named = f"/{idx}/_search?{tf_probe.PARAM}=true"

    def t(k: str, path: str, body: dict) -> dict:
        start = time.perf_counter()
        r = e.ok("POST", path, body)
        times.setdefault(k, []).append((time.perf_counter() - start) * 1000)
        return r

    def same(a: dict, b: dict) -> None:
        ids = [(h["_id"], h["_score"]) for h in a["hits"]["hits"]]
        assert ids == [(h["_id"], h["_score"]) for h in b["hits"]["hits"]], "probes changed the hits"
        assert any(h.get("matched_queries") for h in a["hits"]["hits"]), "no probe reported"

    try:
        for q in (q["text"] for q in scifact_records("queries.jsonl", n)):
            tokens = e.ok("POST", f"/{idx}/_analyze", {"field": "body", "text": q})["tokens"]
            probe = tf_probe.probe_terms({("body", q): [x["token"] for x in tokens]})
            orig = {"match": {"body": q}}
            t("s10", f"/{idx}/_search", {"query": orig, "size": 10})
            r = t("s100", f"/{idx}/_search", {"query": orig, "size": 100})
            t("s100 nosrc", f"/{idx}/_search", {"query": orig, "size": 100, "_source": False})
            if probe is not None:
                now = tf_probe.with_probes({"query": orig, "size": 100}, probe)
                same(t("s100 + probes (never-matching branch)", named, now), r)
                same(
                    t(
                        "s100 + probes (filter + match_all, before)",
                        named,
                        {"query": old_placement(orig, probe), "size": 100},
                    ),
                    r,
                )
                t("s100 nosrc + probes (never-matching branch)", named, {**now, "_source": False})
            lean = lean_body({"query": orig, "size": 100})
            got = t("lean s100", f"/{idx}/_search", lean)
            if probe is not None:
                probed = tf_probe.with_probes(lean, probe)
                t("lean s100 + probes", named, probed)
                # what the probes' cost is made of: their names and the answer's size, or the postings
                t("lean s100 + the canary alone", named, tf_probe.with_named(lean, []))
                match_all = [
                    {"match_all": {"_name": f"{tf_probe.PREFIX}{i}"}} for i in range(len(probe.pairs))
                ]
                t("lean s100 + as many named match_all", named, tf_probe.with_named(lean, match_all))
                t(
                    "lean s100 + term probes (no positions)",
                    named,
                    tf_probe.with_named(lean, term_probes(probe)),
                )
                t("lean s100 + probes (caller's query a must, before)", named, must_placement(lean, probe))
                top = {"top_hits": {"size": 20, "seq_no_primary_term": True, "_source": True}}
                t("lean s100 + probes + top_hits 20 (page inside)", named, {**probed, "aggs": {"page": top}})
                guess = {"query": orig, "size": 20, "track_total_hits": False, "version": True}
                guess["seq_no_primary_term"] = True
                t("page of 20 by the query (the guess beside)", f"/{idx}/_search", guess)
                other = threading.Thread(target=beside.ok, args=("POST", f"/{idx}/_search", guess))
                start = time.perf_counter()
                other.start()
                t("lean s100 + probes, the guess beside it", named, probed)
                other.join()
                times.setdefault("  ... both answered", []).append((time.perf_counter() - start) * 1000)
            by_seq = page_body({idx: [h["_seq_no"] for h in got["hits"]["hits"][:10]]}, {})
            t("page of 10 by _seq_no", f"/{idx}/_search", by_seq)
            rescore = {"window_size": 100, "query": {"rescore_query": orig}}
            t("rescore w100", f"/{idx}/_search", {"query": orig, "size": 10, "rescore": rescore})
            ids = [h["_id"] for h in r["hits"]["hits"][:10]]
            page = {"query": {"bool": {"must": [orig], "filter": [{"ids": {"values": ids}}]}}, "size": 10}
            t("ids10", f"/{idx}/_search", page)
            t("s1000", f"/{idx}/_search", {"query": orig, "size": 1000})
            fields = {
                "term_statistics": False,
                "field_statistics": False,
                "positions": False,
                "offsets": False,
            }
            docs = [{"_index": idx, "_id": h["_id"], "fields": ["body"], **fields} for h in r["hits"]["hits"]]
            t("mtv100", "/_mtermvectors", {"docs": docs})
        for k, v in times.items():
            print(f"{k:45s} p50 {statistics.median(v[WARMUP:] or v):7.2f} ms")
    finally:
        e.call("DELETE", f"/{idx}")


if __name__ == "__main__":
    main()
