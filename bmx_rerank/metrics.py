"""Prometheus metrics of the proxy, in a registry of their own so several apps (tests) can coexist."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable
from typing import TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

T = TypeVar("T")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Labelled children kept by label (each metric's labels are a few fixed names): prometheus_client's
# `labels()` validates its arguments and takes a lock on every call, 3 µs of a passthrough's ~90 µs of
# Python for its two, and a first sight asks for seven (benchmarks/RESULTS.md).
KEPT_LABELS = 64


class Metrics:
    """Counters and histograms: requests by kind, rerank and upstream latency, errors, cache hits."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("bmx_requests", "Requests served, by kind", ["kind"], registry=self.registry)
        self.rerank_seconds = Histogram(
            "bmx_rerank_seconds",
            "Time of a whole reranked search (first stage included)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.upstream_seconds = Histogram(
            "bmx_upstream_seconds",
            "Time of calls to the cluster, by call",
            ["call"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter("bmx_errors", "Errors, by type", ["type"], registry=self.registry)
        self.reranks = Counter(
            "bmx_reranks", "Reranked searches, by outcome", ["outcome"], registry=self.registry
        )
        self.cache = Counter(
            "bmx_termvector_cache", "Term-vector cache lookups, by result", ["result"], registry=self.registry
        )
        self.tf = Counter(
            "bmx_tf_windows",
            "Reranked windows by where their term frequencies came from (probes, cache, termvectors) and "
            "why the first stage carried no probes (probed when it did)",
            ["source", "probes"],
            registry=self.registry,
        )

        self.first_stage = Counter(
            "bmx_lean_windows",
            "Windows whose first stage read no stored field (lean), those that then went again in full "
            "(lean_missed), and windows over several shards whose shards, asked for their share of it "
            "(a repeated window's, else an even one), were asked again for the whole window (shares_short)",
            ["outcome"],
            registry=self.registry,
        )
        self.in_engine = Counter(
            "bmx_in_engine",
            "Searches under --in-engine: scored by the engine (scored), else why the sidecar scored them "
            "(shape, scoring, options, augment, request, indices, settings, no_length_field, "
            "length_field_differs, no_frequencies, unread: the query's analysis or statistics failed, over several shards "
            "edge_refused, edge_partial, edge_tied: the search of the window's edge, zero: a hit of the page "
            "scored 0, no_length, refused: the script, search_refused: the search as sent, shard_failed, timed_out, no_match, "
            "kept: the sidecar kept the window whole, repeated: the engine scored it often lately, so the sidecar keeps it)",
            ["outcome"],
            registry=self.registry,
        )
        self.in_engine_edges = Counter(
            "bmx_in_engine_edges",
            "Windows over several shards scored in the engine, by where their page came from: beside "
            "(the search beside the edge's, its hits within the global window) or after (the search "
            "that keeps to the edge, sent after it)",
            ["page"],
            registry=self.registry,
        )
        self.page_ahead = Counter(
            "bmx_page_ahead",
            "Lean windows' pages by how the fetch of their likely documents while scoring served them "
            "(none made, unused, covered, fetched_after)",
            ["outcome"],
            registry=self.registry,
        )
        self.token_guesses = Counter(
            "bmx_token_guesses",
            "First stages whose probes were built from tokens guessed word by word (not waiting for "
            "_analyze), by whether they covered the real tokens (covered, missed); windows whose tokens "
            "were known word by word with no _analyze at all (known)",
            ["outcome"],
            registry=self.registry,
        )
        self.guarded = Counter(
            "bmx_guard_refused",
            "Requests the guard kept from the cluster, by reason (depth, query_depth, unparsable_bmx, "
            "content_length)",
            ["reason"],
            registry=self.registry,
        )

        self.in_flight_bytes = Gauge(
            "bmx_in_flight_bytes",
            "Bytes of bodies and answers held by requests now (--max-in-flight)",
            registry=self.registry,
        )
        self.in_flight_limit = Gauge(
            "bmx_in_flight_limit_bytes", "The in-flight budget (0: none)", registry=self.registry
        )
        self.breaker_trips = Counter(
            "bmx_in_flight_breaker_trips",
            "Requests refused with a 429 because the in-flight budget was spent",
            registry=self.registry,
        )

        self.client_connections = Gauge(
            "bmx_client_connections", "Client connections open now", registry=self.registry
        )
        self.connections_closed = Counter(
            "bmx_client_connections_closed",
            "Client connections the limits closed, by reason (idle, header_timeout, cap: the oldest idle "
            "one made room, cap_refused: none was idle)",
            ["reason"],
            registry=self.registry,
        )
        for labelled in (
            self.requests,
            self.upstream_seconds,
            self.errors,
            self.reranks,
            self.cache,
            self.tf,
            self.first_stage,
            self.page_ahead,
            self.token_guesses,
            self.guarded,
            self.connections_closed,
        ):  # each child kept by its labels: `labels()` gives the same child again, after its checks
            labelled.labels = functools.lru_cache(maxsize=KEPT_LABELS)(labelled.labels)  # type: ignore[method-assign]

    def served(self, kind: str) -> None:
        """One request served, of `kind`."""
        self.requests.labels(kind).inc()

    def upstream(self, call: str, seconds: float) -> None:
        """One call to the cluster named `call`, and how long it took."""
        self.upstream_seconds.labels(call).observe(seconds)

    async def timed(self, call: str, awaitable: Awaitable[T]) -> T:
        """`awaitable`'s result, its time observed as one upstream call named `call`."""
        start = time.perf_counter()
        try:
            return await awaitable
        finally:
            self.upstream(call, time.perf_counter() - start)

    def render(self) -> bytes:
        return generate_latest(self.registry)
