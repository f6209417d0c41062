"""Calls the sidecar makes to the cluster (`Cluster`): JSON requests, token analysis, term frequencies.

Every call takes the caller's headers (credentials included) so the sidecar reads nothing on a client's
behalf that the client could not read directly. Errors come back as `SearchError`s: the cluster's own
error passes through as `UpstreamError`, an unreachable cluster is a 502 and a slow one a 504.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec
import orjson
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from bmx_rerank.deadline import budget
from bmx_rerank.errors import SearchError, UpstreamError, timed_out, unreachable

# Sidecar-originated reads are idempotent: a dropped connection is retried a few times, quickly.
# Client requests are never retried (a retried write could apply twice).
DEFAULT_ATTEMPTS = 3
THREAD_BYTES = 1 << 20  # answers above this size are parsed in a worker thread

# Only term frequencies: statistics, positions and offsets cost the cluster time and are not needed.
TERM_VECTOR_PARAMETERS = {
    "term_statistics": False,
    "field_statistics": False,
    "positions": False,
    "offsets": False,
    "payloads": False,
}


# How a mapping names the built-in `standard` analyzer, unless the index defines an analyzer so named
# (`default`: what a field that names none is analysed with)
BUILTIN_STANDARD = frozenset({"standard", "default"})


@dataclass(frozen=True)
class FieldAnalyzers:
    """A field's analyzers by name, as its mapping resolves them: `index` makes the documents' tokens,
    `search` a match query's, `quote` a phrase's (None: the field has no such analyzer, e.g. a keyword).
    `standard`: the search analyzer is the built-in `standard` one. `generation` names the indices'
    identities and analysis settings as read (None: not readable): an analyzer's tokens learned under
    one generation are never taken for another's."""

    index: str | None
    search: str | None
    quote: str | None
    standard: bool = False
    generation: str | None = None
    vectors: bool = True  # whether `_mtermvectors` can give the field's terms (`readable`)

    @classmethod
    def of(
        cls,
        spec: Mapping[str, Any],
        custom: Sequence[str] | None = None,
        generation: str | None = None,
        vectors: bool = True,
    ) -> FieldAnalyzers:
        """From a field's mapping with its defaults (a mapping read without them names only what it
        sets, and the rest falls back as the cluster's own defaults do), and the analyzers its index
        defines (`custom`; None: not known)."""
        index = spec.get("analyzer")
        search = spec.get("search_analyzer", index)
        standard = custom is not None and search in BUILTIN_STANDARD and search not in custom
        return cls(index, search, spec.get("search_quote_analyzer", search), standard, generation, vectors)


def index_path(index_expr: str) -> str:
    """An index expression as a path segment (commas and wildcards kept, as the cluster expects; a
    date-math name's `<`, `{`, `/` and `>` escaped)."""
    return quote(index_expr, safe=",*-_.:")


def readable(field: str, spec: Mapping[str, Any], source: Mapping[str, Any] | None) -> bool:
    """Whether the cluster can give a field's term vectors: stored (`term_vector`), or made again from
    the field's stored value (`store`) or from `_source`, where `_source` keeps the field (not disabled,
    not excluded, included where it names what it includes; a pattern names the field or an object
    above it). `source`: the index's `_source` mapping (None: not read, taken as kept)."""
    if spec.get("term_vector", "no") != "no" or spec.get("store") is True or source is None:
        return True
    if source.get("enabled") is False:
        return False
    parts = field.split(".")
    paths = [".".join(parts[: i + 1]) for i in range(len(parts))]
    if any(fnmatch.fnmatchcase(p, pattern) for p in paths for pattern in source.get("excludes") or []):
        return False
    includes = source.get("includes") or []
    return not includes or any(fnmatch.fnmatchcase(p, pattern) for p in paths for pattern in includes)


class TermFreq(msgspec.Struct, gc=False):
    term_freq: int


class FieldVectors(msgspec.Struct, gc=False):
    terms: dict[str, TermFreq] = {}


