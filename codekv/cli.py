"""The ``codekv`` command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from codekv.chunks import DEFAULT_BUDGET
from codekv.gitrepo import NotARepositoryError
from codekv.storage import CorruptIndexError

console = Console()


def _store_option(function):
    return click.option(
        "--store",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Directory of the index (default: $CODEKV_HOME or ~/.cache/codekv).",
    )(function)


@click.group()
@click.version_option(package_name="codekv")
def main() -> None:
    """Reuse the KV state of code an agent has already read."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _open_index(repo, store, **options):
    from codekv.index import Index

    try:
        return Index(repo, store=store, **options)
    except (NotARepositoryError, CorruptIndexError) as error:
        raise click.ClickException(str(error)) from error


def _resolve_repo(repo: str | None, stdlib: bool) -> str:
    if stdlib:
        from codekv.stdlib_repo import make_stdlib_repo

        with console.status("Making the standard library into a git repository..."):
            return str(make_stdlib_repo())
    return repo or "."


@main.command()
@click.argument("repo", required=False)
@click.option("--stdlib", is_flag=True, help="Index this Python's standard library as a git repo.")
@_store_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option("--rebuild", is_flag=True, help="Delete the index database and build it afresh.")
@click.option("--budget", default=DEFAULT_BUDGET, show_default=True, help="Tokens per chunk.")
@click.option("--workers", type=int, default=None, help="Parser processes (default: cores).")
@click.option("--include-secrets", is_flag=True, help="Also index .env, keys and the like.")
@click.option("--include-ignored", is_flag=True, help="Also index files git ignores.")
def index(repo, stdlib, store, as_json, rebuild, budget, workers, include_secrets, include_ignored):
    """Index a git repository (HEAD plus the working tree) into chunks and anchors."""
    repo = _resolve_repo(repo, stdlib)
    if rebuild:
        from codekv.index import INDEX_FILE
        from codekv.paths import home

        database = (store or home()) / INDEX_FILE
        for suffix in ("", "-wal", "-shm"):
            Path(f"{database}{suffix}").unlink(missing_ok=True)
    idx = _open_index(
        repo, store, budget=budget, include_secrets=include_secrets, include_ignored=include_ignored
    )
    try:
        if as_json or not sys.stderr.isatty():
            summary = idx.update(workers=workers)
        else:
            summary = _update_with_progress(idx, workers)
    except CorruptIndexError as error:
        raise click.ClickException(str(error)) from error
    finally:
        idx.close()
    if as_json:
        click.echo(json.dumps(summary.as_json()))
    else:
        _print_summary(summary)


def _update_with_progress(idx, workers):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("Parsing", total=None)

        def advance(step, total):
            progress.update(task, advance=step, total=total)

        return idx.update(workers=workers, progress=advance)


def _print_summary(summary) -> None:
    table = Table(title=f"codekv index: {summary.repo}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("files scanned", str(summary.files))
    table.add_row("parsed", str(summary.parsed))
    table.add_row("reused", str(summary.reused))
    for reason, count in sorted(summary.skipped.items()):
        table.add_row(f"skipped: {reason}", str(count))
    table.add_row("files with syntax errors", str(summary.syntax_errors))
    table.add_row("files not UTF-8", str(summary.decode_errors))
    for kind, count in sorted(summary.chunks.items()):
        table.add_row(f"chunks: {kind}", str(count))
    for kind, count in sorted(summary.anchors.items()):
        table.add_row(f"anchors: {kind}", str(count))
    table.add_row("graph nodes", str(summary.graph_nodes))
    table.add_row("graph edges", str(summary.graph_edges))
    table.add_row("seconds", f"{summary.seconds:.2f}")
    console.print(table)


@main.command()
@click.argument("repo")
@click.argument("target")
@_store_option
def show(repo, target, store):
    """Show the chunks of PATH[::QUALNAME] with anchors marked and def-use neighbours."""
    from codekv.show import render_chunks

    path, _, qualname = target.partition("::")
    idx = _open_index(repo, store)
    try:
        if not idx.files():
            idx.update()
        chunks = idx.find(path, qualname or None)
        if not chunks:
            raise click.ClickException(f"no chunk matches {target!r}; is it indexed?")
        render_chunks(console, idx, chunks)
    finally:
        idx.close()


@main.command()
@click.argument("repo", required=False, default=".")
@_store_option
def gc(repo, store):
    """Drop index entries no longer reachable from the repository's current snapshot."""
    idx = _open_index(repo, store)
    try:
        removed = idx.gc()
    finally:
        idx.close()
    console.print(f"removed {removed} unreachable blob entries")
