"""``codekv eval``: the click command (registered in ``codekv.cli``); torch loads only when run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click
from rich.console import Console

from codekv.backends.engines import ENGINES, TRANSFORMERS
from codekv.cli_types import StoreParam
from codekv.conditioning import CONDITIONINGS, DEFAULT_CONDITIONING
from codekv.eval.methods import (
    EVAL_STRATEGIES,
    PARTIAL_STRATEGIES,
    PEERS,
    PRUNING_RULES,
    SHIFT_ONLY,
    composition_methods,
)
from codekv.eval.preflight import MIN_CONTEXT_TOKENS
from codekv.grammars import LANGUAGES
from codekv.schema import OTHER_REPOS, WORKLOADS, default_workloads
from codekv.support_schema import MIN_TASKS


def _shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    k, _, n = text.partition("/")
    if not (f"{k}{n}".isascii() and k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise click.BadParameter(f"expected K/N with 0 <= K < N, as in 0/2, not {text!r}",
                                 param_hint="--shard")
    return int(k), int(n)


def _floats(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError as error:
        raise click.BadParameter(f"not a comma-separated list of numbers: {text}") from error
    if not values or any(not 0 <= v <= 1 for v in values):
        raise click.BadParameter("ratios must be between 0 and 1")
    return values


def _names(text: str | None, choices=EVAL_STRATEGIES,
           what="strategies") -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        raise click.BadParameter(f"unknown {what} {unknown}; choose from " + ", ".join(choices))
    return names


def _strategies(text: str | None) -> tuple[str, ...] | None:
    """Strategy names, each optionally ``NAME@RATIO`` (that ratio instead of ``--ratios``)."""
    if text is None:
        return None
    entries = tuple(v.strip() for v in text.split(",") if v.strip())
    _names(",".join(entry.partition("@")[0] for entry in entries))
    for entry in entries:
        _, at, ratio = entry.partition("@")
        if at and not _floats(ratio)[0] > 0:  # _floats checks it is a number from 0 to 1
            raise click.BadParameter(f"{entry}: a fixed ratio must be above 0")
    return entries


def _pruning(text: str | None) -> tuple[str, ...] | None:
    if text is not None and text.strip() == "none":
        return ()
    return _names(text, PRUNING_RULES, "pruning methods")


def _peers(text: str | None) -> tuple[str, ...] | None:
    if text is not None and text.strip() == "none":
        return ()
    return _names(text, PEERS, "peer methods")


def _budgets(text: str | None) -> tuple[float, ...] | None:
    values = _floats(text)
    if values is not None and 0 in values:
        raise click.BadParameter("a KV budget must keep something (0 < budget <= 1)")
    return values


def canonical_command(config) -> str:
    """The command that reproduces ``config`` (recorded in the support file)."""
    parts = ["codekv", "eval"]
    if config.quick:
        parts.append("--quick")
    from codekv.eval.harness import AGENT_PROMPT, QUICK_REPOS, REPOS

    if tuple(config.repos) != (QUICK_REPOS if config.quick else REPOS):
        for repo in config.repos:
            parts += ["--repo", shlex.quote(repo)]
    for language in config.languages or ():
        parts += ["--language", language]
    if config.prefix != AGENT_PROMPT:
        parts += ["--prefix", shlex.quote(config.prefix) if config.prefix else "none"]
    for workload in config.workloads:
        if tuple(config.workloads) != default_workloads():
            parts += ["--workload", workload]
    parts += ["--tasks", str(config.tasks), "--seed", str(config.seed),
              "--context-tokens", str(config.context_tokens)]
    if composition_methods(config.strategies, config.ratios) != composition_methods(
        config.strategies, ()
    ):  # not when every strategy names its ratio or has none
        parts += ["--ratios", ",".join(f"{r:g}" for r in config.ratios)]
    parts += ["--strategies", ",".join(config.strategies)]
    if tuple(config.conditioning) != (DEFAULT_CONDITIONING,):
        parts += ["--conditioning", ",".join(config.conditioning)]
    parts += ["--pruning", ",".join(config.pruning) or "none"]
    if config.pruning:
        parts += ["--budgets", ",".join(f"{b:g}" for b in config.budgets),
                  "--pruning-tasks", str(config.pruning_tasks)]
    parts += ["--peers", ",".join(config.peers) or "none"]
    if config.peers:
        parts += ["--peer-tasks", str(config.peer_tasks)]
    parts += ["--throughput-tasks", str(config.throughput_tasks),
              "--reuse-tasks", str(config.reuse_tasks)]
    parts += ["--min-tasks", str(config.thresholds.min_tasks)]
    if not config.reorder:
        parts.append("--no-reorder")
    if config.shard:
        parts += ["--shard", "/".join(map(str, config.shard))]
    if config.model:
        parts += ["--model", str(config.model)]
    if config.backend != TRANSFORMERS:
        parts += ["--backend", config.backend]
    return " ".join(parts)


@click.command("eval")
@click.option("--repo", "repos", multiple=True,
              help="Repository for code-qa, repeatable; its tasks are split evenly: a path, "
                   "'stdlib', 'stdlib-quick', 'package:NAME' (an installed package's source), "
                   "'deb:PACKAGE' (an installed Debian package's sources) or "
                   "'npm:NAME@VERSION' (an npm package's, fetched with npm pack) "
                   "[stdlib and package:rich; --quick: stdlib-quick].")
@click.option("--language", "languages", multiple=True, type=click.Choice(sorted(LANGUAGES)),
              help="Draw code-qa tasks from this language's code only, repeatable [every "
                   "language the repositories have].")
@click.option("--prefix", default=None,
              help="System prompt before the chunks, or 'none' for requests without one "
                   "[a one-sentence agent prompt].")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path),
              help="Keep each finished task's measures in this file and skip the tasks already "
                   "in it: an interrupted run resumes, with a larger --tasks too (a task is "
                   "reused only if its content is the same). A file that is not such a "
                   "checkpoint is refused and left as it is.")
@click.option("--workload", "workloads", multiple=True, type=click.Choice(WORKLOADS),
              help="Workloads to run (default: all but the agent-session ones, whose tasks "
                   "need 4K tokens or more).")
@click.option("--tasks", type=click.IntRange(min=1), default=None,
              help="Tasks per workload [12; --quick 2].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--ratios", default=None,
              help="Recompute ratios, comma-separated [0,0.05,0.1,0.15,0.25; --quick 0.15].")
@click.option("--strategies", default=None,
              help="Strategies, comma-separated; NAME@RATIO runs one at that ratio only ["
                   + ",".join(PARTIAL_STRATEGIES) + "; also " + SHIFT_ONLY + ": the chunks "
                   "in the previous request's order, nothing recomputed].")
@click.option("--conditioning", default=None,
              help="What chunk KV is computed after, comma-separated; each crosses every "
                   "strategy [" + DEFAULT_CONDITIONING + "; choose from "
                   + ",".join(CONDITIONINGS) + "].")
@click.option("--pruning", default=None,
              help="KV pruning baselines (kvpress), comma-separated, or 'none' ["
                   + ",".join(PRUNING_RULES) + "].")
@click.option("--budgets", default=None,
              help="KV budgets for pruning: the share of context KV kept [0.25,0.5; --quick 0.5].")
@click.option("--pruning-tasks", type=click.IntRange(min=0), default=None,
              help="Run pruning on the first N tasks of each workload (each costs a context "
                   "prefill) [4; --quick 2].")
@click.option("--peers", default=None,
              help="The peer library's variants (kvboost), comma-separated, or 'none' ["
                   + ",".join(PEERS) + "].")
@click.option("--peer-tasks", type=click.IntRange(min=0), default=None,
              help="Run the peer library on the first N tasks of each workload [4; --quick 1].")
@click.option("--throughput-tasks", type=click.IntRange(min=0), default=None,
              help="Requests of the agent session served per method for throughput "
                   "[12; --quick 3; 0 skips it].")
@click.option("--context-tokens", type=click.IntRange(min=MIN_CONTEXT_TOKENS), default=None,
              help="Longest context; a task's is 1/2 to all of it [2048; --quick 512].")
@click.option("--model", default=None,
              help="A GGUF file, a local HF model directory, or a named model: smollm2 "
                   "(the default) or gemma3.")
@click.option("--backend", "engine", default=TRANSFORMERS, show_default=True,
              type=click.Choice(ENGINES),
              help="Engine to evaluate (its gate entries license that engine only).")
@click.option("--quick", is_flag=True, help="Few tasks, one ratio, short contexts (minutes).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write results, gate verdicts, tasks and per-task measures as JSON.")
@click.option("--write-gate", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the support file (the gate reads it via $CODEKV_SUPPORT or the "
                   "shipped codekv/data/support.json).")
@click.option("--confirm-gate", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Judge this support file's passing entries again on this run's tasks, which "
                   "must be held out from their evidence (other --repo for code-qa, another "
                   "--seed elsewhere); only a confirmed entry licenses composition.")
@click.option("--plots", type=click.Path(file_okay=False, path_type=Path),
              help="Write PNG plots here (needs matplotlib: the 'eval' extra).")
@click.option("--min-tasks", type=int, default=MIN_TASKS, show_default=True,
              help="Fewer tasks than this are not evidence for the gate.")
@click.option("--no-reorder", is_flag=True,
              help="Skip the full-reordered reference (full prefill of the chunks in another "
                   "order).")
@click.option("--reuse-tasks", type=click.IntRange(min=0), default=None,
              help="Tasks per simulated agent session for the prefix-vs-composition reuse "
                   "estimate [20; --quick 8; 0 skips it].")
@click.option("--shard", type=str, default=None, metavar="K/N",
              help="Measure only every N-th task from the K-th (0-based), so N processes share "
                   "one run, each with its own --checkpoint; join their checkpoints with "
                   "'python -m codekv.eval.checkpoint merge' and run without --shard for the "
                   "verdict.")
@click.option("--store", type=StoreParam(shared=True), default=None,
              help="Chunk KV store to use: a directory, or redis://[user:password@]host:port/db "
                   "or rediss://... (default: a temporary one, bounded by "
                   "$CODEKV_KV_MAX_BYTES, removed afterwards).")
def eval_command(repos, languages, prefix, checkpoint, workloads, tasks, seed, ratios, strategies,
                 conditioning, pruning,
                 budgets, pruning_tasks, peers, peer_tasks, throughput_tasks, context_tokens,
                 model, engine, quick, json_path, write_gate, confirm_gate, plots, min_tasks,
                 no_reorder, reuse_tasks, shard, store):
    """Measure composition (and KV pruning baselines) against full prefill on generated
    workloads; write the gate file."""
    from codekv.eval import checkpoint as checkpoints
    from codekv.eval import report
    from codekv.eval.harness import EvalConfig, evaluate
    from codekv.eval.preflight import EvalOptionError, check_positions, declared_positions
    from codekv.eval.runner import UnkeptChunks
    from codekv.eval.support import (
        SupportFileError,
        Thresholds,
        read_support_document,
        write_json,
    )
    from codekv.models import ModelLoadError
    from codekv.stores import StoreSpecError

    if prefix is not None and prefix.strip() == "none":
        prefix = ""  # no system prompt (None would mean the default one)
    options = dict(repos=tuple(repos) or None, languages=tuple(languages) or None, prefix=prefix,
                   workloads=tuple(workloads) or None, tasks=tasks, seed=seed,
                   ratios=_floats(ratios), strategies=_strategies(strategies),
                   conditioning=_names(conditioning, CONDITIONINGS, "conditionings"),
                   pruning=_pruning(pruning), budgets=_budgets(budgets),
                   pruning_tasks=pruning_tasks, peers=_peers(peers), peer_tasks=peer_tasks,
                   throughput_tasks=throughput_tasks,
                   context_tokens=context_tokens, model=model, backend=engine,
                   reuse_tasks=reuse_tasks,
                   store=str(store) if store else None, reorder=False if no_reorder else None,
                   checkpoint=str(checkpoint) if checkpoint else None,
                   thresholds=Thresholds(min_tasks=min_tasks), shard=_shard(shard))
    if quick:
        config = EvalConfig.quick_config(**options)
    else:
        config = EvalConfig(**{k: v for k, v in options.items() if v is not None})
    console = Console(width=max(140, Console().width))  # the table needs room, even in a pipe
    if write_gate and confirm_gate:
        raise click.UsageError("--write-gate records evidence and --confirm-gate checks it on "
                               "held-out tasks: one run does one of them")
    if shard and (write_gate or confirm_gate):
        raise click.UsageError("a --shard measures part of a run, and a verdict needs all of "
                               "it: merge the shards' checkpoints and run without --shard")
    try:
        # Before the model loads: what would fail after minutes, or measure nothing.
        check_positions(config, declared_positions(config.model))
        if checkpoint:  # one it could not resume from
            checkpoints.verify(checkpoint, checkpoints.config_key(config.as_json()))
        if write_gate:
            read_support_document(write_gate)  # a file it would not replace: refuse now
        if confirm_gate:
            check_held_out(read_support_document(confirm_gate, "--confirm-gate"), config)
        result = _run_with_progress(config, evaluate)
    except (ModelLoadError, StoreSpecError, checkpoints.CheckpointError, SupportFileError,
            EvalOptionError, UnkeptChunks) as error:
        raise click.ClickException(str(error)) from error
    notes = list(result.notes)
    stamp_covers(result)
    if plots:
        made = report.plot(result.rows, result.measures, plots)
        if isinstance(made, str):
            notes.append(made)
        else:
            notes.extend(f"plot written: {path}" for path in made)
    command = canonical_command(config)
    if json_path:
        data = result.as_json()
        data["command"] = command
        write_json(json_path, data)
    try:
        if write_gate:
            notes.append(record_gate(write_gate, result, config, command))
        if confirm_gate:
            notes.extend(confirm(confirm_gate, result, config, command))
    except SupportFileError as error:
        raise click.ClickException(str(error)) from error
    report.print_report(console, result.rows, result.gate, result.reuse, notes,
                        result.throughput, result.comparisons)
    console.print(f"{len(result.tasks)} tasks in {result.seconds:.0f}s; reproduce with: {command}")


def stamp_covers(result) -> None:
    """Record on each of ``result``'s verdicts what it was measured on: all the gate licenses."""
    from codekv.eval.support import coverage

    covers = coverage(result.measures, result.tasks, result.model)
    for entry in result.gate:
        entry["covers"] = covers.get(entry["workload"])


