"""The support file's schema: what ``codekv eval --write-gate``, ``--confirm-gate`` and
``codekv qualify`` write and the gate (``codekv.gate``) reads.

One model per block of the file (``SupportFile``, ``SupportEntry``, its ``HeldOut`` run, what a
run ``Covers``), so the gate, the evaluation's writer and ``qualify`` read an entry the same
way. Names that come from the evaluation's registries (workloads, the rules the gate may
license) are checked against the ``Names`` passed as validation context (the gate passes its
registries'), so this module loads none of them; without a context they are taken as written.
A value that is not what its field holds is one problem in words (``problems``): the key, the
value as the file has it, and what it should be.

What an entry may *license* (a rule its engine runs, a ratio that rule can take, the label
that names it) and which languages its workload's tasks have are the gate's to judge, on the
keys the schema accepts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from codekv.backends.engines import ENGINES, TRANSFORMERS
from codekv.conditioning import CONDITIONINGS

# The gate design entries are judged under now (docs/semantics.md, "The gate design"): its
# criteria, margins and task counts (``codekv.eval.support.Thresholds``) were chosen together
# from measured variances before any run was judged under it. An entry judged under another
# design (or before designs were named) licenses nothing.
DESIGN = "calibrated-1"
FIRST_DESIGN = "first"  # how an entry that names no design is shown: judged before designs
MIN_TASKS = 200  # its task count: fewer tasks are not evidence (ΔNLL's power needs them)
# What a run draws to reach it and 80 solved tasks (full prefill solved 42% of code-qa tasks)
RUN_TASKS = 300


@dataclass(frozen=True)
class Names:
    """What a registry name in an entry may be: the validation context of its models."""

    workloads: tuple[str, ...]
    strategies: tuple[str, ...]  # the rules requests compose with


def shown(value) -> str:
    """A value as the file has it (NaN as NaN), cut short."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."


def _described(kind, what: str | Callable[[Any, Names | None], str],
               fits: Callable[[Any, Names | None], bool] | None = None):
    """``kind``, whose errors at its own level are one problem: the value, then ``what`` it
    should be (a text, or one made of the value and the names); ``fits``: whether a value of
    ``kind`` is one of the names it may be. A problem deeper in (a key of an object that is
    itself described) is left to say itself."""

    def check(value, handler, info: ValidationInfo):
        names = info.context if isinstance(info.context, Names) else None
        try:
            checked = handler(value)
        except ValidationError as error:
            if all(detail["type"] == SCHEMA and detail["loc"] for detail in error.errors()):
                raise
            checked = _WRONG
        if checked is _WRONG or (fits is not None and checked is not None
                                 and not fits(checked, names)):
            said = what(value, names) if callable(what) else what
            raise PydanticCustomError(SCHEMA, "{problem}",
                                      {"problem": f"{shown(value)} {said}"}) from None
        return checked

    return Annotated[kind, WrapValidator(check)]


SCHEMA = "support_schema"  # the type of the errors ``_described`` words
_WRONG = object()
REQUIRED = Field(default=None, validate_default=True)  # missing: a problem, shown as null


def _named(key: str):
    """A check that a name is one of the context's ``key`` names (any, without a context)."""
    return lambda value, names: names is None or value in getattr(names, key)


Number = StrictInt | Annotated[StrictFloat, Field(allow_inf_nan=False)]
Text = _described(StrictStr | None, "is not a text")
Count = Annotated[StrictInt, Field(gt=0)]
Flag = _described(StrictBool, "is not true or false")
# a measurement: a number (finite: JSON has no NaN), an interval (two numbers) or null
Measure = _described(
    Number | Annotated[list[Number | None], Field(min_length=2, max_length=2)] | None,
    lambda value, _: "is not a finite number" + (" or an interval of two"
                                                 if isinstance(value, list) else ""))


class _Block(BaseModel):
    # strict: a number is not a text nor true a number; other keys are kept as written
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class CoveredModel(_Block):
    fingerprint: Annotated[StrictStr, Field(min_length=1)]
    name: StrictStr | None = None


