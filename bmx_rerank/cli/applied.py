"""`bmx-rerank applied INDEX`: the configuration `eval --apply` stored for an index, with its evidence."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
import click
import orjson

from bmx_rerank.applied import read_config
from bmx_rerank.cli.options import parse_headers
from bmx_rerank.errors import SearchError
from bmx_rerank.stats.store import DEFAULT_STORE
from bmx_rerank.upstream import Cluster


def describe(index: str, info: Mapping[str, Any] | None) -> str:
    """The stored configuration in words: what proxies do with the index's searches, and why."""
    if info is None:
        return f"{index}: no applied configuration (searches are reranked only when they ask, or by --policy)"
    ev = info.get("evidence") or {}
    if info.get("rerank"):
        lines = [f"{index}: reranked with {ev.get('chosen', '?')}: {orjson.dumps(info.get('bmx')).decode()}"]
    else:
        lines = [f"{index}: the engine's own ranking (searches pass through untouched)"]
    if ev.get("evaluated_at"):
        compared = ev.get("compared")
        grid = ev.get("grid")
        of = f" of {grid}" if grid and compared and grid > compared else ""
        lines.append(
            f"  evaluated {ev['evaluated_at']} on {ev.get('queries', '?')} judged queries"
            + (f", {compared}{of} configurations compared" if compared else "")
        )
    gate = ev.get("gate")
    if gate:
        pct = 100 * gate["confidence"]
        lines.append(
            f"  expected gain on new queries {100 * gate['expected']:+.2f} {ev.get('measure', 'nDCG@10')}, "
            f"{pct:g} % interval {100 * gate['low']:+.2f} … {100 * gate['high']:+.2f}, "
            f"chance of a loss {100 * gate['p_loss']:.0f} %"
            + (
                f", about {gate['more_queries']} more judged queries would settle it"
                if gate.get("more_queries")
                else ""
            )
        )
        for hurt in gate.get("hurt") or []:
            lines.append(
                f"  hurt most by {gate['best']}: {hurt['query']} {100 * hurt['change']:+.2f} {hurt['text']}"
            )
    if ev.get("decision"):
        lines.append(f"  decision: {ev['decision']}")
    return "\n".join(lines)


@click.command("applied")
@click.argument("index")
@click.option("--upstream", default="http://127.0.0.1:9200", show_default=True, help="Cluster URL.")
@click.option(
    "--header", "header_values", multiple=True, metavar="'NAME: VALUE'", help="A header (repeatable)."
)
@click.option("--store", default=DEFAULT_STORE, show_default=True, help="The statistics store index.")
@click.option("--json", "as_json", is_flag=True, help="The stored document's info as JSON.")
def command(index: str, upstream: str, header_values: tuple[str, ...], store: str, as_json: bool) -> None:
    """Show the configuration `bmx-rerank eval --apply` stored for INDEX and the evidence it was chosen on."""

    async def go() -> dict[str, Any] | None:
        async with aiohttp.ClientSession() as session:
            return await read_config(Cluster(session, upstream), index, parse_headers(header_values), store)

    try:
        info = asyncio.run(go())
    except SearchError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(describe(index, info))
