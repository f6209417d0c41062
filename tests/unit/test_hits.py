"""A window's hits read as columns (rerank/hits.py)."""

from __future__ import annotations

import numpy as np

from bmx_rerank.rerank.hits import SHARD, HitColumns, scores


def test_each_field_a_column_in_the_hits_order_and_none_where_a_hit_lacks_it() -> None:
    hits = [
        {"_index": "a", "_seq_no": 1, "_primary_term": 2, SHARD: 1, "_id": "x"},
        {"_index": "b", "_seq_no": 3, "_primary_term": 1},
    ]
    columns = HitColumns.of(hits)
    assert len(columns) == 2 and columns.hits is hits
    assert (columns.index, columns.seq_no, columns.primary_term) == (["a", "b"], [1, 3], [2, 1])
    assert columns.shard == [1, None] and columns.column("_id", "") == ["x", ""]
    assert columns.versioned


def test_versioned_only_where_every_hit_carries_integers() -> None:
    assert HitColumns.of([]).versioned
    assert not HitColumns.of([{"_seq_no": True, "_primary_term": 1}]).versioned, "a bool is no number"
    assert not HitColumns.of([{"_seq_no": 1}]).versioned
    assert not HitColumns.of([{"_seq_no": 1, "_primary_term": 1.0}]).versioned


def test_scores_read_every_hits_score_and_0_where_there_is_none() -> None:
    assert scores([{"_score": 2.5}, {"_score": 3}]).tolist() == [2.5, 3.0]
    got = scores([{"_score": 2.5}, {"_score": None}, {}, {"_score": 1}])
    assert got.dtype == np.float64 and got.tolist() == [2.5, 0.0, 0.0, 1.0]
    assert scores([]).shape == (0,)
