"""A sweep split into sliced-PIT parts (processes or machines) gives bit-for-bit the statistics of one
process, on both engines; partial files round-trip and a missing or repeated slice is refused."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import aiohttp
import orjson
import pytest
from click.testing import CliRunner

from bmx_rerank.cli.stats import command as stats_cli
from bmx_rerank.stats import sliced
from bmx_rerank.stats import store as stats_store
from bmx_rerank.stats.sweep import SweepOptions, sweep_index
from bmx_rerank.upstream import Cluster
from tests.support.corpora import index_scifact
from tests.support.data import scifact_records
from tests.support.engine_client import EngineClient

pytestmark = pytest.mark.integration

DOCS = 1500


@pytest.fixture(scope="module")
def index(engine: EngineClient) -> Iterator[tuple[EngineClient, str]]:
    name = f"bmxtest-sliced-{uuid.uuid4().hex[:10]}"
    index_scifact(engine, name, scifact_records("corpus.jsonl", DOCS), shards=3)
    try:
        yield engine, name
    finally:
        engine.call("DELETE", f"/{name}")


async def _whole(base: str, name: str):
    async with aiohttp.ClientSession() as session:
        return await sweep_index(
            Cluster(session, base), name, "body", {}, SweepOptions(batch_size=200, concurrency=2)
        )


def test_four_slices_in_processes_equal_one_process_bit_for_bit(index) -> None:
    engine, name = index
    one = asyncio.run(_whole(engine.url, name))
    four = asyncio.run(
        sliced.sweep_sliced(
            engine.url, name, "body", {}, SweepOptions(batch_size=200, concurrency=2, slices=4)
        )
    )
    assert one.stats.n_docs == DOCS and one.live_docs == four.live_docs == DOCS
    assert four.stats.same_as(one.stats) and four.units == one.units
    assert four.exact_marks and four.marks == one.marks
    assert one.lengths is not None and four.lengths is not None and len(one.lengths) == DOCS
    assert four.lengths.same_as(one.lengths), "merged length tables must equal one sweep's"
    assert one.lengths.shards_known, "3 shards: every row has its shard (sliced too: same_as compares them)"


def test_partial_files_from_several_machines_merge_exactly_and_every_slice_is_needed_once(index) -> None:
    engine, name = index
    one = asyncio.run(_whole(engine.url, name))
    parts = [
        sliced.sweep_part(engine.url, name, "body", {}, (i, 3), SweepOptions(batch_size=200, concurrency=2))
        for i in range(3)
    ]
    assert sum(p.exact.stats.n_docs for p in parts) == DOCS and all(p.exact.stats.n_docs > 0 for p in parts)
    files = [orjson.loads(orjson.dumps(p.to_json())) for p in parts]  # what each machine writes
    merged = sliced.merge([sliced.Partial.from_json(f) for f in reversed(files)])
    assert merged.stats.same_as(one.stats) and merged.units == one.units
    assert merged.lengths is not None and one.lengths is not None and merged.lengths.same_as(one.lengths)
    assert sliced.merge(parts, max_length_docs=DOCS - 1).lengths is None  # over the bound: no table
    with pytest.raises(sliced.MergeError):
        sliced.merge(parts[:2])
    with pytest.raises(sliced.MergeError):
        sliced.merge([parts[0], parts[1], parts[1]])


def test_cli_partials_then_merge_publish_the_snapshot_one_build_publishes(index, tmp_path) -> None:
    engine, name = index
    store = f"bmxtest-sliced-store-{uuid.uuid4().hex[:8]}"
    common = ["--field", "body", "--upstream", engine.url, "--store", store, "--no-progress"]
    runner = CliRunner()
    try:
        files = []
        for i in range(2):
            out = tmp_path / f"part{i}.json"
            done = runner.invoke(
                stats_cli, ["partial", name, *common, "--slice", f"{i}/2", "--out", str(out)]
            )
            assert done.exit_code == 0, done.output
            files.append(str(out))
        refused = runner.invoke(stats_cli, ["merge", files[0], "--upstream", engine.url, "--store", store])
        assert refused.exit_code != 0 and "exactly once" in refused.output
        merged = runner.invoke(stats_cli, ["merge", *files, "--upstream", engine.url, "--store", store])
        assert merged.exit_code == 0 and f"{DOCS} docs from 2 slices" in merged.output, merged.output
        sliced_stats = asyncio.run(_published(engine.url, name, store))
        sliced_lengths = asyncio.run(_published_lengths(engine.url, name, store))
        built = runner.invoke(stats_cli, ["build", name, *common, "--slices", "2"])
        assert built.exit_code == 0, built.output
        one = asyncio.run(_whole(engine.url, name))
        assert sliced_stats.stats.same_as(one.stats) and sliced_stats.units == one.units
        assert asyncio.run(_published(engine.url, name, store)).units == one.units
        assert one.lengths is not None and sliced_lengths is not None and sliced_lengths.same_as(one.lengths)
        built_lengths = asyncio.run(_published_lengths(engine.url, name, store))
        assert built_lengths is not None and built_lengths.same_as(one.lengths)
    finally:
        engine.call("DELETE", f"/{store}*")


async def _published(base: str, name: str, store: str):
    async with aiohttp.ClientSession() as session:
        pointers = await stats_store.read_pointers(Cluster(session, base), {}, [(name, "body")], store)
        return await stats_store.load_exact(Cluster(session, base), {}, pointers[(name, "body")], store)


async def _published_lengths(base: str, name: str, store: str):
    async with aiohttp.ClientSession() as session:
        pointers = await stats_store.read_pointers(Cluster(session, base), {}, [(name, "body")], store)
        return await stats_store.load_lengths(Cluster(session, base), {}, pointers[(name, "body")], store)
