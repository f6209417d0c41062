"""The proxy's document-length table (issue 18): a synthetic table of N entries as today's in-memory
`DocLengths` (28 bytes a document, one copy per worker) and as the memory-mapped `LengthIndex` every
worker shares: bytes a document on disk and resident (Rss/Pss of one process and of two processes
mapping the same file, from /proc/PID/smaps), build and load time, and the time to look up 100 hits
(p50); plus exactness: every table version found with its length, changed and never-swept versions None.

    .venv/bin/python -m benchmarks.length_table [--docs 100000000] [--baseline-docs 20000000]

The synthetic table: random sorted 64-bit keys, plus `--named` documents keyed from real ids
(`doc-<i>`, via `doc_key`) so lookups go through the whole path (blake2b of id and routing included);
sequence numbers up to 2N, primary terms 1-3, lengths log-normal around 200 tokens with one document in
100,000 of 70,000 tokens or more (the escape table)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bmx_rerank.stats.freshness import IndexMarks
from bmx_rerank.stats.length_index import LengthIndex, LengthIndexWriter
from bmx_rerank.stats.lengths import DocLengths, doc_key, optional
from bmx_rerank.stats.snapshot import (
    LENGTH_CHUNK,
    SnapshotInfo,
    decode_length_chunk,
    decode_lengths,
    encode_lengths,
)

WINDOW = 100  # hits a lookup asks for
CHANGED = 10  # of them, versions the table does not hold (an update since the build)


@dataclass(frozen=True)
class Synthetic:
    table: DocLengths
    names: list[str]  # ids of the named documents
    seq_nos: np.ndarray  # their versions
    terms: np.ndarray
    lengths: np.ndarray


def synthetic(n: int, named: int = 10_000, seed: int = 18) -> Synthetic:
    """A table of `n` documents, `named` of them with real ids (see the module docstring)."""
    rng = np.random.default_rng(seed)
    names = [f"doc-{i}" for i in range(named)]
    named_keys = np.fromiter((doc_key(x, None) for x in names), np.uint64, named)
    step = (1 << 64) // (n + n // 100 + 1)  # mean gap: the last key stays ~1 % below 2^64
    keys = _merged(
        np.cumsum(rng.integers(1, max(2, 2 * step), n - named, dtype=np.uint64), dtype=np.uint64), named_keys
    )
    if keys.size > 1 and not np.all(keys[1:] > keys[:-1]):
        raise RuntimeError("duplicate synthetic keys; another seed")
    seq = rng.integers(0, 2 * n, n, dtype=np.int64)
    term = rng.integers(1, 4, n, dtype=np.int64)
    length = np.minimum(rng.lognormal(5.3, 0.8, n), 60_000).astype(np.int64)
    length[rng.random(n) < 1e-5] = 70_000
    where = np.searchsorted(keys, named_keys)
    length[where[: named // 100]] = 65_535 + np.arange(named // 100)  # 1 % of the named ones escape too
    table = DocLengths(keys, seq, term, length, np.zeros(0, np.uint64))
    return Synthetic(table, names, seq[where], term[where], length[where])


def _merged(sorted_keys: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """`sorted_keys` with `extra` inserted in order, without sorting the whole again."""
    extra = np.sort(extra)
    return np.insert(sorted_keys, np.searchsorted(sorted_keys, extra), extra)


def windows(
    s: Synthetic, count: int, seed: int = 7
) -> list[tuple[list[str], list[Any], list[Any], list[int | None]]]:
    """`count` windows of WINDOW hits: (ids, seq_nos, primary terms, the lengths a lookup must give)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        pick = rng.choice(len(s.names), WINDOW, replace=False)
        seq = s.seq_nos[pick].copy()
        term = s.terms[pick].copy()
        want: list[int | None] = s.lengths[pick].tolist()
        for j in range(CHANGED):  # updated since the build: a later sequence number, or a new primary term
            if j % 2:
                seq[j] += 1 + int(rng.integers(0, 1000))
            else:
                term[j] += 1
            want[j] = None
        out.append(([s.names[i] for i in pick], seq.tolist(), term.tolist(), want))
    return out


def lookup_p50(table: Any, batch: list[tuple[list[str], list[Any], list[Any], list[int | None]]]) -> float:
    """Median seconds of one WINDOW-hit lookup; checks every answer."""
    times = []
    for ids, seq, term, want in batch:
        started = time.perf_counter()
        got = optional(table.find(ids, [None] * len(ids), seq, term))
        times.append(time.perf_counter() - started)
        if got != want:
            raise AssertionError(f"wrong lengths: {got} != {want}")
    return statistics.median(times)


