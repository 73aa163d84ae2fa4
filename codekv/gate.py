"""The support gate: composition runs only where measured evidence says it keeps quality.

The support file (written by ``codekv eval --write-gate``) holds, per (engine, model family,
workload), the thresholds, the measured values, the best strategy and ratio, and a verdict. An
entry licenses composition only when it passed on its evidence tasks *and* was confirmed on
held-out tasks no rule was tuned on (``codekv eval --confirm-gate``). A pair with no entry, a
failed one or an unconfirmed one is unsupported: the composer falls back to full prefill.

The file is checked against its schema when it is loaded (``entry_problems``): an entry that
does not hold what the gate reads licenses nothing, and its verdict says why. A file that cannot
be read at all licenses nothing either (``SupportGate.error``); it never silently becomes the
shipped one.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# What the schema knows of engines and workloads: their torch-free registries.
from codekv.backends.engines import ENGINES, LLAMA_CPP, TRANSFORMERS  # TRANSFORMERS: none named
from codekv.conditioning import CONDITIONINGS, DEFAULT_CONDITIONING
from codekv.eval.methods import GATE_STRATEGIES, Method
from codekv.eval.registry import WORKLOADS
from codekv.selection import STRATEGIES as SELECTION

# What a rule reads that an engine cannot give it: the engine's backend refuses these
# (``deviation_refusal`` / ``relevance_refusal``; tests/test_gate.py checks they agree).
UNSERVED_NEEDS = {LLAMA_CPP: {"needs_deviation": "per-token KV deviation",
                              "needs_relevance": "the query's attention over reused KV"}}

SUPPORT_ENV = "CODEKV_SUPPORT"
SHIPPED = "codekv/data/support.json"


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str
    strategy: str | None = None
    ratio: float | None = None
    conditioning: str | None = None  # what the passing rule's chunk KV was computed after


class SupportGate:
    """The entries of one support file. ``error`` says why the file could not be read (then
    there are no entries and every verdict carries it)."""

    def __init__(self, entries: list | None = None, source: str = "none",
                 error: str | None = None):
        self.entries = entries or []
        self.source = source
        self.error = error
        self.problems = [entry_problems(entry) for entry in self.entries]

    @classmethod
    def load(cls, path: str | Path | None = None) -> SupportGate:
        """The support file at ``path``, ``$CODEKV_SUPPORT``, else the one shipped with codekv.

        Never raises for a bad file: the gate then licenses nothing and ``error`` says why.
        """
        named, path = path, path or os.environ.get(SUPPORT_ENV)
        if path:
            source = str(path)
            where = source if named else f"${SUPPORT_ENV}={source}"
            try:
                text = Path(path).read_bytes().decode()
            except OSError as error:
                return cls([], source, f"cannot read the support file {where}: "
                                       f"{error.strerror or error}")
            except UnicodeDecodeError:
                return cls([], source, f"cannot read the support file {where}: not UTF-8 text")
        else:
            shipped = resources.files("codekv").joinpath("data", "support.json")
            if not shipped.is_file():
                return cls([], "no support file")
            text, source, where = shipped.read_text(), SHIPPED, SHIPPED
        entries, problem = _document_entries(text)
        if problem:
            return cls([], source, f"cannot read the support file {where}: {problem}")
        return cls(entries, source)

    def pairs(self) -> list[dict]:
        """Each evaluated (engine, family, workload) pair with its verdict and where its
        evidence and held-out confirmation came from: what ``codekv support`` shows. An
        invalid entry is listed with its ``problems`` and licenses nothing."""
        out = []
        for number, (entry, problems) in enumerate(zip(self.entries, self.problems), 1):
            fields = entry if isinstance(entry, dict) else {}
            engine = fields.get("backend", TRANSFORMERS)
            held_out = fields.get("held_out") if isinstance(fields.get("held_out"), dict) else {}
            named = isinstance(fields.get("family"), str) and isinstance(fields.get("workload"),
                                                                          str)
            name = _pair_name(fields) if named else f"entry {number}"
            if problems:
                verdict = self._invalid(f"the entry for {name}" if named else name, problems)
            else:
                verdict = self.verdict(fields["family"], fields["workload"], engine)
            out.append({
                "pair": name, "engine": engine, "family": fields.get("family"),
                "workload": fields.get("workload"), "supported": verdict.allowed,
                "reason": (fields.get("reason") or verdict.reason) if verdict.allowed
                else verdict.reason,
                "problems": problems,
                # what composes, or what passed its evidence; an invalid entry names nothing
                "method": None if problems else fields.get("method"),
                "closest": None if problems else fields.get("closest"),  # of a failed one
                "evidence": {"command": fields.get("generated_by"),
                             "created": fields.get("created"),
                             "measured": fields.get("measured") or {}},
                "held_out": {"command": held_out.get("generated_by"),
                             "created": held_out.get("created"),
                             "measured": held_out.get("measured") or {}} if held_out else None,
            })
        return out

    def verdict(self, family: str, workload: str, engine: str = TRANSFORMERS) -> Verdict:
        """The evidence for ``family`` on ``engine``: one engine's results never license another
        (entries without a ``backend`` field were measured on transformers)."""
        pair = _pair_name({"family": family, "workload": workload, "backend": engine})
        if self.error:
            return Verdict(False, f"unsupported: {self.error}")
        for entry, problems in zip(self.entries, self.problems):
            if not (isinstance(entry, dict) and entry.get("family") == family
                    and entry.get("workload") == workload
                    and entry.get("backend", TRANSFORMERS) == engine):
                continue
            if problems:
                return self._invalid(f"the entry for {pair}", problems)
            if not entry["passed"]:
                return Verdict(False, f"unsupported: {pair} failed its evaluation")
            held_out = entry.get("held_out") or {}
            if "passed" not in held_out:
                return Verdict(False, f"unsupported: {pair} passed its evaluation but was "
                                      "not confirmed on held-out tasks")
            if not held_out["passed"]:
                return Verdict(False, f"unsupported: {pair} failed on held-out tasks")
            return Verdict(True, "supported", entry.get("strategy"), entry.get("ratio"),
                           entry.get("conditioning"))
        return Verdict(False, f"unsupported: no evidence for {pair} ({self.source})")

    def _invalid(self, entry: str, problems: list[str]) -> Verdict:
        return Verdict(False, f"unsupported: {entry} in {self.source} is invalid: "
                              + "; ".join(problems))


def _pair_name(entry: dict) -> str:
    engine = entry.get("backend", TRANSFORMERS)
    return (f"{entry.get('family')}/{entry.get('workload')}"
            + ("" if engine == TRANSFORMERS else f" on {engine}"))


JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


def _document_entries(text: str) -> tuple[list, str | None]:
    """The entries of a support file's text, or why it is not a support file."""
    if not text.strip():
        return [], "the file is empty"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        return [], f"not JSON ({error})"
    if not isinstance(data, dict):
        kind = JSON_TYPES.get(type(data), type(data).__name__)
        return [], f"it holds a JSON {kind}, not an object with an \"entries\" list"
    if data.get("format", 1) != 1:
        return [], f"format {data['format']!r} is not 1, the only one this codekv reads"
    if not isinstance(data.get("entries"), list):
        return [], "it has no \"entries\" list"
    return data["entries"], None


