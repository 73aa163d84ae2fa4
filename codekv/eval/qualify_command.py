"""``codekv qualify``: the click command (registered in ``codekv.cli``), its progress bar with
the time left, and its summary; torch loads only when run (``codekv.eval.qualify`` runs it)."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from codekv.backends.engines import ENGINES, TRANSFORMERS
from codekv.eval.preflight import MIN_CONTEXT_TOKENS
from codekv.grammars import LANGUAGES
from codekv.schema import WORKLOADS
from codekv.support_schema import MIN_TASKS, RUN_TASKS

CHECKPOINTED = "(from the checkpoint)"  # how the runner names a task read back from one


class Estimate:
    """The time a run has left, from the requests this session measured: tasks read back
    from a checkpoint took no time, so they are left out of the rate."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.seconds = 0.0
        self.requests = 0
        self.last: float | None = None

    def step(self, text: str, advance: int) -> None:
        now = self.clock()
        if text == "Evaluating":  # a run starts measuring: what came before is not its cost
            self.last = now
            return
        if self.last is not None and advance and not text.endswith(CHECKPOINTED):
            self.seconds += now - self.last
            self.requests += advance
        self.last = now

    def left(self, requests: int) -> float | None:
        """Seconds for ``requests`` more; None before any was measured."""
        return self.seconds / self.requests * requests if self.requests else None


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "estimating"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes = round(seconds / 60)
    return f"{minutes}m" if minutes < 90 else f"{minutes // 60}h{minutes % 60:02d}m"


class Display:
    """The progress bar (a log line per task when stderr is not a terminal), with the time
    left: this run's requests, plus at most every grid rule on the held-out tasks."""

    def __init__(self, held_out_requests: int):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.estimate = Estimate()
        self.held_out_requests = held_out_requests  # an upper bound until the evidence ends
        self.announced = False
        self.progress = Progress(
            SpinnerColumn(), "[progress.description]{task.description}", BarColumn(),
            MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[left]}"),
            console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())
        self.bar = self.progress.add_task("Starting", total=None, left="")

    def __enter__(self) -> Display:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def status(self, text: str) -> None:
        self.progress.update(self.bar, description=text)
        if self.progress.disable:
            click.echo(f"{text}...", err=True)

    def step(self, phase: str, text: str, advance: int, total: int | None) -> None:
        self.estimate.step(text, advance)
        task = self.progress.tasks[0]
        if text == "Evaluating":  # a new run: its own bar
            self.progress.reset(self.bar, total=total)
        completed = task.completed + advance
        later = self.held_out_requests if phase == "evidence" else 0
        this = self.estimate.left(max(0, (total or 0) - completed))
        left = (f"{duration(this)} left" + (f" (+ up to {duration(self.estimate.left(later))}"
                                            " held out)" if later and this is not None else ""))
        self.progress.update(self.bar, description=f"{phase}: {text}", advance=advance,
                             total=total, left=left)
        finished = advance == 0 and " done in " in text
        if finished and not self.announced and this is not None:
            self.announced = True  # the up-front estimate, from the first measured task
            first = text.rsplit(" done in ", 1)[1]
            more = (f", then up to {duration(self.estimate.left(later))} for the held-out run "
                    "(it runs only the rules that pass)" if later else "")
            self.say(f"Estimate from the first task measured ({first}): about {duration(this)} "
                     f"for the {phase} run's {(total or 0) - completed} requests left{more}")
        elif finished and self.progress.disable:
            self.say(f"[{completed}/{total} requests] {phase}: {text}; {left}")

    def say(self, line: str) -> None:
        if self.progress.disable:
            click.echo(line, err=True)
        else:
            self.progress.console.print(line, highlight=False, markup=False)


