"""Merging a lean window's search of each shard (rerank/shards.py) as the cluster merges a search of
all; on real engines, tests/integration/test_lean_first_stage.py compares the answers whole."""

from __future__ import annotations

import json
from typing import Any

from bmx_rerank.rerank.hits import SHARD, HitColumns
from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.shards import (
    FORMS,
    UNEVEN_OF,
    UNEVEN_SHORTS,
    ShortShares,
    decode,
    decode_each,
    decode_search,
    hold_window,
    items,
    merge,
    msearch_body,
    preference,
    shard_sizes,
)
from bmx_rerank.rerank.tf_probe import PARAM
from bmx_rerank.rerank.window import Window


def _answer(scores: list[float], total: Any = None, **top: Any) -> dict[str, Any]:
    hits: dict[str, Any] = {
        "max_score": max(scores) if scores else None,
        "hits": [
            {"_index": "i", "_seq_no": n, "_primary_term": 1, "_score": s} for n, s in enumerate(scores)
        ],
    }
    if total is not None:
        hits["total"] = total
    shards = {"total": 1, "successful": 1, "skipped": 0, "failed": 0}
    return {"took": 3, "timed_out": False, "_shards": shards, "hits": hits, **top}


def _merged(answers: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any] | None:
    """The merged answer, without its columns."""
    merged = merge(answers, body)
    return None if merged is None else merged[0]


def test_hits_merge_by_score_then_shard_keeping_each_shards_order() -> None:
    answers = [_answer([3.0, 2.0, 2.0]), _answer([2.5, 2.0]), _answer([2.0, 1.0])]
    merged = _merged(answers, {"size": 5})
    assert merged is not None
    got = [(h[SHARD], h["_seq_no"], h["_score"]) for h in merged["hits"]["hits"]]
    # equal scores: the lower shard first, and within a shard the order it answered in
    assert got == [(0, 0, 3.0), (1, 0, 2.5), (0, 1, 2.0), (0, 2, 2.0), (1, 1, 2.0)]
    # the window's hits are the answers' own, marked in place; the rest are left as they came
    assert sum(SHARD in h for a in answers for h in a["hits"]["hits"]) == 5
    assert merged["hits"]["max_score"] == 3.0
    # a shard with no hit, and one whose hits all rank below the window's end
    merged = _merged([_answer([]), _answer([1.0, 0.5]), _answer([]), _answer([2.0])], {"size": 2})
    assert merged is not None
    assert [(h[SHARD], h["_score"]) for h in merged["hits"]["hits"]] == [(3, 2.0), (1, 1.0)]


def test_totals_add_up_to_the_track_total_hits_bound() -> None:
    def total(parts: list[Any], body: dict[str, Any]) -> Any:
        merged = _merged([_answer([1.0], t) for t in parts], {"size": 1, **body})
        assert merged is not None
        return merged["hits"].get("total")

    eq = {"value": 4000, "relation": "eq"}
    assert total([eq, eq], {}) == {"value": 8000, "relation": "eq"}
    assert total([eq, eq, eq], {}) == {"value": 10_000, "relation": "gte"}  # the default bound
    assert total([eq, eq, eq], {"track_total_hits": True}) == {"value": 12_000, "relation": "eq"}
    assert total([eq, eq], {"track_total_hits": 5000}) == {"value": 5000, "relation": "gte"}
    gte = {"value": 100, "relation": "gte"}
    assert total([eq, gte], {"track_total_hits": 100}) == {"value": 100, "relation": "gte"}
    assert total(
        [{"value": 3, "relation": "eq"}, {"value": 2, "relation": "gte"}], {"track_total_hits": 9}
    ) == {
        "value": 5,
        "relation": "gte",
    }
    assert total([7, 5], {}) == 12  # rest_total_hits_as_int
    assert total([None, None], {"track_total_hits": False}) is None


