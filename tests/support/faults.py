"""A fault injector between the proxy and a real engine: an aiohttp reverse proxy that forwards
everything to the engine, records what went through, and misbehaves for the requests a rule picks
(serve it with `tests.support.proxy_thread.LoopThread`)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web


@dataclass
class Rule:
    """A fault for requests whose `METHOD path` matches `pattern`."""

    pattern: str
    action: str  # status:N | reset | truncate | garbage | stall | close | delay:SECONDS | until:MONOTONIC
    every: int = 1  # fires on every n-th request it matches (the others go through untouched)
    matched: int = 0


@dataclass
class FaultInjector:
    """A reverse proxy to the engine that misbehaves for requests matching a rule."""

    engine: str
    rules: list[Rule] = field(default_factory=list)
    hits: list[str] = field(default_factory=list)  # the requests a rule picked
    seen: list[tuple[str, str, str | None, int]] = field(default_factory=list)  # method, path, auth, status
    released: asyncio.Event | None = None  # set at teardown: stalled requests end

    def release(self) -> None:
        if self.released is not None:
            self.released.set()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)

        async def session(app: web.Application):
            self.session = aiohttp.ClientSession(auto_decompress=False)
            self.released = asyncio.Event()
            yield
            await self.session.close()

        app.cleanup_ctx.append(session)
        return app

    def _rule(self, request: web.Request) -> Rule | None:
        line = f"{request.method} {request.path}"
        rule = next((r for r in self.rules if re.search(r.pattern, line)), None)
        if rule is not None and rule.every > 1:
            rule.matched += 1
            if rule.matched % rule.every:
                return None
        return rule

    async def _upstream(self, request: web.Request) -> tuple[int, dict[str, str], bytes]:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self.session.request(
            request.method,
            self.engine + request.path_qs,
            data=body,
            headers=headers,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),  # transparent
        ) as resp:
            payload = await resp.read()
            keep = {
                k: v
                for k, v in resp.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection")
            }
            return resp.status, keep, payload

    async def handle(self, request: web.Request) -> web.StreamResponse:
        rule = self._rule(request)
        if rule is None:
            status, headers, payload = await self._upstream(request)
            self.seen.append((request.method, request.path, request.headers.get("Authorization"), status))
            return web.Response(status=status, headers=headers, body=payload)
        self.hits.append(f"{request.method} {request.path}")
        action = rule.action
        if action.startswith("status:"):
            code = int(action.split(":")[1])
            cause = {"type": "fault_injected_exception", "reason": f"injected {code}"}
            body = {"error": {"root_cause": [cause], **cause}, "status": code}
            return web.json_response(body, status=code, headers={"X-Injected": "1"})
        if action == "stall":  # until the test ends: far past the proxy's timeout
            assert self.released is not None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.released.wait(), 60)
        if action.startswith(("delay:", "until:")):  # slow (or frozen until then), then answered
            value = float(action.split(":")[1])
            await asyncio.sleep(value if action.startswith("delay:") else max(0.0, value - time.monotonic()))
            status, headers, payload = await self._upstream(request)
            return web.Response(status=status, headers=headers, body=payload)
        transport = request.transport
        if action == "close":
            assert transport is not None
            transport.abort()
            raise ConnectionResetError("injected close")
        status, headers, payload = await self._upstream(request)
        if action == "truncate":  # a complete HTTP answer whose JSON stops half-way
            return web.Response(status=status, headers=headers, body=payload[: len(payload) // 2])
        if action == "garbage":
            return web.Response(
                status=200, body=b"<html>proxy error page</html>", content_type="application/json"
            )
        assert action == "reset", action
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = len(payload)
        await resp.prepare(request)
        await resp.write(payload[: len(payload) // 2])
        assert transport is not None
        transport.abort()  # the connection dies with half the announced body sent
        raise ConnectionResetError("injected reset")
