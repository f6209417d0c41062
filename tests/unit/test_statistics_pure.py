"""Pure parts of the statistics layer: snapshot encoding, freshness judgements, entropy estimators."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmx_rerank.scoring import entropy_contribution
from bmx_rerank.stats import estimate
from bmx_rerank.stats.corpus import CorpusStats, EntropyAccumulator
from bmx_rerank.stats.errors import StatisticsError
from bmx_rerank.stats.freshness import (
    IndexMarks,
    ShardMark,
    appends_only,
    drifted,
    incremental_possible,
    judge,
    new_operations,
    parse_shard_stats,
)
from bmx_rerank.stats.snapshot import SnapshotInfo, decode_chunks, decode_units, encode_chunks, encode_units

term_st = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=12
)
docs_st = st.lists(st.dictionaries(term_st, st.integers(1, 40), max_size=8), max_size=20)


def marks(*seq: int, uuid: str = "u1", checkpoints: tuple[int, ...] | None = None) -> IndexMarks:
    cps = checkpoints or seq
    return IndexMarks(
        "idx", uuid, tuple(ShardMark(i, s, c, c) for i, (s, c) in enumerate(zip(seq, cps, strict=True)))
    )


def info_for(stats: CorpusStats, n_chunks: int) -> SnapshotInfo:
    return SnapshotInfo(
        "snap",
        "idx",
        "body",
        stats.n_docs,
        stats.total_length,
        stats.vocabulary_size,
        n_chunks,
        stats.n_docs,
        marks(3, 4),
        True,
        "2026-01-01T00:00:00+00:00",
        1.0,
        "build",
    )


@settings(max_examples=100, deadline=None)
@given(docs=docs_st, per_chunk=st.integers(1, 7))
def test_snapshot_chunks_round_trip_bit_for_bit(docs, per_chunk):
    stats = CorpusStats.from_documents(docs)
    chunks = encode_chunks(stats, per_chunk)
    info = info_for(stats, len(chunks))
    back = decode_chunks(info, list(reversed(chunks)))  # any order
    assert back.same_as(stats)
    assert SnapshotInfo.from_json(info.to_json()) == info


def test_missing_chunk_or_wrong_vocabulary_is_reported_as_corrupt():
    stats = CorpusStats.from_documents([{"a": 1, "b": 2, "c": 3}])
    chunks = encode_chunks(stats, 2)
    with pytest.raises(StatisticsError, match="1 of 2 chunks"):
        decode_chunks(info_for(stats, 2), chunks[:1])
    lying = SnapshotInfo(**{**info_for(stats, 2).__dict__, "vocabulary_size": 4})
    with pytest.raises(StatisticsError, match="3 terms, meta says 4"):
        decode_chunks(lying, chunks)


def test_terms_with_nul_are_refused_rather_than_corrupted():
    with pytest.raises(StatisticsError):
        encode_chunks(CorpusStats.from_documents([{"a\x00b": 1}]))


def test_parse_shard_stats_keeps_primaries_only():
    payload = {
        "indices": {
            "idx": {
                "uuid": "u1",
                "shards": {
                    "1": [
                        {
                            "routing": {"primary": False},
                            "seq_no": {"max_seq_no": 99, "local_checkpoint": 99, "global_checkpoint": 99},
                        },
                        {
                            "routing": {"primary": True},
                            "seq_no": {"max_seq_no": 7, "local_checkpoint": 6, "global_checkpoint": 5},
                        },
                    ],
                    "0": [
                        {
                            "routing": {"primary": True},
                            "seq_no": {"max_seq_no": 3, "local_checkpoint": 3, "global_checkpoint": 3},
                        }
                    ],
                },
            }
        }
    }
    got = parse_shard_stats(payload)["idx"]
    assert got == IndexMarks("idx", "u1", (ShardMark(0, 3, 3, 3), ShardMark(1, 7, 6, 5)))
    assert not got.settled and got.operations == 12


def test_drift_and_incremental_preconditions():
    base = marks(5, 9)
    assert not drifted(base, marks(5, 9))
    assert drifted(base, marks(5, 10)) and drifted(base, marks(5, 9, uuid="u2"))
    assert new_operations(base, marks(7, 9)) == {0: (5, 7)}
    assert incremental_possible(base, marks(7, 9))
    assert not incremental_possible(base, marks(7, 9, uuid="u2"))  # recreated
    assert not incremental_possible(base, marks(7, 9, 1))  # resharded
    assert not incremental_possible(base, marks(7, 9, checkpoints=(6, 9)))  # a write in flight


@pytest.mark.parametrize(
    ("found", "live_now", "ok"),
    [
        ({0: 2, 1: 1}, 103, True),  # three appends
        ({0: 2, 1: 1}, 102, False),  # one of them replaced an old document: an update
        ({0: 1, 1: 1}, 102, False),  # a sequence number without a live document: a delete
        ({0: 2}, 102, False),  # shard 1's operation left nothing behind
    ],
)
def test_appends_only_proves_appends_from_counts(found, live_now, ok):
    assert appends_only({0: (4, 6), 1: (9, 10)}, found, 100, live_now) is ok


def test_judge_reports_each_freshness_state():
    stats = CorpusStats.from_documents([{"a": 1}])
    info = info_for(stats, 1)
    assert judge("idx", "body", None, None).reason.startswith("no snapshot")
    assert judge("idx", "body", info, None).stale is None
    assert judge("idx", "body", info, marks(3, 4)).stale is False
    moved = judge("idx", "body", info, marks(3, 6))
    assert moved.stale is True and moved.operations_since == 2
    assert (
        judge("idx", "body", info, marks(3, 4, uuid="u9")).reason == "index was recreated since the snapshot"
    )
    racy = SnapshotInfo(**{**info.__dict__, "exact_marks": False})
    assert judge("idx", "body", racy, marks(3, 4)).stale is True


@settings(max_examples=100, deadline=None)
@given(tfs=st.lists(st.integers(1, 30), min_size=1, max_size=40))
def test_even_spread_is_a_lower_bound_and_both_estimators_bracket_sanely(tfs):
    exact = float(entropy_contribution(np.array(tfs)).sum())
    df, ttf = np.array([len(tfs)]), np.array([sum(tfs)])
    even = estimate.entropy_even(df, ttf)[0]
    geo = estimate.entropy_geometric(df, ttf)[0]
    assert even <= exact + 1e-12  # h(sigmoid(tf)) is convex on tf >= 1: the even spread is the minimum
    assert 0 < geo <= len(tfs) * float(entropy_contribution(np.array([1]))[0]) + 1e-12


def test_estimators_are_exact_when_every_holder_uses_the_term_once():
    df = np.array([1, 10, 1000])
    want = df * float(entropy_contribution(np.array([1]))[0])
    for fn in estimate.ESTIMATORS.values():
        np.testing.assert_allclose(fn(df, df), want, rtol=1e-12)
    assert estimate.entropy_even(np.array([0]), np.array([0]))[0] == 0.0


@settings(max_examples=100, deadline=None)
@given(a=docs_st, b=docs_st, per_chunk=st.integers(1, 7))
def test_exact_sums_round_trip_and_make_additions_bit_identical_to_a_rebuild(a, b, per_chunk):
    left, right = _exact(a), _exact(b)
    union = _exact(a + b)
    total = left + right
    assert total.stats.same_as(union.stats) and total.units == union.units
    chunks = encode_units(union.units, per_chunk)
    info = SnapshotInfo(**{**info_for(union.stats, len(chunks)).__dict__, "exact_units": True})
    assert decode_units(info, list(reversed(chunks))) == union.units


def _exact(docs):
    acc = EntropyAccumulator()
    for doc in docs:
        acc.add(doc)
    return acc.finish_exact()