def test_the_rest_of_the_answer_merges_and_what_does_not_is_refused() -> None:
    failed = {"total": 1, "successful": 0, "skipped": 0, "failed": 1, "failures": [{"shard": 1}]}
    answers = [
        _answer([1.0], took=2, terminated_early=False),
        {**_answer([], took=9, timed_out=True), "_shards": failed},
    ]
    merged = _merged(answers, {"size": 10})
    assert merged is not None
    assert merged["took"] == 9 and merged["timed_out"] is True and merged["terminated_early"] is False
    assert merged["_shards"] == {
        "total": 2,
        "successful": 1,
        "skipped": 0,
        "failed": 1,
        "failures": [{"shard": 1}],
    }
    assert _merged([_answer([1.0], aggregations={}), _answer([1.0])], {"size": 1}) is None
    assert _merged([_answer([1.0], suggest={}), _answer([1.0])], {"size": 1}) is None


def test_shard_preferences_keep_the_callers_copy_choice() -> None:
    assert preference(0, 2, "bmx-abc") == "_shards:2|bmx-abc"  # Elasticsearch
    assert preference(1, 2, "bmx-abc") == "_shards:2|_primary"  # OpenSearch takes named ones only
    assert len(FORMS) == 2


def _window(params: dict[str, str]) -> Window:
    body = {"query": {"match": {"body": "a"}}, "size": 100, "stored_fields": "_none_"}
    return Window("docs", Plan(body, params), "d", body, params, None, {}, shards=3)


def test_a_windows_shards_go_in_one_msearch_where_its_parameters_fit_there() -> None:
    window = _window({"preference": "bmx-1", "ignore_unavailable": "true"})
    lines = (msearch_body(window, 0) or b"").decode().splitlines()
    assert [json.loads(line) for line in lines[0::2]] == [
        {"index": "docs", "ignore_unavailable": "true", "preference": f"_shards:{i}|bmx-1"} for i in range(3)
    ]
    assert [json.loads(line) for line in lines[1::2]] == [window.body] * 3
    assert msearch_body(_window({"preference": "bmx-1", PARAM: "true"}), 0) is None, "the probes' own"
    # ... unless it goes on the `_msearch`'s own URL (where the cluster takes it): no header line has it
    probed = (
        msearch_body(_window({"preference": "bmx-1", PARAM: "true"}), 0, on_url={PARAM}) or b""
    ).decode()
    assert probed == (msearch_body(_window({"preference": "bmx-1"}), 0) or b"").decode() and probed
    assert msearch_body(_window({"preference": "bmx-1", "timeout": "1s"}), 0) is None
    # the answer's items are the shards' answers; any failed item: none
    ok = [{**_answer([1.0]), "status": 200} for _ in range(3)]
    assert items({"responses": ok}, 3) == [_answer([1.0])] * 3
    failed = [*ok[:2], {"error": {"type": "x"}, "status": 500}]
    assert items({"responses": failed}, 3) is None
    assert items({"responses": ok[:2]}, 3) is None and items(None, 3) is None


def test_a_shard_is_asked_for_its_share_of_a_window_seen_before_else_an_even_one() -> None:
    body = {"query": {"match": {"body": "x"}}, "size": 100}
    assert shard_sizes(body, (40, 35, 25), 3) == [48, 43, 33]  # at least 8 more
    assert shard_sizes({**body, "size": 1000}, (400, 350, 250), 3) == [450, 393, 281]  # an eighth more
    assert shard_sizes(body, (97, 3, 0), 3) == [100, 11, 8], "never more than the window"
    # no share known (a first sight): an even share and three standard deviations of a shard's count
    # (at least 8 more), never more than the window
    assert shard_sizes(body, None, 3) == [49, 49, 49]
    assert shard_sizes({**body, "size": 1000}, None, 3) == [379] * 3
    assert shard_sizes({**body, "size": 1000}, None, 4) == [292] * 4
    assert shard_sizes({**body, "size": 10}, None, 3) == [10, 10, 10], "at least 8 more: the window"
    # answers that may depend on how many hits a shard is asked for: the whole window each
    assert shard_sizes({**body, "terminate_after": 50}, (40, 35, 25), 3) is None
    assert shard_sizes({**body, "track_total_hits": 40}, None, 3) is None
    assert shard_sizes({**body, "track_total_hits": True}, (40, 35, 25), 3) == [48, 43, 33]
    window = _window({"preference": "bmx-1"})
    lines = (msearch_body(window, 0, sizes=[7, 5, 9]) or b"").decode().splitlines()
    assert [json.loads(line) for line in lines[1::2]] == [{**window.body, "size": n} for n in (7, 5, 9)]
    assert lines[0::2] == (msearch_body(window, 0) or b"").decode().splitlines()[0::2]


