"""LengthIndex: the proxy's memory-mapped length table, at most 8 bytes a document, exact or None."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import length_table
from bmx_rerank.stats.freshness import IndexMarks
from bmx_rerank.stats.length_files import file_lock
from bmx_rerank.stats.length_files import ident as length_ident
from bmx_rerank.stats.length_index import HEADER, MAGIC, LengthIndex, LengthIndexWriter, build
from bmx_rerank.stats.lengths import DocLengths, int_column, optional
from bmx_rerank.stats.snapshot import SnapshotInfo

ROWS = (
    ["a", "b", "c", "c", "long"],
    [None, None, None, "r1", None],
    [0, 1, 2, 3, 4],
    [1, 1, 1, 2, 1],
    [5, 0, 7, 9, 1_000_000],
)


def test_answers_as_the_table_does(tmp_path: Path) -> None:
    table = DocLengths.from_rows(*ROWS)
    index = LengthIndex.from_table(table, tmp_path / "t.bmxlen")
    assert len(index) == 5 and index.same_as(table) and index.layout.escapes == 1
    ids, routings, seqs, terms, lengths = ROWS
    assert optional(index.find(ids, routings, seqs, terms)) == lengths
    # another routing, sequence number or primary term; never swept; no or no usable sequence number
    assert (
        optional(
            index.find(
                ["c", "c", "a", "a", "zzz"], ["r2", None, None, None, None], [3, 3, 1, 0, 0], [2, 2, 1, 2, 1]
            )
        )
        == [None] * 5
    )
    assert (
        optional(index.find(["a", "a", "a", "a"], [None] * 4, [None, -2, True, 0], [1, 1, 1, None]))
        == [None] * 4
    )
    assert optional(index.find([], [], [], [])) == []
    assert not index.same_as(DocLengths.from_rows(*(r[:4] for r in ROWS)))
    # `find`: the same answers as one array, -1 where `lookup` says None, for the store's form too
    mixed = (
        ["a", "c", "a", "c", "a"],
        [None, "r1", None, "r1", None],
        [0, 3, True, 2**70, 1],
        [1, 2, 1, 2, 1],
    )
    for form in (index, table):
        assert form.find(ids, routings, seqs, terms).tolist() == lengths
        assert form.find(*mixed).tolist() == [5, 9, -1, -1, -1]
        assert optional(form.find(*mixed)) == [5, 9, None, None, None]


def test_int_column_reads_integers_and_nothing_else() -> None:
    values, ok = int_column([3, 0, -2])
    assert values.dtype == np.int64 and values.tolist() == [3, 0, -2] and ok.all()
    values, ok = int_column([1, True, None, "2", 2.0, 2**63, -(2**63)])
    assert ok.tolist() == [True, False, False, False, False, False, True]
    assert values[ok].tolist() == [1, -(2**63)]
    assert int_column([])[0].shape == (0,)


def test_empty_and_rebuilt_files(tmp_path: Path) -> None:
    empty = LengthIndex.from_table(DocLengths.empty(), tmp_path / "e.bmxlen", ident="x")
    assert len(empty) == 0 and optional(empty.find(["a"], [None], [0], [1])) == [None]
    assert empty.same_as(DocLengths.empty())
    with pytest.raises(ValueError):
        LengthIndex.open(tmp_path / "e.bmxlen", ident="y")  # built for another snapshot
    with open(tmp_path / "e.bmxlen", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ValueError):
        LengthIndex.open(tmp_path / "e.bmxlen")  # not the size its header says
    assert [p.name for p in tmp_path.iterdir()] == ["e.bmxlen"], "no temporary file left behind"


def test_the_writer_checks_what_it_is_given(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        build(tmp_path / "x.bmxlen", 1, [([1, 2], [0, 0], [1, 1], [3, 4])])  # more than announced
    writer = LengthIndexWriter(tmp_path / "y.bmxlen", 2)
    writer.add([1], [0], [1], [3])
    with pytest.raises(ValueError):
        writer.finish()  # fewer than announced
    with pytest.raises(ValueError):
        build(tmp_path / "z.bmxlen", 1, [([1], [0], [0], [3])])  # primary terms start at 1
    assert list(tmp_path.iterdir()) == []


def test_a_million_documents_in_at_most_8_bytes_each_exact(tmp_path: Path) -> None:
    """The benchmark's table at 1 M entries (CI): the layout's size, every version found with its
    length, changed versions None, a million absent versions never answered, and two processes
    mapping the file share its pages."""
    s = length_table.synthetic(1_000_000)
    path = tmp_path / "m.bmxlen"
    index = LengthIndex.from_table(s.table, path)
    assert index.nbytes / len(index) <= 8.0
    assert os.path.getsize(path) == index.nbytes
    assert index.layout.escapes >= 100  # long documents answered from the escape table
    assert index.same_as(s.table)
    length_table.lookup_p50(index, length_table.windows(s, 200))  # raises on any wrong answer
    assert length_table.absent_found(index, s, 1_000_000) == 0
    del index
    one, two = length_table.shared_memory(path, 2, lookups=5)
    size = os.path.getsize(path)
    for report in (one, two):
        assert report["map_rss"] >= 0.9 * size  # every page resident in each process ...
        assert report["map_pss"] <= 0.6 * size  # ... and counted half for each: one copy shared


def test_file_names_follow_the_snapshot(tmp_path: Path) -> None:
    def info(snapshot: str, uuid: str = "u") -> SnapshotInfo:
        return SnapshotInfo(
            snapshot, "idx", "body", 0, 0, 0, 1, 0, IndexMarks("idx", uuid, ()), True,
            "2026-01-01T00:00:00+00:00", 1.0, "build", length_docs=3, length_chunks=1,
        )  # fmt: skip

    base = length_ident("http://a:9200", "bmx-stats", info("s1"))
    assert base == length_ident("http://a:9200", "bmx-stats", info("s1"))
    assert base != length_ident("http://a:9200", "bmx-stats", info("s2"))
    assert base != length_ident("http://a:9200", "bmx-stats", info("s1", "v"))
    assert base != length_ident("http://b:9200", "bmx-stats", info("s1"))
    assert base != length_ident("http://a:9200", "other", info("s1"))


async def test_the_file_lock_is_exclusive(tmp_path: Path) -> None:
    import asyncio

    order: list[str] = []

    async def hold(name: str) -> None:
        async with file_lock(tmp_path / "l.lock", poll=0.01):
            order.append(f"{name}+")
            await asyncio.sleep(0.05)
            order.append(f"{name}-")

    await asyncio.gather(hold("a"), hold("b"))
    assert order in (["a+", "a-", "b+", "b-"], ["b+", "b-", "a+", "a-"])


def test_version_keys_make_an_update_a_new_key() -> None:
    from bmx_rerank.stats.length_index import version_keys

    keys = np.full(4, 12345, np.uint64)
    a, b = version_keys(keys, np.array([0, 1, 0, 1]), np.array([1, 1, 2, 2]))
    assert len(set(a.tolist())) == 4 and len(set(b.tolist())) == 4


def test_a_one_shard_table_is_keyed_by_version_alone(tmp_path: Path) -> None:
    """In one shard a live version is named by (_seq_no, _primary_term): a lean hit, with no `_id`,
    finds its length; a version the table does not hold still finds none."""
    ids, routings, seqs, terms, lengths = ROWS
    table = DocLengths.from_rows(*ROWS)
    index = LengthIndex.from_table(table, tmp_path / "v.bmxlen", by_version=True)
    assert index.by_version and index.same_as(table)
    assert LengthIndex.open(tmp_path / "v.bmxlen").by_version  # in the header
    assert optional(index.find([""] * 5, [None] * 5, seqs, terms)) == lengths  # no ids needed
    assert optional(index.find(["x"] * 3, [None] * 3, [0, 3, 9], [2, 1, 1])) == [None] * 3  # other versions
    by_id = LengthIndex.from_table(table, tmp_path / "i.bmxlen")
    assert not by_id.by_version and optional(by_id.find([""] * 5, [None] * 5, seqs, terms)) != lengths
    assert not DocLengths.by_version


def test_the_file_name_says_how_the_table_is_keyed(tmp_path: Path) -> None:
    from bmx_rerank.stats.freshness import ShardMark
    from bmx_rerank.stats.length_files import keyed_by_version

    def info(shards: int, length_shards: bool = False) -> SnapshotInfo:
        marks = IndexMarks("idx", "u", tuple(ShardMark(s, 5, 5, 5) for s in range(shards)))
        return SnapshotInfo(
            "s1", "idx", "body", 0, 0, 0, 1, 0, marks, True,
            "2026-01-01T00:00:00+00:00", 1.0, "build", length_docs=3, length_chunks=1,
            length_shards=length_shards,
        )  # fmt: skip

    assert keyed_by_version(info(1)) and not keyed_by_version(info(3)) and not keyed_by_version(info(0))
    assert keyed_by_version(info(3, True)) and keyed_by_version(info(1, True))
    assert not keyed_by_version(info(0, True))
    assert length_ident("http://a:9200", "s", info(1)) != length_ident("http://a:9200", "s", info(3))
    assert length_ident("http://a:9200", "s", info(3)) != length_ident("http://a:9200", "s", info(3, True))
    assert SnapshotInfo.from_json(info(3, True).to_json()).length_shards
    old = {k: v for k, v in info(3, True).to_json().items() if k != "length_shards"}
    assert not SnapshotInfo.from_json(old).length_shards  # a snapshot from before the flag


# The same (_seq_no, _primary_term) in each of 3 shards, each a document of its own length.
SHARDED = (
    ["a", "b", "c", "d", "e", "f", "g"],
    [None] * 7,
    [0, 0, 0, 1, 1, 2, 0],
    [1, 1, 1, 1, 1, 1, 2],
    [10, 20, 30, 11, 21, 70_000, 5],
    [0, 1, 2, 0, 1, 2, 1],
)


def test_a_table_of_several_shards_is_keyed_by_shard_and_version(tmp_path: Path) -> None:
    """Each shard numbers its operations from 0: (_seq_no, _primary_term) names a version only with
    its shard. Each version is found with its own length given its shard, no `_id`; another shard, a
    shard beyond the table's, or none at all is no answer."""
    ids, routings, seqs, terms, lengths, shards = SHARDED
    table = DocLengths.from_rows(*SHARDED)
    assert table.shards_known and sorted(table.shard_nos.tolist()) == sorted(shards)
    index = LengthIndex.from_table(table, tmp_path / "s.bmxlen", by_version=True, shards=3)
    assert index.by_version and index.shards == 3 and index.same_as(table)
    reopened = LengthIndex.open(tmp_path / "s.bmxlen")
    assert reopened.shards == 3 and reopened.layout.escapes == 1  # in the header
    nameless = [""] * 7
    assert optional(index.find(nameless, routings, seqs, terms, shards)) == lengths
    assert optional(reopened.find(nameless, routings, seqs, terms, shards)) == lengths
    # seq 0 term 1 in shards 0, 1, 2: three documents
    assert optional(index.find([""] * 3, [None] * 3, [0, 0, 0], [1, 1, 1], [2, 0, 1])) == [30, 10, 20]
    # a version of another shard (shard 2 has no seq 1 term 1, shard 0 no seq 0 term 2)
    assert optional(index.find([""] * 2, [None] * 2, [1, 0], [1, 2], [2, 0])) == [None, None]
    # no shard, a shard beyond the table's, a negative one, not a number: never shard 0's document
    assert (
        optional(index.find([""] * 5, [None] * 5, [0] * 5, [1] * 5, [None, 3, -1, "0", True])) == [None] * 5
    )
    assert optional(index.find([""] * 2, [None] * 2, [0, 1], [1, 1])) == [None, None]
    with pytest.raises(ValueError):
        optional(index.find([""], [None], [0], [1], [0, 1]))  # not one shard a hit
    # rows without their shard cannot make such a table, nor be compared with one
    unknown = DocLengths.from_rows(*SHARDED[:5])
    assert not unknown.shards_known and not index.same_as(unknown)
    with pytest.raises(ValueError):
        LengthIndex.from_table(unknown, tmp_path / "u.bmxlen", by_version=True, shards=3)
    with pytest.raises(ValueError):
        LengthIndex.from_table(table, tmp_path / "t.bmxlen", by_version=True, shards=2)  # shard 2 of 2
    # keyed by id, the same table takes no shard number and answers by `_id`
    by_id = LengthIndex.from_table(table, tmp_path / "i.bmxlen")
    assert by_id.shards == 0 and by_id.same_as(table)
    assert optional(by_id.find(ids, routings, seqs, terms, [None] * 7)) == lengths
    assert DocLengths.shards == 0 and optional(table.find(ids, routings, seqs, terms, shards)) == lengths