def record_gate(path: Path, result, config, command: str) -> str:
    """Write ``result``'s verdicts (``stamp_covers`` first) as the support file at ``path``,
    keeping the entries it did not measure again; the line to report. Raises
    ``SupportFileError`` for a file there that is not a support file (it is left as it is)."""
    from codekv.eval.support import read_support_document, support_document, write_json

    previous = read_support_document(path)
    document = support_document(result.gate, command, result.model,
                                {**config.as_json(), "seconds": round(result.seconds, 1),
                                 "resumed_tasks": result.resumed_tasks,
                                 "machine": result.machine}, previous)
    write_json(path, document)
    kept = len(document["entries"]) - len(result.gate)
    return (f"support file written: {path}"
            + (f" (kept {kept} entries of other workloads, engines or models from earlier "
               "runs)" if kept else ""))


def _run_with_progress(config, evaluate):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(SpinnerColumn(), "[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True,
                  disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task("Starting", total=None)

        def status(text):
            progress.update(task, description=text)
            if progress.disable:
                click.echo(f"{text}...", err=True)

        def advance(text, step, total):
            progress.update(task, description=text, advance=step, total=total)
            if progress.disable and step == 0 and " done in " in text:  # a log, not a bar
                done = int(progress.tasks[0].completed)
                click.echo(f"[{done}/{total} requests] {text}", err=True)

        def warn(text):
            progress.console.print(text, markup=False, highlight=False)

        return evaluate(config, status=status, progress=advance, warn=warn)


def _evidence_tasks(command_line: str) -> tuple[tuple[str, ...], int]:
    """The repositories and seed an evidence run drew its tasks from, read from its recorded
    command by this command's own parser."""
    from codekv.eval.harness import QUICK_REPOS, REPOS
    from codekv.eval.support import SupportFileError

    words = shlex.split(command_line)
    try:
        if words[:2] != ["codekv", "eval"]:
            raise click.UsageError("not a codekv eval command")
        params = eval_command.make_context("eval", words[2:]).params
    except click.UsageError as error:
        raise SupportFileError(f"cannot tell where the evidence of `{command_line}` was drawn: "
                               f"{error.message}") from error
    repos = params["repos"] or (QUICK_REPOS if params["quick"] else REPOS)
    return tuple(repos), params["seed"]


def check_held_out(document: dict | None, config) -> None:
    """Refuse, before any model loads, a confirmation that could not confirm anything: no
    passing entry for these workloads, none of its passing strategies in this run, or tasks
    drawn where its evidence was drawn."""
    from codekv.eval.support import SupportFileError, read_entries

    if document is None:
        raise SupportFileError("no support file to confirm")
    labels = {m.label for m in composition_methods(config.strategies, config.ratios,
                                                   config.conditioning)}
    entries = [e for e in read_entries(document) if e.workload in config.workloads
               and e.engine == config.backend and e.passed_methods()]
    if not entries:
        raise SupportFileError("nothing to confirm: no entry for " + ", ".join(config.workloads)
                               + f" on {config.backend} passed its evidence run")
    for entry in entries:
        workload, passed = entry.workload, entry.passed_methods()
        needed = (entry.thresholds or {}).get("min_tasks", 0)
        if config.tasks < needed:
            raise SupportFileError(f"{workload}: its thresholds need {needed} held-out tasks; "
                                   f"--tasks is {config.tasks}")
        if not labels & set(passed):
            raise SupportFileError(f"{workload}: none of --strategies passed its evidence run; "
                                   "candidates: " + ", ".join(passed))
        command_line = entry.generated_by or document.get("generated_by")
        if not command_line:
            raise SupportFileError(f"{workload}: the entry does not say which run measured it")
        repos, seed = _evidence_tasks(command_line)
        held_out_by = WORKLOADS[workload].held_out_by
        if held_out_by == OTHER_REPOS and set(repos) & set(config.repos):
            raise SupportFileError(
                f"{workload}: its evidence was drawn from {', '.join(sorted(set(repos)))}; "
                "held-out tasks come from other repositories (--repo)")
        if held_out_by != OTHER_REPOS and seed == config.seed:
            raise SupportFileError(f"{workload}: its evidence was drawn with seed {seed}; "
                                   "held-out tasks need another --seed")


def confirm(path: Path, result, config, command: str) -> list[str]:
    """Write the held-out verdicts into the support file at ``path``; the lines to report."""
    from codekv.eval.support import (
        confirm_entries,
        coverage,
        read_entries,
        read_support_document,
        write_json,
    )

    document = read_support_document(path, "--confirm-gate")  # as it is now, not before
    check_held_out(document, config)
    ours = result.model.get("fingerprint")
    theirs = {entry.model for entry in read_entries(document)
              if entry.engine == config.backend and entry.workload in config.workloads
              and entry.passed_methods()}
    if ours not in theirs:
        raise click.ClickException(
            f"{path}'s passing {config.backend} entries for {', '.join(config.workloads)} were "
            f"measured on another model ({', '.join(sorted(map(str, theirs)))}); this run's "
            f"is {ours}")
    run = {"command": command, "engine": config.backend, "seed": config.seed,
           "repos": list(config.repos) if any(WORKLOADS[w].needs_index for w in config.workloads)
           else None,
           "seconds": round(result.seconds, 1), "resumed_tasks": result.resumed_tasks,
           "machine": result.machine,
           "covers": coverage(result.measures, result.tasks, result.model)}
    lines = confirm_entries(document, result.rows, result.model["family"], run)
    write_json(path, document)
    return [f"support file {path}: {line}" for line in lines]
