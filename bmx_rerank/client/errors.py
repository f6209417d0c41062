"""The wrapper's errors as the wrapped client raises the cluster's: its own exception class for the
status, so that `except BadRequestError` (elasticsearch-py) or `except RequestError` (opensearch-py)
catches a bad `ext.bmx` as it catches a bad query, and a status the caller asked the client to ignore
comes back as the answer instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bmx_rerank.errors import SearchError


def raised(view: Any, transport: Mapping[str, Any], error: SearchError) -> Any:
    """What the wrapped client does with an error answer of `error`'s status and body: its answer
    where the caller ignores that status (elasticsearch-py's `ignore_status` option, opensearch-py's
    `ignore` parameter), else its own exception raised, caused by `error`. `view`: the
    elasticsearch-py client the search was made with, None for opensearch-py."""
    if view is not None:
        return _elastic(view, error)
    ignored = transport.get("ignore", ())
    if error.status in (ignored if isinstance(ignored, (list, tuple)) else (ignored,)):
        return error.body()  # opensearch-py answers an ignored error with its body
    from opensearchpy.exceptions import HTTP_EXCEPTIONS, TransportError

    cls = HTTP_EXCEPTIONS.get(error.status, TransportError)
    raise cls(error.status, error.type, error.body()) from error


def _elastic(view: Any, error: SearchError) -> Any:
    from elastic_transport import ApiResponseMeta, HttpHeaders, ObjectApiResponse
    from elasticsearch import ApiError
    from elasticsearch.exceptions import HTTP_EXCEPTIONS

    node = view.transport.node_pool.all()[0].config
    meta = ApiResponseMeta(error.status, "1.1", HttpHeaders(), 0.0, node)
    ignored = getattr(view, "_ignore_status", None)  # a tuple, or elastic-transport's DEFAULT
    if isinstance(ignored, (list, tuple)) and error.status in ignored:
        return ObjectApiResponse(body=error.body(), meta=meta)
    cls = HTTP_EXCEPTIONS.get(error.status, ApiError)
    raise cls(error.type, meta, error.body()) from error
