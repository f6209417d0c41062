"""The proxy's form of a length table (`stats.lengths.DocLengths`): at most 8 bytes a document, in one
file every serving process maps read-only, so N workers share one copy in the page cache.

The store in the cluster stays the source of truth (`DocLengths`, built, merged and refreshed exactly as
before); this is a local cache of it, written once per snapshot (`LengthIndex.build`, atomically: a
temporary file renamed into place) and opened with `numpy.memmap` by every worker (`LengthIndex.open`).

Layout. Each document *version* gets a 128-bit key from its stored 64-bit `doc_key`, `_seq_no` and
`_primary_term` (two independent multiply-xorshift lanes `a` and `b`, each over all three words), so an
update is a new key. A table keyed by version (`by_version`) puts the shard number in place of the
`doc_key`: (shard, `_seq_no`, `_primary_term`) names one live version, so a hit is found without its
`_id` given its shard (0 in an index of one shard); a hit without its shard, of a table that records
its index's routing (`routing_shards`), is given the shard its `_id` or `_routing` routes to. The top
`k` bits of `a` pick a bucket, `k = floor(log2(n / 4))`, i.e. 4 to 8 records a bucket on average. A
bucket's records are contiguous; the directory holds each bucket's start as a uint16 offset from a
uint64 anchor every 4096 buckets (2 bytes a bucket: at most 0.5 byte a document). A record is 7 bytes, a 56-bit word: the top `r = 56 - L` bits of `b` (the fingerprint) above
an `L`-bit length, `L` the fewest bits that hold every length of the table below the escape code
`2^L - 1`, at most 16; a document of 65,535 tokens or more is an escape whose length sits, under its
full 128-bit key, in a small side table. So a document costs 7 bytes plus at most 0.5 of directory
(plus 24 for each escaped document and a 4 KiB header): 7.34 bytes at 100 M documents.

Exactness. A version the table holds is always found with its own length (never a false negative, except
that records equal in bucket and fingerprint make the lookup answer None). A version the table does not
hold (an update, a new document) gets a length only if some record of its bucket has its fingerprint:
with the key behaving as a random function, the probability is at most (records in the bucket, < 8 on
average) x 2^-r per such lookup: below 2^-37 (~7e-12) when lengths need 16 bits, below 2^-41 when every
document is shorter than 4,095 tokens (L <= 12), below 2^-45 under 255 tokens. Two matching records,
a hit without a usable `_seq_no`/`_primary_term`, or one above the table's largest (a write after the
build, on any shard holding the largest) answer None without looking. That is the price of 8 bytes: the
former table compared 64-bit document keys plus the whole sequence number and primary term (28 bytes).

Building reads the stored chunks once, spilling 20 bytes a document to a temporary file beside the
target, and places the records in a second pass: memory stays bounded by a slice of 4 M documents plus
the directory (at most 16 bytes a bucket while counting, 2 to 4 bytes a document), whatever the
table's size."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bmx_rerank.stats.lengths import DocLengths, versions
from bmx_rerank.stats.routing import routed_shards, routing_keys

MAGIC = b"BMXLEN01"
HEADER = 4096  # bytes; sections follow, each 64-byte aligned
RECORD = 7  # bytes a record
ANCHOR_SHIFT = 12  # one uint64 anchor every 2^12 buckets; the uint16 offsets are relative to it
MAX_LENGTH_BITS = 16
SPILL = np.dtype([("bucket", "<u4"), ("fp", "<u8"), ("length", "<u8")])  # 20 bytes a document
_SLICE = 1 << 22  # documents per pass step while building

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SEEDS_A = (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03, 0x8CB92BA72F3D8DD7)
_SEEDS_B = (0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5)


# each seed word for both lanes at once, (2, 1) each
_SEED_KEY, _SEED_SEQ, _SEED_TERM = np.array([_SEEDS_A, _SEEDS_B], np.uint64)[:, :, None].transpose(1, 0, 2)
_S30, _S27, _S31, _S8 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(8)


def _fmix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of 64-bit words with full avalanche."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def version_keys(keys: np.ndarray, seq_nos: np.ndarray, terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two 64-bit lanes of each version's key: `a` (bucket) and `b` (fingerprint). For a fixed
    document each lane is a bijection of the sequence number, so an update is a new key."""
    k = np.asarray(keys, np.uint64)
    s = np.asarray(seq_nos, np.int64).astype(np.uint64)
    t = np.asarray(terms, np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = _fmix(k ^ _SEED_KEY)
        z = _fmix(z ^ (s + _SEED_SEQ))
        z = _fmix(z ^ (t * _SEED_TERM))
    return z[0], z[1]


def _buckets(a: np.ndarray, k: int) -> np.ndarray:
    return (a >> np.uint64(64 - k)).astype(np.int64) if k else np.zeros(a.shape, np.int64)


def _fingerprints(b: np.ndarray, r: int) -> np.ndarray:
    return b >> np.uint64(64 - r)


def bucket_bits(n: int) -> int:
    """k: 2^k buckets of 4 to 8 documents on average (one bucket below 8 documents)."""
    return max(0, (n // 4).bit_length() - 1)


def default_dir() -> Path:
    """`$BMX_RERANK_LENGTHS_DIR` (as `serve --lengths-dir`), else a per-user directory under the system's temporary directory: every
    worker of one host finds the same files there."""
    configured = os.environ.get("BMX_RERANK_LENGTHS_DIR")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"bmx-rerank-lengths-{os.getuid()}"


@dataclass(frozen=True)
class _Layout:
    n: int
    k: int
    length_bits: int
    escapes: int
    max_seq_no: int
    max_primary_term: int
    ident: str
    by_version: bool = False  # keyed by (shard, _seq_no, _primary_term): no `_id` needed
    shard_count: int = 1  # shards a `by_version` table's keys range over (files before it: one shard)
    routing_shards: int = 0  # the index's routing shard count, checked at the build; 0: unknown (older files)

    @property
    def r(self) -> int:
        return 8 * RECORD - self.length_bits

    def sections(self) -> dict[str, tuple[int, int]]:
        """Each section's (offset, size in bytes)."""
        sizes = {
            "anchors": 8 * (((1 << self.k) >> ANCHOR_SHIFT) + 1),
            "offsets": 2 * ((1 << self.k) + 1),
            "records": RECORD * self.n,
            "escapes": 24 * self.escapes,
        }
        out, at = {}, HEADER
        for name, size in sizes.items():
            out[name] = (at, size)
            at += -(-size // 64) * 64
        out["end"] = (at, 0)
        return out

    def header(self) -> bytes:
        meta = json.dumps(
            {
                "n": self.n,
                "k": self.k,
                "length_bits": self.length_bits,
                "escapes": self.escapes,
                "max_seq_no": self.max_seq_no,
                "max_primary_term": self.max_primary_term,
                "ident": self.ident,
                "by_version": self.by_version,
                "shard_count": self.shard_count,
                "routing_shards": self.routing_shards,
            }
        ).encode()
        blob = MAGIC + len(meta).to_bytes(4, "little") + meta
        if len(blob) > HEADER:
            raise ValueError("length index header too long")
        return blob + b"\x00" * (HEADER - len(blob))

    @classmethod
    def parse(cls, head: bytes) -> _Layout:
        if head[:8] != MAGIC:
            raise ValueError("not a length index file")
        size = int.from_bytes(head[8:12], "little")
        meta: dict[str, Any] = json.loads(head[12 : 12 + size])
        return cls(**meta)


class LengthIndex:
    """A memory-mapped, read-only length table (see the module docstring): `find` answers as
    `DocLengths.find` does, from at most 8 bytes a document shared by every process mapping it."""

    def __init__(self, path: Path, layout: _Layout, data: np.ndarray) -> None:
        self.path = path
        self.layout = layout
        self._data = data  # the whole file, uint8, read-only memmap
        sec = layout.sections()
        # The sections as plain arrays over the same mapping: a `memmap` runs Python code at each
        # indexing (`__getitem__`, `__array_finalize__`), five of them a lookup
        whole = data.view(np.ndarray)

        def view(name: str, dtype: str) -> np.ndarray:
            at, size = sec[name]
            return whole[at : at + size].view(dtype)

        self.anchors = view("anchors", "<u8")
        self.offsets = view("offsets", "<u2")
        # each record's 7 bytes as the top of a little-endian word read from the byte before it (the
        # section never starts the file: the header is before it), so a lookup gathers one word each
        at = sec["records"][0]
        self._words = (
            np.ndarray((layout.n,), "<u8", whole, at - 1, (RECORD,)) if layout.n else np.zeros(0, "<u8")
        )
        esc = view("escapes", "<u8").reshape(layout.escapes, 3)
        self._esc_a, self._esc_b, self._esc_len = esc[:, 0], esc[:, 1], esc[:, 2]
        # a record's word: its fingerprint (the top `r` bits of lane `b`) above its length
        self._length_bits = np.uint64(layout.length_bits)
        self._length_mask = np.uint64((1 << layout.length_bits) - 1)
        self._fingerprint_shift = np.uint64(64 - layout.r)

    # --- opening and building ---------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, ident: str | None = None) -> LengthIndex:
        """Map a file `build` wrote; with `ident`, only if it was built for that (ValueError if not)."""
        path = Path(path)
        with open(path, "rb") as fh:
            layout = _Layout.parse(fh.read(HEADER))
        if ident is not None and layout.ident != ident:
            raise ValueError(f"{path} holds another table")
        end = layout.sections()["end"][0]
        if path.stat().st_size != end:
            raise ValueError(f"{path} has {path.stat().st_size} bytes, its header says {end}")
        data = np.memmap(path, dtype=np.uint8, mode="r", shape=(end,)) if end else np.zeros(0, np.uint8)
        return cls(path, layout, data)

    @classmethod
    def from_table(
        cls,
        table: DocLengths,
        path: Path | str,
        ident: str = "",
        *,
        by_version: bool = False,
        shards: int | None = None,
        routing_shards: int | None = None,
    ) -> LengthIndex:
        """The index of a whole `DocLengths` (tests, benchmarks): `build` over its rows. Keyed
        `by_version` over `shards` shards (None: up to the largest shard number in the table), with each
        row's shard number; a table of one shard needs none. `routing_shards`: as `LengthIndexWriter`."""
        writer = LengthIndexWriter(
            path, len(table), ident, by_version=by_version, shards=shards, routing_shards=routing_shards
        )
        one = shards == 1 or (shards is None and not table.shards_known)
        for start in range(0, len(table), _SLICE):
            end = start + _SLICE
            writer.add(
                table.keys[start:end],
                table.seq_nos[start:end],
                table.primary_terms[start:end],
                table.lengths[start:end],
                None if one else table.shard_nos[start:end],
            )
        return writer.finish()

    # --- answering ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.layout.n

    @property
    def by_version(self) -> bool:
        """Whether a hit is found without its `_id`, given its shard: within one shard a live document
        version is named by its `_seq_no` and `_primary_term` alone (sequence numbers are never reused
        within a shard; a primary's failover changes the term)."""
        return self.layout.by_version

    @property
    def shards(self) -> int:
        """The shards a table keyed `by_version` spans (a hit's shard number is in [0, shards); 1: no
        shard number needed); 0 for a table keyed by `_id`, which takes none."""
        return self.layout.shard_count if self.layout.by_version else 0

    @property
    def routing_shards(self) -> int | None:
        """The routing shard count that placed every document of the build in the shard it was found
        in (`stats.routing`), so a hit without its shard is looked up in the shard its `_id` or
        `_routing` routes to; None when unknown (not checked, did not fit, older files, one shard)."""
        lay = self.layout
        return lay.routing_shards or None if lay.by_version and lay.shard_count > 1 else None

    @property
    def nbytes(self) -> int:
        """Bytes of the file (what every process maps, once in the page cache)."""
        return int(self.layout.sections()["end"][0])

    def close(self) -> None:
        mm = getattr(self._data, "_mmap", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # views still alive: the mapping goes with them
                pass

    def find(
        self,
        ids: Sequence[str],
        routings: Sequence[str | None],
        seq_nos: Sequence[object],
        primary_terms: Sequence[object],
        shards: Sequence[object] | None = None,
    ) -> np.ndarray:
        """Each document version's length, -1 when the index cannot be sure it holds that exact
        version (as `DocLengths.find`; the bound on a wrong answer is in the module docstring): a
        window's hits in a few numpy calls (`optional`: None for -1).

        A table keyed `by_version` reads each hit's shard number from `shards`: a given shard is used as
        given; None (or a None in it) is shard 0 in a table of one shard, and in one of several the
        shard the hit's `_routing`, else its `_id`, routes to when the table knows its index's routing
        (`routing_shards`; a hit with an empty `_id` has none), else no answer. That shard is exact:
        the build found every document in the shard the same rule names, a later document of the index
        is routed by the same rule, and an index routed otherwise failed that check and has no
        `routing_shards`. A shard outside [0, `self.shards`) is no answer. A table keyed by `_id`
        ignores `shards`."""
        out = np.full(len(ids), -1, np.int64)
        lay = self.layout
        if self.routing_shards is not None:
            shards = self._routed(ids, routings, shards)
        usable, keys, seq, term = versions(
            ids,
            routings,
            seq_nos,
            primary_terms,
            lay.max_seq_no,
            lay.max_primary_term,
            by_version=lay.by_version,
            shards=shards,
            shard_count=lay.shard_count,
        )
        if usable.size and lay.n:
            out[usable] = self._find(keys, seq, term)
        return out

    def _routed(
        self, ids: Sequence[str], routings: Sequence[str | None], shards: Sequence[object] | None
    ) -> list[object]:
        """`shards` with each missing one the shard the hit's routing key goes to; a hit without its
        `_id` (an empty one: the engines refuse it as an `_id`) stays without."""
        given: list[object] = [None] * len(ids) if shards is None else list(shards)
        if len(given) != len(ids):
            raise ValueError("one shard number (or None) a hit")
        missing = [i for i, s in enumerate(given) if s is None and ids[i]]
        if missing:
            assert self.routing_shards is not None
            keys = routing_keys([ids[i] for i in missing], [routings[i] for i in missing])
            for i, shard in zip(
                missing, routed_shards(keys, self.routing_shards, self.shards).tolist(), strict=True
            ):
                given[i] = shard
        return given

    def _find(self, keys: np.ndarray, seq: np.ndarray, term: np.ndarray) -> np.ndarray:
        """Each version's length, -1 where not sure."""
        lay = self.layout
        n = keys.shape[0]
        a, b = version_keys(keys, seq, term)
        bucket = _buckets(a, lay.k)
        edges = self._start(np.concatenate((bucket, bucket + 1)))  # each bucket's start, then its end
        start, count = edges[:n], edges[n:] - edges[:n]
        total = int(count.sum())
        result = np.full(n, -1, np.int64)
        if total == 0:
            return result
        owner = np.repeat(np.arange(n), count)
        # each candidate record's position: its bucket's start, then the bucket's next records
        pos = np.repeat(start - (np.cumsum(count) - count), count) + np.arange(total)
        word = self._words[pos] >> _S8
        match = (word >> self._length_bits) == (b >> self._fingerprint_shift)[owner]
        matches = np.bincount(owner[match], minlength=n)
        lengths = (word & self._length_mask).astype(np.int64)
        one = (matches == 1).nonzero()[0]
        if one.size:
            # the matching record of each hit with exactly one: the last matching position per owner
            got = np.zeros(n, np.int64)
            got[owner[match]] = lengths[match]
            result[one] = got[one]
        escaped = (result == (1 << lay.length_bits) - 1).nonzero()[0]
        if escaped.size:
            result[escaped] = self._escaped(a[escaped], b[escaped])
        return result

    def _start(self, bucket: np.ndarray) -> np.ndarray:
        return self.anchors[bucket >> ANCHOR_SHIFT].astype(np.int64) + self.offsets[bucket].astype(np.int64)

    def _escaped(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The escaped documents' lengths from the side table (full 128-bit key), -1 if not there."""
        lo = np.searchsorted(self._esc_a, a, "left")
        hi = np.searchsorted(self._esc_a, a, "right")
        out = np.full(a.shape[0], -1, np.int64)
        for i in np.flatnonzero(hi > lo).tolist():
            hits = [j for j in range(int(lo[i]), int(hi[i])) if self._esc_b[j] == b[i]]
            if len(hits) == 1:
                out[i] = int(self._esc_len[hits[0]])
        return out

    def same_as(self, table: DocLengths) -> bool:
        """Holds exactly `table`'s versions with their lengths: as many, and each found with its own
        (keyed by version: under its shard, which a table of several shards must know for every row)."""
        if len(table) != len(self):
            return False
        if self.shards > 1 and not table.shards_known:
            return False
        for start in range(0, len(table), _SLICE):
            end = start + _SLICE
            keys = table.keys[start:end]
            if self.shards == 1:
                keys = np.zeros_like(keys)
            elif self.by_version:
                keys = table.shard_nos[start:end].astype(np.uint64)
            got = self._find(keys, table.seq_nos[start:end], table.primary_terms[start:end])
            if not np.array_equal(got, table.lengths[start:end]):
                return False
        return True


class LengthIndexWriter:
    """Builds a `LengthIndex` file of exactly `n` documents from rows given in any order and chunking
    (`add`), in bounded memory: rows are spilled to a temporary file, then placed (`finish`).

    Keyed `by_version`, over `shards` shards (None: as many as the largest shard number added says);
    `routing_shards`: the index's routing shard count, checked against every document by the build
    (`LengthIndex.routing_shards`; None: unknown)."""

    def __init__(
        self,
        path: Path | str,
        n: int,
        ident: str = "",
        *,
        by_version: bool = False,
        shards: int | None = None,
        routing_shards: int | None = None,
    ) -> None:
        if shards is not None and shards < 1:
            raise ValueError("a table keyed by version spans at least one shard")
        if routing_shards is not None and not (by_version and shards and routing_shards % shards == 0):
            raise ValueError("a routing shard count needs a table keyed by version over a known shard count")
        self.routing_shards = routing_shards
        self.path = Path(path)
        self.n = n
        self.ident = ident
        self.by_version = by_version
        self.shards = shards
        self.max_shard = 0
        self.k = bucket_bits(n)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, spill = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".spill")
        self._spill_path = Path(spill)
        self._spill = os.fdopen(fd, "wb")
        self.rows = 0
        self.max_length = 0
        self.max_seq_no = -1
        self.max_primary_term = 0
        self._long: list[np.ndarray] = []  # escapes: (a, b, length) of documents too long for 16 bits

    def add(
        self,
        keys: np.ndarray | Sequence[int],
        seq_nos: np.ndarray | Sequence[int],
        primary_terms: np.ndarray | Sequence[int],
        lengths: np.ndarray | Sequence[int],
        shards: np.ndarray | Sequence[int] | None = None,
    ) -> None:
        """Rows of (key, seq_no, primary_term, length); keyed `by_version`, `shards` gives each row's
        shard number (None: all of shard 0) and `keys` are not read."""
        seq = np.asarray(seq_nos, np.int64)
        term = np.asarray(primary_terms, np.int64)
        length = np.asarray(lengths, np.int64)
        if not seq.size:
            return
        if seq.min() < 0 or term.min() < 1 or length.min() < 0:
            raise ValueError("sequence numbers, primary terms and lengths must be non-negative (terms >= 1)")
        if self.rows + seq.size > self.n:
            raise ValueError(f"more than the {self.n} documents announced")
        if not self.by_version:
            key = np.asarray(keys, np.uint64)
        elif shards is None:
            key = np.zeros(seq.size, np.uint64)
        else:
            shard = np.asarray(shards, np.int64)
            if shard.shape != seq.shape or shard.min() < 0:
                raise ValueError("keyed by version, every row needs its shard number")
            if self.shards is not None and shard.max() >= self.shards:
                raise ValueError(f"a shard number beyond the {self.shards} shards announced")
            self.max_shard = max(self.max_shard, int(shard.max()))
            key = shard.astype(np.uint64)
        a, b = version_keys(key, seq, term)
        rows = np.empty(seq.size, SPILL)
        rows["bucket"] = _buckets(a, self.k)
        rows["fp"] = b
        rows["length"] = length
        self._spill.write(rows.tobytes())
        self.rows += seq.size
        self.max_length = max(self.max_length, int(length.max()))
        self.max_seq_no = max(self.max_seq_no, int(seq.max()))
        self.max_primary_term = max(self.max_primary_term, int(term.max()))
        # the escapes need the full key; keep `a` for the (rare) long documents only
        long = length >= (1 << MAX_LENGTH_BITS) - 1
        if long.any():
            self._long.append(np.stack([a[long], b[long], length[long].astype(np.uint64)], axis=1))

    def abort(self) -> None:
        """Give up: remove the spill file."""
        self._spill.close()
        self._spill_path.unlink(missing_ok=True)

    def finish(self) -> LengthIndex:
        """Place every record, write the file under a temporary name, rename it into place, map it."""
        try:
            self._spill.close()
            if self.rows != self.n:
                raise ValueError(f"{self.rows} documents added, {self.n} announced")
            length_bits = min(MAX_LENGTH_BITS, max(1, (self.max_length + 1).bit_length()))
            long = self._long
            esc = (
                np.concatenate(long)
                if long and length_bits == MAX_LENGTH_BITS
                else np.zeros((0, 3), np.uint64)
            )
            esc = esc[np.lexsort((esc[:, 1], esc[:, 0]))] if esc.size else esc
            layout = _Layout(
                self.n,
                self.k,
                length_bits,
                int(esc.shape[0]),
                self.max_seq_no,
                self.max_primary_term,
                self.ident,
                self.by_version,
                (self.shards or self.max_shard + 1) if self.by_version else 0,
                self.routing_shards or 0,
            )
            return self._write(layout, esc)
        finally:
            self._spill_path.unlink(missing_ok=True)

    def _write(self, layout: _Layout, esc: np.ndarray) -> LengthIndex:
        sec = layout.sections()
        end = sec["end"][0]
        spill = (
            np.memmap(self._spill_path, dtype=SPILL, mode="r", shape=(self.n,))
            if self.n
            else np.zeros(0, SPILL)
        )
        buckets = 1 << layout.k
        counts = np.zeros(buckets, np.int64)
        for s in range(0, self.n, _SLICE):
            counts += np.bincount(spill["bucket"][s : s + _SLICE], minlength=buckets)
        starts = np.zeros(buckets + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        del counts
        anchors = starts[:: 1 << ANCHOR_SHIFT].copy()
        relative = np.empty(buckets + 1, "<u2")
        for lo in range(0, buckets + 1, _SLICE):
            part = (
                starts[lo : lo + _SLICE]
                - anchors[np.arange(lo, min(lo + _SLICE, buckets + 1)) >> ANCHOR_SHIFT]
            )
            if part.max(initial=0) > np.iinfo(np.uint16).max:
                raise ValueError("a directory block overflows 16 bits")  # ~10^2 standard deviations away
            relative[lo : lo + _SLICE] = part
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            with open(tmp_path, "r+b") as fh:
                fh.truncate(end)
                fh.write(layout.header())
            out = np.memmap(tmp_path, dtype=np.uint8, mode="r+", shape=(end,)) if end else None
            if out is not None:

                def put(name: str, values: np.ndarray) -> None:
                    at, size = sec[name]
                    out[at : at + size] = np.ascontiguousarray(values).view(np.uint8).reshape(-1)

                put("anchors", anchors.astype("<u8"))
                put("offsets", relative)
                del relative
                put("escapes", esc.astype("<u8"))
                records = out[sec["records"][0] : sec["records"][0] + sec["records"][1]].reshape(
                    self.n, RECORD
                )
                fill = starts[:-1]  # each bucket's next free record (starts is not needed any more)
                escape = (1 << layout.length_bits) - 1
                for s in range(0, self.n, _SLICE):
                    part = np.asarray(spill[s : s + _SLICE])
                    order = np.argsort(part["bucket"], kind="stable")
                    part = part[order]
                    bucket = part["bucket"].astype(np.int64)
                    first = np.searchsorted(bucket, bucket, "left")
                    pos = fill[bucket] + (np.arange(bucket.size) - first)
                    uniq, cnt = np.unique(bucket, return_counts=True)
                    fill[uniq] += cnt
                    length = np.minimum(part["length"], np.uint64(escape))
                    word = (_fingerprints(part["fp"], layout.r) << np.uint64(layout.length_bits)) | length
                    records[pos] = word.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :RECORD]
                out.flush()
                del records, out
            with open(tmp_path, "rb") as fh:
                os.fsync(fh.fileno())
            os.chmod(tmp_path, 0o644)
            os.replace(tmp_path, self.path)
        except BaseException:
            tmp_path.unlink(missing_ok=True)
            raise
        finally:
            del spill
        return LengthIndex.open(self.path, layout.ident)


def build(
    path: Path | str,
    n: int,
    chunks: Iterable[tuple[Any, ...]],
    ident: str = "",
    *,
    by_version: bool = False,
    shards: int | None = None,
    routing_shards: int | None = None,
) -> LengthIndex:
    """The index of `n` documents given as (keys, seq_nos, primary_terms, lengths[, shard numbers])
    chunks (`LengthIndexWriter.add`)."""
    writer = LengthIndexWriter(
        path, n, ident, by_version=by_version, shards=shards, routing_shards=routing_shards
    )
    try:
        for chunk in chunks:
            writer.add(*chunk)
    except BaseException:
        writer.abort()
        raise
    return writer.finish()
