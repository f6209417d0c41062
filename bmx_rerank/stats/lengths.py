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

The table belongs to one concrete index; a re-created index of the same name starts again at
`_seq_no` 0 and must not use it (the statistics cache checks the index UUID)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

BYTES_PER_DOC = 28  # key 8, _seq_no 8, _primary_term 4, length 8 (before compression)


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
    by_version: ClassVar[bool] = False  # looked up by `_id` (see `LengthIndex.by_version`)

    def __post_init__(self) -> None:
        n = self.keys.shape[0]
        if not (self.seq_nos.shape == self.primary_terms.shape == self.lengths.shape == (n,)):
            raise ValueError("keys, seq_nos, primary_terms and lengths must be 1-d arrays of one length")

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
    ) -> DocLengths:
        """The table of (id, routing, seq_no, primary_term, length) rows; keys seen twice are dropped."""
        keys = _u64(doc_key(i, r) for i, r in zip(ids, routings, strict=True))
        return cls.from_keys(keys, seq_nos, primary_terms, lengths)

    @classmethod
    def from_keys(
        cls,
        keys: np.ndarray | Sequence[int],
        seq_nos: np.ndarray | Sequence[int],
        primary_terms: np.ndarray | Sequence[int],
        lengths: np.ndarray | Sequence[int],
        dropped: np.ndarray | Sequence[int] = (),
    ) -> DocLengths:
        """The table of rows already keyed (`doc_key`); a key seen twice, or in `dropped`, is left out."""
        k = np.asarray(keys, dtype=np.uint64)
        order = np.argsort(k, kind="stable")
        k = k[order]
        seq = np.asarray(seq_nos, dtype=np.int64)[order]
        term = np.asarray(primary_terms, dtype=np.int64)[order]
        length = np.asarray(lengths, dtype=np.int64)[order]
        twice = np.zeros(k.shape[0], bool)
        if k.shape[0] > 1:
            same = k[1:] == k[:-1]
            twice[1:] |= same
            twice[:-1] |= same
        gone = np.union1d(np.asarray(dropped, dtype=np.uint64), k[twice]).astype(np.uint64)
        keep = ~twice & ~np.isin(k, gone)
        return cls(k[keep], seq[keep], term[keep], length[keep], gone)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @property
    def nbytes(self) -> int:
        arrays = (self.keys, self.seq_nos, self.primary_terms, self.lengths, self.dropped)
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
            )
        )

    def lookup(
        self,
        ids: Sequence[str],
        routings: Sequence[str | None],
        seq_nos: Sequence[object],
        primary_terms: Sequence[object],
    ) -> list[int | None]:
        """Each document version's length, or None when the table does not hold that exact version
        (other `_seq_no` or `_primary_term`, not swept, dropped, or no sequence number given)."""
        out: list[int | None] = [None] * len(ids)
        usable, keys, seq, term = versions(ids, routings, seq_nos, primary_terms)
        if not usable or not len(self):
            return out
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self) - 1)
        hit = (self.keys[pos] == keys) & (self.seq_nos[pos] == seq) & (self.primary_terms[pos] == term)
        for i, p, ok in zip(usable, pos.tolist(), hit.tolist(), strict=True):
            if ok:
                out[i] = int(self.lengths[p])
        return out


def versions(
    ids: Sequence[str],
    routings: Sequence[str | None],
    seq_nos: Sequence[object],
    primary_terms: Sequence[object],
    max_seq_no: int | None = None,
    max_primary_term: int | None = None,
    *,
    by_version: bool = False,
) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """The hits that can name a version a table holds (an integer `_seq_no` >= 0 and `_primary_term`,
    at most the given largest), with their keys (0 for a table keyed `by_version`), sequence numbers
    and primary terms."""
    hi_seq = max_seq_no if max_seq_no is not None else float("inf")
    hi_term = max_primary_term if max_primary_term is not None else float("inf")
    usable = [
        i
        for i, (s, t) in enumerate(zip(seq_nos, primary_terms, strict=True))
        if _is_int(s) and _is_int(t) and 0 <= s <= hi_seq and t <= hi_term  # type: ignore[operator]
    ]
    keys = (
        np.zeros(len(usable), np.uint64) if by_version else _u64(doc_key(ids[i], routings[i]) for i in usable)
    )
    seq = np.array([seq_nos[i] for i in usable], np.int64)
    term = np.array([primary_terms[i] for i in usable], np.int64)
    return usable, keys, seq, term


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Documents per index beyond which a build keeps no table: the build's memory bound (the sweep holds
# ~32 bytes a document until it publishes). The proxy maps each table at <= 8 bytes a document, shared
# by every worker (`stats.length_index`), so it is no longer what bounds the table.
MAX_LENGTH_DOCS = 1_000_000_000


class LengthRecorder:
    """Collects a sweep's (key, seq_no, primary_term, length) rows in numpy blocks (~28 bytes a
    document), keeping none at all past `limit` rows: the table then does not exist (`over`), and
    every hit falls back to `_mtermvectors` as without one."""

    def __init__(self, limit: int = MAX_LENGTH_DOCS) -> None:
        self.limit = limit
        self.rows = 0
        self.over = False
        self._keys: list[np.ndarray] = []
        self._rest: list[np.ndarray] = []  # (3, n) int64: seq_no, primary_term, length

    def add(self, keys: Sequence[int], rest: Sequence[tuple[int, int, int]]) -> None:
        if self.over or not keys:
            return
        self.rows += len(keys)
        if self.rows > self.limit:
            self.over = True
            self._keys.clear()
            self._rest.clear()
            return
        self._keys.append(np.array(keys, dtype=np.uint64))
        self._rest.append(np.array(rest, dtype=np.int64).reshape(len(keys), 3))

    def finish(self) -> DocLengths | None:
        """The table, or None when over the limit."""
        if self.over:
            return None
        if not self._keys:
            return DocLengths.empty()
        rest = np.concatenate(self._rest)
        return DocLengths.from_keys(np.concatenate(self._keys), rest[:, 0], rest[:, 1], rest[:, 2])
