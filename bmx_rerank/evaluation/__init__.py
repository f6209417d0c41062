"""`bmx-rerank eval`: which ranking is best for *this* index, measured on the user's own judged queries.

One module per step: read the judgments (`data`), name the configurations to try (`configs`), run them
through the real reranking pipeline (`run`), measure them with ir-measures and test them against the
engine's own ranking (`measure`), choose honestly by cross-validation (`select`), and show the result
(`report`); `workflow` strings them together."""
