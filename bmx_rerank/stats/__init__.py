"""Corpus statistics: one module per concept, like `bmx_rerank.rerank`.

- `corpus`: the pure, additive numbers (N, total length, df, raw entropy) and their exact sums;
- `sweep`: reading every live document's term frequencies from the cluster;
- `store`: snapshots kept in the cluster itself, published by a pointer flip;
- `freshness`: what a snapshot was built from and whether the index moved on since;
- `build`: the CLI's build / refresh / show, sweeping and publishing;
- `cache`: the proxy's hot path, loading snapshots once and checking drift at most every few seconds;
- `estimate`: the estimated mode, for indices without a snapshot;
- `errors`: the statistics layer's errors, in Elasticsearch's shape.

Statistics are kept per concrete index and summed over the indices an alias or pattern names, so one
snapshot serves every expression that includes its index.
"""