class VectorsDoc(msgspec.Struct, gc=False):
    """One document of an `_mtermvectors` answer, only the keys read (the rest are skipped undecoded).

    Decoded into typed structs (msgspec) rather than dicts: a term's `{"term_freq": n}` costs a small
    struct instead of a dict, and decoding an answer is the sidecar's largest cost per document
    (benchmarks/RESULTS.md, sweep throughput)."""

    found: bool = False
    version: int | None = msgspec.field(name="_version", default=None)
    seq_no: int | None = msgspec.field(name="_seq_no", default=None)
    primary_term: int | None = msgspec.field(name="_primary_term", default=None)
    term_vectors: dict[str, FieldVectors] = {}
    error: Any = None

    def terms(self, field_name: str) -> dict[str, TermFreq]:
        vectors = self.term_vectors.get(field_name)
        return {} if vectors is None else vectors.terms


class _VectorsAnswer(msgspec.Struct, gc=False):
    docs: list[VectorsDoc]


_decode_vectors = msgspec.json.Decoder(_VectorsAnswer).decode


@dataclass(frozen=True)
class DocRef:
    """Where a document lives, as a search hit names it."""

    index: str
    id: str
    routing: str | None = None


@dataclass(frozen=True)
class DocTerms:
    """A document's term frequencies in one field; `length` is their sum (BMX's |D|)."""

    ref: DocRef
    found: bool
    tf: dict[str, int] = field(default_factory=dict)
    version: int | None = None
    seq_no: int | None = None
    primary_term: int | None = None

    @cached_property
    def length(self) -> int:
        """Summed once: a warm window reads the lengths of the same cached documents again and again."""
        return sum(self.tf.values())


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
    decode: Callable[[bytes], Any] = orjson.loads,
) -> Any:
    """One JSON call to the cluster; its error answers become `UpstreamError`, failures 502/504.
    `decode` parses a successful answer's body (orjson, or a typed msgspec decoder)."""
    data = None if body is None else orjson.dumps(body)
    # identity: the session may not decompress (the proxy's passes compressed bodies through untouched)
    hdrs = {
        **(headers or {}),
        "Content-Type": "application/json",
        "Accept": "application/json",
        "Accept-Encoding": "identity",
    }
    try:
        async with session.request(
            method, url, data=data, headers=hdrs, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            payload = await resp.read()
            if resp.status >= 400:
                raise _upstream_error(resp.status, payload, resp.content_type)
            if len(payload) > THREAD_BYTES:  # a large answer is parsed off the event loop
                return await asyncio.to_thread(decode, payload)
            return decode(payload) if payload else None
    except (orjson.JSONDecodeError, msgspec.DecodeError) as exc:  # a 2xx that is not JSON (cut, or a
        # middlebox's page), or not of the shape a typed decoder expects
        raise unreachable(f"{method} {_path(url)} answered with a body that is not JSON") from exc
    except asyncio.TimeoutError as exc:
        raise timed_out(f"{method} {_path(url)} took longer than {timeout}s") from exc
    except aiohttp.ClientError as exc:  # refused, dropped, or an answer that is not HTTP
        raise unreachable(f"{method} {_path(url)} failed: {exc.__class__.__name__}") from exc


def is_unreachable(exc: BaseException) -> bool:
    """True for a connection failure (502 from `request_json`), the one failure worth retrying."""
    return isinstance(exc, SearchError) and not isinstance(exc, UpstreamError) and exc.status == 502


def is_retryable(exc: BaseException) -> bool:
    """A connection failure, or the cluster's 429 (a full thread-pool queue, es_rejected_execution: the
    `_analyze` pool of Elasticsearch has 1 thread and 16 queue slots, which a busy proxy overflows)."""
    return is_unreachable(exc) or (isinstance(exc, UpstreamError) and exc.status == 429)


async def _retried(attempts: int, call: Callable[[], Awaitable[Any]]) -> Any:
    async for attempt in AsyncRetrying(
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait_exponential(multiplier=0.05, max=0.5),
        retry=retry_if_exception(is_retryable),
        reraise=True,
    ):
        with attempt:
            return await call()
    raise AssertionError("unreachable: AsyncRetrying either returns or re-raises")


@dataclass(frozen=True)
class Cluster:
    """The cluster as the sidecar's own calls reach it: every call goes through one session to
    `base_url` + a path, with one timeout (None: the session's) and, for idempotent reads, one bound
    on attempts. Headers are per call: they carry the credentials of whoever the call is for."""

    session: aiohttp.ClientSession
    base_url: str
    timeout: float | None = None
    attempts: int = DEFAULT_ATTEMPTS

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        decode: Callable[[bytes], Any] = orjson.loads,
        *,
        retried: bool = False,
    ) -> Any:
        """One JSON call (`request_json`). `retried`: an idempotent one, retried on connection errors and
        429s (bounded, with backoff); never a write, nor a read whose retry could skip data (a scroll)."""
        if retried:
            return await _retried(self.attempts, lambda: self.request(method, path, body, headers, decode))
        # Never past the request's deadline (bmx_rerank.deadline), when it runs under one.
        return await request_json(
            self.session, method, self.base_url + path, body, headers, budget(self.timeout), decode
        )

    async def post_ndjson(
        self, path: str, lines: Sequence[bytes], headers: Mapping[str, str], error_type: str
    ) -> Any:
        """POST NDJSON lines (`_bulk`, `_msearch`) and parse the JSON answer. Errors are `SearchError`s
        as from `request`: the cluster's error answer as `UpstreamError(error_type)`, an unreachable
        cluster a 502, never a bare aiohttp exception. The timeout applies (else the session's), never
        past the request's deadline."""
        payload = b"\n".join(lines) + b"\n"
        hdrs = {**headers, "Content-Type": "application/x-ndjson", "Accept-Encoding": "identity"}
        url = self.base_url + path
        try:
            limit = budget(self.timeout)
            timeout = aiohttp.ClientTimeout(total=limit) if limit is not None else aiohttp.helpers.sentinel
            async with self.session.post(url, data=payload, headers=hdrs, timeout=timeout) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise UpstreamError(resp.status, error_type, body[:300].decode("utf-8", "replace"))
                return orjson.loads(body)
        except asyncio.TimeoutError as exc:
            raise timed_out(f"POST {_path(url)} timed out") from exc
        except aiohttp.ClientConnectionError as exc:
            raise unreachable(f"POST {_path(url)} failed: {exc.__class__.__name__}") from exc

    async def analyze(
        self,
        index: str,
        field_name: str,
        text: str,
        headers: Mapping[str, str] | None = None,
        analyzer: str | None = None,
    ) -> list[tuple[str, int]]:
        """The tokens of `text`, in order, each with its `start_offset` in `text` (UTF-16 code units):
        with `analyzer`, as that analyzer makes them, else as the field's index analyzer does
        (`_analyze` with `field` ignores a mapping's `search_analyzer`, on both engines; see
        `search_analyzer`)."""
        body = {"analyzer": analyzer, "text": text} if analyzer else {"field": field_name, "text": text}
        answer = await self.request("POST", f"/{index_path(index)}/_analyze", body, headers, retried=True)
        return [(tok["token"], int(tok.get("start_offset", -1))) for tok in answer.get("tokens", [])]

    async def field_analyzers(
        self, index: str, field_name: str, headers: Mapping[str, str] | None = None
    ) -> set[FieldAnalyzers]:
        """How each index `index` names analyses `field_name`, as its mapping resolves it (defaults
        included): one entry when they all agree, none when no index maps the field.

        The cluster resolves a match query's analyzer itself (a field's `search_analyzer`, the index's
        `default_search`, the field's `analyzer`; Elasticsearch and OpenSearch in different orders),
        while `_analyze` with `field` applies the index analyzer: query tokens must come from the
        resolved one, by name, to be the tokens the cluster searched with."""
        answer, settings = await asyncio.gather(
            self.request(
                "GET",
                f"/{index_path(index)}/_mapping/field/{quote(field_name, safe='')},_source?include_defaults=true",
                None,
                headers,
                retried=True,
            ),
            self._analysis_settings(index, headers),
        )
        generation = None
        if settings is not None:
            sorted_json = orjson.dumps(settings, option=orjson.OPT_SORT_KEYS)
            generation = hashlib.blake2b(sorted_json, digest_size=8).hexdigest()
        found = set()
        for name, mapping in (answer or {}).items():
            leaf = mapping.get("mappings", {}).get(field_name, {}).get("mapping", {})
            source = mapping.get("mappings", {}).get("_source", {}).get("mapping", {}).get("_source")
            analysis = (settings or {}).get(name, {}).get("settings", {}).get("index", {}).get("analysis", {})
            custom = None if settings is None else list(analysis.get("analyzer", {}))
            for spec in leaf.values():
                if isinstance(spec, dict):
                    vectors = readable(field_name, spec, source if isinstance(source, dict) else None)
                    found.add(FieldAnalyzers.of(spec, custom, generation, vectors))
        return found

    async def _analysis_settings(
        self, index: str, headers: Mapping[str, str] | None
    ) -> dict[str, Any] | None:
        """Each index's uuid and analysis settings (None: the caller may not read them)."""
        path = f"/{index_path(index)}/_settings?filter_path=*.settings.index.uuid,*.settings.index.analysis"
        try:
            return await self.request("GET", path, None, headers, retried=True) or {}
        except UpstreamError:
            return None

    async def mtermvectors_fields(
        self,
        docs: Sequence[DocRef],
        fields: Sequence[str],
        headers: Mapping[str, str] | None = None,
        realtime: bool | None = None,
    ) -> list[dict[str, DocTerms]]:
        """Exact term frequencies of each of `fields`, per document, in the order given.

        Works whether or not the mapping stores term vectors (the cluster re-analyzes the source).
        `realtime=False` reads the refreshed index, the same view a search's hits come from."""
        found = await self.fetch_vectors(docs, fields, headers, realtime)
        return [{f: _doc_terms(ref, doc, f) for f in fields} for ref, doc in zip(docs, found, strict=True)]

    async def fetch_vectors(
        self,
        docs: Sequence[DocRef],
        fields: Sequence[str],
        headers: Mapping[str, str] | None = None,
        realtime: bool | None = None,
    ) -> list[VectorsDoc]:
        """The `_mtermvectors` answer for `docs` (term frequencies only), one `VectorsDoc` each, in
        order; a document the cluster answered with an error raises it (`raise_doc_error`)."""
        if not docs:
            return []
        specs = []
        for ref in docs:
            spec: dict[str, Any] = {"_index": ref.index, "_id": ref.id, "fields": list(fields)}
            if ref.routing is not None:
                spec["routing"] = ref.routing
            specs.append({**spec, **TERM_VECTOR_PARAMETERS})
        query = "" if realtime is None else f"?realtime={'true' if realtime else 'false'}"
        answer = await self.request(
            "POST", f"/_mtermvectors{query}", {"docs": specs}, headers, _decode_vectors, retried=True
        )
        for ref, doc in zip(docs, answer.docs, strict=True):
            if doc.error is not None:
                raise_doc_error(ref, doc.error)
        return answer.docs


