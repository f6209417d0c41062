"""The lean first stage's own pieces (rerank/lean.py); its answers on real engines are
tests/integration/test_lean_first_stage.py's."""

from __future__ import annotations


def test_the_page_cache_holds_what_its_bound_says() -> None:
    """The page cache's bound in bytes is what it holds in memory (orjson's own output bytes carry a
    buffer's capacity, ~10x a small document: the cache keeps exact copies)."""
    import tracemalloc

    from bmx_rerank.rerank.lean import PageCache

    cache = PageCache(1 << 20)
    doc = {"_index": "i", "_id": "d", "_seq_no": 0, "_primary_term": 1, "_source": {"body": "word " * 300}}
    tracemalloc.start()
    try:
        for i in range(20_000):
            cache.put(("who", "table", "i", i, 1, "{}"), {**doc, "_seq_no": i})
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 1.5 * (1 << 20), held
    assert cache.get(("who", "table", "i", 19_999, 1, "{}")) == {**doc, "_seq_no": 19_999}
    assert cache.get(("who", "table", "i", 0, 1, "{}")) is None  # the least recently used went first


def test_a_hit_searched_beside_over_several_shards_is_named_in_the_shard_its_routing_goes_to() -> None:
    """`lean._routed`: each hit of an index whose routing is known named by (index, shard, `_seq_no`,
    `_primary_term`), its shard the one its `_routing` (else its `_id`) routes to; a hit of another
    index, or with neither, is left out (its page document is fetched after, by version)."""
    from bmx_rerank.rerank.hits import SHARD
    from bmx_rerank.rerank.lean import _routed, version
    from bmx_rerank.stats.routing import routed_shards

    hits = [
        {"_index": "a", "_id": f"doc-{i}", "_seq_no": i, "_primary_term": 1, "_source": {"n": i}}
        for i in range(40)
    ]
    hits[3]["_routing"] = "tenant-7"  # routed by its own value, not its `_id`
    hits.append({"_index": "b", "_id": "x", "_seq_no": 0, "_primary_term": 1})  # no routing known
    hits.append({"_index": "a", "_id": "", "_seq_no": 99, "_primary_term": 1})  # no key to route by
    named = _routed(hits, {"a": 6}, 3)
    assert [doc for _, doc in named] == hits[:40], "each usable hit once, the hit itself as its document"
    keys = [h.get("_routing", h["_id"]) for h in hits[:40]]
    shards = routed_shards(keys, 6, 3).tolist()
    assert len(set(shards)) == 3, "the hits spread over the shards"
    assert routed_shards(["tenant-7"], 6, 3)[0] != routed_shards(["doc-3"], 6, 3)[0], "the routing decides"
    for (name, hit), shard in zip(named, shards, strict=True):
        assert name == {"_index": "a", SHARD: shard, "_seq_no": hit["_seq_no"], "_primary_term": 1}
        assert version(name) == ("a", shard, hit["_seq_no"], 1) and SHARD not in hit
