"""The support gate's verdicts: which (model family, workload) pairs may compose, and how.

A pair passes when some composition strategy met every threshold of the gate design
(``DESIGN``) on enough tasks, judged on the evidence's confidence intervals rather than its
means (docs/semantics.md has the design and its reasoning); the entry then names the
cheapest such strategy and ratio (least recomputed, then fastest). A pair that was evaluated
and failed gets an entry that says why, with the measurements of the candidate closest to
passing. A pair never evaluated gets no entry: the gate treats it as unsupported.

A pass on the tasks a rule was developed on is not enough: ``confirm_entries`` judges the
strategies that passed again on held-out tasks (other repositories, or another seed), and only
a confirmed entry licenses composition.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from pydantic import ValidationError

from codekv.backends.engines import TRANSFORMERS
from codekv.chunks import Chunk
from codekv.eval.measures import ResultRow
from codekv.gate import CODE_WORKLOADS, UnreadableSupportFile, read_entry, read_support_text
from codekv.schema import GATE_STRATEGIES
from codekv.support_schema import (
    DESIGN,
    MIN_TASKS,
    Covers,
    SupportEntry,
    SupportFile,
    context_band,
    languages_overlap,
)

MEASURED_KEYS = ("tasks", "delta_nll", "delta_nll_ci", "abs_delta_nll", "agreement",
                 "decisive_agreement", "near_ties", "solved", "retention", "retention_ci",
                 "same_answer", "edit_similarity", "score_drop", "score_drop_ci",
                 "greedy_match", "kl", "exact_match", "ttft_s", "full_ttft_s", "speedup",
                 "recompute_ratio", "context_tokens")


@dataclass(frozen=True)
class Thresholds:
    """The gate design's (``DESIGN``) criteria and task counts."""

    # The upper end of the 95% interval of mean answer NLL difference, nats/token.
    max_delta_nll_high: float = 0.05
    # Of the tasks full prefill solves (its greedy answer is the expected one), the lower end
    # of the Wilson 95% interval of the share the rule still solves, over at least
    # ``min_solved`` such tasks.
    min_retention_low: float = 0.85
    min_solved: int = 80
    # Greedy top-1 agreement with full prefill where full's top token beats its runner-up by
    # >= 0.1 in probability (near-ties flip under any perturbation; they are reported apart).
    min_decisive_agreement: float = 0.95
    min_speedup: float = 2.0  # median over tasks of full prefill TTFT / composed TTFT
    # (composed TTFT includes reading the chunk store and every selection pass)
    min_tasks: int = MIN_TASKS

    @classmethod
    def of(cls, written: dict | None) -> Thresholds:
        """The thresholds an entry records (those of its design; keys of none are left out)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (written or {}).items() if k in known})


def _high(interval) -> float:
    return interval[1] if interval else math.inf


def _low(interval) -> float:
    return interval[0] if interval else -math.inf


def _past(value: float, bound: float, digits: int) -> str:
    """``value`` to ``digits`` decimals, or more where rounding would show it equal to the
    ``bound`` it misses (a speedup of 1.9996x is not "2.00x < 2.0x")."""
    while digits < 6 and math.isfinite(value) and round(value, digits) == bound:
        digits += 1
    return f"{value:.{digits}f}"


def _delta_nll(row, t: Thresholds) -> str | None:
    high = _high(row.delta_nll_ci)
    if high > t.max_delta_nll_high:
        return f"delta NLL CI high {_past(high, t.max_delta_nll_high, 3)} > {t.max_delta_nll_high}"
    return None


def _retention(row, t: Thresholds) -> str | None:
    solved = row.solved or 0
    if solved < t.min_solved:
        return f"full prefill solves {solved} tasks (need {t.min_solved})"
    low = _low(row.retention_ci)
    if solved and low < t.min_retention_low:
        return f"retention CI low {_past(low, t.min_retention_low, 3)} < {t.min_retention_low}"
    return None


def _decisive_agreement(row, t: Thresholds) -> str | None:
    decisive = row.decisive_agreement
    if decisive is None or decisive < t.min_decisive_agreement:
        shown = "n/a" if decisive is None else _past(decisive, t.min_decisive_agreement, 3)
        return f"decisive agreement {shown} < {t.min_decisive_agreement}"
    return None


def _speedup(row, t: Thresholds) -> str | None:
    if row.speedup is None or row.speedup < t.min_speedup:
        speedup = "n/a" if row.speedup is None else f"{_past(row.speedup, t.min_speedup, 2)}x"
        return f"speedup {speedup} < {t.min_speedup}x"
    return None


# The design's quality and speed criteria, each judging anything with a result row's
# ``delta_nll_ci``, ``solved``, ``retention_ci``, ``decisive_agreement`` and ``speedup``: why it
# fails, or None. ``codekv.eval.controls`` judges resampled cells with the same ones.
CRITERIA = {"delta_nll": _delta_nll, "retention": _retention,
            "decisive_agreement": _decisive_agreement, "speedup": _speedup}


def failures(row: ResultRow, thresholds: Thresholds) -> list[str]:
    """Why a result row does not meet the thresholds (empty when it does)."""
    t = thresholds
    out = []
    if row.tasks < t.min_tasks:
        out.append(f"only {row.tasks} tasks (need {t.min_tasks})")
    if row.fallbacks:
        out.append(f"{row.fallbacks} requests fell back to full prefill")
    return out + [why for check in CRITERIA.values() if (why := check(row, t))]


def gate_entries(rows: list[ResultRow], family: str, thresholds: Thresholds = Thresholds(),
                 model: str | None = None, engine: str = TRANSFORMERS) -> list[dict]:
    """One entry per workload in ``rows``: the verdict for (engine, family, workload)."""
    entries = []
    for workload in dict.fromkeys(r.workload for r in rows):
        candidates = [r for r in rows
                      if r.workload == workload and r.strategy in GATE_STRATEGIES]
        judged = [(r, failures(r, thresholds)) for r in candidates]
        passing = [r for r, why in judged if not why]
        entry = {"backend": engine, "family": family, "workload": workload, "model": model,
                 "design": DESIGN, "thresholds": asdict(thresholds)}
        if passing:
            best = _cheapest(passing)
            entry.update(passed=True, strategy=best.strategy, ratio=best.ratio,
                         conditioning=best.conditioning, method=best.method,
                         measured=_measured(best),
                         reason=f"{best.method} meets every threshold")
        elif judged:
            closest, why = _closest(judged)
            entry.update(passed=False, strategy=None, ratio=None, method=None,
                         closest=closest.method, measured=_measured(closest),
                         reason=f"no strategy meets the thresholds; closest {closest.method}: "
                                + "; ".join(why))
        else:
            entry.update(passed=False, strategy=None, ratio=None, method=None, measured={},
                         reason="no composition strategy was evaluated")
        entry["candidates"] = _candidates(judged)
        entries.append(entry)
    return entries


def _candidates(judged) -> list[dict]:
    return [{"method": r.method, "passed": not why, "failures": why, "measured": _measured(r)}
            for r, why in judged]


def _cheapest(rows: list[ResultRow]) -> ResultRow:
    return min(rows, key=lambda r: (r.recompute_ratio, r.ratio, -r.speedup))


def _closest(judged) -> tuple[ResultRow, list[str]]:
    """The candidate nearest to passing: fewest failed thresholds, then lowest ΔNLL bound."""
    return min(judged, key=lambda j: (len(j[1]), _high(j[0].delta_nll_ci)))


def read_entries(document: dict) -> list[SupportEntry]:
    """The valid entries of a support file's ``document``, read."""
    return [entry for entry in map(_read, document["entries"]) if entry is not None]