def test_the_writer_keys_rows_by_their_shard(tmp_path: Path) -> None:
    """Chunks as `length_files.write` streams them: the shard count counts from the rows when not
    given; one shard needs no shard numbers."""
    _, _, seqs, terms, lengths, shards = SHARDED
    chunks = [
        ([0] * 4, seqs[:4], terms[:4], lengths[:4], shards[:4]),
        ([0] * 3, seqs[4:], terms[4:], lengths[4:], shards[4:]),
    ]
    index = build(tmp_path / "w.bmxlen", 7, chunks, by_version=True)
    assert index.shards == 3
    assert optional(index.find([""] * 7, [None] * 7, seqs, terms, shards)) == lengths
    one = build(tmp_path / "o.bmxlen", 2, [([5, 6], [0, 1], [1, 1], [4, 8])], by_version=True, shards=1)
    assert one.shards == 1 and optional(one.find([""] * 2, [None] * 2, [0, 1], [1, 1])) == [4, 8]
    assert optional(one.find([""] * 3, [None] * 3, [0, 1, 0], [1, 1, 1], [0, None, 1])) == [4, 8, None]


def test_a_file_from_before_the_shard_count_reads_as_one_shard(tmp_path: Path) -> None:

    _, _, seqs, terms, lengths = ROWS
    path = tmp_path / "v.bmxlen"
    LengthIndex.from_table(DocLengths.from_rows(*ROWS), path, by_version=True)
    assert _without_header_field(path, "shard_count") == 1
    old = LengthIndex.open(path)
    assert old.by_version and old.shards == 1
    assert optional(old.find([""] * 5, [None] * 5, seqs, terms)) == lengths


