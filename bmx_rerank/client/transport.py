"""The official clients' transport: reading the request they built, and hooking `perform_request` so a
search passes through the rerank."""

from __future__ import annotations

import asyncio
import copy
import functools
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from bmx_rerank.client.sidecar import is_elastic

# opensearch-py keeps these transport options in `params`; they are not part of the search.
TRANSPORT_PARAMS = ("request_timeout", "ignore")


def search_index(path: str) -> str | None:
    """The index expression of a search path (`/a,b/_search` -> "a,b", `/_search` -> "_all"), or None
    when the request is not a search (the wrapper leaves those alone)."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if parts == ["_search"]:
        return "_all"
    if len(parts) == 2 and parts[1] == "_search":
        return urllib.parse.unquote(parts[0])
    return None


def query_strings(params: Mapping[str, Any] | None) -> dict[str, str]:
    """Query parameters as the clients put them on the URL: lists comma-joined, booleans lower-case
    (opensearch-py hands them over already escaped, as UTF-8 bytes)."""
    out: dict[str, str] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in value)
        elif isinstance(value, bool):
            value = str(value).lower()
        out[key] = str(value)
    return out


def request_timeout(view: Any, transport: Mapping[str, Any]) -> Any:
    """The caller's `request_timeout` (opensearch-py: a transport param; elasticsearch-py: an option
    of the client view, `client.options(request_timeout=...)`), or None."""
    if "request_timeout" in transport:
        return transport["request_timeout"]
    return getattr(view, "_request_timeout", None)


def split_transport(params: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(search params, opensearch-py transport options kept in params)."""
    search = dict(params or {})
    transport = {k: search.pop(k) for k in TRANSPORT_PARAMS if k in search}
    return search, transport


Hook = Callable[..., Any]


@functools.cache
def _hooked_class(base: type) -> type:
    """A subclass of an elasticsearch-py client class whose `perform_request` goes through the hook
    its instance carries; `options()` passes the hook on, so per-call transport options work too."""
    if asyncio.iscoroutinefunction(base.perform_request):

        class Hooked(base):  # type: ignore[valid-type,misc]
            _bmx_hook: Hook

            async def perform_request(self, method: str, path: str, **kw: Any) -> Any:
                return await self._bmx_hook(self, super().perform_request, method, path, kw)

    else:

        class Hooked(base):  # type: ignore[valid-type,misc,no-redef]
            _bmx_hook: Hook

            def perform_request(self, method: str, path: str, **kw: Any) -> Any:
                return self._bmx_hook(self, super().perform_request, method, path, kw)

    def options(self: Any, **kwargs: Any) -> Any:
        other = base.options(self, **kwargs)
        other._bmx_hook = self._bmx_hook
        return other

    Hooked.options = options  # type: ignore[method-assign]
    Hooked.__name__ = Hooked.__qualname__ = f"BMX{base.__name__}"
    return Hooked


def _hooked_elastic(client: Any, hook: Hook) -> Any:
    """A copy of an elasticsearch-py client (made by its own `options()`: same transport, headers,
    timeouts) whose requests pass through `hook`."""
    view = client.options()
    view.__class__ = _hooked_class(type(client))
    view._bmx_hook = hook
    return view


class _HookedTransport:
    """opensearch-py's transport with `perform_request` through a hook; everything else delegated."""

    def __init__(self, transport: Any, hook: Hook) -> None:
        self._transport = transport
        self._hook = hook

    def perform_request(self, method: str, url: str, *args: Any, **kw: Any) -> Any:
        return self._hook(None, self._transport.perform_request, method, url, kw, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _hooked_opensearch(client: Any, hook: Hook) -> Any:
    view = copy.copy(client)
    view.transport = _HookedTransport(client.transport, hook)
    return view


def hooked(client: Any, hook: Hook) -> Any:
    return _hooked_elastic(client, hook) if is_elastic(client) else _hooked_opensearch(client, hook)


def request_headers(view: Any, kw: Mapping[str, Any]) -> dict[str, str]:
    """The headers the client sends with this request (elasticsearch-py merges its own in later)."""
    own = dict(view._headers) if view is not None else {}
    return {**own, **(kw.get("headers") or {})}
