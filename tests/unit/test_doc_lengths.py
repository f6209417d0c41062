"""DocLengths: exact lengths per document version, None whenever anything is uncertain."""

from __future__ import annotations

import orjson
import pytest

from bmx_rerank.rerank.frequencies import table_lengths
from bmx_rerank.rerank.hits import HitColumns
from bmx_rerank.stats.cache import StatsView
from bmx_rerank.stats.corpus import CorpusStats, ExactStats
from bmx_rerank.stats.errors import StatisticsError
from bmx_rerank.stats.freshness import IndexMarks
from bmx_rerank.stats.lengths import DocLengths, LengthRecorder, doc_key, optional
from bmx_rerank.stats.sliced import Partial
from bmx_rerank.stats.snapshot import SnapshotInfo, decode_lengths, encode_lengths

ROWS = (
    ["a", "b", "c", "c"],
    [None, None, None, "r1"],
    [0, 1, 2, 3],
    [1, 1, 1, 2],
    [5, 0, 7, 9],
)


def table() -> DocLengths:
    return DocLengths.from_rows(*ROWS)


def test_lookup_matches_id_routing_seq_no_and_primary_term() -> None:
    t = table()
    assert len(t) == 4
    assert optional(t.find(["a", "b", "c", "c"], [None, None, None, "r1"], [0, 1, 2, 3], [1, 1, 1, 2])) == [
        5,
        0,
        7,
        9,
    ]
    # same id under another routing is another document
    assert optional(t.find(["c"], ["r2"], [3], [2])) == [None]
    assert optional(t.find(["c"], [None], [3], [2])) == [None]


def test_seq_no_or_primary_term_mismatch_is_none() -> None:
    t = table()
    assert optional(t.find(["a", "a", "a"], [None] * 3, [1, 0, None], [1, 2, 1])) == [None, None, None]
    assert optional(t.find(["a"], [None], [-2], [1])) == [None]  # unassigned sequence number
    assert optional(t.find(["zzz"], [None], [0], [1])) == [None]  # never swept
    assert optional(t.find(["a"], [None], [True], [1])) == [None]  # not a number


def test_keys_seen_twice_are_dropped_and_stay_dropped() -> None:
    t = DocLengths.from_keys([7, 3, 7, 9], [0, 1, 2, 3], [1, 1, 1, 1], [10, 11, 12, 13])
    assert t.keys.tolist() == [3, 9]
    assert t.dropped.tolist() == [7]
    # a key dropped in one part is not answered after merging with a part that holds it once
    other = DocLengths.from_keys([7], [5], [1], [20])
    merged = t + other
    assert 7 not in merged.keys.tolist()
    assert merged.same_as(
        DocLengths.from_keys([7, 3, 7, 9, 7], [0, 1, 2, 3, 5], [1] * 5, [10, 11, 12, 13, 20])
    )


def test_duplicate_documents_are_dropped() -> None:
    t = DocLengths.from_rows(["x", "x", "y"], [None, None, None], [0, 4, 1], [1, 1, 1], [3, 4, 5])
    assert optional(t.find(["x", "x", "y"], [None] * 3, [0, 4, 1], [1, 1, 1])) == [None, None, 5]


def test_merge_equals_building_at_once() -> None:
    ids, routings, seqs, terms, lengths = ROWS
    a = DocLengths.from_rows(ids[:2], routings[:2], seqs[:2], terms[:2], lengths[:2])
    b = DocLengths.from_rows(ids[2:], routings[2:], seqs[2:], terms[2:], lengths[2:])
    assert (a + b).same_as(table())
    assert (b + a).same_as(table())
    assert (table() + DocLengths.empty()).same_as(table())


def test_empty_table_answers_none() -> None:
    t = DocLengths.empty()
    assert len(t) == 0
    assert optional(t.find(["a"], [None], [0], [1])) == [None]
    assert optional(t.find([], [], [], [])) == []


def test_key_separates_id_and_routing() -> None:
    assert doc_key("a\x00b", None) != doc_key("a", "b")
    assert doc_key("a", None) != doc_key("a", "")
    assert doc_key("ab", None) != doc_key("a", "b")
    assert doc_key("a", "r") == doc_key("a", "r")