def qualify_argv(options) -> str:
    """The command line that runs ``options`` again (and continues it where it stopped)."""
    from codekv.eval.support import Thresholds

    parts = ["codekv", "qualify"]
    if options.model:
        parts += ["--model", shlex.quote(options.model)]
    if options.engine != TRANSFORMERS:
        parts += ["--backend", options.engine]
    for option, values in (("--repo", options.repos), ("--held-out-repo", options.held_out_repos),
                           ("--held-out-path", options.held_out_paths)):
        for value in values:
            parts += [option, shlex.quote(value)]
    for workload in options.workloads:
        parts += ["--workload", workload]
    for language in options.languages or ():
        parts += ["--language", language]
    parts += ["--tasks", str(options.tasks), "--context-tokens", str(options.context_tokens)]
    if options.strategies:
        parts += ["--strategies", ",".join(options.strategies)]
    if options.seed:
        parts += ["--seed", str(options.seed)]
    if options.thresholds.min_tasks != Thresholds().min_tasks:
        parts += ["--min-tasks", str(options.thresholds.min_tasks)]
    return " ".join(parts)


@click.command("qualify")
@click.option("--model", default=None,
              help="Your model: a GGUF file or a Hugging Face directory [the default model].")
@click.option("--backend", "engine", default=TRANSFORMERS, show_default=True,
              type=click.Choice(ENGINES), help="Engine to qualify the model on (its entries "
                                               "license that engine only).")
@click.option("--repo", "repos", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="A git repository to draw evidence tasks from, repeatable.")
@click.option("--held-out-repo", "held_out_repos", multiple=True,
              type=click.Path(exists=True, file_okay=False),
              help="A git repository to draw held-out tasks from, repeatable [none: the files "
                   "of each --repo are split in two, see --held-out-path].")
@click.option("--held-out-path", "held_out_paths", multiple=True,
              help="Files of the --repo repositories held out from the evidence: a glob, a "
                   "directory or a file, repeatable [half of the files, by a hash of each "
                   "path].")
@click.option("--workload", "workloads", multiple=True, type=click.Choice(WORKLOADS),
              help="Workloads to qualify [code-qa].")
@click.option("--language", "languages", multiple=True, type=click.Choice(sorted(LANGUAGES)),
              help="Draw code-qa tasks from this language's code only, repeatable; the entry "
                   "covers these languages [every language the repositories have].")
@click.option("--tasks", type=click.IntRange(min=1), default=RUN_TASKS, show_default=True,
              help="Tasks per workload, in the evidence run and in the held-out run each.")
@click.option("--context-tokens", type=click.IntRange(min=MIN_CONTEXT_TOKENS), default=2048,
              show_default=True,
              help="Longest context; a task's is 1/2 to all of it (what the entry covers).")
@click.option("--strategies", default=None,
              help="The rule grid, comma-separated, NAME@RATIO [the rules that passed the "
                   "shipped evidence, or came closest, plus none and boundary@0.15].")
@click.option("--seed", type=int, default=0, show_default=True,
              help="The evidence's seed; the held-out run draws with the next one.")
@click.option("--min-tasks", type=click.IntRange(min=1), default=MIN_TASKS, show_default=True,
              help=f"Fewer tasks than this are not evidence. Below {MIN_TASKS} the run is a "
                   "trial: its entries say so and license nothing.")
def qualify_command(model, engine, repos, held_out_repos, held_out_paths, workloads, languages,
                    tasks, context_tokens, strategies, seed, min_tasks):
    """Qualify your model on your repositories: evidence tasks, the rule grid, the held-out
    confirmation, and an entry in your support file that the gate reads (resumable: run the
    same command again to continue)."""
    from codekv.eval import qualify
    from codekv.eval.command import _strategies
    from codekv.eval.preflight import EvalOptionError, check_positions, declared_positions
    from codekv.eval.runner import UnkeptChunks
    from codekv.eval.support import Thresholds
    from codekv.models import ModelLoadError

    options = qualify.QualifyOptions(
        repos=tuple(str(Path(r).resolve()) for r in repos),
        held_out_repos=tuple(str(Path(r).resolve()) for r in held_out_repos),
        held_out_paths=tuple(held_out_paths), model=model, engine=engine,
        workloads=tuple(workloads) or ("code-qa",), languages=tuple(languages) or None,
        tasks=tasks,
        context_tokens=context_tokens, strategies=_strategies(strategies), seed=seed,
        thresholds=Thresholds(min_tasks=min_tasks))
    grid = options.strategies or qualify.default_grid(options.workloads)
    held_out_requests = tasks * len(options.workloads) * qualify.methods_count(grid)
    console = Console(width=max(120, Console().width))
    console.print(f"Qualifying {escape(model or 'the default model')} on {engine}: "
                  f"{', '.join(options.workloads)}, {tasks} evidence and {tasks} held-out tasks "
                  f"each, contexts up to {context_tokens:,} tokens; rules {', '.join(grid)}: up "
                  f"to {2 * held_out_requests:,} requests (the held-out run runs only the rules "
                  "that pass); the time they take is estimated after the first task",
                  highlight=False)
    try:
        check_positions(qualify.eval_config(options, (), seed, grid, None),
                        declared_positions(model))
        with Display(held_out_requests) as display:
            outcome = qualify.run(options, qualify_argv(options), status=display.status,
                                  progress=display.step, warn=display.say)
    except (qualify.QualifyError, ModelLoadError, EvalOptionError, UnkeptChunks) as error:
        raise click.ClickException(str(error)) from error
    print_summary(console, outcome)


