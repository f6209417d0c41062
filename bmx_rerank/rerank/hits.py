"""A window's hits as columns: what a rerank reads of every hit (its index, version, shard), taken from
the decoded answer once, each field in one C-level pass (`map` over the hits), instead of a Python
call per hit at every step that reads it: a window is 100 to 10,000 hits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import methodcaller
from typing import Any

# Where a hit of a lean window over several shards lives: its shard's number, set by the proxy (never
# shown: the page's hits are replaced by their documents), since `_seq_no` is unique only in a shard
SHARD = "_bmx_shard"


@dataclass(frozen=True, eq=False)
class HitColumns:
    """The hits of one answer, in its order, and their fields as lists (None where a hit lacks one),
    each read when first asked for."""

    hits: Sequence[Mapping[str, Any]]

    def __len__(self) -> int:
        return len(self.hits)

    def column(self, key: str, default: Any = None) -> list[Any]:
        """Every hit's `key` (`default` where it has none)."""
        return list(map(methodcaller("get", key, default), self.hits))

    @cached_property
    def index(self) -> list[Any]:
        return self.column("_index")

    @cached_property
    def seq_no(self) -> list[Any]:
        return self.column("_seq_no")

    @cached_property
    def primary_term(self) -> list[Any]:
        return self.column("_primary_term")

    @cached_property
    def shard(self) -> list[Any]:
        """Each hit's shard (`SHARD`), None in a window searched whole."""
        return self.column(SHARD)

    @cached_property
    def versioned(self) -> bool:
        """Every hit carries an integer `_seq_no` and `_primary_term` (not a bool: no number here)."""
        return set(map(type, self.seq_no)) | set(map(type, self.primary_term)) <= {int}
