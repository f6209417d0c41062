"""Who is asking, and which of the caller's headers go on the sidecar's own calls.

The sidecar holds no credentials of its own: every call it makes for a search carries the caller's
headers (`forwardable_headers`), and everything it caches per caller is keyed by a digest of the
headers that say who the caller is (`caller`), never by the credentials themselves."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping

# The headers that say who is asking, on Elasticsearch and OpenSearch: credentials (basic, bearer, API
# key, cookies), secondary authorization, run-as and impersonation, proxy authentication. Configurable
# (`serve --identity-header`) for a cluster that authenticates with a header of its own.
IDENTITY_HEADERS = (
    "authorization",
    "cookie",
    "es-secondary-authorization",
    "es-security-runas-user",
    "opendistro_security_impersonate_as",
    "securitytenant",
    "x-proxy-user",
    "x-proxy-roles",
    "x-forwarded-for",
)

# Header names the client wrapper's sidecar calls carry from the search they serve: its credentials,
# nothing else (the official client's other headers are about its own request).
CREDENTIAL_HEADERS = ("authorization", "es-security-runas-user")

# Headers about the client's own body, its encoding, the connection or the host: never repeated on the
# sidecar's calls, which have bodies and answers of their own.
NOT_FORWARDED = frozenset(
    (
        "host",
        "content-length",
        "content-type",
        "content-encoding",
        "content-md5",
        "accept",
        "accept-encoding",
        "expect",
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    )
)


def caller(headers: Mapping[str, str], names: Iterable[str] = IDENTITY_HEADERS) -> str:
    """Who is asking: a digest of the authentication headers among `headers` (never the credentials
    themselves). Anonymous callers (no such header) share one identity, as they share their rights."""
    wanted = {n.lower() for n in names}
    items = sorted((k.lower(), v) for k, v in headers.items() if k.lower() in wanted)
    return hashlib.sha256(repr(items).encode()).hexdigest()


def credentials(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The `CREDENTIAL_HEADERS` among `headers` (lower-cased names)."""
    found = {k.lower(): v for k, v in (headers or {}).items()}
    return {k: found[k] for k in CREDENTIAL_HEADERS if k in found}


def basic_auth(user: str, password: str | None) -> str:
    """An `Authorization` value for HTTP Basic credentials (UTF-8, as Elasticsearch reads them): the one
    place URL userinfo, `--user/--password` and a client's `http_auth` become a header."""
    if ":" in user:  # RFC 7617: the first colon ends the user-id, so one inside it would move the split
        raise ValueError('A ":" is not allowed in login (RFC 7617, section 2)')
    pair = f"{user}:{password or ''}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def forwardable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The caller's headers to repeat on the sidecar's own calls: all but those of `NOT_FORWARDED`.

    Not a list of known credential headers: a cluster may authenticate with any header (OpenSearch's
    proxy authentication `x-proxy-user`/`x-proxy-roles`, a JWT in a header of its choosing, run-as,
    cookies), and a sidecar call that lacked one would run with other rights than the caller's."""
    return {k: v for k, v in headers.items() if k.lower() not in NOT_FORWARDED}