def test_shares_hold_the_window_only_where_each_full_shard_ends_below_it() -> None:
    # a window of 4: shard 0 sent the 3 it was asked for, ending below the window's last (4.2); shard 1
    # and 2 sent fewer than asked (all they had)
    held = [_answer([6.0, 5.0, 1.0]), _answer([4.5, 4.2]), _answer([])]
    assert hold_window(held, [3, 3, 2], 4)
    # shard 1 sent all it was asked for and its last is in the window: it may have more
    assert not hold_window(held[:2], [3, 2], 4)
    # a full shard's last equal to the window's last: an unsent hit of that score could rank before it
    assert not hold_window([_answer([6.0, 5.0, 4.0]), _answer([4.5, 4.0])], [3, 3], 4)
    # fewer hits than the window in all: a full shard may have more
    assert not hold_window([_answer([6.0, 5.0]), _answer([4.0])], [2, 2], 4)
    assert hold_window([_answer([6.0]), _answer([4.0])], [2, 2], 4), "every shard sent all it had"
    # a shard asked for the whole window holds its share whatever it sent
    assert hold_window([_answer([6.0, 5.0, 4.9, 4.8]), _answer([1.0, 0.5])], [4, 2], 4)
    # typed hits (`decode`) are read as dicts are; a hit without a score holds nothing
    payload = json.dumps({"responses": [{**a, "status": 200} for a in held]}).encode()
    assert hold_window(decode(payload, 3) or [], [3, 3, 2], 4)
    unscored = _answer([6.0, 5.0, 1.0])
    unscored["hits"]["hits"][0]["_score"] = None
    assert not hold_window([unscored, *held[1:]], [3, 3, 2], 4)


def test_decoded_items_merge_as_the_whole_answer_does() -> None:
    """`decode` keeps each hit a `Hit` until the window is made: the merge is the same as of the
    answer decoded whole, and an answer a `Hit` does not describe is decoded whole."""
    answers = [_answer([3.0, 2.0, 2.0], {"value": 3, "relation": "eq"}), _answer([2.5, 2], took=9)]
    answers[1]["hits"]["hits"][0]["matched_queries"] = {"q": 1.0}
    payload = json.dumps({"took": 9, "responses": [{**a, "status": 200} for a in answers]}).encode()
    whole = merge(items(json.loads(payload), 2) or [], {"size": 4})
    typed = merge(decode(payload, 2) or [], {"size": 4})
    assert whole is not None and typed is not None
    made = typed[0]["hits"]["hits"]  # each made a dict as it is read, then all at once
    assert made[1] == whole[0]["hits"]["hits"][1] and made[:2] == whole[0]["hits"]["hits"][:2]
    assert {**typed[0], "hits": {**typed[0]["hits"], "hits": list(made)}} == whole[0]
    assert list(made)[1] is made[1], "a hit made once"
    # the columns read from the `Hit`s are those read from the whole answer's hits
    same = {**vars(typed[1]), "hits": whole[1].hits, "first": whole[1].first}
    assert same == vars(whole[1])
    assert typed[1].first.tolist() == whole[1].first.tolist() == [3.0, 2.5, 2.0, 2.0]
    probed = json.loads(payload)  # a probed window's probes read from its `Hit`s, no dict made
    for item in probed["responses"]:
        for n, hit in enumerate(item["hits"]["hits"]):
            hit["matched_queries"] = {"q": float(n)}
    probed_payload = json.dumps(probed).encode()
    for read_first in (False, True):  # a hit made a dict before the probes are taken, or none
        whole, typed = (
            merge(found or [], {"size": 4})
            for found in (items(json.loads(probed_payload), 2), decode(probed_payload, 2))
        )
        assert whole is not None and typed is not None
        made, dicts = typed[0]["hits"]["hits"], whole[0]["hits"]["hits"]
        if read_first:
            assert made[1] == dicts[1]
        taken = [h.pop("matched_queries") for h in dicts]
        assert made.take_matched() == taken == [{"q": 0.0}, {"q": 0.0}, {"q": 1.0}, {"q": 2.0}]
        assert {**typed[0], "hits": {**typed[0]["hits"], "hits": list(made)}} == whole[0], "none shown after"
    own = json.loads(payload)
    own["responses"][0]["hits"]["hits"][0]["_id"] = "x"  # a field of its own: decoded whole
    assert decode(json.dumps(own).encode(), 2) == items(own, 2)
    del own["responses"][0]["hits"]["hits"][0]["_id"], own["responses"][0]["hits"]["hits"][1]["_seq_no"]
    assert decode(json.dumps(own).encode(), 2) == items(own, 2), "a hit named by no version: whole"
    own["responses"][0]["hits"]["hits"][1]["_seq_no"] = 1
    own["responses"][0]["hits"]["hits"][2]["_score"] = None
    assert decode(json.dumps(own).encode(), 2) == items(own, 2), "a hit with no score: whole"
    own["responses"][1] = {"error": {"type": "x"}, "status": 500}
    assert decode(json.dumps(own).encode(), 2) is None
    assert decode(payload, 3) is None and decode(b"not json", 2) is None


