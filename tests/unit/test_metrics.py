"""The proxy's metrics (bmx_rerank/metrics.py): a labelled child is kept by its labels, and what it
counts is what the exposition shows."""

from __future__ import annotations

from bmx_rerank.metrics import KEPT_LABELS, Metrics


def test_labelled_children_are_kept_and_counted_in_the_exposition() -> None:
    metrics = Metrics()
    assert metrics.reranks.labels("reranked") is metrics.reranks.labels("reranked")
    assert metrics.reranks.labels("reranked") is not metrics.reranks.labels("declined")
    for _ in range(3):
        metrics.reranks.labels("reranked").inc()
    metrics.tf.labels("probes", "probed").inc()
    metrics.tf.labels(source="probes", probes="probed").inc()  # by name: the same child
    metrics.served("search")
    metrics.upstream("search", 0.004)
    for n in range(KEPT_LABELS + 5):  # more labels than are kept: each still counted once
        metrics.errors.labels(f"type_{n}").inc()
    metrics.errors.labels("type_0").inc()
    shown = metrics.render().decode()
    assert 'bmx_reranks_total{outcome="reranked"} 3.0' in shown
    assert 'bmx_reranks_total{outcome="declined"} 0.0' in shown
    assert 'bmx_tf_windows_total{probes="probed",source="probes"} 2.0' in shown
    assert 'bmx_requests_total{kind="search"} 1.0' in shown
    assert 'bmx_upstream_seconds_count{call="search"} 1.0' in shown
    assert 'bmx_errors_total{type="type_0"} 2.0' in shown
    assert f'bmx_errors_total{{type="type_{KEPT_LABELS + 4}"}} 1.0' in shown
