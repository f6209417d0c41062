"""Exact field lengths |D| of every document version a sweep read, so a window whose term frequencies
come from the first stage's probes needs no `_mtermvectors` at all.

A table maps a 64-bit hash of (`_id`, `_routing`) to the `_seq_no` and `_primary_term` of the version
the sweep read, and that version's length. A hit's length is taken only when all three match: the
same document (id and routing) in the same version (sequence number and primary term). Anything else
(a document changed since the build, a hit without a sequence number) is None, and the caller fetches
term vectors as before. Keys that occur twice (a hash collision) are dropped, and remembered as
dropped so tables merged from slices or refreshes equal a rebuild's table: exactness first.

This is the build's and the store's form (exact keys, merged by slices and refreshes); the proxy
serves the same table from a compact memory-mapped file, `stats.length_index.LengthIndex`.

Each row also records the number of the shard its version lives in (`shard_nos`, -1 where the scan
could not tell): within one shard a live version is named by (`_seq_no`, `_primary_term`) alone, so a
table whose every row has its shard can be served keyed by (shard, `_seq_no`, `_primary_term`), a hit
found without its `_id` (`stats.length_index.LengthIndex.by_version`).

The table belongs to one concrete index; a re-created index of the same name starts again at
`_seq_no` 0 and must not use it (the statistics cache checks the index UUID)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import ClassVar

import numpy as np

UNKNOWN_SHARD = -1  # a row whose shard the scan could not tell (a scroll over several shards, an old chunk)
INT64 = (-(2**63), 2**63 - 1)


def doc_key(doc_id: str, routing: str | None) -> int:
    """The 64-bit key of a document: blake2b of its id (length-prefixed) and routing (or none)."""
    raw = doc_id.encode()
    h = hashlib.blake2b(len(raw).to_bytes(4, "little"), digest_size=8)
    h.update(raw)
    h.update(b"\x00" if routing is None else b"\x01" + routing.encode())
    return int.from_bytes(h.digest(), "little")


def _u64(values: Iterable[int]) -> np.ndarray:
    return np.fromiter(values, np.uint64)


@dataclass(frozen=True)
class DocLengths:
    """Lengths of one concrete index's documents, sorted by key (see the module docstring)."""

    keys: np.ndarray  # (n,) uint64, sorted, unique
    seq_nos: np.ndarray  # (n,) int64
    primary_terms: np.ndarray  # (n,) int64
    lengths: np.ndarray  # (n,) int64
    dropped: np.ndarray  # (d,) uint64, sorted unique keys seen more than once (never answered)
    # (n,) int32: the shard each version lives in, UNKNOWN_SHARD where not known; not given: all unknown
    shard_nos: np.ndarray = dataclass_field(default_factory=lambda: np.zeros(0, np.int32))
    by_version: ClassVar[bool] = False  # looked up by `_id` (see `LengthIndex.by_version`)
    # Keyed by `_id`, it takes no shard number: 0 shards of version keys (a table keyed by version has
    # at least 1), so nothing reads it as a one-shard table that a shard number 0 would fit.
    shards: ClassVar[int] = 0

    def __post_init__(self) -> None:
        n = self.keys.shape[0]
        if not n or self.shard_nos.shape != (0,):
            shard_nos = np.asarray(self.shard_nos, np.int32)
        else:
            shard_nos = np.full(n, UNKNOWN_SHARD, np.int32)
        object.__setattr__(self, "shard_nos", shard_nos)
        shapes = (self.seq_nos.shape, self.primary_terms.shape, self.lengths.shape, self.shard_nos.shape)
        if any(shape != (n,) for shape in shapes):
            raise ValueError("keys, seq_nos, primary_terms, lengths and shard_nos must be 1-d of one length")

    @property
    def shards_known(self) -> bool:
        """Every row has its shard number: the table can be keyed by (shard, version)."""
        return bool(np.all(self.shard_nos >= 0))

    @classmethod
    def empty(cls) -> DocLengths:
        return cls.from_keys(_u64([]), [], [], [])

    @classmethod
    def from_rows(
        cls,
        ids: Sequence[str],
        routings: Sequence[str | None],
        seq_nos: Sequence[int],
        primary_terms: Sequence[int],
        lengths: Sequence[int],
        shard_nos: Sequence[int] | None = None,
    ) -> DocLengths:
        """The table of (id, routing, seq_no, primary_term, length[, shard]) rows; keys seen twice are
        dropped."""
        keys = _u64(doc_key(i, r) for i, r in zip(ids, routings, strict=True))
        return cls.from_keys(keys, seq_nos, primary_terms, lengths, shard_nos=shard_nos)

    @classmethod
    def from_keys(
        cls,
        keys: np.ndarray | Sequence[int],
        seq_nos: np.ndarray | Sequence[int],
        primary_terms: np.ndarray | Sequence[int],
        lengths: np.ndarray | Sequence[int],
        dropped: np.ndarray | Sequence[int] = (),
        shard_nos: np.ndarray | Sequence[int] | None = None,
    ) -> DocLengths:
        """The table of rows already keyed (`doc_key`); a key seen twice, or in `dropped`, is left out.
        Rows without `shard_nos` have an unknown shard."""
        k = np.asarray(keys, dtype=np.uint64)
        order = np.argsort(k, kind="stable")
        k = k[order]
        seq = np.asarray(seq_nos, dtype=np.int64)[order]
        term = np.asarray(primary_terms, dtype=np.int64)[order]
        length = np.asarray(lengths, dtype=np.int64)[order]
        given = np.full(k.shape[0], UNKNOWN_SHARD, np.int32) if shard_nos is None else shard_nos
        shard = np.asarray(given, dtype=np.int32)[order]
        twice = np.zeros(k.shape[0], bool)
        if k.shape[0] > 1:
            same = k[1:] == k[:-1]
            twice[1:] |= same
            twice[:-1] |= same
        gone = np.union1d(np.asarray(dropped, dtype=np.uint64), k[twice]).astype(np.uint64)
        keep = ~twice & ~np.isin(k, gone)
        return cls(k[keep], seq[keep], term[keep], length[keep], gone, shard[keep])

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @property
    def nbytes(self) -> int:
        arrays = (self.keys, self.seq_nos, self.primary_terms, self.lengths, self.dropped, self.shard_nos)
        return int(sum(a.nbytes for a in arrays))

    def __add__(self, other: DocLengths) -> DocLengths:
        """The table of both tables' documents (disjoint sets: slices, or a refresh's new documents),
        equal to the table built from all rows at once."""
        return DocLengths.from_keys(
            np.concatenate([self.keys, other.keys]),
            np.concatenate([self.seq_nos, other.seq_nos]),
            np.concatenate([self.primary_terms, other.primary_terms]),
            np.concatenate([self.lengths, other.lengths]),
            np.union1d(self.dropped, other.dropped),
            np.concatenate([self.shard_nos, other.shard_nos]),
        )

    def same_as(self, other: DocLengths) -> bool:
        return all(
            np.array_equal(a, b)
            for a, b in (
                (self.keys, other.keys),
                (self.seq_nos, other.seq_nos),
                (self.primary_terms, other.primary_terms),
                (self.lengths, other.lengths),
                (self.dropped, other.dropped),
                (self.shard_nos, other.shard_nos),
            )
        )

    def find(
        self,
        ids: Sequence[str],
        routings: Sequence[str | None],
        seq_nos: Sequence[object],
        primary_terms: Sequence[object],
        shards: Sequence[object] | None = None,
    ) -> np.ndarray:
        """Each document version's length, -1 when the table does not hold that exact version (other
        `_seq_no` or `_primary_term`, not swept, dropped, or no sequence number given; `optional`:
        None for -1). `shards` is ignored: the document is named by its `_id` and routing."""
        out = np.full(len(ids), -1, np.int64)
        usable, keys, seq, term = versions(ids, routings, seq_nos, primary_terms)
        if not usable.size or not len(self):
            return out
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self) - 1)
        hit = (self.keys[pos] == keys) & (self.seq_nos[pos] == seq) & (self.primary_terms[pos] == term)
        out[usable[hit]] = self.lengths[pos[hit]]
        return out


