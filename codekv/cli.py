"""The ``codekv`` command line."""

from __future__ import annotations

import json
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from codekv import paths
from codekv.backends.engines import ENGINES, TRANSFORMERS, engines_help
from codekv.chunks import DEFAULT_BUDGET
from codekv.cli_types import StoreParam
from codekv.conditioning import CONDITIONINGS
from codekv.gitrepo import MissingBlobError, NotARepositoryError
from codekv.index_db import CorruptIndexError
from codekv.selection import STRATEGIES

console = Console()


def _store_option(function):
    return click.option(
        "--store",
        type=StoreParam(shared=False),
        default=None,
        help="Directory of the index (default: $CODEKV_HOME or ~/.cache/codekv).",
    )(function)


def _kv_store_option(function):
    return click.option(
        "--store",
        type=StoreParam(shared=True),
        default=None,
        help="Directory of the index and chunk KV (default: $CODEKV_HOME or ~/.cache/codekv), "
             "or a shared chunk KV store: redis://[user:password@]host:port/db, rediss://..., "
             "or local,<url> (default: $CODEKV_STORE).",
    )(function)


def _split_store(store) -> tuple[Path | None, str | None]:
    """(index directory, shared store spec) of a ``--store`` value."""
    return (None, store) if isinstance(store, str) else (store, None)


def _kv_store(directory: Path | None, shared: str | None):
    """The chunk KV store: ``shared``, else ``$CODEKV_STORE``, else the local one."""
    from codekv.paths import home
    from codekv.stores import STORE_ENV, StoreSpecError, default_kv_store

    try:
        return default_kv_store(directory or home(), shared)
    except StoreSpecError as error:
        where = "--store" if shared else f"${STORE_ENV}"
        raise click.ClickException(f"{where}: {error}") from error


