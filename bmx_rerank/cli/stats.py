"""`bmx-rerank stats build|show|refresh|partial|merge`: exact corpus statistics kept in the cluster.

Errors print one line and exit non-zero; credentials (from `--user/--password`, `--header`, the URL's
userinfo or the BMX_UPSTREAM_* environment) go only into the Authorization header, never into output.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import aiohttp
import click
import orjson
from yarl import URL

from bmx_rerank.cli.options import UPSTREAM_OPTIONS, parse_headers, upstream_options
from bmx_rerank.errors import SearchError
from bmx_rerank.identity import basic_auth
from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats import sliced
from bmx_rerank.stats import store as stats_store
from bmx_rerank.stats.lengths import MAX_LENGTH_DOCS
from bmx_rerank.stats.snapshot import SnapshotInfo
from bmx_rerank.stats.sweep import DEFAULT_SWEEP, SweepOptions, resolve_text_field, sweep_index
from bmx_rerank.upstream import Cluster

T = TypeVar("T")


def _options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options every stats command shares."""
    opts = [
        click.argument("index"),
        click.option(
            "--field",
            "fields",
            required=True,
            multiple=True,
            help="Analyzed text field the statistics describe; repeat it for several (one snapshot each).",
        ),
        *UPSTREAM_OPTIONS,
        click.option(
            "--store",
            default=stats_store.DEFAULT_STORE,
            show_default=True,
            help="Index holding the snapshots (env BMX_STATS_INDEX).",
        ),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def _sweep_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--no-progress", is_flag=True, help="No progress bar.")(func)
    func = _length_options(func)
    func = click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        default=DEFAULT_SWEEP.concurrency,
        show_default=True,
        help="Term-vector requests in flight.",
    )(func)
    return click.option(
        "--batch-size",
        type=click.IntRange(min=1),
        default=DEFAULT_SWEEP.batch_size,
        show_default=True,
        help="Documents per _mtermvectors request.",
    )(func)


def _length_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "--no-lengths",
        is_flag=True,
        help="Keep no table of document lengths (the proxy then reads them with _mtermvectors).",
    )(func)
    return click.option(
        "--max-length-docs",
        type=click.IntRange(min=0),
        default=MAX_LENGTH_DOCS,
        show_default=True,
        help="Documents per index beyond which no length table is kept (~32 bytes each in the build's "
        "memory; the proxy maps <= 8 bytes each, shared by its workers).",
    )(func)


def _max_length_docs(opts: dict[str, Any]) -> int | None:
    """None when no length table is wanted; pops the length options from `opts`."""
    skip, bound = opts.pop("no_lengths"), opts.pop("max_length_docs")
    return None if skip else bound


def _sweep_settings(opts: dict[str, Any], slices: int = 1) -> SweepOptions:
    """The sweep options given on the command line; pops them from `opts`."""
    bound = _max_length_docs(opts)
    return SweepOptions(opts.pop("batch_size"), opts.pop("concurrency"), slices, bound)


@click.group(name="stats")
def command() -> None:
    """Exact corpus statistics (N, lengths, df, raw entropy) stored in the cluster."""


@command.command()
@_options
@_sweep_options
@click.option(
    "--slices",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Sweep each index in this many sliced-PIT parts, in parallel processes (merged exactly).",
)
def build(index: str, fields: tuple[str, ...], slices: int, **opts: Any) -> None:
    """Sweep every live document of INDEX (name, alias or pattern) and publish a snapshot per index
    and field."""
    sweep = _sweep_settings(opts, slices)

    def one(field: str) -> None:
        for info in _sweep(stats_build.build_snapshots, index, field, sweep, opts):
            click.echo(
                f"{info.index} [{info.field}]: {info.n_docs} docs, avgdl {info.total_length / max(info.n_docs, 1):.2f}, "
                f"{info.vocabulary_size} terms in {info.build_seconds:.1f}s -> snapshot {info.snapshot}"
                + ("" if info.exact_marks else " (writes landed during the sweep: next refresh rebuilds)")
                + _lengths_note(info)
            )

    _each_field(fields, one)


def _each_field(fields: tuple[str, ...], run: Callable[[str], None]) -> None:
    """`run` for every field, on to the next when one fails (its error said on its own line): a field
    empty in every document (BEIR Quora's titles) leaves the others their statistics. Exits 1 after,
    if one failed; an interrupt stops at once."""
    failed = False
    for field in _distinct(fields):
        try:
            run(field)
        except SystemExit as exc:
            if exc.code != 1:
                raise
            failed = True
    if failed:
        sys.exit(1)