def raise_doc_error(ref: DocRef, err: Any) -> None:
    """A document's error in an `_mtermvectors` answer, as the `UpstreamError` the caller gets."""
    reason = err.get("reason", str(err)) if isinstance(err, dict) else str(err)
    raise UpstreamError(
        500, "bmx_termvectors_exception", f"term vectors of [{ref.index}][{ref.id}]: {reason}"
    )


def _doc_terms(ref: DocRef, doc: VectorsDoc, field_name: str) -> DocTerms:
    return DocTerms(
        ref,
        doc.found,
        {t: v.term_freq for t, v in doc.terms(field_name).items()},
        doc.version,
        doc.seq_no,
        doc.primary_term,
    )


def _upstream_error(status: int, payload: bytes, content_type: str) -> UpstreamError:
    try:
        err = orjson.loads(payload).get("error", {})
        kind = err.get("type", "upstream_exception") if isinstance(err, dict) else "upstream_exception"
        reason = err.get("reason", str(err)) if isinstance(err, dict) else str(err)
    except (orjson.JSONDecodeError, AttributeError):
        kind, reason = "upstream_exception", payload[:200].decode("utf-8", "replace")
    return UpstreamError(status, kind, reason, payload, content_type or "application/json")


def _path(url: str) -> str:
    """The URL without scheme, host or query, so logs and errors never carry credentials."""
    return "/" + url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
