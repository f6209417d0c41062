"""A 20-second version of benchmarks/soak.py, and a 30-second one with faults and hostile clients (the
full runs and their figures are in benchmarks/RESULTS.md): `bmx-rerank serve` in its own process, 16 concurrent clients in this one mixing reranked searches, plain
searches and writes into the searched index. Zero errors (a fallback counts as one), every kind of
traffic served, and the proxy's RSS after warm-up growing by less than 25 % in so short a run (the full
soak's own limit is 10 %), its file descriptors bounded by the connection pools."""

from __future__ import annotations

from benchmarks import soak


def test_short_soak_has_no_errors_and_flat_memory(elasticsearch_url: str):
    report = soak.soak(elasticsearch_url, seconds=20, clients=16, n_docs=3_000)
    assert report.errors == {}, report.errors
    assert all(n > 20 for n in report.counts.values()), report.counts
    assert report.rss_growth_pct < 25, report
    assert report.fds_after < report.fds_before + 16 + 64 + 256, report


def test_half_minute_soak_with_faults_and_hostile_clients(elasticsearch_url: str):
    """A 30-second version of `benchmarks.soak --faults --hostile` at 32 clients: the node slowed,
    frozen and its sidecar reads reset on a schedule, gzip bombs, slow senders and 2,000 idle
    hoarders beside the clients. No sidecar 5xx, no acknowledged write lost, the hostile clients
    answered or cut as documented, and the proxy's fds back within its pools at the end."""
    report = soak.soak(elasticsearch_url, seconds=30, clients=32, n_docs=3_000, faults=True, hostile=True)
    assert report.sidecar_5xx == 0, report.errors
    assert report.writes_acked > 100 and report.writes_lost == 0, report
    assert set(report.faults) == {"slow", "frozen", "reset"}, report.faults
    assert all(n > 20 for n in report.counts.values()), report.counts
    hostile = report.hostile
    assert not any(k.startswith("bomb 5") for k in hostile), hostile
    assert sum(v for k, v in hostile.items() if k.startswith("bomb 4")) > 10, hostile
    assert hostile.get("slow sender closed", 0) > 0 and "slow sender answered" not in hostile, hostile
    assert hostile.get("hoarder closed by the proxy", 0) > 0, hostile
    assert report.fds_after < report.fds_before + 32 + 64 + 256, report
