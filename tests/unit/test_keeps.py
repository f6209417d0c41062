"""What a rerank keeps for next time, put while a later search waits (rerank/keeps.py); on real engines,
tests/integration/test_lean_first_stage.py sends a repeat before its first sight's puts ran."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bmx_rerank.rerank.keeps import Keeps


async def test_puts_wait_until_a_search_is_on_the_wire_and_run_before_it_answers() -> None:
    keeps, done, order = Keeps(idle=3600.0), [], []
    keeps.add(lambda: done.append("window"), ("caller", "digest"))
    keeps.add(lambda: done.append("page"))
    assert done == [] and len(keeps) == 2
    assert keeps.holds(("caller", "digest")) and not keeps.holds(("other", "digest"))
    answered = asyncio.get_running_loop().create_future()

    async def search() -> str:
        order.append(("written", list(done)))  # the request goes out in the task's first step
        await answered
        order.append(("answered", list(done)))
        return "answer"

    waiting = keeps.sent(search())
    asyncio.get_running_loop().call_later(0.01, answered.set_result, None)
    assert await waiting == "answer"
    assert order == [("written", []), ("answered", ["window", "page"])]
    assert len(keeps) == 0 and not keeps.holds(("caller", "digest"))


async def test_with_nothing_waiting_a_search_is_awaited_as_it_is() -> None:
    keeps = Keeps()

    async def search() -> int:
        return 1

    coro = search()
    assert keeps.sent(coro) is coro
    assert await coro == 1


async def test_puts_run_within_idle_seconds_when_no_search_comes() -> None:
    keeps, done = Keeps(idle=0.01), []
    keeps.add(lambda: done.append(1), "w")
    await asyncio.sleep(0)
    assert done == []
    await asyncio.sleep(0.05)
    assert done == [1] and not keeps.holds("w")


async def test_past_the_bound_every_put_runs_at_once() -> None:
    keeps, done = Keeps(bound=3, idle=3600.0), []
    keeps.add(lambda: done.append(1))
    keeps.add(lambda: done.append(2))
    assert done == []
    keeps.add(lambda: done.append(3))
    assert done == [1, 2, 3] and len(keeps) == 0


def test_with_no_loop_running_a_put_runs_at_once() -> None:
    keeps, done = Keeps(), []
    keeps.add(lambda: done.append(1), "w")
    assert done == [1] and len(keeps) == 0 and not keeps.holds("w")


async def test_a_failed_put_is_logged_and_the_others_run(caplog: pytest.LogCaptureFixture) -> None:
    keeps, done = Keeps(idle=3600.0), []

    def broken() -> None:
        raise ValueError("no room")

    keeps.add(broken, "w")
    keeps.add(lambda: done.append(2), "w")
    assert keeps.holds("w")
    with caplog.at_level(logging.WARNING, logger="bmx_rerank.proxy"):
        keeps.run()
    assert done == [2] and not keeps.holds("w")
    assert any("cache put failed" in r.getMessage() for r in caplog.records)