class ContextTokens(_Block):
    min: Count | None = None
    max: Count

    @model_validator(mode="after")
    def _ordered(self) -> ContextTokens:
        if self.min is not None and self.min > self.max:
            raise ValueError("min above max")
        return self


class Covers(_Block):
    """What a run measured: ``models`` (fingerprint and name), ``languages`` (a code
    workload's: the languages of its code tasks; null for other workloads), ``context_tokens``
    (the range of its tasks' lengths) and ``source`` (how it was found)."""

    models: _described(Annotated[list[CoveredModel], Field(min_length=1)],
                       "is not a list of models, each with a fingerprint and a name") = REQUIRED
    languages: _described(list[StrictStr] | None, "is not a list of languages") = None
    context_tokens: _described(ContextTokens, 'is not a range of token counts ({"min": count '
                                              'or null, "max": count})') = REQUIRED
    source: Text = None


class Candidate(_Block):
    """One rule a run judged: its label, whether it met every threshold, and why not."""

    method: StrictStr
    passed: StrictBool | None = None
    failures: list[Any] = []
    measured: dict[str, Any] | None = None


Candidates = _described(list[Candidate] | None,
                        "is not a list of candidates, each with a method")
Measured = _described(dict[str, Measure] | None, "is not an object")
Covered = _described(Covers | None, "is not an object")


class HeldOut(_Block):
    """The held-out run that confirmed (or refused) the evidence's rules (``passed`` absent:
    not yet run): what its tasks covered, the command and when, the rule that passed (or the
    closest), its measurements and every candidate's."""

    passed: Flag = None
    covers: Covered = None
    generated_by: Text = None
    created: Text = None
    method: Text = None
    closest: Text = None
    measured: Measured = None
    candidates: Candidates = None


class SupportEntry(_Block):
    """One verdict, for requests of one (engine, family, workload) on the models, languages and
    context lengths its evidence and held-out runs covered; its fields as ``HeldOut``'s for the
    evidence run, and the rule requests compose with."""

    # the engine it was measured on (the file's key is "backend"; none: transformers)
    engine: _described(StrictStr, "is not one of " + ", ".join(ENGINES),
                       fits=lambda value, _: value in ENGINES) = Field(TRANSFORMERS,
                                                                       alias="backend")
    family: _described(Annotated[StrictStr, Field(min_length=1)],
                       "is not a model family's name") = REQUIRED
    workload: _described(StrictStr, lambda _, names: "is not one of "
                         + ", ".join(names.workloads if names else ()),
                         fits=_named("workloads")) = REQUIRED
    passed: Flag = REQUIRED
    held_out: _described(HeldOut | None, "is not an object") = None
    strategy: _described(StrictStr | None, lambda _, names: "is not a rule requests compose "
                         "with; choose from " + ", ".join(names.strategies if names else ()),
                         fits=_named("strategies")) = None
    ratio: _described(Annotated[Number, Field(ge=0, le=1, allow_inf_nan=False)] | None,
                      "is not a share from 0 to 1") = None
    conditioning: _described(StrictStr | None, "is not one of " + ", ".join(CONDITIONINGS),
                             fits=lambda value, _: value in CONDITIONINGS) = None
    covers: Covered = None
    model: Text = None  # the fingerprint of the model it was measured on
    method: Text = None
    closest: Text = None
    reason: Text = None
    generated_by: Text = None
    created: Text = None
    # why a ``codekv qualify`` run was a trial (thresholds below the gate's): it licenses nothing
    trial: _described(list[StrictStr] | None, "is not a list of texts") = None
    measured: Measured = None
    candidates: Candidates = None
    # the gate design it was judged under (``DESIGN``; none: before designs, ``FIRST_DESIGN``)
    design: Text = None
    thresholds: Any = None  # what it was held to (``codekv.eval.support.Thresholds``)
    qualified_by: Text = None

    @property
    def pair(self) -> tuple[str, str, str]:
        """The requests it rules on: (engine, family, workload)."""
        return self.engine, self.family, self.workload

    @property
    def name(self) -> str:
        return pair_name(self.family, self.workload, self.engine)

    @property
    def licenses(self) -> bool:
        """Passed on its evidence and confirmed on held-out tasks."""
        return self.passed and self.held_out is not None and self.held_out.passed is True

    @property
    def models(self) -> list[str]:
        """The fingerprints of the models it was measured on (its own ``model`` where it does
        not say what it covers)."""
        if self.covers is None:
            return [self.model]
        return list(dict.fromkeys(m.fingerprint for m in self.covers.models))

    @property
    def languages(self) -> frozenset[str] | None:
        """The languages its evidence covers; None where it names none (a workload without
        code, or an entry that does not say what it covers): it stands for every language."""
        if self.covers is None or self.covers.languages is None:
            return None
        return frozenset(self.covers.languages)

    @property
    def band(self) -> int | None:
        """The context band its evidence speaks for (``context_band``)."""
        return context_band(self.covers)

    def passed_methods(self) -> list[str]:
        """The methods that met every threshold on its evidence tasks."""
        return [c.method for c in self.candidates or () if c.passed] if self.passed else []

    def same_requests(self, other: SupportEntry) -> bool:
        """Whether it and ``other`` (for one engine, family, workload and model) could both
        speak for one request: their languages overlap and they are in one context band (an
        entry that does not say stands for every language, or every length)."""
        return (languages_overlap(self.languages, other.languages)
                and (self.band is None or other.band is None or self.band == other.band))


