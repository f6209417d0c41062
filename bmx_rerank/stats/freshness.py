"""What a snapshot was built from, and whether the index has moved on since: pure functions over `_stats`.

Every write to a shard (index, update, delete) takes the next sequence number of that shard, so per
primary shard `max_seq_no` is a cheap, exact "has anything changed" marker, and the number of
operations since a snapshot is `max_seq_no(now) - max_seq_no(then)`. That count is what lets an
incremental refresh prove that only appends happened (see `appends_only`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bmx_rerank.stats.snapshot import SnapshotInfo


@dataclass(frozen=True)
class ShardMark:
    """One primary shard's sequence-number state."""

    shard: int
    max_seq_no: int
    local_checkpoint: int
    global_checkpoint: int

    @property
    def settled(self) -> bool:
        """Every operation up to max_seq_no has been processed on the primary (no write in flight)."""
        return self.local_checkpoint == self.max_seq_no


@dataclass(frozen=True)
class IndexMarks:
    """One concrete index's identity and per-primary-shard sequence numbers."""

    index: str
    uuid: str
    shards: tuple[ShardMark, ...]

    @property
    def settled(self) -> bool:
        return all(s.settled for s in self.shards)

    @property
    def operations(self) -> int:
        """Sequence numbers taken so far over all primaries (max_seq_no starts at -1)."""
        return sum(s.max_seq_no + 1 for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "shards": [[s.shard, s.max_seq_no, s.local_checkpoint, s.global_checkpoint] for s in self.shards],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IndexMarks:
        return cls(
            str(data["index"]),
            str(data["uuid"]),
            tuple(ShardMark(*(int(x) for x in row)) for row in data["shards"]),
        )


def parse_shard_stats(payload: Mapping[str, Any]) -> dict[str, IndexMarks]:
    """IndexMarks per index from a `GET /{expr}/_stats/docs?level=shards` answer (primaries only)."""
    out: dict[str, IndexMarks] = {}
    for name, data in (payload.get("indices") or {}).items():
        marks = []
        for shard_id, copies in (data.get("shards") or {}).items():
            for copy in copies:
                if not copy.get("routing", {}).get("primary", False):
                    continue
                seq = copy.get("seq_no") or {}
                marks.append(
                    ShardMark(
                        int(shard_id),
                        int(seq.get("max_seq_no", -1)),
                        int(seq.get("local_checkpoint", -1)),
                        int(seq.get("global_checkpoint", -1)),
                    )
                )
        out[name] = IndexMarks(name, str(data.get("uuid", "")), tuple(sorted(marks, key=lambda s: s.shard)))
    return out


def same_state(a: IndexMarks, b: IndexMarks) -> bool:
    """No write happened between two readings (same index, same sequence numbers on every primary)."""
    return a.uuid == b.uuid and [(s.shard, s.max_seq_no) for s in a.shards] == [
        (s.shard, s.max_seq_no) for s in b.shards
    ]


def drifted(recorded: IndexMarks, current: IndexMarks) -> bool:
    """The index changed since `recorded`: recreated, resharded, or any primary took a write."""
    return not same_state(recorded, current)


def new_operations(recorded: IndexMarks, current: IndexMarks) -> dict[int, tuple[int, int]]:
    """Per shard, the sequence-number range (after, up_to] written since `recorded` (same shards only)."""
    before = {s.shard: s.max_seq_no for s in recorded.shards}
    return {
        s.shard: (before[s.shard], s.max_seq_no)
        for s in current.shards
        if s.shard in before and s.max_seq_no > before[s.shard]
    }


def incremental_possible(recorded: IndexMarks, current: IndexMarks) -> bool:
    """Same index and shard layout, and no write in flight: appends can be checked against seq_nos."""
    return (
        recorded.uuid == current.uuid
        and [s.shard for s in recorded.shards] == [s.shard for s in current.shards]
        and all(c.max_seq_no >= r.max_seq_no for r, c in zip(recorded.shards, current.shards, strict=True))
        and current.settled
    )


def appends_only(
    ops: Mapping[int, tuple[int, int]], found: Mapping[int, int], live_before: int, live_now: int
) -> bool:
    """True when every operation since the snapshot added one new document that is still live.

    An append takes one sequence number and leaves one live document carrying it. An update also
    leaves a live document with a new sequence number but removes the old version, so the live count
    grows by less than the number of new documents; a delete leaves no document for its sequence
    number. So: per shard, documents found in the new range == operations in it, and the live count
    grew by exactly that many."""
    per_shard = all(found.get(shard, 0) == hi - lo for shard, (lo, hi) in ops.items())
    total = sum(found.get(shard, 0) for shard in ops)
    return per_shard and live_now == live_before + total


@dataclass(frozen=True)
class Freshness:
    """What is stored for one concrete index and whether the index changed since."""

    index: str
    field: str
    snapshot: SnapshotInfo | None
    current: IndexMarks | None  # None when `_stats` was not allowed or failed
    stale: bool | None  # None: unknown (no snapshot, or no permission to read the markers)
    reason: str
    operations_since: int | None

    def to_json(self) -> dict[str, Any]:
        info = self.snapshot
        return {
            "index": self.index,
            "field": self.field,
            "snapshot": info.snapshot if info else None,
            "built_at": info.built_at if info else None,
            "method": info.method if info else None,
            "live_docs": info.live_docs if info else None,
            "stale": self.stale,
            "reason": self.reason,
            "operations_since": self.operations_since,
            "age_seconds": _age_seconds(info.built_at) if info else None,
            "length_docs": info.length_docs if info else None,  # entries of its length table, None: none
            "lengths_skipped": info.lengths_skipped if info else None,
        }


def judge(index: str, field: str, info: SnapshotInfo | None, current: IndexMarks | None) -> Freshness:
    """Freshness of one index from its snapshot info and current markers (pure)."""
    if info is None:
        return Freshness(index, field, None, current, None, "no snapshot: estimated mode", None)
    if current is None:
        return Freshness(index, field, info, None, None, "sequence numbers unavailable", None)
    ops = current.operations - info.marks.operations
    if info.marks.uuid != current.uuid:
        return Freshness(index, field, info, current, True, "index was recreated since the snapshot", None)
    if drifted(info.marks, current):
        return Freshness(index, field, info, current, True, f"{ops} write(s) since the snapshot", ops)
    if not info.exact_marks:
        return Freshness(index, field, info, current, True, "writes landed during the build", 0)
    return Freshness(index, field, info, current, False, "up to date", 0)


def _age_seconds(iso: str) -> float:
    from datetime import datetime, timezone

    return round((datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds(), 1)
