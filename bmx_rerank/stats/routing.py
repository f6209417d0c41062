"""Which shard a document lives in, from its `_id` or `_routing`, as the cluster routes it. Pure: no I/O.

Elasticsearch and OpenSearch route a document to shard
`floorMod(murmur3_x86_32(key), routing_shards) // (routing_shards // shards)`, the key being its
`_routing` when it has one, else its `_id`, hashed as UTF-16LE code units with seed 0, the hash read
as a signed 32-bit integer. `routing_shards` (the index's routing shard count) is not in its settings
on Elasticsearch; an index created by Elasticsearch 7+ or OpenSearch without one given takes
`default_routing_shards`. An index may set another, `routing_partition_size > 1` adds an offset
from the `_id` to a routed document's hash, and a time-series index routes by its dimensions: so the
formula is never trusted unchecked. A sweep checks it against the shard it found every document in
(`RoutingCheck`); only a formula that placed every document, on enough distinct keys to rule out
chance, is recorded (`SnapshotInfo.length_routing_shards`) and used (`LengthIndex.find`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import mmh3
import numpy as np

# The engines' default splits an index up to 2^10 routing shards (at least one split), so that
# `_split` can later multiply its shards by any power of two up to that.
MAX_ROUTING_SHARDS_LOG2 = 10
# Distinct keys (documents without custom routing: each its own `_id`) a formula must place right
# before it is trusted. A wrong routing puts a key in the formula's shard about 1/shards of the time
# (a half at most, on two shards), so 64 agreeing by chance has probability below 2^-64; documents
# sharing a routing value land together and count for nothing here (they still must all agree).
MIN_EVIDENCE = 64


def default_routing_shards(shards: int) -> int:
    """The routing shard count an index of `shards` shards gets when none is given (Elasticsearch 7+,
    OpenSearch: `MetadataCreateIndexService.calculateNumRoutingShards`): the largest `shards * 2^x`
    up to 1024, with x at least 1."""
    if shards < 1:
        raise ValueError("an index has at least one shard")
    ceil_log2 = (shards - 1).bit_length()
    return shards << max(1, MAX_ROUTING_SHARDS_LOG2 - ceil_log2)


def routing_hash(key: str) -> int:
    """murmur3_x86_32 of the key's UTF-16LE code units, seed 0, signed: Java hashes each `char`, so a
    character outside the BMP is its two surrogates (kept as such if the key holds a lone one)."""
    return mmh3.hash(key.encode("utf-16-le", "surrogatepass"), 0, signed=True)


def routed_shards(keys: Sequence[str], routing_shards: int, shards: int) -> np.ndarray:
    """The shard each routing key (`_routing`, else `_id`) goes to in an index of `shards` shards
    routed over `routing_shards` (int64)."""
    if shards < 1 or routing_shards < shards or routing_shards % shards:
        raise ValueError(f"{routing_shards} routing shards cannot route to {shards} shards")
    hashes = np.fromiter(map(routing_hash, keys), np.int64, len(keys))
    return np.mod(hashes, routing_shards) // (routing_shards // shards)  # numpy's mod is floorMod


def routing_keys(ids: Sequence[str], routings: Sequence[str | None]) -> list[str]:
    """Each document's routing key: its `_routing` where it has one, else its `_id`."""
    return [i if r is None else r for i, r in zip(ids, routings, strict=True)]


def routing_candidates(settings: Mapping[str, Any] | None, shards: int) -> tuple[int, ...]:
    """The routing shard counts worth checking for an index of `shards` shards with these flat
    settings (`_settings?flat_settings=true`; None: not readable): the default, and the one the
    settings name if they do (OpenSearch shows an explicit `index.number_of_routing_shards`). None at
    all where the documents are not routed by key alone, however well they happen to fit: a routing
    partition (the `_id` shifts the hash by less than one shard's span, so most documents still fit),
    a routing path (time series), logsdb routed on its sort fields; and where the settings could not
    be read."""
    if settings is None or shards < 2:
        return ()
    if int(settings.get("index.routing_partition_size", 1)) > 1:
        return ()
    if settings.get("index.routing_path") or settings.get("index.mode") == "time_series":
        return ()
    if str(settings.get("index.logsdb.route_on_sort_fields", "false")).lower() == "true":
        return ()
    out = [default_routing_shards(shards)]
    named = settings.get("index.number_of_routing_shards")
    if named is not None and int(named) != out[0] and int(named) % shards == 0:
        out.append(int(named))
    return tuple(out)


class RoutingCheck:
    """Which candidate routing shard counts place every document fed to it in the shard it was found
    in (`add`), over how many distinct keys: what a sweep learns of its index's routing, added up
    over slices (`combine`) and carried in a slice's partial (`to_json`).

    `proven`: the candidates already stand on an earlier sweep's documents (an incremental refresh
    checks only that the new ones fit too)."""

    def __init__(
        self, shards: int, candidates: Iterable[int], evidence: int = 0, proven: bool = False
    ) -> None:
        self.shards = shards
        self.candidates = tuple(candidates)
        self.evidence = evidence
        self.proven = proven

    def add(self, ids: Sequence[str], routings: Sequence[str | None], found: Sequence[int | None]) -> None:
        """Documents and the shard each was found in (None: not known, which no candidate fits)."""
        if not self.candidates or not ids:
            return
        if any(s is None for s in found):
            self.candidates = ()
            return
        seen = np.asarray(found, np.int64)
        keys = routing_keys(ids, routings)
        self.candidates = tuple(
            c for c in self.candidates if np.array_equal(routed_shards(keys, c, self.shards), seen)
        )
        self.evidence += sum(r is None for r in routings)

    @property
    def routing_shards(self) -> int | None:
        """The one candidate every document fitted, on enough evidence; None otherwise (none fitted,
        two did, or too few distinct keys to tell a fit from chance)."""
        if len(self.candidates) != 1 or not (self.proven or self.evidence >= MIN_EVIDENCE):
            return None
        return self.candidates[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "candidates": list(self.candidates),
            "evidence": self.evidence,
            "proven": self.proven,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoutingCheck:
        return cls(
            int(data["shards"]), map(int, data["candidates"]), int(data["evidence"]), bool(data["proven"])
        )


def combine(checks: Sequence[RoutingCheck | None]) -> RoutingCheck | None:
    """The check of all the slices' documents together: the candidates every slice kept, their
    evidence added (the keys of different slices are different documents); None if a slice has none."""
    if not checks or any(c is None for c in checks):
        return None
    first = checks[0]
    assert first is not None
    kept = [
        c for c in first.candidates if all(c in other.candidates for other in checks if other is not None)
    ]
    if any(other is not None and other.shards != first.shards for other in checks):
        kept = []
    return RoutingCheck(
        first.shards,
        kept,
        sum(c.evidence for c in checks if c is not None),
        all(c.proven for c in checks if c is not None),
    )