def pair_name(family, workload, engine: str = TRANSFORMERS) -> str:
    return f"{family}/{workload}" + ("" if engine == TRANSFORMERS else f" on {engine}")


def languages_overlap(a: frozenset[str] | None, b: frozenset[str] | None) -> bool:
    """Whether entries covering ``a`` and ``b`` could both speak for one request."""
    return a is None or b is None or bool(a & b)


def context_band(covers: Covers | None) -> int | None:
    """The context band of a run that covered ``covers``: the power of two at or above its
    longest task (2,048, 4,096, 8,192 tokens); None where it does not say. Evidence at 2K and
    at 4K speak for different requests, and the passing rule may differ between them."""
    if covers is None:
        return None
    return 1 << (covers.context_tokens.max - 1).bit_length()


class SupportFile(_Block):
    """The file: its format, its entries (each checked on its own: one bad entry does not
    spoil the others) and what the run that wrote it records (command, model, settings)."""

    format: Literal[1] = 1
    entries: list[Any] = REQUIRED

    @classmethod
    def problem(cls, data) -> str | None:
        """Why ``data`` (a file's JSON) is not a support file, in words; None when it is one."""
        if not isinstance(data, dict):
            kind = JSON_TYPES.get(type(data), type(data).__name__)
            return f"it holds a JSON {kind}, not an object with an \"entries\" list"
        try:
            cls.model_validate(data)
        except ValidationError as error:
            if error.errors()[0]["loc"] == ("format",):
                return f"format {data['format']!r} is not 1, the only one this codekv reads"
            return "it has no \"entries\" list"
        return None


JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


def problems(error: ValidationError) -> list[str]:
    """Each of ``error``'s problems in words: where it is (``held_out.covers.models``), the
    value the file has there and what it should be."""
    return [text for _, text in located_problems(error)]


def located_problems(error: ValidationError) -> list[tuple[str | None, str]]:
    """``problems``, each with the top-level key it is under (None: not an object)."""
    out = []
    for detail in error.errors():
        loc = detail["loc"]
        if not loc:
            out.append((None, f"an entry must be an object, not {shown(detail['input'])}"))
            continue
        said = (detail["msg"] if detail["type"] == SCHEMA
                else f"{shown(detail['input'])} {detail['msg']}")
        out.append((str(loc[0]), f"{'.'.join(map(str, loc))} {said}"))
    return out


# The keys of an entry in the order its problems are told (the file's keys).
KEYS = [field.alias or name for name, field in SupportEntry.model_fields.items()]
