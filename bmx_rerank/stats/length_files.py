"""The length tables' local files: one per snapshot and host, written once from the store's chunks under
a lock (the first process to need it writes, the others wait and map it), memory-mapped read-only by
every process, removed a day after nothing touched them."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from bmx_rerank.stats import store
from bmx_rerank.stats.length_index import LengthIndex, LengthIndexWriter
from bmx_rerank.stats.snapshot import SnapshotInfo
from bmx_rerank.upstream import Cluster

log = logging.getLogger("bmx_rerank.stats.cache")  # the cache's log: these are its files
STALE_FILES = 24 * 3600.0  # seconds after which another snapshot's length file may be removed


async def write(
    cluster: Cluster, store_index: str, info: SnapshotInfo, headers: Mapping[str, str], path: Path, ident: str
) -> LengthIndex:
    """The snapshot's length file at `path`, written from the store unless another process did."""
    assert info.length_docs is not None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    async with file_lock(path.with_suffix(".lock")):
        opened = open_index(path, ident)  # another process wrote it while this one waited
        if opened is not None:
            return opened
        started = time.perf_counter()
        by_version = keyed_by_version(info)
        shards = len(info.marks.shards) if by_version else None
        routing = info.length_routing_shards if by_version and shards and shards > 1 else None
        writer = await asyncio.to_thread(
            LengthIndexWriter,
            path,
            info.length_docs,
            ident,
            by_version=by_version,
            shards=shards,
            routing_shards=routing,
        )
        try:
            async for keys, seq, term, length, shard_nos in store.length_chunks(
                cluster, headers, info, store_index
            ):
                # one shard: every row is of shard 0, also in chunks written before the shard numbers
                shard_nos = shard_nos if by_version and shards != 1 else None
                await asyncio.to_thread(writer.add, keys, seq, term, length, shard_nos)
            index = await asyncio.to_thread(writer.finish)
        except BaseException:
            writer.abort()
            raise
    log.info(
        "length table mapped",
        extra={
            "fields": {
                "snapshot": info.snapshot,
                "documents": len(index),
                "bytes": index.nbytes,
                "seconds": round(time.perf_counter() - started, 3),
            }
        },
    )
    remove_stale(path.parent, keep=path)
    return index


def ident(base_url: str, store_index: str, info: SnapshotInfo) -> str:
    """The name of a snapshot's length file: a digest of where it comes from and what it holds."""
    parts = (
        base_url,
        store_index,
        info.snapshot,
        info.index,
        info.field,
        str(info.length_docs),
        str(info.length_chunks),
        info.marks.uuid or "",
        info.built_at,
        "by_version" if keyed_by_version(info) else "by_id",
        f"routing_shards={info.length_routing_shards}",  # a file without them would answer fewer hits
    )
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:40]


def keyed_by_version(info: SnapshotInfo) -> bool:
    """Whether the snapshot's table is mapped keyed by (shard, `_seq_no`, `_primary_term`), so a hit is
    found without its `_id` (`LengthIndex.by_version`): when its index has one shard (its marks name
    each primary), or several and every row of the table has its shard number (`info.length_shards`).
    Decided from the meta alone, before any chunk is read."""
    shards = len(info.marks.shards)
    return shards == 1 or (shards > 1 and info.length_shards)


def open_index(path: Path, ident: str) -> LengthIndex | None:
    """The mapped file, or None when there is none (or not a whole one for this ident: rebuilt)."""
    try:
        return LengthIndex.open(path, ident)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning(
            "unreadable length file, rebuilt", extra={"fields": {"path": str(path), "error": str(exc)}}
        )
        return None


@asynccontextmanager
async def file_lock(path: Path, poll: float = 0.05) -> AsyncIterator[None]:
    """An exclusive `flock` on `path`, waited for without blocking the event loop."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(poll)
        yield
    finally:
        os.close(fd)  # releases the lock


def remove_stale(directory: Path, keep: Path, age: float = STALE_FILES) -> None:
    """Remove length files (and left-over temporary files) untouched for `age` seconds: a process
    still mapping one keeps its mapping; one opening it later builds it again."""
    cutoff = time.time() - age
    for old in directory.glob("*.bmxlen*"):
        try:
            if old != keep and old.stat().st_mtime < cutoff:
                old.unlink()
        except OSError:
            pass