@click.group()
@click.version_option(package_name="codekv")
def main() -> None:
    """Reuse the KV state of code an agent has already read."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        paths.check_environment()  # before any command loads a model
    except paths.SettingError as error:
        raise click.ClickException(str(error)) from error


def _budget_option(function):
    return click.option(
        "--budget", default=DEFAULT_BUDGET, show_default=True, type=click.IntRange(min=1),
        help="Tokens per chunk.",
    )(function)


def _share(ctx, param, value: float | None) -> float | None:
    """A share from 0 to 1 (click's FloatRange lets NaN through), or None when not given."""
    if value is not None and not (math.isfinite(value) and 0 <= value <= 1):
        raise click.BadParameter(f"{value} is not a share from 0 to 1")
    return value


def _finite(value):
    """``value`` with NaN and infinities as None: strict JSON parsers refuse them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


@contextmanager
def _opened_index(repo, store, **options):
    """The repository's Index, closed afterwards; a missing repository, a damaged index
    database (found on opening or on any later read) or a file that changed since it was
    indexed is a one-line error, not a traceback."""
    from codekv.index import Index

    try:
        idx = Index(repo, store=store, **options)
    except (NotARepositoryError, CorruptIndexError) as error:
        raise click.ClickException(str(error)) from error
    try:
        yield idx
    except (CorruptIndexError, MissingBlobError) as error:
        raise click.ClickException(str(error)) from error
    finally:
        idx.close()


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
@_budget_option
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
    options = dict(budget=budget, include_secrets=include_secrets, include_ignored=include_ignored)
    with _opened_index(repo, store, **options) as idx:
        if as_json or not sys.stderr.isatty():
            summary = idx.update(workers=workers)
        else:
            summary = _update_with_progress(idx, workers)
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
@_budget_option
def show(repo, target, store, budget):
    """Show the chunks at TARGET with anchors marked and def-use neighbours.

    TARGET is PATH, PATH::QUALNAME (``db.py::Pool.get``), PATH::QUALNAME@LINE or a chunk id.
    """
    from codekv.address import AddressError
    from codekv.show import render_chunks

    with _opened_index(repo, store, budget=budget) as idx:
        # Incremental (nothing changed: nothing parsed); without it a file edited since the
        # last index would be shown from a snapshot whose blob is no longer on disk.
        idx.update()
        try:
            chunks = idx.lookup(target).chunks
        except AddressError as error:
            raise click.ClickException(str(error)) from error
        render_chunks(console, idx, chunks)


@main.command()
@click.argument("repo", required=False, default=".")
@_kv_store_option
@_budget_option
def gc(repo, store, budget):
    """Drop index entries no longer reachable from the repository's current snapshot.

    Blobs chunked with another budget (or an older chunker) count as unreachable. In the chunk
    KV store, only the repository's scope is collected, and its entries of blobs that left the
    snapshot go only where no other codekv home has claimed the scope within a week.
    """
    from codekv.stores import StoreUnavailable, default_holder

    store, shared = _split_store(store)
    with _opened_index(repo, store, budget=budget) as idx:
        scope = _scope(idx)  # a bad $CODEKV_SCOPE is refused before anything goes
        removed = idx.gc()
        live = {file.blob_hash for file in idx.files()}
        root = idx.root
        holder = default_holder(idx.store_dir)

    def keep(provenance: dict) -> bool:
        # Chunk KV of this repository whose blob left the snapshot goes; all else stays. An
        # index that holds no file of the repository (never indexed here) judges nothing.
        return not live or provenance.get("repository") != root or provenance.get("blob") in live

    kv_store = _kv_store(store, shared)
    try:
        kv_removed, others = kv_store.collect(scope, keep, holder)
    except StoreUnavailable as error:
        raise click.ClickException(f"chunk KV store: {error}") from error
    console.print(f"removed {removed} unreachable blob entries and {kv_removed} chunk KV files")
    if others:
        console.print(f"{len(others)} other codekv home(s) used scope {scope!r} within a week: "
                      "their chunk KV stays (only leftovers were removed)", highlight=False)


def _scope(idx) -> str:
    """The index's chunk KV scope; a bad ``$CODEKV_SCOPE`` is a usage error."""
    from codekv.stores import default_scope

    try:
        return default_scope(idx)
    except paths.SettingError as error:
        raise click.ClickException(str(error)) from error


def _conditioning_option(function):
    return click.option(
        "--conditioning", default=None, type=click.Choice(CONDITIONINGS),
        help="What each chunk's KV is computed after: nothing, the prefix, or the prefix and "
             "the definitions the chunk uses (graph) [prefix; compose with auto: what the "
             "support file's rule was measured with].",
    )(function)


def _backend_option(function):
    return click.option(
        "--backend", "engine", default=TRANSFORMERS, show_default=True,
        type=click.Choice(ENGINES),
        help=engines_help(),
    )(function)


@contextmanager
def _composer(repo, store, model, experimental, engine=TRANSFORMERS):
    """An up-to-date index of ``repo`` and a Composer over it with the loaded model."""
    from codekv.compose import Composer
    from codekv.models import ModelLoadError, load_backend

    store, shared = _split_store(store)
    with _opened_index(repo, store) as idx:
        scope = _scope(idx)  # a bad $CODEKV_SCOPE is refused before the model loads
        try:
            with console.status("Loading the model..."):
                backend = load_backend(model, engine=engine)
        except ModelLoadError as error:
            raise click.ClickException(str(error)) from error
        # Indexed after the load (seconds), so files edited meanwhile are read as they are now.
        idx.update()
        kv_store = _kv_store(store, shared)
        yield idx, Composer(backend, idx, kv_store, scope=scope, experimental=experimental)


@main.command()
@click.argument("repo", required=False, default=".")
@click.option("--chunk", "chunks", multiple=True, required=True,
              help="PATH, PATH::QUALNAME[@LINE] or a chunk id.")
@click.option("--query", required=True, help="The question or instruction after the chunks.")
@click.option("--prefix", default=None, help="Exact prefix (system prompt, tool docs).")
@click.option("--strategy", default="auto", show_default=True,
              type=click.Choice(["auto", *STRATEGIES]),
              help="Selection rule; auto: the rule and ratio the support gate records as "
                   "passing for the request's workloads.")
@click.option("--ratio", type=float, default=None, callback=_share,
              help="Share of chunk tokens to recompute, from 0 to 1 [with a named strategy: "
                   "0.15; with auto: the support file's].")
@click.option("--max-new-tokens", default=48, show_default=True, type=click.IntRange(min=0),
              help="Tokens to generate after the query.")
@click.option("--model", default=None,
              help="A GGUF file, a local HF model directory, or a named model: smollm2 "
                   "(the default) or gemma3.")
@click.option("--check", is_flag=True, help="Also run full prefill and compare.")
@click.option("--experimental", is_flag=True, help="Compose even where the gate has no evidence.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_conditioning_option
@_backend_option
@_kv_store_option
def compose(repo, chunks, query, prefix, strategy, ratio, max_new_tokens, model, check,
            experimental, as_json, conditioning, engine, store):
    """Answer QUERY over cached chunks composed in the given order."""
    with _composer(repo, store, model, experimental, engine) as (_, composer):
        try:
            result = composer.compose(list(chunks), query, prefix=prefix, strategy=strategy,
                                      ratio=ratio, max_new_tokens=max_new_tokens,
                                      conditioning=conditioning)
        except (KeyError, ValueError) as error:
            raise click.ClickException(_message(error)) from error
        answer = result.generate(max_new_tokens)
        output = {"status": result.status, "answer": answer, "report": result.report.as_json()}
        if check:
            output["check"] = _check(composer, result, list(chunks), query, prefix)
    if result.report.store_error:
        click.echo(f"codekv: chunk KV store not used: {result.report.store_error}", err=True)
    if composer.gate.error and not experimental:
        click.echo(f"codekv: {composer.gate.error} (requests fall back to full prefill)",
                   err=True)
    if as_json:
        click.echo(json.dumps(_finite(output), allow_nan=False))
        return
    console.print(f"[bold]status[/bold]: {output['status']}")
    console.print(f"[bold]answer[/bold]: {answer}")
    table = Table(show_header=False)
    for key, value in output["report"].items():
        table.add_row(key, "-" if value is None else str(value))
    for key, value in output.get("check", {}).items():
        table.add_row(f"check.{key}", str(value))
    console.print(table)


def _message(error: Exception) -> str:
    """An error's message as written: ``str`` of a KeyError quotes it, nothing else is cut."""
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    return str(error)


def _check(composer, result, chunks, query, prefix) -> dict:
    """Full prefill of the same tokens: KL, max logit difference, top-1 agreement, speedup.

    On an engine whose numerics depend on the batch shape (llama.cpp), also its noise floor:
    the KL of the same tokens decoded in the composed request's batches without composition;
    ``within_floor`` says whether composition stayed within it.
    """
    from codekv.divergence import logits_kl

    full = composer.full_prefill(chunks, query, prefix=prefix)
    full_logits, composed_logits = full.next_token_logits(), result.next_token_logits()
    check = {
        "kl": logits_kl(full_logits, composed_logits),
        "max_logit_diff": float((full_logits - composed_logits).abs().max()),
        "top1_agree": bool(full_logits.argmax() == composed_logits.argmax()),
        "full_prefill_s": full.report.ttft_s,
        "speedup": full.report.ttft_s / result.report.ttft_s if result.report.ttft_s else None,
    }
    same_batches = (composer.backend.batch_floor(result.state)
                    if result.status != "full-prefill" else None)
    if same_batches is not None:
        check["batch_floor_kl"] = logits_kl(full_logits, same_batches.logits)
        check["within_floor"] = check["kl"] <= check["batch_floor_kl"] + FLOOR_SLACK
    return check


# KL allowed above the measured batch floor: the composed cells sit elsewhere in llama.cpp's
# cache than the same-batch decode's, which changes summation order, nothing else.
FLOOR_SLACK = 1e-4


@main.command()
@click.argument("repo", required=False, default=".")
@click.option("--model", default=None,
              help="A GGUF file, a local HF model directory, or a named model: smollm2 "
                   "(the default) or gemma3.")
@click.option("--limit", type=int, default=None, help="At most this many chunks.")
@click.option("--prefix", default=None,
              help="The system prompt requests will put before the chunks (their KV is "
                   "computed after it).")
@_conditioning_option
@_backend_option
@_kv_store_option
def prefill(repo, model, limit, prefix, conditioning, engine, store):
    """Fill the chunk KV store for a repository's chunks."""
    from rich.progress import Progress

    from codekv.compose import ChunkTooLongError

    with _composer(repo, store, model, experimental=True, engine=engine) as (idx, composer):
        chunks = idx.chunks()[:limit] if limit else idx.chunks()
        computed = cached = too_long = 0
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("Prefilling chunks", total=len(chunks))
            for chunk in chunks:
                try:
                    made, had = composer.prefill([chunk], prefix, conditioning)
                except ChunkTooLongError:  # no request could use its KV
                    too_long += 1
                    made = had = 0
                except ValueError as error:
                    raise click.ClickException(f"{chunk.path}: {error}") from error
                computed, cached = computed + made, cached + had
                progress.advance(task)
    if composer.store.error:
        click.echo(f"codekv: chunk KV store not used: {composer.store.error}", err=True)
    stats = composer.store.stats(composer.scope)
    refused = f", {too_long} longer than the model's positions" if too_long else ""
    console.print(f"computed {computed}, already cached {cached}{refused}; store "
                  f"{composer.store.location}: {stats.entries} entries, "
                  f"{stats.bytes / 1e6:.1f} MB in this scope", highlight=False)


@main.command()
@click.option("--file", "path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="One support file alone [$CODEKV_SUPPORT, else the one shipped with codekv; "
                   "each with the user file that codekv qualify writes in the codekv home].")
@click.option("--json", "as_json", is_flag=True, help="Print the pairs as one JSON object.")
def support(path, as_json):
    """Where composition runs: each evaluated (engine, family, workload) pair, its verdict and
    rule, the evidence and held-out runs behind it, and the file it is in (the user file's
    entries win for the models they were measured on)."""
    from codekv.eval.report import ci
    from codekv.gate import SupportGate

    gate = SupportGate.load(path)
    if gate.error:
        raise click.ClickException(gate.error)
    pairs = gate.pairs()
    if as_json:
        click.echo(json.dumps(_finite({"source": gate.source, "pairs": pairs}), allow_nan=False))
        return
    table = Table(title=f"support gate ({escape(gate.source)})")
    for name in ("pair", "file", "requests", "rule", "design", "model", "languages",
                 "contexts", "ΔNLL evidence", "ΔNLL held out"):
        table.add_column(name, no_wrap=True)
    for pair in pairs:
        held_out = pair["held_out"] or {"measured": {}}
        table.add_row(escape(pair["pair"]), _file_shown(pair),
                      _requests_shown(pair),
                      _rule_shown(pair), _design_shown(pair), *_covers_shown(pair["covers"]),
                      *(ci(m.get("delta_nll"), m.get("delta_nll_ci"), "+.3f")
                        if not pair["problems"] else "-"
                        for m in (pair["evidence"]["measured"], held_out["measured"])))
    from rich.measure import Measurement

    # The table needs its room whole, even in a pipe or a narrow terminal: never cut a cell.
    needed = Measurement.get(console, console.options.update_width(10_000), table).maximum
    wide = Console(width=max(needed, console.width))
    wide.print(table)
    for pair in pairs:
        wide.print(f"{pair['pair']}: {pair['reason']}", highlight=False, markup=False)
        covers = pair["covers"]
        if covers:
            models = ", ".join(f"{m['name'] or 'unnamed'} (fingerprint {m['fingerprint']})"
                               for m in covers["models"])
            languages = covers.get("languages")
            wide.print(f"  covers {models}" + (f"; {', '.join(languages)} code"
                                                 if languages else ""),
                       highlight=False, markup=False)
    wide.print("Pairs not listed have no evidence: their requests fall back to full prefill. An "
               "entry licenses only the models, code languages and context lengths it covers.")


def _file_shown(pair: dict) -> str:
    """Which file an entry is in: the user's, the shipped one, or the named file's name (the
    table's title names it whole)."""
    from codekv.gate import SHIPPED

    if pair["user_file"]:
        return "user"
    return "shipped" if pair["file"] == SHIPPED else escape(Path(pair["file"]).name)


def _requests_shown(pair: dict) -> str:
    if pair["supported"]:
        return "[green]composed[/green]"
    if pair["reason"].startswith("superseded"):  # the user file's entry rules its model
        return "[yellow]by the user file[/yellow]"
    return "[red]full prefill[/red]"


def _covers_shown(covers: dict | None) -> tuple[str, str, str]:
    """The model, languages and context range an entry covers, as table cells."""
    if covers is None:
        return "[red]not said[/red]", "-", "-"
    names = [m["name"].split(" (")[0] if m["name"] else m["fingerprint"][:12]
             for m in covers["models"]]
    languages = covers["languages"]
    low, high = covers["context_tokens"]["min"], covers["context_tokens"]["max"]
    return (escape(", ".join(names)) or "none",
            "-" if languages is None else escape(", ".join(languages)) or "none",
            f"{low:,}-{high:,}" if low is not None else f"up to {high:,}")


def _rule_shown(pair: dict) -> str:
    if pair["problems"]:
        return "[red]invalid entry[/red]"
    if pair["method"] and (pair["held_out"] or {}).get("passed") is False:
        return f"{escape(pair['method'])}, [red]failed held out[/red]"
    return escape(pair["method"] or (f"closest {pair['closest']}" if pair["closest"] else "-"))


def _design_shown(pair: dict) -> str:
    """The gate design an entry was judged under: one of an earlier design licenses nothing."""
    from codekv.support_schema import DESIGN

    if pair["problems"]:
        return "-"
    design = pair["design"]
    return escape(design) if design == DESIGN else f"[red]{escape(design)}[/red]"


def _register_eval() -> None:
    """``codekv eval`` lives in codekv.eval.command (it imports torch only when run)."""
    from codekv.eval.command import eval_command

    main.add_command(eval_command)


def _register_qualify() -> None:
    """``codekv qualify`` lives in codekv.eval.qualify_command (torch loads only when run)."""
    from codekv.eval.qualify_command import qualify_command

    main.add_command(qualify_command)


def _register_serve() -> None:
    """``codekv serve`` lives in codekv.serve.command (its server stack loads when run)."""
    from codekv.serve.command import serve_command

    main.add_command(serve_command)


_register_eval()
_register_qualify()
_register_serve()