def _routed_table(
    n: int = 300,
) -> tuple[DocLengths, tuple[list[str], list[str | None], list[int], list[int], list[int], list[int]]]:
    """`n` documents of 3 shards placed by the engines' default routing (some under a custom routing
    value), each shard numbering its operations from 0: every (_seq_no, _primary_term) is in every shard."""
    from bmx_rerank.stats.routing import routed_shards, routing_keys

    ids = [f"doc-{i}" for i in range(n)]
    routings: list[str | None] = [None if i % 7 else f"user{i % 3}" for i in range(n)]
    shards = routed_shards(routing_keys(ids, routings), 768, 3).tolist()
    per: dict[int, int] = {}
    seqs = []
    for s in shards:
        seqs.append(per.get(s, 0))
        per[s] = seqs[-1] + 1
    terms = [1] * n
    lengths = [3 + i for i in range(n)]
    rows = (ids, routings, seqs, terms, lengths, shards)
    return DocLengths.from_rows(*rows), rows


def test_a_hit_without_its_shard_is_found_where_its_id_routes(tmp_path: Path) -> None:
    """A table of several shards that knows its index's routing finds a hit from its `_id` (or
    `_routing`) and version, no shard given; without the routing it answers nothing; a given shard is
    used as given, even a wrong one."""
    table, (ids, routings, seqs, terms, lengths, shards) = _routed_table()
    assert len(set(shards)) == 3 and len(set(seqs)) < len(seqs)  # the same versions in several shards
    n = len(ids)
    index = LengthIndex.from_table(
        table, tmp_path / "r.bmxlen", by_version=True, shards=3, routing_shards=768
    )
    assert index.routing_shards == 768 and LengthIndex.open(tmp_path / "r.bmxlen").routing_shards == 768
    assert optional(index.find(ids, routings, seqs, terms)) == lengths
    assert optional(index.find(ids, routings, seqs, terms, [None] * n)) == lengths
    assert (
        optional(index.find([""] * n, routings, seqs, terms)) == [None] * n
    )  # no `_id`: no shard to compute
    assert optional(index.find(ids, routings, seqs, terms, shards)) == lengths
    wrong = [(s + 1) % 3 for s in shards]
    assert all(
        g != want
        for g, want in zip(optional(index.find(ids, routings, seqs, terms, wrong)), lengths, strict=True)
    )
    # a routed document looked up by its `_id` alone, which routes elsewhere: not its length
    from bmx_rerank.stats.routing import routed_shards

    by_id = routed_shards(ids, 768, 3).tolist()
    moved = [i for i, r in enumerate(routings) if r is not None and by_id[i] != shards[i]]
    assert moved
    got = optional(index.find([ids[i] for i in moved], [None] * len(moved), [seqs[i] for i in moved],
                       [terms[i] for i in moved]))  # fmt: skip
    assert all(g != lengths[i] for g, i in zip(got, moved, strict=True))
    # without the routing: nothing without a shard
    unknown = LengthIndex.from_table(table, tmp_path / "u.bmxlen", by_version=True, shards=3)
    assert unknown.routing_shards is None and optional(unknown.find(ids, routings, seqs, terms)) == [None] * n
    assert optional(unknown.find(ids, routings, seqs, terms, shards)) == lengths
    # only a table keyed by version over a known shard count takes one
    with pytest.raises(ValueError):
        LengthIndex.from_table(table, tmp_path / "x.bmxlen", routing_shards=768)
    with pytest.raises(ValueError):
        LengthIndex.from_table(table, tmp_path / "y.bmxlen", by_version=True, shards=3, routing_shards=10)