def _lengths_note(info: SnapshotInfo) -> str:
    if info.length_docs is not None:
        return f", {info.length_docs} document lengths"
    return f", no length table ({info.lengths_skipped or 'not recorded'})"


@command.command()
@_options
@_sweep_options
@click.option("--rebuild", is_flag=True, help="Rebuild even when an incremental refresh would do.")
def refresh(index: str, fields: tuple[str, ...], rebuild: bool, **opts: Any) -> None:
    """Bring the snapshots of INDEX up to date, per field (incremental when only appends happened)."""
    sweep = _sweep_settings(opts)

    def one(field: str) -> None:
        for out in _sweep(stats_build.refresh, index, field, sweep, opts, force_rebuild=rebuild):
            snap = out.snapshot.snapshot if out.snapshot else "-"
            click.echo(f"{out.index} [{field}]: {out.action} ({out.reason}), snapshot {snap}")

    _each_field(fields, one)


@command.command()
@_options
@_sweep_options
@click.option("--slice", "part", required=True, metavar="I/N", help="Sweep slice I of N (0 <= I < N).")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="Partial file to write.")
def partial(index: str, fields: tuple[str, ...], part: str, out: str, **opts: Any) -> None:
    """Sweep one slice of the concrete index INDEX into a partial file, for `stats merge` (run one
    slice per machine or process; nothing is published)."""
    try:
        i, n = (int(x) for x in part.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        raise click.BadParameter(
            f"expected I/N with 0 <= I < N, got {part!r}", param_hint="--slice"
        ) from None
    if len(fields) != 1:
        raise click.BadParameter("one --field per partial", param_hint="--field")
    base, headers = connection(opts["upstream"], opts["user"], opts["password"], opts["header"])
    sweep = _sweep_settings(opts)

    async def go(cluster: Cluster) -> sliced.Partial:
        names = await resolve_text_field(cluster, index, fields[0], headers)
        if names != [index]:
            _fail(f"[{index}] is {names}: a partial is of one concrete index")
        result = await sweep_index(cluster, index, fields[0], headers, sweep, part=(i, n))
        return sliced.partial(index, fields[0], (i, n), result)

    found = run_with_cluster(base, go)
    Path(out).write_bytes(orjson.dumps(found.to_json()))
    click.echo(f"{index} [{fields[0]}] slice {i}/{n}: {found.exact.stats.n_docs} docs -> {out}")


@command.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@upstream_options
@click.option("--store", envvar="BMX_STATS_INDEX", default=stats_store.DEFAULT_STORE, show_default=True)
@_length_options
def merge(
    files: tuple[str, ...],
    upstream: str,
    user: str | None,
    password: str | None,
    header: tuple[str, ...],
    store: str,
    **opts: Any,
) -> None:
    """Add up the partial FILES of every slice of one index (`stats partial`), exactly, and publish
    them as its snapshot (with the slices' length tables merged, when every slice has one)."""
    bound = _max_length_docs(opts)
    try:
        partials = [sliced.Partial.from_json(orjson.loads(Path(f).read_bytes())) for f in files]
        result = sliced.merge(partials, bound)
    except (sliced.MergeError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        _fail(f"cannot merge: {exc}")
    first = partials[0]
    base, headers = connection(upstream, user, password, header)

    async def go(cluster: Cluster) -> SnapshotInfo:
        return await stats_build.publish_sweep(cluster, headers, first.index, first.field, result, store)

    info = run_with_cluster(base, go)
    click.echo(
        f"{info.index} [{info.field}]: {info.n_docs} docs from {len(files)} slices -> snapshot {info.snapshot}"
        + ("" if info.exact_marks else " (writes landed during the sweep: next refresh rebuilds)")
        + _lengths_note(info)
    )


def _distinct(fields: tuple[str, ...]) -> list[str]:
    """The fields named, each once, in order (`--field text --field text` builds once)."""
    return list(dict.fromkeys(fields))


def _sweep(
    call: Callable[..., Awaitable[T]],
    index: str,
    field: str,
    sweep: SweepOptions,
    opts: dict[str, Any],
    **extra: Any,
) -> T:
    """Run `stats_build.build_snapshots` or `stats_build.refresh` with the shared options and a progress bar."""
    base, headers = connection(opts["upstream"], opts["user"], opts["password"], opts["header"])

    async def go(cluster: Cluster) -> T:
        with progress_bar(opts["no_progress"]) as bar:
            return await call(
                cluster, index, field, headers, sweep, store=opts["store"], progress=bar, **extra
            )

    return run_with_cluster(base, go)


@command.command()
@_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.option("--terms", default="", help="Comma-separated terms to report df and raw entropy of.")
def show(
    index: str,
    fields: tuple[str, ...],
    upstream: str,
    user: str | None,
    password: str | None,
    header: tuple[str, ...],
    store: str,
    as_json: bool,
    terms: str,
) -> None:
    """What is stored for INDEX and how fresh it is (statistics summed over the indices it names), per
    field; `--json` prints one object per field, one per line."""
    base, headers = connection(upstream, user, password, header)
    wanted = [t for t in (x.strip() for x in terms.split(",")) if t]

    async def go(cluster: Cluster) -> list[dict[str, Any]]:
        return [
            await stats_build.describe(cluster, index, f, headers, wanted, store=store)
            for f in _distinct(fields)
        ]

    for field, report in zip(_distinct(fields), run_with_cluster(base, go), strict=True):
        _print_report(index, field, report, as_json)


def _print_report(index: str, field: str, report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(orjson.dumps(report).decode())
        return
    mode = "estimated (no snapshot)" if report["estimated"] else "exact"
    click.echo(
        f"{index} [{field}]: {mode}, N={report['n_docs']}, avgdl={report['avgdl']:.3f}, "
        f"vocabulary={report['vocabulary_size'] if report['vocabulary_size'] is not None else '-'}, "
        f"stale={report['stale']}"
    )
    for item in report["freshness"]:
        lengths = (
            f"{item['length_docs']} document lengths"
            if item.get("length_docs") is not None
            else f"no length table ({item.get('lengths_skipped') or 'not recorded'})"
        )
        if item.get("length_docs") is not None and item["index"] not in report.get("length_tables", {}):
            lengths += ", not used (index re-created, or its markers unreadable)"
        click.echo(
            f"  {item['index']}: snapshot {item['snapshot'] or '-'} built {item['built_at'] or '-'} "
            f"({item['method'] or '-'}), {item['reason']}; {lengths}"
        )
    for term, data in report["terms"].items():
        click.echo(f"  {term}: df={data['df']} entropy={data['entropy']:.6f}")


def connection(
    upstream: str, user: str | None, password: str | None, header: tuple[str, ...]
) -> tuple[str, dict[str, str]]:
    """Base URL without userinfo, and the headers every call carries (credentials as Authorization)."""
    url = URL(upstream)
    headers: dict[str, str] = {}
    if url.user and not user:
        user, password = url.user, url.password
    url = url.with_user(None).with_password(None)
    if user:
        try:
            headers["Authorization"] = basic_auth(user, password)
        except ValueError as exc:  # a ":" in the user name cannot be sent as Basic credentials
            raise click.BadParameter(str(exc), param_hint="--user") from None
    headers.update(parse_headers(header))
    return str(url).rstrip("/"), headers


def run_with_cluster(
    base_url: str,
    func: Callable[[Cluster], Awaitable[T]],
    interrupted: str = "interrupted: the last good snapshot is unchanged",
) -> T:
    async def main() -> T:
        async with aiohttp.ClientSession() as session:
            return await func(Cluster(session, base_url))

    try:
        return asyncio.run(main())
    except SearchError as exc:
        _fail(str(exc))
    except orjson.JSONDecodeError:
        _fail(
            "[502] bmx_upstream_not_json_exception: the upstream answered something other than JSON; is it Elasticsearch or OpenSearch?"
        )
    except KeyboardInterrupt:
        click.echo(interrupted, err=True)
        sys.exit(130)


def _fail(message: str) -> NoReturn:
    """One line on stderr (a cluster's error reason can be a multi-line HTML page), exit 1."""
    line = " ".join(message.split())
    click.echo(f"error: {line[:500]}{'...' if len(line) > 500 else ''}", err=True)
    sys.exit(1)


class _LazyBar:
    """A tqdm bar in documents (with docs/s), opened only once a sweep reports, so commands that
    sweep nothing (an unchanged refresh, an error before the first page) print no empty bar."""

    def __init__(self) -> None:
        self._bar: Any = None

    def _open(self) -> Any:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(unit="docs", unit_scale=True, dynamic_ncols=True, file=sys.stderr)
        return self._bar

    @property
    def total(self) -> float | None:
        return None if self._bar is None else self._bar.total

    @total.setter
    def total(self, value: float | None) -> None:
        bar = self._open()
        bar.total = value
        bar.refresh()

    def update(self, n: float = 1) -> None:
        self._open().update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class progress_bar:
    """Context manager for an optional `_LazyBar`."""

    def __init__(self, disabled: bool) -> None:
        self.bar = None if disabled else _LazyBar()

    def __enter__(self) -> _LazyBar | None:
        return self.bar

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