def entry_problems(entry) -> list[str]:
    """What is wrong with one support-file entry, in words (empty for a valid entry).

    The gate reads: ``family``, ``workload`` and ``backend`` (which requests it rules on);
    ``passed`` and ``held_out.passed`` (booleans); ``strategy``, ``ratio`` and ``conditioning``
    (the rule requests compose with: a registered rule this engine runs, a share above 0 unless
    the rule is ratio-free, a registered conditioning), required once the entry licenses;
    ``method``, the rule's label, must then name that rule; and what ``codekv support`` shows
    (texts, and ``measured`` numbers that are finite).
    """
    if not isinstance(entry, dict):
        return [f"an entry must be an object, not {_shown(entry)}"]
    problems = []
    engine = entry.get("backend", TRANSFORMERS)
    if engine not in ENGINES:
        problems.append(f"backend {_shown(engine)} is not one of {', '.join(ENGINES)}")
    family = entry.get("family")
    if not (isinstance(family, str) and family):
        problems.append(f"family {_shown(family)} is not a model family's name")
    if entry.get("workload") not in WORKLOADS:
        problems.append(f"workload {_shown(entry.get('workload'))} is not one of "
                        + ", ".join(WORKLOADS))
    if not isinstance(entry.get("passed"), bool):
        problems.append(f"passed {_shown(entry.get('passed'))} is not true or false")
    held_out = entry.get("held_out")
    if held_out is not None and not isinstance(held_out, dict):
        problems.append(f"held_out {_shown(held_out)} is not an object")
        held_out = None
    held_out = held_out or {}
    if "passed" in held_out and not isinstance(held_out["passed"], bool):
        problems.append(f"held_out.passed {_shown(held_out['passed'])} is not true or false")
    licenses = entry.get("passed") is True and held_out.get("passed") is True
    problems += _rule_problems(entry, engine, licenses)
    for key in ("method", "closest", "reason", "generated_by", "created"):
        problems += _text_problem(key, entry.get(key))
    for key in ("generated_by", "created"):
        problems += _text_problem(f"held_out.{key}", held_out.get(key))
    problems += _measured_problems("measured", entry.get("measured"))
    problems += _measured_problems("held_out.measured", held_out.get("measured"))
    return problems