def absent_found(index: LengthIndex, s: Synthetic, probes: int, seed: int = 11) -> int:
    """How many of `probes` random versions the table does not hold get a length (must be 0)."""
    rng = np.random.default_rng(seed)
    t = s.table
    pick = rng.integers(0, len(t), probes)
    seq = t.seq_nos[pick] + rng.integers(1, 1 << 20, probes)  # every table document, updated since
    found = 0
    for start in range(0, probes, 1 << 20):
        end = start + (1 << 20)
        found += int(
            (
                index._find(t.keys[pick[start:end]], seq[start:end], t.primary_terms[pick[start:end]]) >= 0
            ).sum()
        )
    return found


def mapping_memory(pid: int, path: Path) -> dict[str, int]:
    """Rss and Pss (bytes) of `path`'s mapping in process `pid`, and of the whole process."""
    out = {"map_rss": 0, "map_pss": 0}
    current = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            current = line.rstrip().endswith(str(path))
        elif current and head[0] in ("Rss:", "Pss:"):
            out["map_" + head[0][:-1].lower()] += int(head[1]) * 1024
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        head = line.split()
        if head and head[0] in ("Rss:", "Pss:"):
            out[head[0][:-1].lower()] = int(head[1]) * 1024
    return out


def shared_memory(path: Path, processes: int, lookups: int = 200) -> list[dict[str, Any]]:
    """Start `processes` children that each map `path`, read every page, look up a few windows and
    wait; their memory, read while all of them hold the mapping."""
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.length_table",
                "--child",
                str(path),
                "--child-lookups",
                str(lookups),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        reports = [json.loads(c.stdout.readline()) for c in children]  # type: ignore[union-attr]
        for child, report in zip(children, reports, strict=True):
            report.update(mapping_memory(child.pid, path))
        return reports
    finally:
        for child in children:
            child.stdin.close()  # type: ignore[union-attr]
            child.wait(timeout=60)