def test_a_file_from_before_the_routing_reads_as_unknown(tmp_path: Path) -> None:

    table, (ids, routings, seqs, terms, lengths, shards) = _routed_table(100)
    path = tmp_path / "o.bmxlen"
    LengthIndex.from_table(table, path, by_version=True, shards=3, routing_shards=768)
    assert _without_header_field(path, "routing_shards") == 768
    old = LengthIndex.open(path)
    assert old.routing_shards is None and optional(old.find(ids, routings, seqs, terms)) == [None] * len(ids)
    assert optional(old.find(ids, routings, seqs, terms, shards)) == lengths


def test_the_file_name_and_snapshot_carry_the_routing() -> None:
    from bmx_rerank.stats.freshness import ShardMark

    marks = IndexMarks("idx", "u", tuple(ShardMark(s, 5, 5, 5) for s in range(3)))
    base = SnapshotInfo(
        "s1", "idx", "body", 0, 0, 0, 1, 0, marks, True,
        "2026-01-01T00:00:00+00:00", 1.0, "build", length_docs=3, length_chunks=1, length_shards=True,
    )  # fmt: skip
    routed = SnapshotInfo.from_json({**base.to_json(), "length_routing_shards": 768})
    assert routed.length_routing_shards == 768 and base.length_routing_shards is None
    assert SnapshotInfo.from_json(routed.to_json()) == routed
    old = {k: v for k, v in routed.to_json().items() if k != "length_routing_shards"}
    assert SnapshotInfo.from_json(old).length_routing_shards is None  # a snapshot from before it
    assert length_ident("http://a:9200", "s", base) != length_ident("http://a:9200", "s", routed)


def _without_header_field(path: Path, name: str) -> Any:
    """Rewrite the file's header without `name`, as a file written before it was (its value)."""
    with open(path, "r+b") as fh:
        head = fh.read(HEADER)
        size = int.from_bytes(head[8:12], "little")
        meta = json.loads(head[12 : 12 + size])
        value = meta.pop(name)
        raw = json.dumps(meta).encode()
        fh.seek(0)
        fh.write((MAGIC + len(raw).to_bytes(4, "little") + raw).ljust(HEADER, b"\x00"))
    return value