def test_each_shards_own_answer_decodes_as_the_items_of_one_msearch() -> None:
    """A window searched shard by shard (a cluster whose `_msearch` refuses the probes) decodes each
    answer as `decode` decodes an `_msearch`'s items: its hits `Hit`s, merged as the answers decoded
    whole. Where one answer is not so described, every one is decoded whole (a merge reads one form of
    hit); no JSON object: None."""
    answers = [_answer([3.0, 2.0, 2.0], {"value": 3, "relation": "eq"}), _answer([2.5, 2], took=9)]
    answers[1]["hits"]["hits"][0]["matched_queries"] = {"q": 1.0}
    payloads = [json.dumps(a).encode() for a in answers]
    each = decode_each(payloads)
    msearch = json.dumps({"responses": [{**a, "status": 200} for a in answers]}).encode()
    assert each is not None and each == decode(msearch, 2)
    whole, typed = merge(answers, {"size": 4}), merge(each, {"size": 4})
    assert whole is not None and typed is not None
    assert {**typed[0], "hits": {**typed[0]["hits"], "hits": list(typed[0]["hits"]["hits"])}} == whole[0]
    assert typed[1].first.tolist() == whole[1].first.tolist() == [3.0, 2.5, 2.0, 2.0]
    own = json.loads(payloads[1])
    own["hits"]["hits"][1]["_id"] = "x"  # a field of its own: every answer decoded whole
    assert decode_each([payloads[0], json.dumps(own).encode()]) == [json.loads(payloads[0]), own]
    assert decode_each([payloads[0], b"not json"]) is None and decode_each([payloads[0], b"[1]"]) is None


def test_typed_hits_columns_are_the_dicts_columns_with_no_dict_made() -> None:
    """`WindowHits.column` reads what `HitColumns.column` reads of the hits decoded whole (a `Hit`'s
    fields, its shard's mark, a key no hit has), making no dict; once some are made (and marked by a
    caller), it reads those dicts; after the probes are taken, no hit shows them."""
    payload = json.dumps(
        {"took": 1, "responses": [{**a, "status": 200} for a in (_answer([3.0, 1.0]), _answer([2.0]))]}
    ).encode()
    probed = json.loads(payload)
    probed["responses"][0]["hits"]["hits"][0]["matched_queries"] = {"q": 1.0}
    probed["responses"][1]["hits"]["hits"][0]["_version"] = 4
    payload = json.dumps(probed).encode()
    whole, typed = (
        merge(found or [], {"size": 3}) for found in (items(json.loads(payload), 2), decode(payload, 2))
    )
    assert whole is not None and typed is not None
    made, dicts = typed[0]["hits"]["hits"], whole[0]["hits"]["hits"]
    keys = ("_index", "_seq_no", "_score", "_version", "matched_queries", SHARD, "_id", "_routing")
    for key in keys:
        assert made.column(key, "-") == [h.get(key, "-") for h in dicts], key
    assert made._made == [None, None, None], "no dict made"
    made[1]["_seq_no"] = dicts[1]["_seq_no"] = 7  # a caller's change to a hit made a dict
    assert made.column("_seq_no") == [0, 7, 1] and made.column("_id", "") == ["", "", ""]
    assert made.take_matched() == [{"q": 1.0}, None, None]
    assert made.column("matched_queries") == [None, None, None], "taken"


