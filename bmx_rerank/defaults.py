"""Defaults shared by the proxy's configuration, the `serve` command and the client wrappers: one
place, so the three cannot drift apart."""

from __future__ import annotations

TIMEOUT = 60.0  # seconds a call to the cluster may take
DEADLINE = 60.0  # seconds for everything one reranked search does (0: none, each call --timeout)
CONNECT_TIMEOUT = 10.0  # seconds to open a connection to a node
ON_RERANK_ERROR = "fallback"  # a failed rerank answers with the cluster's own ranking, marked
CACHE_BYTES = 256 << 20  # term-vector cache, bytes (estimated)
PAGE_CACHE_BYTES = 64 << 20  # lean windows' page documents, bytes of their JSON (rerank/lean.py)
TF_PROBES = "auto"  # term frequencies from the first stage where they pay (rerank/probing)
MAX_BODY = 64 << 20  # bytes of a search body read to look for ext.bmx, after inflation
MAX_AUGMENT = 64  # augmented queries (WQA) per search: each costs an `_analyze`
MAX_MSEARCH = 100  # items reranked per `_msearch`; the others get the cluster's own answer
MAX_CONCURRENT_RERANKS = 32  # reranks running at once; each holds a window of hits in memory
ON_OVERLOAD = "fallback"  # past that: the cluster's own answer, marked ("reject": a 429)
EVAL_CONFIDENCE = 0.9  # `eval` applies a configuration when its gain's interval at this level is above 0
# The guard: what the cluster would refuse, or what would harm it, is a 400/413 before it reaches it.
MAX_DEPTH = 100  # JSON nesting levels of a search body (a query at 30 nested bools fits)
MAX_QUERY_DEPTH = 30  # nested bool queries, Elasticsearch's indices.query.bool.max_nested_depth
MAX_CONTENT_LENGTH = 100 << 20  # a search body's bytes, Elasticsearch's http.max_content_length
MAX_IN_FLIGHT = 256 << 20  # bytes of search bodies and answers held at once, all requests together
# Client connections: closed when idle this long between requests (or before the first), when a request
# head takes longer than this to arrive, and the oldest idle one when a new one would pass the cap.
IDLE_TIMEOUT = 75.0
HEADER_TIMEOUT = 30.0
MAX_CONNECTIONS = 50_000  # at most; by default the file-descriptor limit less a reserve
