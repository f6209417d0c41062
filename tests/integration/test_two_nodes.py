"""A real two-node cluster behind the proxy loses a node under load (a 12-second run of
benchmarks/two_nodes.py; the one-minute runs and their figures are in benchmarks/RESULTS.md).

Two processes of the launcher's default distribution of each kind (Elasticsearch 8.19 on Java 17,
OpenSearch 2.19) form one cluster on pre-picked transport ports: node 0 master-eligible and data, node
1 data-only. Node 1 is the one `kill -9`ed, because a data-only node can never be the elected master:
the cluster keeps its master and goes on serving, so what is tested is the proxy in front of a cluster
losing a node, not a cluster losing its quorum. Both indices (2 shards, 1 replica) have every primary on
node 1 when it dies, so each acknowledged write survives only in a replica promoted on node 0.

Asserted: every request is answered, every answer that is not 2xx in Elasticsearch's error shape; every
acknowledged write (bulk items and single PUTs) is read back by id, unaltered; reranked searches (a
window covering every match) score every document as BMX computed here from its words, to 1e-6, before,
during and after the kill. Two answers are allowed, and counted, only while the node dies (in flight
at the kill, or sent before the cluster counted one node): a write cut with its node is a 502, and so is
one sent on a keep-alive connection to the node that the proxy had not yet seen close (the broken
connection is how it learns; the node may have read such a write before dying, or not, and the proxy
never sends a write twice, so it is not acknowledged and nobody counts on it); and a search whose fetch
phase ran on the dying node is the cluster's own partial answer, its shard failure in `_shards`, still
exact on the hits it holds.
"""

from __future__ import annotations

import time

from benchmarks import two_nodes
from bmx_rerank.testing.kinds import DEFAULT_VERSIONS, EngineError
from tests.support.engine_client import unavailable

SECONDS = 12.0
WRITERS = SEARCHERS = 3


def test_a_node_killed_under_load_loses_no_write_and_rankings_stay_exact(cluster_kind: str):
    started = time.monotonic()
    try:
        report = two_nodes.run(cluster_kind, DEFAULT_VERSIONS[cluster_kind], SECONDS, 0.4, WRITERS, SEARCHERS)
    except EngineError as exc:  # no Java or distribution for it here: a skip, or a failure in CI
        unavailable(f"no two-node {cluster_kind} cluster: {exc}")
    print(
        f"{cluster_kind}: {report.requests} requests, {dict(report.answers)}, errors {report.errors}, "
        f"partial {report.partial}, {time.monotonic() - started:.0f}s"
    )
    assert report.primaries_on_killed_node == 4, "every primary of both indices died with the node"
    assert report.node_gone_after_s < 5 and report.node_left_after_s < 30, report
    assert report.no_answer == 0 and report.not_es_shaped == [], report
    dying = ("at the kill", "during")
    for kind, status, err, phase in report.errors:
        assert (kind, status, err) == ("write", 502, "bmx_upstream_unreachable_exception"), report.errors
        assert phase in dying, report.errors
    assert len(report.errors) <= WRITERS, f"about one write per writer at most: {report.errors}"
    assert all(phase in dying for _, phase in report.partial) and len(report.partial) <= SEARCHERS
    assert report.writes_acked > 1_000 and report.bulk_items_failed == 0, report
    assert (report.writes_lost, report.writes_altered) == (0, 0), report
    assert report.inexact == [], report.inexact
    assert report.exact_before and report.exact_after
    assert report.reranked["before"] > 10 and report.reranked["after"] > 10, report.reranked
