"""Corpus statistics: one module per concept, below the request path (`bmx_rerank.rerank` reads them,
never the other way round).

- `corpus`: the pure, additive numbers (N, total length, df, raw entropy) and their exact sums;
- `scan`: every live document's ids, from a point in time or a scroll;
- `sweep`: every live document's term frequencies folded into statistics (`SweepOptions`: how);
- `sliced`: one index swept in slices, in parallel processes or on several machines, added up exactly;
- `lengths`: each swept document version's length, so a window needs no `_mtermvectors` for it;
- `snapshot`: what a snapshot holds, and its encoding as the store's documents;
- `store`: snapshots kept in the cluster itself, published by a pointer flip;
- `freshness`: what a snapshot was built from and whether the index moved on since;
- `build`: the CLI's build / refresh / show, sweeping and publishing;
- `cache`: the request path's statistics, loading snapshots once and checking drift at most every few
  seconds;
- `source`: what the request path asks for statistics (`StatsSource`): the cache, made per session by
  `statistics_source`, or `FixedStats` given up front;
- `estimate`: the estimated mode, for indices without a snapshot;
- `errors`: the statistics layer's errors, in Elasticsearch's shape.

Every call to the cluster goes through an `upstream.Cluster`. Statistics are kept per concrete index and
summed over the indices an alias or pattern names, so one snapshot serves every expression that
includes its index.
"""