def _read(entry: dict) -> SupportEntry | None:
    """An entry of a file this module wrote or will replace, read (None where it is invalid:
    the gate lists it as such, and nothing here takes it for another)."""
    try:
        return read_entry(entry)
    except ValidationError:
        return None


def confirm_entries(document: dict, rows: list[ResultRow], family: str, run: dict) -> list[str]:
    """Judge ``document``'s entries for ``rows``' workloads again on these held-out rows, in
    place; returns what was decided, one line per entry.

    Only strategies that passed the entry's evidence run are candidates, held to the entry's
    own thresholds; the cheapest that passes here too becomes the entry's rule; an entry of
    another model or other languages than the run's (``run["covers"]``), or in another
    context band than an entry beside it that is in the run's, is left alone. ``run`` (the
    command, repositories, seed, seconds, tasks resumed from a checkpoint, machine) is
    recorded in the entry's ``held_out`` block, which the gate requires, with what its tasks
    covered (``run["covers"]``, by workload: ``coverage``). The caller checks
    beforehand that these tasks are not the evidence's (``codekv.eval.command``).
    """
    created = _now()
    lines = []
    for entry, read in _confirmable(document, family, run):
        candidates = set(read.passed_methods())
        ours = [r for r in rows if r.workload == read.workload and r.method in candidates]
        if not ours:
            continue
        thresholds = Thresholds.of(read.thresholds)
        judged = [(r, failures(r, thresholds)) for r in ours]
        passing = [r for r, why in judged if not why]
        pair = f"{family}/{read.workload}"
        held_out = {"generated_by": run["command"], "created": created, "repos": run["repos"],
                    "covers": run["covers"].get(read.workload),
                    "seed": run["seed"], "seconds": run["seconds"],
                    "resumed_tasks": run.get("resumed_tasks", 0), "machine": run["machine"]}
        if passing:
            best = _cheapest(passing)
            evidence = {c.method: c.measured for c in read.candidates or ()}
            measured = evidence.get(best.method) or (
                read.measured if read.method == best.method else None)
            held_out.update(passed=True, method=best.method, measured=_measured(best))
            entry.update(strategy=best.strategy, ratio=best.ratio,
                         conditioning=best.conditioning, method=best.method,
                         measured=measured,
                         reason=f"{best.method} meets every threshold on its evidence tasks "
                                "and on held-out tasks")
            lines.append(f"{pair}: confirmed on held-out tasks with {best.method}")
        else:
            closest, why = _closest(judged)
            held_out.update(passed=False, method=None, closest=closest.method,
                            measured=_measured(closest))
            entry["reason"] = (f"passed its evidence tasks, but on held-out tasks no strategy "
                               f"meets the thresholds; closest {closest.method}: "
                               + "; ".join(why))
            lines.append(f"{pair}: not confirmed on held-out tasks ({closest.method}: "
                         + "; ".join(why) + ")")
        held_out["candidates"] = _candidates(judged)
        entry["held_out"] = held_out
    return lines


