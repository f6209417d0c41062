"""Gzip bombs: small compressed search bodies that inflate to many MiB, and firing several at once."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import aiohttp

GZIP_JSON = {"Content-Type": "application/json", "Content-Encoding": "gzip"}


def gzip_bomb(inflated: int) -> bytes:
    """A search body asking for a rerank that inflates to `inflated` bytes and never ends its string:
    the proxy must read all of it to know, and then refuses it (never forwarded with ext.bmx in it)."""
    head = b'{"ext":{"bmx":{"field":"body","query":"t3"}},"pad":"'
    return gzip.compress(head + b" " * (inflated - len(head)), 9)


async def fire(url: str, data: bytes, n: int, path: str = "/docs/_search") -> list[tuple[int, Any]]:
    """`n` bombs at once (one connection each): the status and JSON answer of each."""
    async with aiohttp.ClientSession() as client:

        async def one() -> tuple[int, Any]:
            async with client.post(f"{url}{path}", data=data, headers=GZIP_JSON) as resp:
                return resp.status, await resp.json(content_type=None)

        return await asyncio.gather(*(one() for _ in range(n)))
