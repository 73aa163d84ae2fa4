"""``codekv qualify``: gate evidence for a user's own model on their own repositories.

It runs what ``codekv eval --write-gate`` and ``--confirm-gate`` run for the shipped support
file, with their code: the rule grid on evidence tasks drawn from the named repositories, then
the rules that passed judged again on held-out tasks - from other repositories
(``--held-out-repo``), or from files of the same repositories that the evidence never drew
from - and writes the entries into the user support file in the codekv home
(``codekv.paths.user_support_file``), which the gate reads beside the shipped one; its entries
win for the model they were measured on.

Both runs keep each finished task in a checkpoint under ``<home>/qualify/<key>``, the key
being the model (its fingerprint), the repositories' contents and the settings but the task
count: the same command run again continues where it stopped, with a larger ``--tasks`` too
(where full prefill solves too few of the tasks, the run says so early). A run whose
thresholds are below the gate's (``--min-tasks`` under 100, to try the command quickly) is a
trial: its entries say so and license nothing.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from codekv import gitrepo, paths
from codekv.backends.engines import TRANSFORMERS
from codekv.eval.methods import PARTIAL_STRATEGIES, composition_methods, split_entry
from codekv.eval.support import Thresholds
from codekv.schema import WORKLOADS
from codekv.support_schema import RUN_TASKS

# Beside the rules that passed for the default model: the cheapest re-positioning rule and
# the one that recomputes nothing, so the grid always has a cheap candidate and a floor.
BASELINE_RULES = ("none", "boundary@0.15")
WORKDIR = "qualify"
HELD_OUT = "held-out"
EVIDENCE = "evidence"
EMPTY_BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's hash of an empty file


class QualifyError(ValueError):
    """What ``codekv qualify`` cannot run with; the message names it and what it expects."""


@dataclass(frozen=True)
class QualifyOptions:
    repos: tuple[str, ...]  # where evidence tasks come from (git repositories)
    held_out_repos: tuple[str, ...] = ()  # where held-out tasks come from; () splits ``repos``
    held_out_paths: tuple[str, ...] = ()  # the files of ``repos`` held out; () a hash split
    model: str | None = None  # a GGUF file or a Hugging Face directory; None: the default
    engine: str = TRANSFORMERS
    workloads: tuple[str, ...] = ("code-qa",)
    languages: tuple[str, ...] | None = None  # code-qa's languages; None: all the code has
    tasks: int = RUN_TASKS
    context_tokens: int = 2048
    strategies: tuple[str, ...] | None = None  # None: ``default_grid``
    seed: int = 0  # the evidence's; the held-out run's is the next one
    thresholds: Thresholds = field(default_factory=Thresholds)


def default_grid(workloads: tuple[str, ...]) -> tuple[str, ...]:
    """The rules that passed the shipped evidence for ``workloads``, or came closest where
    none passed (a rule that missed on one model may pass on another), plus
    ``BASELINE_RULES``."""
    from codekv.gate import read_entry

    shipped = json.loads(resources.files("codekv").joinpath("data", "support.json").read_text())
    entries = [read_entry(entry) for entry in shipped["entries"]]  # valid: tests check it
    best = [label for entry in entries if entry.workload in workloads
            for label in entry.passed_methods() or ([entry.closest] if entry.closest else [])
            if split_entry(label)[0] in PARTIAL_STRATEGIES]  # no conditioning suffix
    return tuple(dict.fromkeys((*BASELINE_RULES, *best)))


def laxer(thresholds: Thresholds) -> list[str]:
    """Which of ``thresholds`` are below the gate's (``Thresholds()``), in words: a run held to
    them is a trial, not evidence."""
    gate = Thresholds()
    out = []
    for name, value in asdict(thresholds).items():
        bound = getattr(gate, name)
        lower_is_laxer = name.startswith("min_")
        if (value < bound) if lower_is_laxer else (value > bound):
            option = "--min-tasks" if name == "min_tasks" else name
            out.append(f"{option} {value:g} is {'below' if lower_is_laxer else 'above'} the "
                       f"gate's {bound:g}")
    return out


# -- where the evidence and the held-out tasks come from -------------------------------------

@dataclass(frozen=True)
class Sides:
    """The repositories each run draws from (paths), where the held-out tasks come from (in
    words), and what they hold (each repository's path and a digest of its files: part of
    the checkpoints' key)."""

    evidence: tuple[str, ...]
    held_out: tuple[str, ...]
    how: str
    contents: dict = field(default_factory=dict)


def sides(options: QualifyOptions) -> Sides:
    """The evidence's and the held-out run's repositories. Without ``--held-out-repo``, each
    repository's code files are split in two (``--held-out-path`` patterns, else by a hash of
    each path) and each part committed to a repository of its own under the codekv home, so
    no held-out task, nor any chunk of its context, comes from a file the evidence drew on."""
    if not any(WORKLOADS[w].needs_index for w in options.workloads):
        return Sides((), (), "another seed")
    if not options.repos:
        raise QualifyError("name at least one repository to draw evidence tasks from (--repo)")
    evidence = {_root(path, "--repo"): path for path in options.repos}
    if options.held_out_repos:
        if options.held_out_paths:
            raise QualifyError("--held-out-path splits the --repo repositories; with "
                               "--held-out-repo the held-out tasks come from those instead: "
                               "give one of them")
        held_out = {_root(path, "--held-out-repo"): path for path in options.held_out_repos}
        shared = sorted(set(evidence) & set(held_out))
        if shared:
            raise QualifyError(f"{', '.join(shared)} is both a --repo and a --held-out-repo: "
                               "held-out tasks come from repositories the evidence did not "
                               "draw from")
        files = {root: _code_files(root) for root in (*evidence, *held_out)}
        seen = {f.blob_hash: f"{root}/{f.path}" for root in evidence for f in files[root]}
        copies = [f"{root}/{f.path} (as {seen[f.blob_hash]})" for root in held_out
                  for f in files[root] if f.blob_hash in seen and f.blob_hash != EMPTY_BLOB]
        if copies:
            raise QualifyError(f"the held-out repositories hold {len(copies)} code files the "
                               f"evidence repositories hold too, such as {copies[0]}: held-out "
                               "tasks come from code the evidence did not see (a fork or a "
                               "copy is the same code); name another --held-out-repo, or "
                               "--held-out-path to split one repository")
        contents = {root: _digest(found) for root, found in files.items()}
        return Sides(tuple(evidence), tuple(held_out), "other repositories", contents)
    evidence_parts, held_out_parts, contents = [], [], {}
    for root in evidence:
        files = _code_files(root)
        held = [f for f in files if _held_out(f.path, options.held_out_paths)]
        kept = [f for f in files if f not in held]
        if not held or not kept:
            side = "held-out" if not held else "evidence"
            how = ("--held-out-path " + " ".join(options.held_out_paths)
                   if options.held_out_paths else "the hash split")
            raise QualifyError(f"--repo {root}: {how} leaves no code file on the {side} side "
                               f"(of {len(files)}); name --held-out-path patterns that hold "
                               "some of its files but not all, or a --held-out-repo")
        evidence_parts.append(_part(root, kept, EVIDENCE))
        held_out_parts.append(_part(root, held, HELD_OUT))
        contents[root] = {"evidence": _digest(kept), "held_out": _digest(held)}
    how = ("the files matching " + ", ".join(options.held_out_paths) if options.held_out_paths
           else "half of the files, by a hash of each path")
    return Sides(tuple(evidence_parts), tuple(held_out_parts), how, contents)


def _root(path: str, option: str) -> str:
    try:
        repo = gitrepo.open_repository(path)
    except gitrepo.NotARepositoryError as error:
        raise QualifyError(f"{option} {path}: {error}; expected a git repository") from error
    return str(Path(repo.workdir).resolve())


def _code_files(root: str) -> list[gitrepo.SourceFile]:
    """The files codekv indexes in ``root`` that a grammar parses (HEAD and the working tree)."""
    return [f for f in gitrepo.scan(gitrepo.open_repository(root)).files if f.language != "text"]


def _held_out(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether a file is held out: it matches a pattern (a glob, or a directory or file path),
    else half of the paths by their hash."""
    if patterns:
        return any(fnmatch.fnmatchcase(path, pattern)
                   or path == pattern.rstrip("/") or path.startswith(pattern.rstrip("/") + "/")
                   for pattern in patterns)
    return hashlib.sha256(path.encode()).digest()[0] % 2 == 1


def _digest(files: list[gitrepo.SourceFile]) -> str:
    return hashlib.sha256("\n".join(f"{f.path} {f.blob_hash}"
                                    for f in files).encode()).hexdigest()[:16]


def _part(root: str, files: list[gitrepo.SourceFile], side: str) -> str:
    """``files`` of ``root`` committed to a repository of their own (made once per content)."""
    from codekv.stdlib_repo import committed_copy

    dest = (paths.private_dir(paths.home() / WORKDIR / "repos")
            / f"{Path(root).name}-{side}-{_digest(files)}")
    if (dest / ".git").is_dir():  # made by an earlier run: the name is its content's digest
        return str(dest)
    reader = gitrepo.BlobReader(root)
    return str(committed_copy(dest, {f.path: reader.read(f) for f in files},
                              f"{side} files of {root}"))


# -- the runs ----------------------------------------------------------------------------------

@dataclass
class Qualification:
    """What a run measured and wrote: the entries installed in the user file, each run's
    result (``held_out`` None when nothing passed the evidence), and where it all is."""

    entries: list[dict]
    evidence: object  # harness.EvalResult
    held_out: object | None
    user_file: Path
    workdir: Path
    sides: Sides
    trial: list[str]
    model: dict
    notes: list[str] = field(default_factory=list)


def run(options: QualifyOptions, command: str, backend=None,
        status: Callable[[str], None] | None = None,
        progress: Callable[[str, str, int, int | None], None] | None = None,
        warn: Callable[[str], None] | None = None) -> Qualification:
    """The evidence run, the held-out run of what passed, and the user file's new entries.

    ``command``: this qualify command line, recorded in the entries; ``status(text)`` for
    phases; ``progress(phase, text, advance, total)`` per measured request (``phase``:
    ``evidence`` or ``held-out``); ``warn(text)`` for what to act on during a run.
    """
    from codekv.eval import command as eval_command
    from codekv.eval.harness import count_tasks, evaluate
    from codekv.eval.support import SupportFileError, read_entries, read_support_document

    say = status or (lambda text: None)
    user_file = paths.user_support_file()
    _user_document(user_file)  # a file it would not replace: refuse before anything runs
    if options.tasks < options.thresholds.min_tasks:
        raise QualifyError(f"--tasks {options.tasks} is below --min-tasks "
                           f"{options.thresholds.min_tasks}: the run could license nothing; "
                           "raise --tasks, or lower --min-tasks for a trial run")
    grid = options.strategies or default_grid(options.workloads)
    drawn = sides(options)
    if backend is None:
        from codekv.models import load_backend

        say("Loading the model")
        backend = load_backend(options.model, engine=options.engine)
    workdir = _workdir(options, grid, drawn, backend.info.fingerprint)
    evidence = eval_config(options, drawn.evidence, options.seed, grid, workdir / "evidence.ckpt")
    held_out_seed = options.seed + 1
    for config, side in ((evidence, "evidence"),
                         (eval_config(options, drawn.held_out, held_out_seed, grid, None),
                          "held-out")):
        _enough(config, side, count_tasks(config, backend, say))
    say("Evidence run")
    result = evaluate(evidence, backend, say, _phase(progress, "evidence"), warn)
    staged = workdir / "support.json"
    eval_command.stamp_covers(result)
    try:
        eval_command.record_gate(staged, result, evidence,
                                 eval_command.canonical_command(evidence))
        notes = []
        document = read_support_document(staged)
        passed = [label for entry in read_entries(document)
                  if entry.workload in options.workloads for label in entry.passed_methods()]
        held_out_result = None
        if passed:
            held_out = eval_config(options, drawn.held_out, held_out_seed,
                                   tuple(dict.fromkeys(passed)), workdir / "held-out.ckpt")
            eval_command.check_held_out(document, held_out)
            say("Held-out run of the rules that passed")
            held_out_result = evaluate(held_out, backend, say, _phase(progress, "held-out"),
                                       warn)
            eval_command.stamp_covers(held_out_result)
            notes += eval_command.confirm(staged, held_out_result, held_out,
                                          eval_command.canonical_command(held_out))
        entries = [entry for entry in read_support_document(staged)["entries"]
                   if entry["workload"] in options.workloads]
    except SupportFileError as error:
        raise QualifyError(str(error)) from error
    trial = laxer(options.thresholds)
    for entry in entries:
        entry["qualified_by"] = command
        if trial:
            entry.update(passed=False, trial=trial,
                         reason="a trial run, not evidence: it licenses nothing; "
                                + entry.get("reason", ""))
    install(user_file, entries)
    return Qualification(entries, result, held_out_result, user_file, workdir, drawn, trial,
                   result.model, [*result.notes, *notes])


def eval_config(options: QualifyOptions, repos, seed: int, strategies, checkpoint):
    from codekv.eval.harness import EvalConfig

    return EvalConfig(repos=tuple(repos), languages=options.languages,
                      workloads=options.workloads, tasks=options.tasks,
                      seed=seed, strategies=tuple(strategies),
                      context_tokens=options.context_tokens, pruning=(), peers=(),
                      throughput_tasks=0, reuse_tasks=0, reorder=False, model=options.model,
                      backend=options.engine, thresholds=options.thresholds,
                      checkpoint=str(checkpoint) if checkpoint else None)


def _enough(config, side: str, made: dict[str, int]) -> None:
    """Refuse material that cannot give the tasks the thresholds need, before any is run."""
    need = config.thresholds.min_tasks
    for workload, count in made.items():
        if count < need:
            where = (f" from {', '.join(config.repos)}" if WORKLOADS[workload].needs_index
                     else "")
            raise QualifyError(
                f"{workload}: the {side} side gives only {count} tasks{where} at "
                f"--context-tokens {config.context_tokens}; the thresholds need {need} "
                "(--min-tasks): name more or larger repositories (--repo, --held-out-repo), "
                "or a longer --context-tokens")


def _phase(progress, phase: str):
    if progress is None:
        return None
    return lambda text, advance, total: progress(phase, text, advance, total)


def _workdir(options: QualifyOptions, grid, drawn: Sides, fingerprint: str) -> Path:
    """The directory of this qualification's checkpoints: one per model fingerprint,
    repositories' contents and settings (the task count aside: the checkpoints match their
    tasks), so the same command continues where it stopped."""
    key = {"model": options.model, "fingerprint": fingerprint, "engine": options.engine,
           "repos": drawn.contents, "held_out": drawn.how, "workloads": list(options.workloads),
           "languages": list(options.languages) if options.languages else None,
           "context_tokens": options.context_tokens,
           "strategies": list(grid), "seed": options.seed,
           "thresholds": asdict(options.thresholds)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    workdir = paths.private_dir(paths.home() / WORKDIR / digest)
    paths.private_file(workdir / "key.json", (json.dumps(key, indent=2) + "\n").encode())
    return workdir


# -- the user support file -------------------------------------------------------------------

def _user_document(path: Path) -> dict:
    """The user support file as it is (an empty one when there is none); ``QualifyError``
    when it is not one, which is then left as it is."""
    from codekv.gate import SupportGate

    if not os.path.lexists(path):
        return {"format": 1, "entries": []}
    gate = SupportGate.load(path)
    if gate.error:
        raise QualifyError(f"{gate.error.replace('support file', 'user support file', 1)}; "
                           "it was left as it is: repair it, or move it away and run codekv "
                           "qualify again")
    return json.loads(path.read_text())


def _replaces(new: dict, old) -> bool:
    """Whether ``new`` speaks for ``old``'s requests: the same engine, family and workload,
    a model in common, languages that overlap and one context band (a go entry leaves a
    python one, a 4K entry a 2K one). An invalid ``old`` entry, whose languages and band
    cannot be read, is replaced where it names the same pair and a model in common."""
    from codekv.gate import Said, read_entry

    new = read_entry(new)
    try:
        read = read_entry(old)
    except ValidationError:
        said = Said.written(old)
        return ((said.engine, said.family, said.workload) == new.pair
                and bool(set(said.models or ()) & set(new.models)))
    return (new.pair == read.pair and bool(set(new.models) & set(read.models))
            and new.same_requests(read))


def install(path: Path, entries: list[dict]) -> None:
    """Put ``entries`` in the user support file at ``path``, replacing its entries for the
    same requests (engine, family, workload, model, context band and overlapping languages),
    keeping every other; written whole (a temporary file renamed over it), owner-only."""
    document = _user_document(path)  # as it is now, not as it was when the run started
    kept = [old for old in document["entries"]
            if not any(_replaces(new, old) for new in entries)]
    document.update(format=1, entries=[*kept, *entries],
                    updated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    document.setdefault("about", "codekv qualify's entries: the gate reads them beside the "
                                 "shipped support file, and they win for their models")
    paths.private_file(path, (json.dumps(document, indent=2) + "\n").encode())


def methods_count(strategies: tuple[str, ...]) -> int:
    """Composition requests per task for ``strategies`` (for an estimate of a run's length)."""
    return len(composition_methods(strategies))
