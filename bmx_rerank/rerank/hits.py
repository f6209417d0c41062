"""A window's hits as columns: what a rerank reads of every hit (its index, version, shard, score),
taken from the decoded answer once, each field in one C-level pass (`dict.get` mapped over the hits),
instead of a Python call per hit at every step that reads it: a window is 100 to 10,000 hits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

# Where a hit of a lean window over several shards lives: its shard's number, set by the proxy (never
# shown: the page's hits are replaced by their documents), since `_seq_no` is unique only in a shard
SHARD = "_bmx_shard"


@dataclass(frozen=True, eq=False)
class HitColumns:
    """The hits of one answer, in its order, and the fields every rerank reads as lists (None where a
    hit lacks one); `column` reads any other."""

    hits: Sequence[dict[str, Any]]
    index: list[Any]
    seq_no: list[Any]
    primary_term: list[Any]
    shard: list[Any]  # each hit's shard (`SHARD`), None in a window searched whole
    # every hit carries an integer `_seq_no` and `_primary_term` (not a bool: no number here)
    versioned: bool
    first: np.ndarray  # the cluster's `_score` of each hit (`scores`)

    @classmethod
    def of(cls, hits: Sequence[dict[str, Any]]) -> HitColumns:
        index, seq_no, primary_term, shard = (
            _column(hits, k) for k in ("_index", "_seq_no", "_primary_term", SHARD)
        )
        # counting the types is cheaper than a set of them
        versioned = all(list(map(type, c)).count(int) == len(c) for c in (seq_no, primary_term))
        return cls(hits, index, seq_no, primary_term, shard, versioned, scores(hits))

    def __len__(self) -> int:
        return len(self.hits)

    def column(self, key: str, default: Any = None) -> list[Any]:
        """Every hit's `key` (`default` where it has none): a window's typed hits read without a dict
        made of each (`shards.WindowHits.column`)."""
        typed = getattr(self.hits, "column", None)
        return typed(key, default) if typed is not None else _column(self.hits, key, default)


def _column(hits: Sequence[dict[str, Any]], key: str, default: Any = None) -> list[Any]:
    # `dict.get` mapped over the hits: three times as fast as a `methodcaller`, a third faster than a
    # comprehension
    return list(map(dict.get, hits, repeat(key), repeat(default)))


def scores(hits: Sequence[dict[str, Any]]) -> np.ndarray:
    """The cluster's `_score` of each hit (0 where it sent none): read in one C-level pass where every
    hit has a number."""
    found = _column(hits, "_score")
    if set(map(type, found)) <= {float, int}:
        return np.fromiter(found, np.float64, len(found))
    return np.array([float(s or 0.0) for s in found], dtype=np.float64)
