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
