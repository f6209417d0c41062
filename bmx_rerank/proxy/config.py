"""The proxy's configuration, and the typed state one running app keeps."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from bmx_rerank import defaults
from bmx_rerank.applied import DEFAULT_TTL
from bmx_rerank.identity import IDENTITY_HEADERS
from bmx_rerank.metrics import Metrics
from bmx_rerank.nodes import FailoverSession
from bmx_rerank.policy import Rule
from bmx_rerank.proxy.admission import Admission
from bmx_rerank.proxy.memory import InFlight
from bmx_rerank.rerank.pipeline import Reranker
from bmx_rerank.rerank.probing import PROBE_MODES
from bmx_rerank.rerank.spec import MAX_WINDOW
from bmx_rerank.stats.store import DEFAULT_STORE

ON_OVERLOAD = ("fallback", "reject")


@dataclass
class ProxyConfig:
    upstream: str | Sequence[str]  # one node URL, a comma-separated list, or a list (see bmx_rerank.nodes)
    policies: Sequence[Rule] = ()
    on_rerank_error: str = defaults.ON_RERANK_ERROR
    timeout: float = defaults.TIMEOUT  # first stage and sidecar calls, seconds
    connect_timeout: float = defaults.CONNECT_TIMEOUT
    # One budget for everything a reranked search does (first stage, analysis, term vectors,
    # statistics), seconds; ext.bmx.deadline and the search's `timeout` may lower it. 0: none.
    deadline: float = defaults.DEADLINE
    cache_bytes: int = defaults.CACHE_BYTES  # term-vector cache, bytes (estimated)
    page_cache_bytes: int = defaults.PAGE_CACHE_BYTES  # lean windows' page documents (rerank/lean.py)
    widen: bool = True
    # Term frequencies from the first stage (rerank/probing): "auto" probes new windows only, "on"
    # every search that can, "off" none; True/False mean "on"/"off".
    tf_probes: str | bool = defaults.TF_PROBES
    # Windows the engine can score exactly are scored there by a Painless rescore (rerank/in_engine.py)
    in_engine: bool = False
    upstream_ca: str | None = None  # PEM bundle the nodes' certificates are checked against
    upstream_cert: str | None = None  # client certificate (PEM) for https nodes
    upstream_key: str | None = None
    upstream_verify: bool = True
    applied_ttl: float = DEFAULT_TTL  # seconds an index's applied configuration is remembered (0: ignore)
    stats_index: str = DEFAULT_STORE  # where snapshots and applied configurations are stored
    max_body: int = defaults.MAX_BODY  # bytes of a search/msearch body read to look for ext.bmx, inflated
    max_window: int = MAX_WINDOW  # hits a rerank may ask the cluster for
    max_augment: int = defaults.MAX_AUGMENT  # augmented queries (WQA) per search
    max_msearch: int = defaults.MAX_MSEARCH  # items reranked per `_msearch`
    max_concurrent_reranks: int = defaults.MAX_CONCURRENT_RERANKS  # reranks (searches or msearches) at once
    on_overload: str = defaults.ON_OVERLOAD  # past that: the cluster's own answer, marked, or "reject" (429)
    identity_headers: Sequence[str] = IDENTITY_HEADERS  # what tells callers apart (caches, statistics)
    # The guard (0: off): search bodies nested deeper, bool queries nested deeper, or search bodies
    # larger than the cluster accepts are refused (400, 400, 413) before they reach it.
    max_depth: int = defaults.MAX_DEPTH
    max_query_depth: int = defaults.MAX_QUERY_DEPTH
    max_content_length: int = defaults.MAX_CONTENT_LENGTH
    # Bytes of search bodies (read, inflated, parsed) and first-stage answers held at once, all requests
    # together; past it a 429 circuit_breaking_exception. 0: none.
    max_in_flight: int = defaults.MAX_IN_FLIGHT

    def __post_init__(self) -> None:
        if self.on_overload not in ON_OVERLOAD:
            raise ValueError(f"on_overload must be one of {ON_OVERLOAD}, got {self.on_overload!r}")
        for name in ("max_body", "max_window", "max_msearch", "max_concurrent_reranks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if min(self.max_depth, self.max_query_depth, self.max_content_length, self.max_in_flight) < 0:
            raise ValueError("max_depth, max_query_depth and max_content_length must be >= 0 (0: off)")
        if self.max_augment < 0 or self.cache_bytes < 0 or self.page_cache_bytes < 0:
            raise ValueError("max_augment, cache_bytes and page_cache_bytes must be >= 0")
        if self.deadline < 0:
            raise ValueError("deadline must be >= 0 seconds (0: none)")
        if self.timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("timeouts must be > 0 seconds")
        if isinstance(self.tf_probes, bool):
            self.tf_probes = "on" if self.tf_probes else "off"
        if self.tf_probes not in PROBE_MODES:
            raise ValueError(f"tf_probes must be one of {PROBE_MODES}, got {self.tf_probes!r}")


@dataclass
class ProxyState:
    """What one running proxy app holds. The client session and the reranker exist while the app runs
    (made at startup, closed at cleanup)."""

    config: ProxyConfig
    base: str  # the node URL call sites build on (see bmx_rerank.nodes)
    nodes: Sequence[str]
    metrics: Metrics
    admission: Admission
    memory: InFlight
    session: FailoverSession | None = None  # client traffic, byte-exact (no decompression)
    reranker: Reranker | None = None

    @functools.cached_property
    def relay_timeout(self) -> aiohttp.ClientTimeout:
        """A call relayed as it comes: bounded in connecting and between reads, not in total."""
        return aiohttp.ClientTimeout(
            total=None, sock_connect=self.config.connect_timeout, sock_read=self.config.timeout
        )

    @property
    def upstream(self) -> FailoverSession:
        assert self.session is not None, "the app is not running"
        return self.session

    @property
    def rerank(self) -> Reranker:
        assert self.reranker is not None, "the app is not running"
        return self.reranker