def child(path: Path, lookups: int) -> None:
    """A worker: map the file, touch every page (as a long-running worker's lookups would), say ready."""
    started = time.perf_counter()
    index = LengthIndex.open(path)
    opened = time.perf_counter() - started
    started = time.perf_counter()
    data = index._data
    total = 0
    for at in range(0, data.shape[0], 1 << 26):
        total += int(data[at : at + (1 << 26) : 4096].sum())  # one byte a page: faults it in
    touched = time.perf_counter() - started
    rng = np.random.default_rng(3)
    times = []
    names = [f"doc-{i}" for i in range(10_000)]
    for _ in range(lookups):
        pick = rng.choice(len(names), WINDOW, replace=False)
        started = time.perf_counter()
        optional(index.find([names[i] for i in pick], [None] * WINDOW, [0] * WINDOW, [1] * WINDOW))
        times.append(time.perf_counter() - started)
    print(
        json.dumps(
            {
                "open_s": opened,
                "touch_s": touched,
                "lookup_p50_s": statistics.median(times),
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    sys.stdin.read()  # hold the mapping until the parent has read /proc


@dataclass
class Figures:
    docs: int
    file_bytes: int
    build_s: float
    from_store_s: float
    open_s: float
    lookup_p50_s: float
    absent_probes: int
    absent_found: int
    escapes: int
    length_bits: int
    one: dict[str, Any]
    two: list[dict[str, Any]]

    @property
    def bytes_per_doc(self) -> float:
        return self.file_bytes / max(1, self.docs)


def from_store_chunks(table: DocLengths, path: Path) -> float:
    """Seconds the proxy spends writing the file from the store's chunks (as `StatsCache` does:
    decode each chunk, add it), the fetching not counted; the chunks are encoded one at a time."""
    spent = 0.0
    info = _info(len(table), -(-len(table) // LENGTH_CHUNK))
    started = time.perf_counter()
    writer = LengthIndexWriter(path, len(table))
    for start in range(0, len(table), LENGTH_CHUNK):
        end = start + LENGTH_CHUNK
        part = DocLengths(
            table.keys[start:end], table.seq_nos[start:end], table.primary_terms[start:end],
            table.lengths[start:end], table.dropped[:0],
        )  # fmt: skip
        spent += time.perf_counter() - started
        (chunk,) = encode_lengths(part)
        started = time.perf_counter()
        writer.add(*decode_length_chunk(info, chunk)[:4])
    writer.finish().close()
    spent += time.perf_counter() - started
    path.unlink()
    return spent


def _info(n: int, chunks: int) -> SnapshotInfo:
    return SnapshotInfo(
        "bench", "idx", "body", n, 0, 0, 1, n, IndexMarks("idx", "u", ()), True, "2026-01-01T00:00:00+00:00",
        0.0, "build", length_docs=n, length_chunks=chunks,
    )  # fmt: skip


def measure_index(n: int, directory: Path, absent: int = 1_000_000, lookups: int = 2_000) -> Figures:
    s = synthetic(n)
    path = directory / "lengths.bmxlen"
    started = time.perf_counter()
    LengthIndex.from_table(s.table, path).close()
    build = time.perf_counter() - started
    from_store = from_store_chunks(s.table, directory / "from-store.bmxlen")
    started = time.perf_counter()
    index = LengthIndex.open(path)
    opened = time.perf_counter() - started
    batch = windows(s, lookups)
    p50 = lookup_p50(index, batch)
    found = absent_found(index, s, absent)
    layout, file_bytes = index.layout, index.nbytes
    del s, index, batch
    gc.collect()  # this process maps the file no more: the children's figures are theirs alone
    one = shared_memory(path, 1)[0]
    two = shared_memory(path, 2)
    return Figures(
        n,
        file_bytes,
        build,
        from_store,
        opened,
        p50,
        absent,
        found,
        layout.escapes,
        layout.length_bits,
        one,
        two,
    )


def measure_baseline(n: int, lookups: int = 2_000) -> dict[str, float]:
    """Today's `DocLengths`: resident bytes (its arrays, one copy per worker), load time (decoding the
    store's chunks, the network not counted) and lookup p50."""
    s = synthetic(n)
    chunks = encode_lengths(s.table)
    info = _info(n, len(chunks))
    started = time.perf_counter()
    table = decode_lengths(info, chunks)
    load = time.perf_counter() - started
    del chunks
    p50 = lookup_p50(table, windows(s, lookups))
    return {"docs": n, "bytes": table.nbytes, "load_s": load, "lookup_p50_s": p50}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=100_000_000)
    parser.add_argument("--baseline-docs", type=int, default=20_000_000, help="0: skip today's table")
    parser.add_argument("--dir", default=None, help="where the file goes (default: a temporary directory)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-lookups", type=int, default=200, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child), args.child_lookups)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        f = measure_index(args.docs, Path(tmp))
    mib = 1 << 20
    print(f"LengthIndex, {f.docs:,} documents (length bits {f.length_bits}, {f.escapes} escapes):")
    print(
        f"  file {f.file_bytes / mib:,.1f} MiB = {f.bytes_per_doc:.2f} B/doc; build {f.build_s:.1f} s "
        f"(from the store's chunks: {f.from_store_s:.1f} s), open {f.open_s * 1e3:.2f} ms"
    )
    print(
        f"  lookup of {WINDOW} hits p50 {f.lookup_p50_s * 1e3:.3f} ms; {f.absent_found} of {f.absent_probes:,} absent versions found"
    )
    for label, reports in (("1 process", [f.one]), ("2 processes", f.two)):
        for r in reports:
            print(
                f"  {label}: mapping Rss {r['map_rss'] / mib:,.1f} MiB, Pss {r['map_pss'] / mib:,.1f} MiB "
                f"({r['map_pss'] / f.docs:.2f} B/doc); process Rss {r['rss'] / mib:,.1f} Pss {r['pss'] / mib:,.1f} MiB; "
                f"open {r['open_s'] * 1e3:.2f} ms, touch {r['touch_s']:.2f} s, lookup p50 {r['lookup_p50_s'] * 1e3:.3f} ms"
            )
    if args.baseline_docs:
        b = measure_baseline(args.baseline_docs)
        print(f"DocLengths (today), {b['docs']:,} documents:")
        print(
            f"  resident {b['bytes'] / mib:,.1f} MiB = {b['bytes'] / b['docs']:.2f} B/doc per worker; "
            f"load (decode) {b['load_s']:.1f} s; lookup of {WINDOW} hits p50 {b['lookup_p50_s'] * 1e3:.3f} ms"
        )


if __name__ == "__main__":
    main()