def _confirmable(document: dict, family: str, run: dict) -> list[tuple[dict, SupportEntry]]:
    """The entries of ``document`` that ``run``'s held-out tasks can confirm: passed on their
    evidence, for the run's engine and family, measured on its model, for its tasks'
    languages; where a language set has entries in several context bands, the one in the
    band of the run's tasks (a 4K run confirms the 4K entry, not the 2K one beside it). Each
    as the file has it (confirming changes it there), and read."""
    out = []
    for raw in document.get("entries", []):
        entry = _read(raw)
        if (entry is None or entry.pair != (run["engine"], family, entry.workload)
                or entry.design != DESIGN or not entry.passed_methods()):
            continue  # an entry of an earlier design is re-earned, never confirmed
        covered = _covers(run, entry.workload)
        if covered is None or entry.model not in {m.fingerprint for m in covered.models}:
            continue  # measured on another model: these rows say nothing of it
        ran = covered.languages
        if languages_overlap(entry.languages, None if ran is None else frozenset(ran)):
            out.append((raw, entry))

    def in_band(entry):
        return entry.band == context_band(_covers(run, entry.workload))

    def in_band_beside(entry, other):  # for the same tasks, and in the run's band
        return (other is not entry and other.workload == entry.workload and in_band(other)
                and languages_overlap(other.languages, entry.languages))

    return [(raw, entry) for raw, entry in out
            if in_band(entry) or not any(in_band_beside(entry, other) for _, other in out)]


def _covers(run: dict, workload: str) -> Covers | None:
    """What ``run``'s tasks of ``workload`` covered (None: it ran none)."""
    covered = run["covers"].get(workload)
    return None if covered is None else Covers.model_validate(covered)