def _rule_problems(entry: dict, engine, licenses: bool) -> list[str]:
    """The rule an entry names, checked against the strategy registry and the engine."""
    strategy, ratio = entry.get("strategy"), entry.get("ratio")
    conditioning = entry.get("conditioning")
    problems = []
    rule = None
    if strategy is None:
        if licenses:
            problems.append("it licenses composition but names no strategy")
    elif strategy not in GATE_STRATEGIES:
        problems.append(f"strategy {_shown(strategy)} is not a rule requests compose with; "
                        "choose from " + ", ".join(GATE_STRATEGIES))
    else:
        rule = SELECTION[strategy]
        for need, what in UNSERVED_NEEDS.get(engine, {}).items():
            if getattr(rule, need):
                problems.append(f"strategy {strategy!r} needs {what}, which {engine} cannot "
                                "give")
    ratio_free = rule is not None and rule.ratio_free
    if ratio is None:
        if licenses and rule is not None and not ratio_free:
            problems.append(f"it licenses composition but names no ratio for {strategy!r}")
    elif not (isinstance(ratio, int | float) and not isinstance(ratio, bool)
              and math.isfinite(ratio) and 0 <= ratio <= 1):
        problems.append(f"ratio {_shown(ratio)} is not a share from 0 to 1")
    elif ratio == 0 and rule is not None and not ratio_free:
        problems.append(f"ratio 0 recomputes nothing: {strategy!r} needs a share above 0")
    if conditioning is not None and conditioning not in CONDITIONINGS:
        problems.append(f"conditioning {_shown(conditioning)} is not one of "
                        + ", ".join(CONDITIONINGS))
    method = entry.get("method")
    if licenses and isinstance(method, str) and rule is not None and not problems:
        label = Method(strategy, ratio or 0.0,
                       conditioning=conditioning or DEFAULT_CONDITIONING).label
        if method != label:
            problems.append(f"method {method!r} is not its rule {label!r}")
    return problems


def _text_problem(key: str, value) -> list[str]:
    return [] if value is None or isinstance(value, str) else [
        f"{key} {_shown(value)} is not a text"]


def _measured_problems(key: str, measured) -> list[str]:
    """``measured`` maps names to numbers (finite: JSON has no NaN), intervals (two numbers)
    or null; ``codekv support`` prints them."""
    if measured is None:
        return []
    if not isinstance(measured, dict):
        return [f"{key} {_shown(measured)} is not an object"]
    problems = []
    for name, value in measured.items():
        values = value if isinstance(value, list) else [value]
        interval_ok = not isinstance(value, list) or len(value) == 2
        if not interval_ok or not all(
                v is None or (isinstance(v, int | float) and math.isfinite(v)) for v in values):
            problems.append(f"{key}.{name} {_shown(value)} is not a finite number"
                            + (" or an interval of two" if isinstance(value, list) else ""))
    return problems


def _shown(value) -> str:
    """A value as the file has it (NaN as NaN), cut short."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."