def test_table_lengths_per_field_and_index() -> None:
    corpus = CorpusStats.empty()
    t = table()
    views = [
        StatsView(corpus, False, False, None, lengths={"i1": t}),
        StatsView(corpus, False, False, None),  # no table for this field
    ]
    hits = [
        {"_index": "i1", "_id": "a", "_seq_no": 0, "_primary_term": 1},
        {"_index": "i2", "_id": "a", "_seq_no": 0, "_primary_term": 1},  # other index: no table
        {"_index": "i1", "_id": "c", "_routing": "r1", "_seq_no": 3, "_primary_term": 2},
        {"_index": "i1", "_id": "b"},  # no sequence number: uncertain
    ]
    got = table_lengths(HitColumns.of(hits), ["f", "g"], views)
    assert got.tolist() == [[5, -1], [-1, -1], [9, -1], [-1, -1]]
    one = [hits[0], hits[2], hits[3]]  # of one index: every row in one lookup
    assert table_lengths(HitColumns.of(one), ["f", "g"], views).tolist() == [[5, -1], [9, -1], [-1, -1]]


def _info(table: DocLengths, chunks: int) -> SnapshotInfo:
    marks = IndexMarks("idx", "uuid", ())
    return SnapshotInfo(
        "snap", "idx", "body", 0, 0, 0, 1, 0, marks, True, "2026-01-01T00:00:00+00:00", 1.0, "build",
        length_docs=len(table), length_chunks=chunks,
    )  # fmt: skip


def test_store_chunks_round_trip_with_dropped_keys() -> None:
    t = DocLengths.from_keys(
        [9, 1, 5, 5, 2**64 - 1, 3], [0, 1, 2, 3, 4, 2**40], [1, 1, 1, 1, 3, 2], [1, 2, 3, 4, 5, 0]
    )
    chunks = encode_lengths(t, per_chunk=2)
    assert len(chunks) == 2  # 4 entries, 2 a chunk; the dropped key 5 rides on chunk 0
    back = decode_lengths(_info(t, 2), list(reversed(chunks)))
    assert back.same_as(t)
    assert optional(back.find(["x"], [None], [0], [1])) == [None]
    with pytest.raises(StatisticsError):
        decode_lengths(_info(t, 3), chunks)  # a chunk missing
    empty = DocLengths.empty()
    assert decode_lengths(_info(empty, 1), encode_lengths(empty)).same_as(empty)


def test_partial_file_carries_the_length_table() -> None:
    t = DocLengths.from_keys([9, 1, 5, 5], [0, 1, 2, 3], [1, 1, 1, 1], [1, 2, 3, 4])
    stats = CorpusStats.from_documents([{"a": 1}])
    part = Partial(
        "idx", "body", (0, 1), ExactStats(stats, [1]), IndexMarks("idx", "u", ()), 1, True, 0.1, t, None
    )
    back = Partial.from_json(orjson.loads(orjson.dumps(part.to_json())))
    assert back.lengths is not None and back.lengths.same_as(t)
    sharded = DocLengths.from_keys([9, 1, 5], [0, 1, 2], [1, 1, 1], [1, 2, 3], shard_nos=[1, 0, 2])
    part = Partial(
        "idx", "body", (0, 1), ExactStats(stats, [1]), IndexMarks("idx", "u", ()), 1, True, 0.1, sharded, None
    )
    back = Partial.from_json(orjson.loads(orjson.dumps(part.to_json())))
    assert back.lengths is not None and back.lengths.same_as(sharded) and back.lengths.shards_known
    none = Partial.from_json({**part.to_json(), "lengths": None, "lengths_skipped": "not requested"})
    assert none.lengths is None and none.lengths_skipped == "not requested"


def test_recorder_keeps_nothing_past_its_limit() -> None:
    rec = LengthRecorder(limit=3)
    rec.add([doc_key("a", None), doc_key("b", None)], [(0, 1, 4), (1, 1, 0)])
    got = rec.finish()
    assert got is not None and optional(got.find(["a", "b"], [None, None], [0, 1], [1, 1])) == [4, 0]
    rec.add([doc_key("c", None), doc_key("d", None)], [(2, 1, 4), (3, 1, 0)])
    assert rec.over and rec.finish() is None


