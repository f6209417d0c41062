"""`bmx-rerank engine start|stop|status`: a real local Elasticsearch/OpenSearch without Docker."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bmx_rerank.testing import engine as eng

_KIND = click.Choice(list(eng.KINDS))


def _fail(exc: eng.EngineError | OSError) -> None:
    """Print the actionable message (or the file system's complaint) without a stack trace, exit 1."""
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


@click.group(name="engine")
def command() -> None:
    """Run a single-node Elasticsearch or OpenSearch on 127.0.0.1 (for tests, CI and the demo)."""


@command.command()
@click.argument("kind", type=_KIND)
@click.option("--version", "version", help="Engine version (default: ES 8.19.21, OpenSearch 2.19.3).")
@click.option("--port", type=click.IntRange(1, 65535), help="HTTP port (default: ES 9200, OpenSearch 9201).")
@click.option(
    "--java-home",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="JDK to run it with (default: the oldest installed JDK the version supports).",
)
@click.option(
    "--timeout", type=float, default=eng.START_TIMEOUT_S, show_default=True, help="Seconds to wait."
)
def start(kind: str, version: str | None, port: int | None, java_home: Path | None, timeout: float) -> None:
    """Start KIND (downloading it once) and print its URL as the last line."""
    req = eng.StartRequest(
        kind=kind,  # type: ignore[arg-type]
        version=version or eng.DEFAULT_VERSIONS[kind],
        port=port or eng.DEFAULT_PORTS[kind],
        java_home=java_home,
        timeout=timeout,
    )
    try:
        state = eng.start(req, eng.default_reporter)
    except (eng.EngineError, OSError) as exc:
        _fail(exc)
    click.echo(state.url)


@command.command()
@click.argument("kind", type=_KIND, required=False)
def stop(kind: str | None) -> None:
    """Stop KIND (default: both). Its data is discarded."""
    try:
        for k in [kind] if kind else eng.KINDS:
            was_running = eng.stop(k, eng.default_reporter)  # type: ignore[arg-type]
            click.echo(f"{k}: {'stopped' if was_running else 'not running'}")
    except (eng.EngineError, OSError) as exc:
        _fail(exc)


@command.command()
@click.argument("kind", type=_KIND, required=False)
def status(kind: str | None) -> None:
    """Show KIND (default: both); with KIND, exit 1 when it is not running."""
    down = False
    for k in [kind] if kind else eng.KINDS:
        st = eng.status(k)  # type: ignore[arg-type]
        if st.running and st.state is not None:
            click.echo(
                f"{k}: running {st.state.version} at {st.state.url} "
                f"(pid {st.state.pid}, health {st.health or 'not answering'}, logs {st.state.node_dir}/logs)"
            )
        else:
            down = True
            click.echo(f"{k}: not running")
    if kind and down:
        sys.exit(1)
