"""The support gate: composition runs only where measured evidence says it keeps quality.

The support file (written by ``codekv eval --write-gate``) holds, per (engine, model family,
workload), the thresholds, the measured values, the best strategy and ratio, and a verdict. An
entry licenses composition only when it passed on its evidence tasks *and* was confirmed on
held-out tasks no rule was tuned on (``codekv eval --confirm-gate``). A pair with no entry, a
failed one or an unconfirmed one is unsupported: the composer falls back to full prefill.

An entry licenses only what was measured (``covers``): the model fingerprints it was measured
on, the languages of its code tasks and the longest context of its tasks, on its evidence and
on its held-out tasks alike; entries of one model at different context lengths (2K, 4K, 8K
bands) stand side by side, and a request is judged by the one measured on the shortest contexts
that reach its length. A request outside that is unsupported, and the reason names what is
missing; an entry that does not say what it covers (a file written before entries did)
licenses nothing.

The file is checked against its schema (``codekv.support_schema``) when it is loaded
(``checked_entry``): an entry that does not hold what the gate reads licenses nothing, and its
verdict says why. A file that cannot be read at all licenses nothing either
(``SupportGate.error``); it never silently becomes the shipped one.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError

# What the schema knows of engines and workloads: their torch-free registries.
from codekv.backends.engines import ENGINES, TRANSFORMERS  # TRANSFORMERS: none named
from codekv.conditioning import DEFAULT_CONDITIONING
from codekv.grammars import LANGUAGES
from codekv.schema import GATE_STRATEGIES, WORKLOADS, rule_label
from codekv.selection import STRATEGIES as SELECTION
from codekv.support_schema import (
    DESIGN,
    FIRST_DESIGN,
    KEYS,
    CoveredModel,
    Covers,
    HeldOut,
    Names,
    SupportEntry,
    SupportFile,
    located_problems,
    pair_name,
    shown,
)

SUPPORT_ENV = "CODEKV_SUPPORT"
SHIPPED = "codekv/data/support.json"
# The workloads whose tasks are code of a language each: their entries name their languages.
CODE_WORKLOADS = tuple(name for name, workload in WORKLOADS.items() if workload.by_language)
# What a code chunk's language can be: a grammar's name, or "text" (a file no grammar parses).
CHUNK_LANGUAGES = (*LANGUAGES, "text")
# What the schema's registry names may be: the gate's registries.
NAMES = Names(workloads=tuple(WORKLOADS), strategies=GATE_STRATEGIES)
# A support file is a few kilobytes; more than this is not one (and /dev/zero never ends).
MAX_SUPPORT_BYTES = 16 * 2**20
RERUN = "re-run codekv eval --write-gate and --confirm-gate"


class UnreadableSupportFile(ValueError):
    """A support file path that cannot be read as a file of text."""


def read_support_text(path: str | Path) -> str:
    """The text of the support file at ``path``; ``UnreadableSupportFile`` says why not.

    Only a regular file is read, and at most ``MAX_SUPPORT_BYTES`` of it: a FIFO, a device or
    an endless file would otherwise block the reader forever.
    """
    try:  # non-blocking: opening a FIFO without a writer would wait for one
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise UnreadableSupportFile(error.strerror or str(error)) from error
    try:
        mode = os.fstat(descriptor).st_mode
        if stat.S_ISDIR(mode):
            raise UnreadableSupportFile("Is a directory")
        if not stat.S_ISREG(mode):
            raise UnreadableSupportFile("not a regular file (a FIFO, device or socket); a "
                                        "support file is a JSON file")
        data = b""
        while len(data) <= MAX_SUPPORT_BYTES and (block := os.read(descriptor, 2**20)):
            data += block
    except OSError as error:
        raise UnreadableSupportFile(error.strerror or str(error)) from error
    finally:
        os.close(descriptor)
    if len(data) > MAX_SUPPORT_BYTES:
        raise UnreadableSupportFile(f"larger than {MAX_SUPPORT_BYTES // 2**20} MiB, which no "
                                    "support file is")
    try:
        return data.decode()
    except UnicodeDecodeError as error:
        raise UnreadableSupportFile("not UTF-8 text") from error


@dataclass(frozen=True)
class GateRequest:
    """What the gate checks a request against an entry's coverage with: the model (its
    fingerprint), the languages of the request's code chunks, and its context length in tokens
    (prefix and chunks, as ``codekv eval`` counts its tasks')."""

    fingerprint: str
    languages: frozenset[str] = frozenset()
    context_tokens: int = 0


@dataclass(frozen=True)
class Coverage:
    """What an entry's runs measured: the models (fingerprint: name), the languages of its
    code tasks (None for a workload without code) and its tasks' context lengths."""

    models: dict[str, str | None]
    languages: frozenset[str] | None
    min_tokens: int | None
    max_tokens: int

    @classmethod
    def of(cls, covers: Covers) -> Coverage:
        languages = covers.languages
        return cls({m.fingerprint: m.name for m in covers.models},
                   None if languages is None else frozenset(languages),
                   covers.context_tokens.min, covers.context_tokens.max)

    @classmethod
    def of_entry(cls, entry: SupportEntry) -> Coverage | None:
        """What a valid entry licenses: its evidence's ``covers``, narrowed to its held-out
        run's where it has one; None where the entry does not say."""
        if entry.covers is None:
            return None
        covered = cls.of(entry.covers)
        held_out = entry.held_out.covers if entry.held_out else None
        return covered.within(cls.of(held_out)) if held_out is not None else covered

    def within(self, other: Coverage) -> Coverage:
        """What both runs measured: an entry licenses only what its evidence and its held-out
        tasks both covered."""
        # both None (a workload without code) or both sets: the gate checks it per workload
        languages = None if self.languages is None else self.languages & other.languages
        lows = [n for n in (self.min_tokens, other.min_tokens) if n is not None]
        return Coverage({fp: name for fp, name in self.models.items() if fp in other.models},
                        languages, max(lows) if lows else None,
                        min(self.max_tokens, other.max_tokens))

    def as_json(self) -> dict:
        return {"models": [{"fingerprint": fp, "name": name} for fp, name in self.models.items()],
                "languages": None if self.languages is None else sorted(self.languages),
                "context_tokens": {"min": self.min_tokens, "max": self.max_tokens}}

    def missing(self, request: GateRequest) -> list[str]:
        """What ``request`` has that this coverage lacks, in words (empty: covered)."""
        out = []
        if request.fingerprint not in self.models:  # measured on it, not confirmed on it
            out.append("its held-out run covers " + (_models_shown(self.models) or "no model "
                       "of its evidence") + ", not this model")
        if self.languages is not None:
            outside = sorted(request.languages - self.languages)
            if outside:
                out.append(f"no evidence for {', '.join(outside)} code (it covers "
                           f"{', '.join(sorted(self.languages)) or 'no language'})")
        if request.context_tokens > self.max_tokens:
            out.append(f"its evidence covers contexts up to {self.max_tokens:,} tokens; this "
                       f"request has {request.context_tokens:,}")
        return out


def _models_shown(models: dict[str, str | None]) -> str:
    return " or ".join(f"{name} (fingerprint {fingerprint[:12]})" if name
                       else f"fingerprint {fingerprint[:12]}"
                       for fingerprint, name in models.items())


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str
    strategy: str | None = None
    ratio: float | None = None
    conditioning: str | None = None  # what the passing rule's chunk KV was computed after


@dataclass(frozen=True)
class Said:
    """Which requests an entry rules on, and whom it was measured on, as far as it says: of an
    invalid entry, what can still be read of it, so its verdict and listing name it."""

    engine: object
    family: object
    workload: object
    models: dict[str, str | None] | None  # None where it does not say (or not validly)

    @classmethod
    def of(cls, entry: SupportEntry) -> Said:
        covers = entry.covers
        return cls(*entry.pair, None if covers is None
                   else {m.fingerprint: m.name for m in covers.models})

    @classmethod
    def written(cls, raw) -> Said:
        fields = raw if isinstance(raw, dict) else {}
        covers = fields.get("covers")
        try:
            models = MODELS.validate_python(covers.get("models") if isinstance(covers, dict)
                                            else None)
        except ValidationError:
            models = None
        return cls(fields.get("backend", TRANSFORMERS), fields.get("family"),
                   fields.get("workload"),
                   None if models is None else {m.fingerprint: m.name for m in models})

    @property
    def named(self) -> bool:
        return isinstance(self.family, str) and isinstance(self.workload, str)


MODELS = TypeAdapter(Annotated[list[CoveredModel], Field(min_length=1)])


@dataclass
class Listed:
    """One entry of a support file as the gate holds it: as the file has it (``raw``), read
    (``entry``; None when it is invalid), what is wrong with it, what it says of the requests
    it rules on, the file it is in and its number there, and the models whose requests an
    entry of the user file governs instead."""

    raw: object
    entry: SupportEntry | None
    problems: list[str]
    said: Said
    file: str | None
    number: int
    from_user: bool
    superseded: list[str] = field(default_factory=list)


class SupportGate:
    """The entries of a support file, and of the user's (``codekv qualify``'s) beside it.

    ``user_entries`` come first and win for their models: a request is judged by the first
    entry measured on its model, so the user file's entry for a model governs it, and the
    other file's entries still govern every other model. ``error`` says why a file could not
    be read (then there are no entries and every verdict carries it)."""

    def __init__(self, entries: list | None = None, source: str = "none",
                 error: str | None = None, user_entries: list | None = None,
                 user_source: str | None = None):
        base, user = entries or [], user_entries or []
        self.entries = [*user, *base]  # as the files have them
        self.source = f"{user_source} (user) + {source}" if user_source else source
        self.error = error
        theirs = _listed(user, user_source, True)
        ours = _listed(base, source, False)
        for listed in ours:
            listed.superseded = _superseded(listed, theirs)
        self.listed = [*theirs, *ours]

    @property
    def problems(self) -> list[list[str]]:
        """Each entry's problems (empty for a valid one), in ``entries``' order."""
        return [listed.problems for listed in self.listed]

    @classmethod
    def load(cls, path: str | Path | None = None) -> SupportGate:
        """The support file at ``path`` alone; else ``$CODEKV_SUPPORT`` or the one shipped
        with codekv, with the user's (``codekv.paths.user_support_file``) beside it.

        Never raises for a bad file: the gate then licenses nothing and ``error`` says why
        (a bad user file too: it never silently leaves the shipped file alone in charge).
        """
        base = cls._load_one(path)
        if path or base.error:
            return base
        from codekv import paths

        try:
            user_path = paths.user_support_file()
        except paths.SettingError as error:
            return cls([], base.source, f"cannot find the user support file: {error}")
        if not os.path.lexists(user_path):
            return base
        user = cls._load_one(user_path, "user support file")
        if user.error:
            return cls([], f"{user_path} (user) + {base.source}",
                       f"{user.error}; it was left as it is: repair it, or move it away (codekv "
                       "qualify writes a new one)")
        return cls(base.entries, base.source, user_entries=user.entries,
                   user_source=user.source)

    @classmethod
    def _load_one(cls, path: str | Path | None = None,
                  what: str = "support file") -> SupportGate:
        named, path = path, path or os.environ.get(SUPPORT_ENV)
        if path:
            source = str(path)
            where = source if named else f"${SUPPORT_ENV}={source}"
            try:
                text = read_support_text(path)
            except UnreadableSupportFile as error:
                return cls([], source, f"cannot read the {what} {where}: {error}")
        else:
            shipped = resources.files("codekv").joinpath("data", "support.json")
            if not shipped.is_file():
                return cls([], "no support file")
            text, source, where = shipped.read_text(), SHIPPED, SHIPPED
        entries, problem = _document_entries(text)
        if problem:
            return cls([], source, f"cannot read the {what} {where}: {problem}")
        return cls(entries, source)

    def pairs(self) -> list[dict]:
        """Each entry: its (engine, family, workload) pair, its verdict, what it covers and
        where its evidence and held-out confirmation came from: what ``codekv support`` shows.
        An invalid entry is listed with its ``problems`` and licenses nothing."""
        out = []
        for listed in self.listed:
            entry, said = listed.entry, listed.said
            name = (pair_name(said.family, said.workload, said.engine) if said.named
                    else f"entry {listed.number}")
            verdict = (self._invalid(f"the entry for {name}" if said.named else name,
                                     listed.problems, listed.file)
                       if entry is None else self._judged(entry, name))
            covered = Coverage.of_entry(entry) if entry else None
            if covered and listed.superseded and set(covered.models) <= set(listed.superseded):
                verdict = Verdict(False, f"superseded: the user file's entry for {name} on "
                                  "this model governs its requests")
            evidence, held_out = _runs_shown(listed)
            out.append({
                "pair": name, "engine": said.engine, "family": said.family,
                "workload": said.workload,
                # where the KV it licenses came from: the chunk store, or the last prompt
                "source": WORKLOADS[said.workload].source if said.workload in WORKLOADS
                else None,
                "supported": verdict.allowed,
                "reason": (entry.reason or verdict.reason) if verdict.allowed
                else verdict.reason,
                "problems": listed.problems,
                # the file it is in, and the models whose requests the user file's entries
                # govern instead (a shipped entry's, where the user qualified the same model)
                "file": listed.file, "user_file": listed.from_user,
                "superseded_for": listed.superseded,
                # what composes, or what passed its evidence; an invalid entry names nothing
                "method": entry.method if entry else None,
                "closest": entry.closest if entry else None,  # of a failed one
                # the gate design it was judged under
                "design": (entry.design or FIRST_DESIGN) if entry else None,
                # what it licenses: what its evidence and held-out runs both measured (the
                # evidence's alone before a confirmation); None where the entry does not say
                "covers": covered.as_json() if covered else None,
                "evidence": evidence, "held_out": held_out,
            })
        return out

    def verdict(self, family: str, workload: str, engine: str = TRANSFORMERS,
                request: GateRequest | None = None) -> Verdict:
        """The evidence for ``family`` on ``engine``: one engine's results never license another
        (entries without a ``backend`` field were measured on transformers).

        With ``request``, only an entry measured on its model licenses it, and only for the
        languages and context lengths the entry covers; without, the verdict is the pair's for
        what its entries cover.
        """
        pair = pair_name(family, workload, engine)
        if self.error:
            return Verdict(False, f"unsupported: {self.error}")
        matching = [listed for listed in self.listed
                    if (listed.said.engine, listed.said.family, listed.said.workload)
                    == (engine, family, workload)]
        if not matching:
            return Verdict(False, f"unsupported: no evidence for {pair} ({self.source})")
        others = []  # the models of entries measured on other models
        ours = []  # valid entries for this model: one per set of languages
        for listed in matching:
            models = listed.said.models
            if request is not None and models and request.fingerprint not in models:
                others.append(_models_shown(models))
                continue
            if listed.entry is None:
                return self._invalid(f"the entry for {pair}", listed.problems, listed.file)
            if request is not None and request.fingerprint in listed.superseded:
                continue  # the user file's entry for this model and these languages rules
            ours.append(listed.entry)
        if ours:
            return self._judged(_for_request(ours, request), pair, request)
        return Verdict(False, f"unsupported: the {pair} evidence is for " + "; ".join(others)
                              + f"; this model is another {family} model (fingerprint "
                              f"{request.fingerprint[:12]}): evidence licenses the model it "
                              "was measured on, not its family")

    @staticmethod
    def _judged(entry: SupportEntry, pair: str, request: GateRequest | None = None) -> Verdict:
        """A valid entry's verdict (for ``request``, when given)."""
        if entry.trial:
            return Verdict(False, f"unsupported: {pair} is from a trial run, not evidence: "
                                  + "; ".join(entry.trial))
        if not entry.passed:
            return Verdict(False, f"unsupported: {pair} failed its evaluation{_why_not(entry)}")
        if entry.design != DESIGN:
            judged = (f"the gate design {entry.design}" if entry.design
                      else "the first gate design (before designs were named)")
            return Verdict(False, f"unsupported: {pair} was judged under {judged}, not "
                                  f"{DESIGN}; it licenses nothing until re-earned ({RERUN})")
        held_out = entry.held_out
        if held_out is None or held_out.passed is None:
            return Verdict(False, f"unsupported: {pair} passed its evaluation but was "
                                  "not confirmed on held-out tasks")
        if not held_out.passed:
            return Verdict(False, f"unsupported: {pair} failed on held-out tasks"
                                  f"{_why_not(held_out)}")
        if entry.covers is None:
            return Verdict(False, f"unsupported: the entry for {pair} does not say what it "
                                  f"covers (models, languages, context lengths); {RERUN}")
        if held_out.covers is None:
            return Verdict(False, f"unsupported: the held-out run of {pair} does not say what "
                                  f"it covers; {RERUN}")
        missing = Coverage.of_entry(entry).missing(request) if request else []
        if missing:
            return Verdict(False, f"unsupported: {pair}: " + "; ".join(missing))
        return Verdict(True, "supported", entry.strategy, entry.ratio, entry.conditioning)

    @staticmethod
    def _invalid(entry: str, problems: list[str], file: str) -> Verdict:
        return Verdict(False, f"unsupported: {entry} in {file} is invalid: "
                              + "; ".join(problems))


def _listed(entries: list, file: str | None, from_user: bool) -> list[Listed]:
    """One file's entries, each read and checked, and those that could both speak for one
    request marked (``_duplicates``)."""
    listed = []
    for number, raw in enumerate(entries, 1):
        entry, wrong = checked_entry(raw)
        said = Said.of(entry) if entry else Said.written(raw)
        listed.append(Listed(raw, entry, wrong, said, file, number, from_user))
    for number, others in _duplicates(listed).items():
        listed[number].entry = None
        listed[number].problems.append(
            "it is for the same engine, model, workload, languages and context band as entr"
            + ("y " if len(others) == 1 else "ies ") + ", ".join(map(str, others))
            + ": which of them holds is unknown, so none licenses")
    return listed


def _runs_shown(listed: Listed) -> tuple[dict, dict | None]:
    """Where an entry's evidence and held-out confirmation came from, and what each measured
    and covered, as the file has them."""
    if listed.entry is None:  # invalid: what it says, as it says it
        fields = listed.raw if isinstance(listed.raw, dict) else {}
        held_out = fields.get("held_out") if isinstance(fields.get("held_out"), dict) else {}
        runs = [{"command": run.get("generated_by"), "created": run.get("created"),
                 "covers": run.get("covers"), "measured": run.get("measured") or {}}
                for run in (fields, held_out)]
        passed = held_out.get("passed")
        runs[1]["passed"] = passed if isinstance(passed, bool) else None
        return runs[0], runs[1] if held_out else None
    entry = listed.entry
    held_out = entry.held_out
    runs = [{"command": run.generated_by, "created": run.created,
             "covers": run.covers.model_dump(exclude_unset=True) if run.covers else None,
             "measured": run.measured or {}} for run in (entry, held_out or entry)]
    runs[1]["passed"] = held_out.passed if held_out else None  # None: not said
    return runs[0], (runs[1] if held_out and held_out.model_dump(exclude_unset=True)
                     else None)


def _why_not(run: SupportEntry | HeldOut) -> str:
    """What a run's closest rule missed (an entry's evidence, or its held-out run), as its
    record says (or nothing)."""
    for candidate in run.candidates or ():
        if candidate.method == run.closest and candidate.failures:
            return f" ({run.closest}: {'; '.join(map(str, candidate.failures))})"
    return ""


def _for_request(entries: list[SupportEntry], request: GateRequest | None) -> SupportEntry:
    """Of one model's entries (one per set of languages and context band), the one for
    ``request``: the one covering most of its code's languages, and of those the one measured
    on the shortest contexts that still reach the request's length (the longest where none
    does, so the verdict names what is missing)."""
    if request is None or len(entries) == 1:
        return entries[0]
    def covered(entry):
        return len(request.languages & (entry.languages or set()))
    most = max(map(covered, entries))
    fitting = [entry for entry in entries if covered(entry) == most]
    def longest(entry):
        coverage = Coverage.of_entry(entry)
        return coverage.max_tokens if coverage is not None else 0
    reaching = [entry for entry in fitting if longest(entry) >= request.context_tokens]
    return min(reaching, key=longest) if reaching else max(fitting, key=longest)


def _superseded(listed: Listed, user: list[Listed]) -> list[str]:
    """The models of a (shipped) entry whose requests an entry of the user file governs
    instead: one for the same engine, family and workload, measured on the model too, that
    speaks for the same requests (a user entry for go leaves a python entry in force, one
    measured at 2K a shipped 4K one)."""
    entry = listed.entry
    if entry is None or entry.covers is None:
        return []
    theirs = {model for other in user if other.entry and other.entry.covers is not None
              and other.entry.pair == entry.pair and other.entry.same_requests(entry)
              for model in other.entry.models}
    return [m.fingerprint for m in entry.covers.models if m.fingerprint in theirs]


def _duplicates(listed: list[Listed]) -> dict[int, list[int]]:
    """Valid entries for the same engine, family, model and workload that could speak for one
    request (``SupportEntry.same_requests``), each with the numbers of the others: a file
    holding two verdicts for one request says nothing reliable. Entries for disjoint languages
    (python, go) or context bands (2K, 4K) are one each."""
    by_key: dict[tuple, list[int]] = {}
    for number, one in enumerate(listed):
        if one.entry is not None:
            for model in one.entry.models:
                by_key.setdefault((*one.entry.pair, model), []).append(number)
    out: dict[int, list[int]] = {}
    for numbers in by_key.values():
        for number in numbers:
            clashing = [n for n in numbers if n != number
                        and listed[n].entry.same_requests(listed[number].entry)]
            if clashing:
                out.setdefault(number, [])
                out[number] += [n + 1 for n in clashing if n + 1 not in out[number]]
    return out


def _document_entries(text: str) -> tuple[list, str | None]:
    """The entries of a support file's text, or why it is not a support file."""
    if not text.strip():
        return [], "the file is empty"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        return [], f"not JSON ({error})"
    problem = SupportFile.problem(data)
    return ([], problem) if problem else (data["entries"], None)


def read_entry(raw) -> SupportEntry:
    """``raw``, an entry as the file has it, read against the gate's registries;
    ``ValidationError`` says what is wrong (``codekv.support_schema.problems``)."""
    return SupportEntry.model_validate(raw, context=NAMES)


def checked_entry(raw) -> tuple[SupportEntry | None, list[str]]:
    """One support-file entry read, and what is wrong with it in words (then no entry).

    The schema (``codekv.support_schema``) checks what each key holds; the gate checks what
    the entry licenses, on the keys that hold what they should: the rule requests compose
    with (``strategy``, ``ratio``, ``conditioning``) is a registered rule this engine runs, a
    share above 0 unless the rule is ratio-free, required once the entry licenses, and
    ``method``, the rule's label, then names that rule; and a code workload's ``covers`` name
    the languages of its tasks, no other workload's do. Problems are told in the order of
    the entry's keys.
    """
    try:
        entry = read_entry(raw)
        found, dropped = [], set()
    except ValidationError as error:
        found = located_problems(error)
        dropped = {key for key, _ in found}
        entry = _readable_part(raw, dropped)
    if entry is not None:
        found += _rule_problems(entry, dropped) + _languages_problems(entry)
    if not found:
        return entry, []
    order = {key: number for number, key in enumerate(KEYS)}
    return None, [text for _, text in sorted(found, key=lambda kv: order.get(kv[0], -1))]


def _readable_part(raw, dropped: set) -> SupportEntry | None:
    """``raw`` without the keys the schema refused, where the rest reads (what the licence
    checks can still judge of an invalid entry); None where it does not."""
    if None in dropped or not isinstance(raw, dict):
        return None
    try:
        return read_entry({key: value for key, value in raw.items() if key not in dropped})
    except ValidationError:
        return None


def entry_problems(raw) -> list[str]:
    """What is wrong with one support-file entry, in words (empty for a valid entry)."""
    return checked_entry(raw)[1]


def _rule_problems(entry: SupportEntry, dropped: set) -> list[tuple[str, str]]:
    """The rule an entry names, checked against the strategy registry and the engine (a key
    in ``dropped``, which the schema refused, is not judged again)."""
    strategy, ratio, licenses = entry.strategy, entry.ratio, entry.licenses
    problems = []
    rule = None
    if strategy is None:
        if licenses and "strategy" not in dropped:
            problems.append(("strategy", "it licenses composition but names no strategy"))
    else:
        rule = SELECTION[strategy]
        for need, what in ENGINES[entry.engine].unserved:
            if getattr(rule, need):
                problems.append(("strategy", f"strategy {strategy!r} needs {what}, which "
                                             f"{entry.engine} cannot give"))
    ratio_free = rule is not None and rule.ratio_free
    if ratio is None:
        if licenses and rule is not None and not ratio_free and "ratio" not in dropped:
            problems.append(("ratio", "it licenses composition but names no ratio for "
                                      f"{strategy!r}"))
    elif ratio == 0 and rule is not None and not ratio_free:
        problems.append(("ratio", f"ratio 0 recomputes nothing: {strategy!r} needs a share "
                                  "above 0"))
    if (licenses and entry.method is not None and rule is not None and not problems
            and not dropped):
        label = rule_label(strategy, ratio or 0.0, entry.conditioning or DEFAULT_CONDITIONING)
        if entry.method != label:
            problems.append(("method", f"method {entry.method!r} is not its rule {label!r}"))
    return problems


def _languages_problems(entry: SupportEntry) -> list[tuple[str, str]]:
    """A code workload's runs name the languages of their code tasks; no other's do."""
    problems = []
    for key, covers in (("covers", entry.covers),
                        ("held_out.covers", entry.held_out.covers if entry.held_out else None)):
        if covers is None:
            continue
        languages = covers.languages
        if entry.workload in CODE_WORKLOADS and not (
                languages and all(language in CHUNK_LANGUAGES for language in languages)):
            problems.append((key, f"{key}.languages {shown(languages)} is not a list of the "
                                  "languages of its code tasks (" + ", ".join(CHUNK_LANGUAGES)
                             + ")"))
        elif entry.workload not in CODE_WORKLOADS and languages is not None:
            problems.append((key, f"{key}.languages {shown(languages)}: {entry.workload} "
                                  "tasks hold no code"))
    return problems
