"""Reranking a search: one module per verb (read `ext.bmx`, widen the first stage, gather candidates,
score, pack the answer), pure functions except `pipeline`, which does the I/O."""
