"""`bmx-rerank serve`: run the rerank proxy in front of a cluster.

Every value is checked before anything starts: a bad one is a one-line usage error, never a traceback."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import re
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bmx_rerank import defaults
from bmx_rerank.identity import IDENTITY_HEADERS
from bmx_rerank.logs import serve_logs
from bmx_rerank.nodes import parse_nodes, server_ssl
from bmx_rerank.policy import PolicyError, load_rules, parse_rules
from bmx_rerank.proxy import ProxyConfig, make_app, serve_forever
from bmx_rerank.proxy.server import ConnectionLimits, raise_fd_limit
from bmx_rerank.rerank.probing import PROBE_MODES
from bmx_rerank.rerank.spec import MAX_WINDOW
from bmx_rerank.stats.source import statistics_source
from bmx_rerank.stats.store import DEFAULT_STORE

ENV_PREFIX = "BMX_RERANK"  # every option also from BMX_RERANK_<OPTION>, e.g. BMX_RERANK_UPSTREAM
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
}
POSITIVE = click.FloatRange(min=0, min_open=True)


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets: [::1]:9400), port 1-65535."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    if not 1 <= int(port) <= 65535:
        raise click.BadParameter(f"the port must lie in [1, 65535], got {port}")
    return host.strip("[]") or "127.0.0.1", int(port)


class ByteSize(click.ParamType):
    """A size in bytes: 1048576, 64MiB, 1GB."""

    name = "SIZE"

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in SIZE_UNITS:
            self.fail(f"expected a size such as 1048576, 64MiB or 1GB, got {value!r}", param, ctx)
        return int(match.group(1)) * SIZE_UNITS[unit]


class ProbeMode(click.ParamType):
    """auto, on or off; a boolean (a config file's `tf-probes = true`, an environment's 1/0) is on/off."""

    name = "[auto|on|off]"

    def convert(self, value, param, ctx) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        mode = str(value).strip().lower()
        mode = {"true": "on", "yes": "on", "1": "on", "false": "off", "no": "off", "0": "off"}.get(mode, mode)
        if mode not in PROBE_MODES:
            self.fail(f"expected auto, on or off, got {value!r}", param, ctx)
        return mode


def read_config_file(path: str) -> dict[str, Any]:
    """A config file's settings: TOML (`.toml`) or YAML (anything else), a flat table of option names
    (`upstream = ["https://a:9200", "https://b:9200"]`, `upstream-ca = "ca.pem"`); `-` or `_` alike."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        if path.endswith(".toml"):
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # the parsers' own errors say where
        raise click.BadParameter(f"{path}: {exc}", param_hint="--config") from exc
    if not isinstance(data, dict):
        raise click.BadParameter(f"{path}: expected a table of option names", param_hint="--config")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _load_config(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Eager: the file's settings become the defaults, so the command line and BMX_RERANK_* win."""
    if not value:
        return
    names: dict[str, click.Option] = {}  # `policy` and `policies` alike: a flag's name or the parameter's
    for p in ctx.command.params:
        if isinstance(p, click.Option) and p.name and p.name != "config":
            names[p.name] = p
            names.update({o.lstrip("-").replace("-", "_"): p for o in p.opts})
    settings: dict[str, Any] = {}
    for key, setting in read_config_file(value).items():
        option = names.get(key)
        if option is None:
            raise click.BadParameter(f"{value}: unknown setting {key!r}", param_hint="--config")
        if option.multiple and isinstance(setting, str):
            setting = [setting]
        settings[str(option.name)] = setting
    ctx.default_map = {**(ctx.default_map or {}), **settings}


@click.command("serve", context_settings={"auto_envvar_prefix": ENV_PREFIX, "show_default": True})
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    is_eager=True,
    expose_value=False,
    callback=_load_config,
    help="TOML or YAML file of option values; the command line and BMX_RERANK_* variables win.",
)
@click.option(
    "--upstream",
    multiple=True,
    required=True,
    help="Node URL, e.g. https://es1:9200; repeat or comma-separate several: round robin, with failover "
    "when a node cannot be reached. In BMX_RERANK_UPSTREAM: space- or comma-separated.",
)
@click.option(
    "--upstream-ca", type=click.Path(exists=True, dir_okay=False), help="CA bundle (PEM) for https."
)
@click.option(
    "--upstream-cert",
    type=click.Path(exists=True, dir_okay=False),
    help="Client certificate (PEM) for https.",
)
@click.option("--upstream-key", type=click.Path(exists=True, dir_okay=False), help="Its private key (PEM).")
@click.option(
    "--upstream-verify/--no-upstream-verify", default=True, help="Check the nodes' TLS certificates."
)
@click.option("--listen", default="127.0.0.1:9400", help="HOST:PORT to listen on.")
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False),
    help="Serve HTTPS with this certificate (PEM).",
)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="Its private key (PEM).")
@click.option(
    "--policy",
    "policies",
    multiple=True,
    metavar="PATTERN=FIELD[,key=value...]",
    help="Rerank plain match searches on matching indices without client changes (repeatable).",
)
@click.option("--policy-file", type=click.Path(exists=True, dir_okay=False), help="One policy per line.")
@click.option(
    "--on-rerank-error",
    type=click.Choice(["fallback", "fail"]),
    default=defaults.ON_RERANK_ERROR,
    show_default=True,
    help="When reranking fails: answer in the cluster's order with a marker, or fail the search.",
)
@click.option("--timeout", type=POSITIVE, default=defaults.TIMEOUT, help="Seconds to wait for the cluster.")
@click.option(
    "--deadline",
    type=click.FloatRange(min=0),
    default=defaults.DEADLINE,
    help="Seconds for everything one reranked search does (first stage and sidecar calls together); "
    "past it the cluster's answer marked skipped; reason=deadline, or a 504. 0: none.",
)
@click.option(
    "--connect-timeout",
    type=POSITIVE,
    default=defaults.CONNECT_TIMEOUT,
    help="Seconds to connect to the cluster.",
)
@click.option(
    "--cache-bytes",
    type=ByteSize(),
    default=defaults.CACHE_BYTES,
    help="Term-vector cache size (estimated bytes; 0 disables it), e.g. 256MiB.",
)
@click.option(
    "--page-cache-bytes",
    type=ByteSize(),
    default=defaults.PAGE_CACHE_BYTES,
    help="A lean window's page documents kept by version for a repeated window (bytes of JSON; 0 "
    "disables it), e.g. 64MiB.",
)
@click.option(
    "--widen/--no-widen",
    default=True,
    show_default=True,
    help="Let augmented queries (WQA) join the first-stage query.",
)
@click.option(
    "--stats-check-interval",
    type=click.FloatRange(min=0),
    default=5.0,
    help="Seconds between staleness checks.",
)
@click.option("--stats-index", default=DEFAULT_STORE, help="Index the statistics are stored in.")
@click.option(
    "--lengths-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory of the memory-mapped length tables every worker shares (default: bmx-rerank-lengths-UID "
    "in the system's temporary directory).",
)
@click.option(
    "--tf-probes",
    type=ProbeMode(),
    default=defaults.TF_PROBES,
    is_flag=False,
    flag_value="on",
    help="Term frequencies from the first stage (named intervals probes): auto (new windows whose "
    "lengths are known), on (every search that can; bare --tf-probes), off (_mtermvectors and its cache).",
)
@click.option("--no-tf-probes", is_flag=True, default=False, help="Same as --tf-probes off.")
@click.option(
    "--in-engine",
    is_flag=True,
    default=False,
    help="Score a window inside the cluster where that is exact: OpenSearch 2.10+ with painless, an index "
    "of one shard whose field has a <field>.len token_count sub-field (bmx-rerank lengths add), one "
    "text scored with BMX. Every other search, and any the engine refuses, is reranked by the sidecar.",
)
@click.option(
    "--workers",
    default=1,
    type=click.IntRange(1, 64),
    help="Processes serving the same port (SO_REUSEPORT), each with its own caches: use the cores.",
)
@click.option(
    "--loop",
    type=click.Choice(["auto", "uvloop", "asyncio"]),
    default="auto",
    help="Event loop: uvloop (faster, see benchmarks/RESULTS.md) where installed, else asyncio's.",
)
@click.option(
    "--max-body",
    type=ByteSize(),
    default=defaults.MAX_BODY,
    help="Search/msearch body bytes read (after decompression); a larger body goes to the cluster unread.",
)
@click.option(
    "--max-content-length",
    type=ByteSize(),
    default=defaults.MAX_CONTENT_LENGTH,
    help="Largest search/msearch body sent to the cluster (its http.max_content_length); past it a 413. "
    "0: no limit.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0),
    default=defaults.IDLE_TIMEOUT,
    help="Seconds a client connection may sit idle (before its first request or between two). 0: no limit.",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(min=0),
    default=defaults.HEADER_TIMEOUT,
    help="Seconds from a request's first byte to its last header. 0: no limit.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=0),
    default=None,
    help="Open client connections; past it the oldest idle one is closed for the new one. Default: the "
    "file-descriptor limit (raised to its hard limit) less 1024. 0: no cap.",
)
@click.option(
    "--max-in-flight",
    type=ByteSize(),
    default=defaults.MAX_IN_FLIGHT,
    help="Bytes of search bodies and first-stage answers held at once, all requests together; past it a "
    "429 circuit_breaking_exception. 0: no budget.",
)
@click.option(
    "--max-depth",
    type=click.IntRange(0, 1000),
    default=defaults.MAX_DEPTH,
    help="JSON nesting levels of a search/msearch body; deeper is a 400 before the cluster sees it. 0: off.",
)
@click.option(
    "--max-query-depth",
    type=click.IntRange(min=0),
    default=defaults.MAX_QUERY_DEPTH,
    help="Nested bool queries (the cluster's indices.query.bool.max_nested_depth); deeper is a 400. 0: off.",
)
@click.option(
    "--max-window", type=click.IntRange(1, MAX_WINDOW), default=MAX_WINDOW, help="Largest rerank window."
)
@click.option(
    "--max-augment",
    type=click.IntRange(min=0),
    default=defaults.MAX_AUGMENT,
    help="Augmented queries per search.",
)
@click.option(
    "--max-msearch",
    type=click.IntRange(min=1),
    default=defaults.MAX_MSEARCH,
    help="Items reranked per _msearch.",
)
@click.option(
    "--max-concurrent-reranks",
    type=click.IntRange(min=1),
    default=defaults.MAX_CONCURRENT_RERANKS,
    help="Reranks running at once; beyond them --on-overload applies.",
)
@click.option(
    "--on-overload",
    type=click.Choice(["fallback", "reject"]),
    default=defaults.ON_OVERLOAD,
    help="Past --max-concurrent-reranks: the cluster's own answer (marked), or 429.",
)
@click.option(
    "--identity-header",
    "identity_headers",
    multiple=True,
    metavar="NAME",
    help="A header that tells callers apart (repeatable; replaces the default list: "
    + ", ".join(IDENTITY_HEADERS)
    + ").",
)
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="info")
def command(
    upstream: tuple[str, ...],
    upstream_ca: str | None,
    upstream_cert: str | None,
    upstream_key: str | None,
    upstream_verify: bool,
    listen: str,
    tls_cert: str | None,
    tls_key: str | None,
    policies: tuple[str, ...],
    policy_file: str | None,
    on_rerank_error: str,
    timeout: float,
    deadline: float,
    connect_timeout: float,
    cache_bytes: int,
    page_cache_bytes: int,
    widen: bool,
    stats_check_interval: float,
    stats_index: str,
    lengths_dir: str | None,
    tf_probes: str,
    no_tf_probes: bool,
    in_engine: bool,
    workers: int,
    loop: str,
    max_body: int,
    max_content_length: int,
    idle_timeout: float,
    header_timeout: float,
    max_connections: int | None,
    max_in_flight: int,
    max_depth: int,
    max_query_depth: int,
    max_window: int,
    max_augment: int,
    max_msearch: int,
    max_concurrent_reranks: int,
    on_overload: str,
    identity_headers: tuple[str, ...],
    log_level: str,
) -> None:
    """Run the rerank proxy: point clients at --listen instead of the cluster.

    Every option may also come from the environment, BMX_RERANK_<OPTION> (BMX_RERANK_UPSTREAM,
    BMX_RERANK_UPSTREAM_CA, BMX_RERANK_POLICIES, ...), or from --config; the command line wins, then
    the environment, then the file."""
    if max_body < 1:
        raise click.BadParameter("must be at least 1 byte", param_hint="--max-body")
    try:
        rules = parse_rules(policies, widen_default=widen)
        if policy_file:
            rules += load_rules(policy_file, widen_default=widen)
    except PolicyError as exc:
        raise click.BadParameter(str(exc), param_hint="--policy") from exc
    for rule in rules:
        if rule.spec.window_size > max_window:
            raise click.BadParameter(
                f"a policy's window_size {rule.spec.window_size} exceeds --max-window {max_window}",
                param_hint="--policy",
            )
    host, port = parse_listen(listen)
    try:
        nodes = parse_nodes(upstream)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--upstream") from exc
    listener = listener_ssl(tls_cert, tls_key)
    identity = identity_headers or IDENTITY_HEADERS
    config = ProxyConfig(
        upstream=nodes,
        upstream_ca=upstream_ca,
        upstream_cert=upstream_cert,
        upstream_key=upstream_key,
        upstream_verify=upstream_verify,
        policies=rules,
        on_rerank_error=on_rerank_error,
        timeout=timeout,
        deadline=deadline,
        connect_timeout=connect_timeout,
        cache_bytes=cache_bytes,
        page_cache_bytes=page_cache_bytes,
        widen=widen,
        max_body=max_body,
        max_content_length=max_content_length,
        max_in_flight=max_in_flight,
        max_depth=max_depth,
        max_query_depth=max_query_depth,
        max_window=max_window,
        max_augment=max_augment,
        max_msearch=max_msearch,
        max_concurrent_reranks=max_concurrent_reranks,
        on_overload=on_overload,
        identity_headers=identity,
        tf_probes="off" if no_tf_probes else tf_probes,
        in_engine=in_engine,
        stats_index=stats_index,
    )
    serve_logs(log_level, sys.stderr)
    stats_source = statistics_source(stats_check_interval, stats_index, timeout, identity, lengths_dir)
    try:
        make_app(config, stats_source)  # checked here, made per worker
    except (ValueError, OSError) as exc:  # ssl.SSLError is an OSError: a bad CA bundle or key pair
        raise click.BadParameter(str(exc), param_hint="--upstream-ca/--upstream-cert/--upstream-key") from exc
    fields = {"listen": f"{'https' if listener else 'http'}://{host}:{port}", "upstream": list(nodes)}
    logging.getLogger("bmx_rerank.proxy").info("serving", extra={"fields": {**fields, "workers": workers}})

    raise_fd_limit()
    limits = ConnectionLimits(idle_timeout, header_timeout, max_connections)

    def serve() -> None:
        install_loop(loop)
        serve_forever(
            make_app(config, stats_source),
            host,
            port,
            ssl_context=listener,
            reuse_port=workers > 1,
            limits=limits,
        )

    try:
        run_workers(serve, workers)
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


def install_loop(kind: str) -> str:
    """Make `kind` the event loop of this process ("auto": uvloop when installed); the one installed."""
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise click.BadParameter("uvloop is not installed", param_hint="--loop") from None
            return "asyncio"
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    return "asyncio"


def run_workers(serve: Callable[[], None], workers: int) -> None:
    """`serve` in this process and `workers - 1` forked ones (they share the listening port through
    SO_REUSEPORT, the kernel spreads connections); the children end with this process."""
    if workers == 1:
        serve()
        return
    ctx = multiprocessing.get_context("fork")
    children = [ctx.Process(target=serve, daemon=True) for _ in range(workers - 1)]
    for child in children:
        child.start()
    try:
        serve()
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.join(10)


def listener_ssl(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The listener's TLS context from --tls-cert/--tls-key, or None for plain HTTP."""
    if not cert:
        if key:
            raise click.BadParameter("--tls-key needs --tls-cert", param_hint="--tls-key")
        return None
    try:
        return server_ssl(cert, key)
    except OSError as exc:
        raise click.BadParameter(f"cannot load the certificate: {exc}", param_hint="--tls-cert") from exc
