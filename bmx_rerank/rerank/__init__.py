"""Reranking a search: `pipeline.Reranker.rerank` is the one entry point; every other module is one
concept it uses.

- `spec`, `plan`, `query`, `widen`: reading a search (`ext.bmx`, a policy) into a plan and its first stage;
- `window`: the window in flight (its request, the calls started beside the first stage);
- `hits`: the first stage's hits read as columns, once, for every step that reads each hit;
- `analysis`: the query's tokens as the cluster analyses them;
- `probing` (decides) and `tf_probe` (builds and reads): term frequencies from the first stage itself;
- `frequencies`: each hit's term frequencies and length, from probes, caches, length tables or
  `_mtermvectors`; `term_vector_cache`: what it keeps for the next window;
- `augment`: weighted query augmentation (given queries, PRF, an LLM);
- `rescore` (the scoring core's input and the tree's fold), `pack` (the answer), `filter_path`.

Everything but `pipeline`, `analysis`, `probing` and `frequencies` is pure."""
