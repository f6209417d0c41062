"""stats.routing: a document's shard from its `_id` or `_routing`, and the check a sweep makes of it."""

from __future__ import annotations

import pytest

from bmx_rerank.stats import routing
from bmx_rerank.stats.routing import (
    MIN_EVIDENCE,
    RoutingCheck,
    combine,
    default_routing_shards,
    routed_shards,
    routing_candidates,
)

# (_id, _routing, shard on 3 shards, shard on 5 shards): where Elasticsearch 8.19 and OpenSearch 2.19
# put each document (found with `preference=_shards:i`), indices created with default settings.
KNOWN = [
    ("1", None, 2, 4),
    ("doc-42", None, 2, 0),
    ("é漢字😀x", None, 0, 1),
    ("a b", None, 2, 0),
    ("z" * 40, None, 0, 2),
    ("Ωmega", None, 2, 3),
    ("😀", None, 0, 2),
    ("4e7c2a1f-0b9d-4c55-9a63-2f1d8e0c7b11", None, 2, 0),
    ("r1", "user7", 1, 3),
    ("r2", "ünïcødé-😀", 2, 2),
]


def test_default_routing_shards() -> None:
    assert [default_routing_shards(n) for n in (1, 2, 3, 5, 8, 30, 512, 513, 1024)] == [
        1024,
        1024,
        768,
        640,
        1024,
        960,
        1024,
        1026,
        2048,
    ]


@pytest.mark.parametrize(("shards", "column"), [(3, 2), (5, 3)])
def test_the_engines_own_placement(shards: int, column: int) -> None:
    keys = [r if r is not None else i for i, r, *_ in KNOWN]
    got = routed_shards(keys, default_routing_shards(shards), shards).tolist()
    assert got == [row[column] for row in KNOWN]
    # the routing shard count the settings show by default is not the one the engines use
    assert routed_shards(keys, shards, shards).tolist() != got


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError):
        routed_shards(["a"], 10, 3)
    with pytest.raises(ValueError):
        default_routing_shards(0)


def _docs(n: int, shards: int = 3) -> tuple[list[str], list[str | None], list[int | None]]:
    ids = [f"doc-{i}" for i in range(n)]
    routings: list[str | None] = [None] * n
    found: list[int | None] = list(routed_shards(ids, default_routing_shards(shards), shards).tolist())
    return ids, routings, found


def test_a_check_every_document_passes_names_its_routing() -> None:
    ids, routings, found = _docs(MIN_EVIDENCE + 10)
    check = RoutingCheck(3, routing_candidates({}, 3))
    check.add(ids[:30], routings[:30], found[:30])
    check.add(ids[30:], routings[30:], found[30:])
    assert check.routing_shards == 768 and check.evidence == MIN_EVIDENCE + 10


def test_one_misplaced_document_fails_the_check() -> None:
    ids, routings, found = _docs(200)
    found[123] = (found[123] + 1) % 3  # type: ignore[operator]
    check = RoutingCheck(3, [768])
    check.add(ids, routings, found)
    assert check.candidates == () and check.routing_shards is None


def test_a_document_of_unknown_shard_fails_the_check() -> None:
    ids, routings, found = _docs(200)
    found[5] = None
    check = RoutingCheck(3, [768])
    check.add(ids, routings, found)
    assert check.routing_shards is None


def test_too_few_distinct_keys_prove_nothing() -> None:
    ids, routings, found = _docs(MIN_EVIDENCE - 1)
    check = RoutingCheck(3, [768])
    check.add(ids, routings, found)
    assert check.candidates == (768,) and check.routing_shards is None
    # documents sharing one routing value are one key: they must fit, and do not count
    routed = [f"r-{i}" for i in range(50)]
    check.add(routed, ["user7"] * 50, [1] * 50)  # "user7" goes to shard 1 of 3 (KNOWN)
    assert check.candidates == (768,) and check.routing_shards is None
    check.add(["last"], [None], routed_shards(["last"], 768, 3).tolist())
    assert check.routing_shards == 768
    # an earlier snapshot's proof: the new documents need only fit
    proven = RoutingCheck(3, [768], proven=True)
    proven.add(routed[:1], ["user7"], [1])
    assert proven.routing_shards == 768


def test_two_fitting_candidates_are_no_answer() -> None:
    check = RoutingCheck(3, [768, 1536], evidence=MIN_EVIDENCE)
    assert check.routing_shards is None  # nothing told them apart


def test_settings_that_route_otherwise_leave_no_candidate() -> None:
    assert routing_candidates({}, 3) == (768,)
    assert routing_candidates({}, 1) == ()
    assert routing_candidates(None, 3) == ()  # settings not readable
    assert routing_candidates({"index.routing_partition_size": "2"}, 3) == ()
    assert routing_candidates({"index.routing_partition_size": "1"}, 3) == (768,)
    assert routing_candidates({"index.routing_path": ["host"]}, 3) == ()
    assert routing_candidates({"index.mode": "time_series"}, 3) == ()
    assert routing_candidates({"index.logsdb.route_on_sort_fields": "true"}, 3) == ()
    assert routing_candidates({"index.number_of_routing_shards": "6"}, 3) == (768, 6)
    assert routing_candidates({"index.number_of_routing_shards": "768"}, 3) == (768,)


def test_slices_combine() -> None:
    ids, routings, found = _docs(100)
    a, b = RoutingCheck(3, [768, 6]), RoutingCheck(3, [768, 6])
    a.add(ids[:50], routings[:50], found[:50])
    b.add(ids[50:], routings[50:], found[50:])
    assert a.routing_shards is None and b.routing_shards is None  # 50 keys each: too few alone
    both = combine([a, b])
    assert both is not None and both.routing_shards == 768 and both.evidence == 100
    again = combine([RoutingCheck.from_json(a.to_json()), RoutingCheck.from_json(b.to_json())])
    assert again is not None and again.routing_shards == 768
    bad = RoutingCheck(3, [768, 6])
    bad.add(ids[:1], routings[:1], [(found[0] + 1) % 3])  # type: ignore[operator]
    merged = combine([a, b, bad])
    assert merged is not None and merged.routing_shards is None
    assert combine([a, None]) is None


def test_hash_is_of_utf16_code_units() -> None:
    # a character outside the BMP is hashed as its two surrogates, as Java's `char`s
    assert routing.routing_hash("😀") == routing.routing_hash("\ud83d\ude00")
