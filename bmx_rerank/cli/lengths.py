"""`bmx-rerank lengths add|check`: a `token_count` sub-field that gives each document's length from the
cluster's doc values (`<field>.len`), for `serve --in-engine` (stats/length_field.py).

Errors print one line and exit non-zero; credentials go only into the Authorization header."""

from __future__ import annotations

import sys
from typing import Any

import click

from bmx_rerank.cli.options import upstream_options
from bmx_rerank.cli.stats import connection, progress_bar, run_with_cluster
from bmx_rerank.stats import length_field
from bmx_rerank.upstream import Cluster


def _options(func: Any) -> Any:
    func = upstream_options(func)
    func = click.option("--field", required=True, help="The analyzed text field whose length is counted.")(
        func
    )
    return click.argument("index")(func)


@click.group(name="lengths")
def command() -> None:
    """Each document's length in the cluster (a <field>.len token_count), for serve --in-engine."""


@command.command()
@_options
@click.option("--batch", default=500, show_default=True, type=click.IntRange(1, length_field.MAX_BATCH))
@click.option(
    "--rate",
    default=1000.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Documents a second (0: unbounded).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def add(index: str, field: str, batch: int, rate: float, no_progress: bool, **opts: Any) -> None:
    """Add <field>.len to INDEX's mapping and give it to every document written before: each is written
    again, unchanged, from its _source, only if no one changed it meanwhile."""
    base, headers = connection(opts["upstream"], opts["user"], opts["password"], opts["header"])

    async def go(cluster: Cluster) -> tuple[bool, length_field.Filled, int]:
        added = await length_field.add(cluster, index, field, headers)
        with progress_bar(no_progress) as bar:
            filled = await length_field.fill(
                cluster, index, field, headers, batch=batch, rate=rate, progress=bar
            )
        return added, filled, await length_field.missing(cluster, index, field, headers)

    interrupted = "interrupted: the documents written so far keep their length; run it again for the rest"
    added, filled, left = run_with_cluster(base, go, interrupted)
    state = "added" if added else "already mapped"
    click.echo(
        f"{index}: {field}.len {state}; {filled.written} documents written again, {filled.changed} changed "
        f"meanwhile (left as written since), {filled.failed} refused; {left} without a length"
    )
    if filled.failed or left:
        reason = f": {filled.first_failure}" if filled.first_failure else ""
        click.echo(f"error: {left} documents still have no length{reason}; run it again", err=True)
        sys.exit(1)


@command.command()
@_options
def check(index: str, field: str, **opts: Any) -> None:
    """How many of INDEX's documents hold the field but no length; exit 1 if any."""
    base, headers = connection(opts["upstream"], opts["user"], opts["password"], opts["header"])

    async def go(cluster: Cluster) -> int:
        return await length_field.missing(cluster, index, field, headers)

    left = run_with_cluster(base, go)
    click.echo(f"{index}: {left} documents without a length in {field}.len")
    sys.exit(1 if left else 0)