def coverage(measures, tasks, model: dict) -> dict[str, dict]:
    """What each workload's composed tasks covered, by workload: the model they ran on, the
    languages of the code in their contexts (code-qa, agent-session), and the range of their context
    lengths in tokens (prefix and chunks, as the gate counts a request's). An entry licenses
    only this (``codekv.gate``)."""
    lengths: dict[str, list[int]] = {}
    for measure in measures:
        if measure.kind == "composition":
            lengths.setdefault(measure.workload, []).append(measure.context_tokens)
    out = {}
    for workload, counts in lengths.items():
        languages = sorted({language for task in tasks if task.workload == workload
                            for language in _task_languages(task)})
        out[workload] = {
            "models": [{"fingerprint": model["fingerprint"], "name": model.get("name")}],
            "languages": languages if workload in CODE_WORKLOADS else None,
            "context_tokens": {"min": min(counts), "max": max(counts)},
            "source": "measured: the run's composed tasks"}
    return out


def _task_languages(task) -> set[str]:
    """The languages of a task's code: its own (the query's) and its context chunks'."""
    own = {task.meta["language"]} if "language" in task.meta else set()
    return own | {item.language for item in task.context if isinstance(item, Chunk)}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _measured(row: ResultRow) -> dict:
    return {key: getattr(row, key) for key in MEASURED_KEYS}


class SupportFileError(ValueError):
    """An existing support file that a new run must not overwrite blindly."""


def support_document(entries: list[dict], command: str, model: dict, config: dict,
                     previous: dict | None = None) -> dict:
    """The support file for this run's ``entries``, each stamped with the command that measured
    it. With ``previous`` (the file being replaced), its entries this run did not measure
    again are kept with their own commands: other workloads, engines, models (each entry names
    its own) or languages (a go entry beside a python one), so they can be evaluated by
    separate runs into one file; an entry is replaced only by one for the same engine, family,
    workload and model with overlapping languages in one context band. The top-level
    ``model`` and ``config`` are this run's."""
    created = _now()
    entries = [{**entry, "generated_by": command, "created": created} for entry in entries]
    if previous:
        kept = [{**entry,
                 "generated_by": entry.get("generated_by", previous.get("generated_by")),
                 "created": entry.get("created", previous.get("created"))}
                for entry in previous.get("entries", [])
                if not any(_same_request(entry, new) for new in entries)]
        entries = kept + entries
    return {
        "format": 1,
        "generated_by": command,
        "created": created,
        "model": model,
        "config": config,
        "entries": entries,
    }


def read_support_document(path: str | Path, option: str = "--write-gate") -> dict | None:
    """The support file at ``path`` (None when there is none yet); raise SupportFileError when
    it exists but is not one, so a run never replaces (``--write-gate``) or judges
    (``--confirm-gate``) a file it cannot read."""
    path = Path(path)
    if not path.exists():
        return None
    advice = ("move it away or name another --write-gate file" if option == "--write-gate"
              else "expected a support file written by codekv eval --write-gate")
    try:
        data = json.loads(read_support_text(path))
    except (UnreadableSupportFile, json.JSONDecodeError) as error:
        raise SupportFileError(f"{option} {path} is not a readable support file ({error}); "
                               + advice) from error
    if SupportFile.problem(data) or "format" not in data or not all(
            isinstance(entry, dict) for entry in data["entries"]):
        raise SupportFileError(f"{option} {path} is not a codekv support file (format 1, a "
                               "list of entries); " + advice)
    return data


def _same_request(a: dict, b: dict) -> bool:
    """Whether entries ``a`` and ``b`` would speak for the same requests: one pair, measured
    on one model, with languages that overlap, in one context band (``codekv.gate``: one entry
    per model, set of languages and band). An invalid entry speaks for none."""
    a, b = _read(a), _read(b)
    return (a is not None and b is not None and a.pair == b.pair and a.model == b.model
            and a.same_requests(b))


def write_json(path: str | Path, data: dict) -> None:
    """Write atomically: a reader (the gate) never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
