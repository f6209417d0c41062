"""`bmx-rerank serve`: run the rerank proxy in front of a cluster."""

from __future__ import annotations

import logging
import sys

import click
from aiohttp import web

from bmx_rerank.policy import PolicyError, load_rules, parse_rules
from bmx_rerank.proxy import JsonLines, ProxyConfig, make_app, split_upstream


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets: [::1]:9400)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def statistics_source(check_interval: float):
    """The cluster-backed statistics cache (bmx_rerank.stats.cache), built per session at startup."""
    from bmx_rerank.stats.cache import StatsCache

    return lambda session, base_url: StatsCache(session, base_url, check_interval=check_interval)


@click.command("serve")
@click.option("--upstream", required=True, help="Cluster URL, e.g. http://127.0.0.1:9200.")
@click.option("--listen", default="127.0.0.1:9400", show_default=True, help="HOST:PORT to listen on.")
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
    default="fallback",
    show_default=True,
    help="When reranking fails: answer in the cluster's order with a marker, or fail the search.",
)
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the cluster.")
@click.option("--connect-timeout", default=10.0, show_default=True, help="Seconds to connect to the cluster.")
@click.option("--cache-size", default=100_000, show_default=True, help="Term-vector cache entries.")
@click.option(
    "--widen/--no-widen",
    default=True,
    show_default=True,
    help="Let augmented queries (WQA) join the first-stage query.",
)
@click.option(
    "--stats-check-interval", default=5.0, show_default=True, help="Seconds between staleness checks."
)
@click.option("--log-level", default="info", show_default=True)
def command(
    upstream: str,
    listen: str,
    policies: tuple[str, ...],
    policy_file: str | None,
    on_rerank_error: str,
    timeout: float,
    connect_timeout: float,
    cache_size: int,
    widen: bool,
    stats_check_interval: float,
    log_level: str,
) -> None:
    """Run the rerank proxy: point clients at --listen instead of the cluster."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=log_level.upper(), handlers=[handler], force=True)
    try:
        rules = parse_rules(policies, widen_default=widen)
        if policy_file:
            rules += load_rules(policy_file, widen_default=widen)
    except PolicyError as exc:
        raise click.BadParameter(str(exc), param_hint="--policy") from exc
    host, port = parse_listen(listen)
    config = ProxyConfig(
        upstream=upstream,
        policies=rules,
        on_rerank_error=on_rerank_error,
        timeout=timeout,
        connect_timeout=connect_timeout,
        cache_size=cache_size,
        widen=widen,
    )
    try:
        app = make_app(config, statistics_source(stats_check_interval))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--upstream") from exc
    logging.getLogger("bmx_rerank.proxy").info(
        "serving", extra={"fields": {"listen": f"{host}:{port}", "upstream": split_upstream(upstream)[0]}}
    )
    web.run_app(app, host=host, port=port, print=None, auto_decompress=False, access_log=None)