def test_shard_numbers_ride_along_sorting_dropping_merging_and_recording() -> None:
    """A row keeps its shard through `from_keys` (sorted, a key seen twice dropped) and `+`; rows
    given none have it unknown (-1), and a table is keyed by version only when every row has one."""
    t = DocLengths.from_keys(
        [9, 1, 5, 5, 3], [0, 1, 2, 3, 4], [1] * 5, [1, 2, 3, 4, 5], shard_nos=[2, 0, 1, 1, 1]
    )
    assert t.keys.tolist() == [1, 3, 9] and t.shard_nos.tolist() == [0, 1, 2] and t.shards_known
    assert not t.same_as(DocLengths.from_keys([9, 1, 5, 5, 3], [0, 1, 2, 3, 4], [1] * 5, [1, 2, 3, 4, 5]))
    unknown = DocLengths.from_keys([7], [0], [1], [4])
    assert unknown.shard_nos.tolist() == [-1] and not unknown.shards_known
    merged = t + unknown
    assert merged.shard_nos.tolist() == [0, 1, -1, 2] and not merged.shards_known
    assert DocLengths.empty().shards_known and DocLengths.empty().nbytes == 0
    assert t.nbytes == 3 * (8 + 8 + 8 + 8 + 4) + 8
    rec = LengthRecorder()
    rec.add([doc_key("a", None), doc_key("b", None)], [(0, 1, 4), (0, 1, 6)], [2, 0])
    rec.add([doc_key("c", None)], [(1, 1, 7)])
    got = rec.finish()
    assert got is not None
    want = DocLengths.from_rows(["a", "b", "c"], [None] * 3, [0, 0, 1], [1, 1, 1], [4, 6, 7], [2, 0, -1])
    assert got.same_as(want)


def test_store_chunks_keep_the_shards_and_old_chunks_have_none() -> None:
    import base64
    import zlib

    t = DocLengths.from_keys(
        [9, 1, 5, 5, 4, 3], [0, 1, 2, 3, 4, 5], [1] * 6, [1, 2, 3, 4, 5, 6], shard_nos=[2, 0, 1, 1, 0, 1]
    )
    chunks = encode_lengths(t, per_chunk=2)
    assert all(c["shards"] is True for c in chunks)
    back = decode_lengths(_info(t, 2), chunks)
    assert back.same_as(t) and back.shard_nos.tolist() == [0, 1, 0, 2]
    # a chunk written before the shard column: the same blob without it, and no "shards" field
    old = []
    for c in chunks:
        blob = zlib.decompress(base64.b64decode(c["blob"]))
        old.append(
            {k: v for k, v in c.items() if k != "shards"}
            | {"blob": base64.b64encode(zlib.compress(blob[: -4 * c["n"]])).decode()}
        )
    was = decode_lengths(_info(t, 2), old)
    assert was.shard_nos.tolist() == [-1] * 4 and not was.shards_known
    assert was.same_as(DocLengths.from_keys(t.keys, t.seq_nos, t.primary_terms, t.lengths, t.dropped))
    # the size check stays strict: a flagged chunk without the column, an old one with it
    with pytest.raises(StatisticsError):
        decode_lengths(_info(t, 2), [old[0] | {"shards": True}, old[1]])
    with pytest.raises(StatisticsError):
        decode_lengths(_info(t, 2), [{k: v for k, v in chunks[0].items() if k != "shards"}, chunks[1]])


def test_a_published_table_says_whether_every_row_has_its_shard() -> None:
    from bmx_rerank.stats.build import snapshot_info

    marks = IndexMarks("idx", "u", ())
    known = DocLengths.from_keys([1, 2], [0, 0], [1, 1], [3, 4], shard_nos=[0, 1])
    unknown = known + DocLengths.from_keys([3], [1], [1], [5])
    args = ("idx", "body", CorpusStats.empty(), marks, 0, True, 0.1, "build")
    assert snapshot_info(*args, lengths=known).length_shards
    assert not snapshot_info(*args, lengths=unknown).length_shards
    assert not snapshot_info(*args).length_shards