def print_summary(console: Console, outcome) -> None:
    """Per workload: each rule on the evidence and held-out tasks (intervals), what passed,
    what the entry covers, and what the gate now does with this model's requests."""
    from codekv.eval.report import ci
    from codekv.gate import Coverage, GateRequest, SupportGate, read_entry

    gate = SupportGate.load()
    for entry in map(read_entry, outcome.entries):  # as installed: the writer's, valid
        table = Table(title=f"{entry.name}: each rule's 95% intervals over the tasks")
        for name in ("run", "rule", "tasks", "ΔNLL", "score drop", "decisive agr.", "speedup",
                     "meets the thresholds"):
            table.add_column(name)
        held_out = entry.held_out
        for run, block in (("evidence", entry), ("held out", held_out)):
            for candidate in (block.candidates or ()) if block else ():
                m = candidate.measured
                table.add_row(run, escape(candidate.method), str(m["tasks"]),
                              ci(m["delta_nll"], m["delta_nll_ci"], "+.3f"),
                              ci(m["score_drop"], m["score_drop_ci"], "+.2f"),
                              "-" if m["decisive_agreement"] is None
                              else f"{m['decisive_agreement']:.3f}",
                              "-" if m["speedup"] is None else f"{m['speedup']:.2f}x",
                              "[green]yes[/green]" if candidate.passed else
                              escape("no: " + "; ".join(candidate.failures)))
        console.print(table)
        say = lambda line: console.print(line, highlight=False, markup=False)  # noqa: E731
        passed = [c.method for c in entry.candidates or () if c.passed]
        say(f"evidence (held-out tasks from {outcome.sides.how}): "
            + (f"{', '.join(passed)} met every threshold" if passed
               else "no rule met every threshold"))
        if held_out is not None and held_out.passed is not None:
            say("held out: " + (f"confirmed with {held_out.method}" if held_out.passed
                                else f"not confirmed (closest {held_out.closest})"))
        else:
            say("held out: not run (no rule passed the evidence)")
        covers = Coverage.of_entry(entry)
        if covers is None:  # no composed task: nothing was measured
            say("the entry covers nothing: no task was composed")
            continue
        low, high = covers.min_tokens, covers.max_tokens
        say("the entry covers: " + ", ".join(f"{name or 'unnamed'} (fingerprint {fp[:12]})"
                                             for fp, name in covers.models.items())
            + (f"; {', '.join(sorted(covers.languages))} code" if covers.languages else "")
            + f"; contexts {'' if low is None else f'{low:,}-'}{high:,} tokens")
        if outcome.trial:
            say("TRIAL RUN, NOT EVIDENCE (" + "; ".join(outcome.trial) + "): the entry "
                "licenses nothing")
        asked = GateRequest(outcome.model["fingerprint"], covers.languages or frozenset(),
                            high)
        verdict = gate.verdict(entry.family, entry.workload, entry.engine, asked)
        say("the gate now: " + (f"composes these requests with {verdict.strategy}"
                                + (f"@{verdict.ratio:g}" if verdict.ratio else "")
                                if verdict.allowed else f"falls back to full prefill "
                                f"({verdict.reason})"))
    for note in outcome.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    console.print(f"written to the user support file {outcome.user_file} (`codekv support` "
                  f"lists it); checkpoints in {outcome.workdir}", highlight=False)
