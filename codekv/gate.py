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

The file is checked against its schema when it is loaded (``entry_problems``): an entry that
does not hold what the gate reads licenses nothing, and its verdict says why. A file that cannot
be read at all licenses nothing either (``SupportGate.error``); it never silently becomes the
shipped one.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# What the schema knows of engines and workloads: their torch-free registries.
from codekv.backends.engines import ENGINES, TRANSFORMERS  # TRANSFORMERS: none named
from codekv.conditioning import CONDITIONINGS, DEFAULT_CONDITIONING
from codekv.grammars import LANGUAGES
from codekv.schema import GATE_STRATEGIES, WORKLOADS, ChunkKind, rule_label, workload_of
from codekv.selection import STRATEGIES as SELECTION

SUPPORT_ENV = "CODEKV_SUPPORT"
SHIPPED = "codekv/data/support.json"
# The workload whose tasks are code chunks: its entries name their languages.
CODE_WORKLOAD = workload_of(ChunkKind.CODE)
# What a code chunk's language can be: a grammar's name, or "text" (a file no grammar parses).
CHUNK_LANGUAGES = (*LANGUAGES, "text")
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
    def of(cls, covers: dict) -> Coverage:
        """From a valid ``covers`` block (``entry_problems`` checked it)."""
        languages = covers.get("languages")
        lengths = covers["context_tokens"]
        return cls({m["fingerprint"]: m.get("name") for m in covers["models"]},
                   None if languages is None else frozenset(languages),
                   lengths.get("min"), lengths["max"])

    def within(self, other: Coverage) -> Coverage:
        """What both runs measured: an entry licenses only what its evidence and its held-out
        tasks both covered."""
        # both None (a workload without code) or both sets: the schema checks it per workload
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
        self.entries = [*user, *base]
        self.files = [user_source] * len(user) + [source] * len(base)  # each entry's file
        self.numbers = [*range(1, len(user) + 1), *range(1, len(base) + 1)]  # in its file
        self.from_user = [True] * len(user) + [False] * len(base)
        self.source = f"{user_source} (user) + {source}" if user_source else source
        self.error = error
        self.problems = [entry_problems(entry) for entry in self.entries]
        for offset, group in ((0, user), (len(user), base)):
            problems = self.problems[offset:offset + len(group)]
            for number, others in _duplicates(group, problems).items():
                self.problems[offset + number].append(
                    "it is for the same engine, model, workload, languages and context band "
                    "as entr"
                    + ("y " if len(others) == 1 else "ies ") + ", ".join(map(str, others))
                    + ": which of them holds is unknown, so none licenses")
        self.superseded = [[] for _ in user] + [
            _superseded(entry, problems, user, self.problems[:len(user)])
            for entry, problems in zip(base, self.problems[len(user):])]

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
        for entry, problems, number, file, user_file, superseded in zip(
                self.entries, self.problems, self.numbers, self.files, self.from_user,
                self.superseded):
            fields = entry if isinstance(entry, dict) else {}
            engine = fields.get("backend", TRANSFORMERS)
            held_out = fields.get("held_out") if isinstance(fields.get("held_out"), dict) else {}
            named = isinstance(fields.get("family"), str) and isinstance(fields.get("workload"),
                                                                          str)
            name = _pair_name(fields) if named else f"entry {number}"
            verdict = (self._invalid(f"the entry for {name}" if named else name, problems,
                                     file)
                       if problems else self._judged(fields, name))
            covered = None if problems else _coverage(fields)
            if covered and superseded and set(covered.models) <= set(superseded):
                verdict = Verdict(False, f"superseded: the user file's entry for {name} on "
                                  "this model governs its requests")
            out.append({
                "pair": name, "engine": engine, "family": fields.get("family"),
                "workload": fields.get("workload"), "supported": verdict.allowed,
                "reason": (fields.get("reason") or verdict.reason) if verdict.allowed
                else verdict.reason,
                "problems": problems,
                # the file it is in, and the models whose requests the user file's entries
                # govern instead (a shipped entry's, where the user qualified the same model)
                "file": file, "user_file": user_file,
                "superseded_for": superseded,
                # what composes, or what passed its evidence; an invalid entry names nothing
                "method": None if problems else fields.get("method"),
                "closest": None if problems else fields.get("closest"),  # of a failed one
                # what it licenses: what its evidence and held-out runs both measured (the
                # evidence's alone before a confirmation); None where the entry does not say
                "covers": covered.as_json() if covered else None,
                "evidence": {"command": fields.get("generated_by"),
                             "created": fields.get("created"),
                             "covers": fields.get("covers"),
                             "measured": fields.get("measured") or {}},
                "held_out": {"command": held_out.get("generated_by"),
                             "created": held_out.get("created"),
                             "covers": held_out.get("covers"),
                             "measured": held_out.get("measured") or {}} if held_out else None,
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
        pair = _pair_name({"family": family, "workload": workload, "backend": engine})
        if self.error:
            return Verdict(False, f"unsupported: {self.error}")
        matching = [(entry, problems, file, superseded) for entry, problems, file, superseded
                    in zip(self.entries, self.problems, self.files, self.superseded)
                    if isinstance(entry, dict) and entry.get("family") == family
                    and entry.get("workload") == workload
                    and entry.get("backend", TRANSFORMERS) == engine]
        if not matching:
            return Verdict(False, f"unsupported: no evidence for {pair} ({self.source})")
        others = []  # the models of entries measured on other models
        ours = []  # valid entries for this model: one per set of languages
        for entry, problems, file, superseded in matching:
            covers = entry.get("covers")
            models = covers.get("models") if isinstance(covers, dict) else None
            if (request is not None and _models_valid(models)
                    and request.fingerprint not in {m["fingerprint"] for m in models}):
                others.append(_models_shown({m["fingerprint"]: m.get("name") for m in models}))
                continue
            if problems:
                return self._invalid(f"the entry for {pair}", problems, file)
            if request is not None and request.fingerprint in superseded:
                continue  # the user file's entry for this model and these languages rules
            ours.append(entry)
        if ours:
            return self._judged(_for_request(ours, request), pair, request)
        return Verdict(False, f"unsupported: the {pair} evidence is for " + "; ".join(others)
                              + f"; this model is another {family} model (fingerprint "
                              f"{request.fingerprint[:12]}): evidence licenses the model it "
                              "was measured on, not its family")

    @staticmethod
    def _judged(entry: dict, pair: str, request: GateRequest | None = None) -> Verdict:
        """A valid entry's verdict (for ``request``, when given)."""
        if entry.get("trial"):
            return Verdict(False, f"unsupported: {pair} is from a trial run, not evidence: "
                                  + "; ".join(entry["trial"]))
        if not entry["passed"]:
            return Verdict(False, f"unsupported: {pair} failed its evaluation{_why_not(entry)}")
        held_out = entry.get("held_out") or {}
        if "passed" not in held_out:
            return Verdict(False, f"unsupported: {pair} passed its evaluation but was "
                                  "not confirmed on held-out tasks")
        if not held_out["passed"]:
            return Verdict(False, f"unsupported: {pair} failed on held-out tasks"
                                  f"{_why_not(held_out)}")
        if entry.get("covers") is None:
            return Verdict(False, f"unsupported: the entry for {pair} does not say what it "
                                  f"covers (models, languages, context lengths); {RERUN}")
        if held_out.get("covers") is None:
            return Verdict(False, f"unsupported: the held-out run of {pair} does not say what "
                                  f"it covers; {RERUN}")
        missing = _coverage(entry).missing(request) if request else []
        if missing:
            return Verdict(False, f"unsupported: {pair}: " + "; ".join(missing))
        return Verdict(True, "supported", entry.get("strategy"), entry.get("ratio"),
                       entry.get("conditioning"))

    @staticmethod
    def _invalid(entry: str, problems: list[str], file: str) -> Verdict:
        return Verdict(False, f"unsupported: {entry} in {file} is invalid: "
                              + "; ".join(problems))


def _why_not(run: dict) -> str:
    """What a run's closest rule missed (an entry's evidence, or its held-out run), as its
    record says (or nothing)."""
    closest = run.get("closest")
    for candidate in run.get("candidates") or []:
        if (isinstance(candidate, dict) and candidate.get("method") == closest
                and candidate.get("failures")):
            return f" ({closest}: {'; '.join(map(str, candidate['failures']))})"
    return ""


def _coverage(entry: dict) -> Coverage | None:
    """What a valid entry covers: its evidence's ``covers``, narrowed to its held-out run's
    where it has one; None where the entry does not say."""
    if entry.get("covers") is None:
        return None
    covered = Coverage.of(entry["covers"])
    held_out = (entry.get("held_out") or {}).get("covers")
    return covered.within(Coverage.of(held_out)) if held_out is not None else covered


def entry_languages(entry: dict) -> frozenset[str] | None:
    """The languages an entry's evidence covers; None where it names none (a workload without
    code, or an entry that does not say what it covers): then it stands for every language."""
    covers = entry.get("covers")
    languages = covers.get("languages") if isinstance(covers, dict) else None
    return frozenset(languages) if isinstance(languages, list) else None


def languages_overlap(a: frozenset[str] | None, b: frozenset[str] | None) -> bool:
    """Whether entries covering ``a`` and ``b`` could both speak for one request."""
    return a is None or b is None or bool(a & b)


def context_band(lengths) -> int | None:
    """The context band of a run whose tasks' lengths were ``lengths`` (a ``covers``
    ``context_tokens`` block): the power of two at or above its longest task (2,048, 4,096,
    8,192 tokens); None where it does not say. Evidence at 2K and at 4K speak for different
    requests, and the passing rule may differ between them."""
    longest = lengths.get("max") if isinstance(lengths, dict) else None
    if not isinstance(longest, int) or isinstance(longest, bool) or longest < 1:
        return None
    return 1 << (longest - 1).bit_length()


def entry_band(entry: dict) -> int | None:
    """The context band an entry's evidence speaks for (``context_band``)."""
    covers = entry.get("covers")
    return context_band(covers.get("context_tokens") if isinstance(covers, dict) else None)


def same_requests(a: dict, b: dict) -> bool:
    """Whether two entries for one engine, family, workload and model could both speak for one
    request: their languages overlap and they are in one context band (an entry that does not
    say stands for every language, or every length)."""
    band_a, band_b = entry_band(a), entry_band(b)
    return (languages_overlap(entry_languages(a), entry_languages(b))
            and (band_a is None or band_b is None or band_a == band_b))


def _for_request(entries: list[dict], request: GateRequest | None) -> dict:
    """Of one model's entries (one per set of languages and context band), the one for
    ``request``: the one covering most of its code's languages, and of those the one measured
    on the shortest contexts that still reach the request's length (the longest where none
    does, so the verdict names what is missing)."""
    if request is None or len(entries) == 1:
        return entries[0]
    def covered(entry):
        return len(request.languages & (entry_languages(entry) or set()))
    most = max(map(covered, entries))
    fitting = [entry for entry in entries if covered(entry) == most]
    def longest(entry):
        coverage = _coverage(entry)
        return coverage.max_tokens if coverage is not None else 0
    reaching = [entry for entry in fitting if longest(entry) >= request.context_tokens]
    return min(reaching, key=longest) if reaching else max(fitting, key=longest)


def _superseded(entry, problems: list[str], user: list, user_problems: list[list[str]]
                ) -> list[str]:
    """The models of a (shipped) ``entry`` whose requests an entry of the user file governs
    instead: one for the same engine, family and workload, measured on the model too, that
    speaks for the same requests (a user entry for go leaves a python entry in force, one
    measured at 2K a shipped 4K one)."""
    if problems or not isinstance(entry, dict) or entry.get("covers") is None:
        return []
    key = _pair(entry)
    theirs = {m["fingerprint"] for other, wrong in zip(user, user_problems)
              if isinstance(other, dict) and not wrong and _pair(other) == key
              and other.get("covers") is not None and same_requests(other, entry)
              for m in other["covers"]["models"]}
    return [m["fingerprint"] for m in entry["covers"]["models"] if m["fingerprint"] in theirs]


def _pair(entry: dict) -> tuple:
    return entry.get("backend", TRANSFORMERS), entry.get("family"), entry.get("workload")


def _duplicates(entries: list, problems: list[list[str]]) -> dict[int, list[int]]:
    """Valid entries for the same engine, family, model and workload that could speak for one
    request (``same_requests``), each with the numbers of the others: a file holding two
    verdicts for one request says nothing reliable. Entries for disjoint languages (python, go)
    or context bands (2K, 4K) are one each."""
    by_key: dict[tuple, list[int]] = {}
    for number, (entry, wrong) in enumerate(zip(entries, problems)):
        if wrong:
            continue
        covers = entry.get("covers")
        models = ([m["fingerprint"] for m in covers["models"]] if covers is not None
                  else [entry.get("model")])
        for model in dict.fromkeys(models):
            key = (entry.get("backend", TRANSFORMERS), entry["family"], entry["workload"], model)
            by_key.setdefault(key, []).append(number)
    out: dict[int, list[int]] = {}
    for numbers in by_key.values():
        for number in numbers:
            clashing = [n for n in numbers
                        if n != number and same_requests(entries[n], entries[number])]
            if clashing:
                out.setdefault(number, [])
                out[number] += [n + 1 for n in clashing if n + 1 not in out[number]]
    return out


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
    ``covers`` and ``held_out.covers`` (what its runs measured: ``_covers_problems``);
    ``passed`` and ``held_out.passed`` (booleans); ``strategy``, ``ratio`` and ``conditioning``
    (the rule requests compose with: a registered rule this engine runs, a share above 0 unless
    the rule is ratio-free, a registered conditioning), required once the entry licenses;
    ``method``, the rule's label, must then name that rule; ``trial`` (why a ``codekv
    qualify`` run with thresholds below the gate's is no evidence: such an entry licenses
    nothing); and what ``codekv support`` shows (texts, and ``measured`` numbers that are
    finite).
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
    workload = entry.get("workload")
    problems += _covers_problems("covers", entry.get("covers"), workload)
    problems += _covers_problems("held_out.covers", held_out.get("covers"), workload)
    for key in ("model", "method", "closest", "reason", "generated_by", "created"):
        problems += _text_problem(key, entry.get(key))
    trial = entry.get("trial")  # why a run was a trial (``codekv qualify``): it licenses nothing
    if trial is not None and not (isinstance(trial, list)
                                  and all(isinstance(why, str) for why in trial)):
        problems.append(f"trial {_shown(trial)} is not a list of texts")
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
        for need, what in ENGINES[engine].unserved if engine in ENGINES else ():
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
        label = rule_label(strategy, ratio or 0.0, conditioning or DEFAULT_CONDITIONING)
        if method != label:
            problems.append(f"method {method!r} is not its rule {label!r}")
    return problems


def _covers_problems(key: str, covers, workload) -> list[str]:
    """``covers``: ``models`` (a non-empty list of ``{"fingerprint", "name"}``), ``languages``
    (a code-qa entry's: a non-empty list of chunk languages; null for other workloads),
    ``context_tokens`` (``{"min": count or null, "max": count}``) and ``source`` (a text)."""
    if covers is None:
        return []
    if not isinstance(covers, dict):
        return [f"{key} {_shown(covers)} is not an object"]
    problems = []
    models = covers.get("models")
    if not _models_valid(models):
        problems.append(f"{key}.models {_shown(models)} is not a list of models, each with a "
                        "fingerprint and a name")
    languages = covers.get("languages")
    if workload == CODE_WORKLOAD:
        if not (isinstance(languages, list) and languages
                and all(language in CHUNK_LANGUAGES for language in languages)):
            problems.append(f"{key}.languages {_shown(languages)} is not a list of the "
                            "languages of its code tasks (" + ", ".join(CHUNK_LANGUAGES) + ")")
    elif languages is not None:
        problems.append(f"{key}.languages {_shown(languages)}: {workload} tasks hold no code")
    lengths = covers.get("context_tokens")
    low, high = (lengths.get("min"), lengths.get("max")) if isinstance(lengths, dict) else (
        None, None)
    if not (_count(high) and (low is None or (_count(low) and low <= high))):
        problems.append(f"{key}.context_tokens {_shown(lengths)} is not a range of token "
                        'counts ({"min": count or null, "max": count})')
    problems += _text_problem(f"{key}.source", covers.get("source"))
    return problems


def _models_valid(models) -> bool:
    return isinstance(models, list) and bool(models) and all(
        isinstance(m, dict) and isinstance(m.get("fingerprint"), str) and m["fingerprint"]
        and isinstance(m.get("name"), str | None) for m in models)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


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