def test_one_shards_lean_answer_decoded_typed_is_the_answer_decoded_whole() -> None:
    """`decode_search` (a lean window on one shard): the same answer and columns as the
    answer decoded whole, its hits unmarked (one shard) and made dicts only when read; anything a
    `Hit` or a plain answer does not describe is decoded whole, with no columns; no JSON object is
    None."""
    hits = [
        {"_index": "i", "_version": 2, "_seq_no": n, "_primary_term": 1, "_score": s}
        for n, s in enumerate([3.0, 2.0, 2.0])
    ]
    answer = {  # in the order an engine writes it
        "took": 3,
        "timed_out": False,
        "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
        "hits": {"total": {"value": 3, "relation": "eq"}, "max_score": 3.0, "hits": hits},
    }
    payload = json.dumps(answer).encode()
    found = decode_search(payload)
    assert found is not None
    typed, columns = found
    made = typed["hits"]["hits"]
    assert made[2] == answer["hits"]["hits"][2] and SHARD not in made[2], "one shard: no mark"
    assert json.dumps({**typed, "hits": {**typed["hits"], "hits": list(made)}}) == json.dumps(answer)
    whole = HitColumns.of(answer["hits"]["hits"])
    assert {**vars(columns), "hits": None, "first": None} == {**vars(whole), "hits": None, "first": None}
    assert columns.first.tolist() == whole.first.tolist() == [3.0, 2.0, 2.0]
    assert decode_search(json.dumps({**answer, "hits": {"hits": []}}).encode()) is not None
    refused = [
        {**answer, "aggregations": {"n": {"value": 3}}},
        {**answer, "terminated_early": True},  # sent before `_shards`: decoded whole, in that order
        {"error": {"type": "x"}, "status": 500},
        {**answer, "hits": {**answer["hits"], "hits": [{**answer["hits"]["hits"][0], "_id": "x"}]}},
        {**answer, "hits": {**answer["hits"], "hits": [{**answer["hits"]["hits"][0], "_score": None}]}},
    ]
    for other in refused:  # decoded whole, with no columns
        assert decode_search(json.dumps(other).encode()) == (other, None), other
    assert decode_search(b"not json") is None and decode_search(b"[1]") is None


def test_an_index_asks_for_whole_windows_once_its_even_shares_fall_short_often() -> None:
    """A share short now and then (one shard's hits scoring higher by its own statistics) leaves an
    index's first sights asking for even shares; `UNEVEN_SHORTS` of the last `UNEVEN_OF` mark it, for
    the ttl, and its record starts over."""
    now = [0.0]
    uneven = ShortShares(indices=2, ttl=600.0, timer=lambda: now[0])
    uneven.add("i", True)  # a short, then 31 held: it is among the last 32 until one more
    for _ in range(UNEVEN_OF - 1):
        uneven.add("i", False)
    for _ in range(UNEVEN_SHORTS - 1):  # 7 shorts more: the first is out of the last 32
        uneven.add("i", True)
    assert "i" not in uneven
    uneven.add("i", True)
    assert "i" in uneven and "other" not in uneven, "8 of the last 32"
    assert "i" not in uneven.record
    now[0] += 601
    assert "i" not in uneven, "for the ttl"
    uneven.add("i", True)
    assert "i" not in uneven, "its record started over"
    for name in ("a", "b", "c"):
        for _ in range(UNEVEN_SHORTS):
            uneven.add(name, True)
    assert len(uneven.marked) <= 2 and len(uneven.record) <= 2, "bounded"