def optional(lengths: np.ndarray) -> list[int | None]:
    """A `find` answer as a list, None where unknown (-1)."""
    return [None if n < 0 else n for n in lengths.tolist()]


def int_column(values: Sequence[object]) -> tuple[np.ndarray, np.ndarray]:
    """`values` as int64, and where each is an integer (not a bool: no number here) that int64 holds;
    0 where not. One C-level pass where every value is one, as the cluster's hits give them."""
    if set(map(type, values)) <= {int}:
        with contextlib.suppress(OverflowError):
            return np.fromiter(values, np.int64, len(values)), np.ones(len(values), bool)
    ok = [type(v) is int and INT64[0] <= v <= INT64[1] for v in values]  # type: ignore[operator]
    return np.array([v if k else 0 for v, k in zip(values, ok, strict=True)], np.int64), np.array(ok, bool)


def versions(
    ids: Sequence[str],
    routings: Sequence[str | None],
    seq_nos: Sequence[object],
    primary_terms: Sequence[object],
    max_seq_no: int | None = None,
    max_primary_term: int | None = None,
    *,
    by_version: bool = False,
    shards: Sequence[object] | None = None,
    shard_count: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The hits that can name a version a table holds (an integer `_seq_no` >= 0 and `_primary_term`,
    at most the given largest), as positions, with their keys, sequence numbers and primary terms.

    A table keyed `by_version` spans `shard_count` shards and its key is the hit's shard number: a hit
    needs one in [0, shard_count), except in a table of one shard, where every hit is of shard 0
    (`shards` None, or a None in it, means 0 there). Without its shard a hit of a table of several
    shards names no version: another shard may hold the same (`_seq_no`, `_primary_term`)."""
    seq, ok = int_column(seq_nos)
    term, term_ok = int_column(primary_terms)
    ok &= term_ok & (seq >= 0)
    if max_seq_no is not None:
        ok &= seq <= max_seq_no
    if max_primary_term is not None:
        ok &= term <= max_primary_term
    if by_version:
        given = [None] * len(seq_nos) if shards is None else list(shards)
        if len(given) != len(seq_nos):
            raise ValueError("one shard number (or None) a hit")
        if shard_count == 1 and given.count(None) == len(given):  # a window searched whole: shard 0
            usable = ok.nonzero()[0]
            return usable, np.zeros(usable.size, np.uint64), seq[usable], term[usable]
        if shard_count == 1:
            given = [0 if g is None else g for g in given]
        shard, shard_ok = int_column(given)
        ok &= shard_ok & (shard >= 0) & (shard < shard_count)
        usable = ok.nonzero()[0]
        keys = shard[usable].astype(np.uint64)
    else:
        usable = ok.nonzero()[0]
        keys = _u64(doc_key(ids[i], routings[i]) for i in usable.tolist())
    return usable, keys, seq[usable], term[usable]


# Documents per index beyond which a build keeps no table: the build's memory bound (the sweep holds
# ~32 bytes a document until it publishes). The proxy maps each table at <= 8 bytes a document, shared
# by every worker (`stats.length_index`), so it is no longer what bounds the table.
MAX_LENGTH_DOCS = 1_000_000_000


class LengthRecorder:
    """Collects a sweep's (key, seq_no, primary_term, length, shard) rows in numpy blocks (~32 bytes a
    document), keeping none at all past `limit` rows: the table then does not exist (`over`), and
    every hit falls back to `_mtermvectors` as without one."""

    def __init__(self, limit: int = MAX_LENGTH_DOCS) -> None:
        self.limit = limit
        self.rows = 0
        self.over = False
        self._keys: list[np.ndarray] = []
        self._rest: list[np.ndarray] = []  # (3, n) int64: seq_no, primary_term, length
        self._shards: list[np.ndarray] = []  # (n,) int32, UNKNOWN_SHARD where not known

    def add(
        self,
        keys: Sequence[int],
        rest: Sequence[tuple[int, int, int]],
        shards: Sequence[int | None] | None = None,
    ) -> None:
        """Rows of (key, (seq_no, primary_term, length)) and each one's shard (None: unknown)."""
        if self.over or not keys:
            return
        self.rows += len(keys)
        if self.rows > self.limit:
            self.over = True
            self._keys.clear()
            self._rest.clear()
            self._shards.clear()
            return
        self._keys.append(np.array(keys, dtype=np.uint64))
        self._rest.append(np.array(rest, dtype=np.int64).reshape(len(keys), 3))
        given = [None] * len(keys) if shards is None else shards
        if len(given) != len(keys):
            raise ValueError("one shard number (or None) a row")
        self._shards.append(np.array([UNKNOWN_SHARD if s is None else s for s in given], np.int32))

    def finish(self) -> DocLengths | None:
        """The table, or None when over the limit."""
        if self.over:
            return None
        if not self._keys:
            return DocLengths.empty()
        rest = np.concatenate(self._rest)
        return DocLengths.from_keys(
            np.concatenate(self._keys),
            rest[:, 0],
            rest[:, 1],
            rest[:, 2],
            shard_nos=np.concatenate(self._shards),
        )
