"""The LLM augmentation provider against a local HTTP server speaking OpenAI's chat-completions protocol:
good answers, junk around the JSON, timeouts, 5xx, and a slow server under concurrent requests."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from aiohttp import web

from bmx_rerank.rerank.augment import (
    PROMPT,
    Augment,
    LLMConfig,
    LLMError,
    LLMProvider,
    parse_reply,
    resolve_llm,
)


class ChatServer:
    """A chat-completions endpoint whose reply, status and delay a test chooses per call."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.status = 200
        self.delay = 0.0
        self.reply = None  # callable(query, size) -> content string

    def content(self, query: str, size: int) -> str:
        if self.reply is not None:
            return self.reply(query, size)
        augmented = [f"{query} variant {i}" for i in range(size)]
        return json.dumps({"query": query, "augmented_queries": augmented})

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        prompt = body["messages"][0]["content"]
        query = prompt.split("Input query: ", 1)[1].split("\n", 1)[0]
        size = int(prompt.split("augment each query with ", 1)[1].split(" ", 1)[0])
        self.calls[query] += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status != 200:
            return web.json_response({"error": {"message": "boom"}}, status=self.status)
        return web.json_response(
            {
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": self.content(query, size)}}
                ]
            }
        )


@pytest.fixture
async def chat():
    server = ChatServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{port}/v1"  # type: ignore[attr-defined]
    yield server
    await runner.cleanup()


def provider(server, **options) -> LLMProvider:
    config = LLMConfig(base_url=server.url, model="test-model", api_key="sk-test", **options)
    return LLMProvider(config)


async def test_a_good_answer_gives_the_queries_with_the_papers_prompt_and_the_key(chat):
    llm = provider(chat)
    try:
        got = await llm.queries("entropy weighted ranking", 3)
    finally:
        await llm.close()
    assert got == tuple(f"entropy weighted ranking variant {i}" for i in range(3))
    body = chat.bodies[0]
    assert body["model"] == "test-model"
    assert body["messages"][0]["content"] == PROMPT.format(size=3, query="entropy weighted ranking")
    assert "You are an intelligent query augmentation tool" in body["messages"][0]["content"]
    assert chat.headers[0]["Authorization"] == "Bearer sk-test"


@pytest.mark.parametrize(
    "content",
    [
        'Sure! Here you go:\n```json\n{"query": "q", "augmented_queries": ["a b", "c d"]}\n```\nHope it helps.',
        '{"query": "q", "augmented_queries": ["a b", "c d"]}\n{"query": "q", "augmented_queries": ["x"]}',
        'Output: ["a b", "c d"] and that is all',
        'noise {not json} [1, 2 {"query": "q", "augmented_queries": ["a b", "", "q", "c d", "a b"]}',
    ],
)
async def test_junk_around_the_json_is_tolerated(chat, content):
    chat.reply = lambda query, size: content
    llm = provider(chat)
    try:
        assert await llm.queries("q", 5) == ("a b", "c d")
    finally:
        await llm.close()


def test_a_reply_without_queries_is_an_error_and_count_bounds_the_answer():
    with pytest.raises(LLMError):
        parse_reply("I cannot help with that.", "q", 3)
    with pytest.raises(LLMError):
        parse_reply('{"augmented_queries": []}', "q", 3)
    assert parse_reply('{"augmented_queries": ["a", "b", "c", "d"]}', "q", 2) == ["a", "b"]


async def test_a_5xx_is_retried_a_bounded_number_of_times_then_falls_back(chat):
    chat.status = 503
    llm = provider(chat, attempts=3)
    try:
        with pytest.raises(LLMError, match="503"):
            await llm.queries("down", 4)
        assert chat.calls["down"] == 3
        fell = await resolve_llm(Augment(provider="llm", count=4), "down", llm)
    finally:
        await llm.close()
    assert fell.queries == () and "LLM unavailable" in (fell.note or "")
    assert fell.marker() == {"provider": "llm", "queries": 0, "note": fell.note}


async def test_a_4xx_is_not_retried(chat):
    chat.status = 401
    llm = provider(chat, attempts=3)
    try:
        with pytest.raises(LLMError, match="401"):
            await llm.queries("nokey", 4)
    finally:
        await llm.close()
    assert chat.calls["nokey"] == 1


async def test_a_timeout_is_bounded_and_falls_back(chat):
    chat.delay = 2.0
    llm = provider(chat, timeout=0.2, attempts=2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        got = await resolve_llm(Augment(provider="llm", count=2, weight=0.4), "slow", llm)
    finally:
        await llm.close()
    assert loop.time() - start < 1.5  # two attempts of 0.2 s and a short pause, not the server's 2 s each
    assert got.queries == () and "longer than 0.2s" in (got.note or "")


async def test_a_slow_server_under_concurrent_requests_gets_one_call_per_distinct_query(chat):
    chat.delay = 0.3
    llm = provider(chat)
    queries = ["alpha", "beta", "gamma"]
    try:
        answers = await asyncio.gather(*(llm.queries(q, 2) for q in queries * 10))
        again = await asyncio.gather(*(llm.queries(q, 2) for q in queries))
    finally:
        await llm.close()
    assert chat.calls == Counter(dict.fromkeys(queries, 1))
    assert llm.calls == 3
    assert [a[0] for a in answers[:3]] == [f"{q} variant 0" for q in queries]
    assert again == tuple(answers[:3]) or list(again) == answers[:3]


async def test_the_cache_is_bounded(chat):
    llm = provider(chat, cache_size=2)
    try:
        for q in ("a", "b", "c", "a"):
            await llm.queries(q, 1)
    finally:
        await llm.close()
    assert chat.calls["a"] == 2  # evicted by b and c, so asked again


async def test_resolved_queries_carry_the_providers_weight(chat):
    llm = provider(chat)
    try:
        got = await resolve_llm(Augment(provider="llm", count=2, weight=0.25), "q", llm)
    finally:
        await llm.close()
    assert got.queries == ("q variant 0", "q variant 1") and got.weights == (0.25, 0.25)


async def test_no_llm_configured_means_the_original_query_only():
    got = await resolve_llm(Augment(provider="llm"), "q", None)
    assert got.queries == () and "no LLM configured" in (got.note or "")


def test_config_from_env():
    assert LLMConfig.from_env({}) is None
    config = LLMConfig.from_env(
        {"BMX_LLM_BASE_URL": "http://x/v1/", "BMX_LLM_MODEL": "m", "BMX_LLM_API_KEY": "k"}
    )
    assert config == LLMConfig("http://x/v1", "m", "k")
