"""The support file's schema: each problem in words at its key, registry names checked only
against the names a reader passes, and the shipped file read whole without loading the
evaluation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from codekv.support_schema import Names, SupportEntry, SupportFile, context_band, problems

SHIPPED = Path(__file__).parent.parent / "codekv" / "data" / "support.json"
NAMES = Names(workloads=("code-qa", "rag"), strategies=("query", "boundary"))
COVERS = {"models": [{"fingerprint": "m1", "name": None}], "languages": ["python"],
          "context_tokens": {"min": None, "max": 2048}}
ENTRY = {"family": "llama", "workload": "code-qa", "passed": True, "strategy": "query",
         "ratio": 0.15, "covers": COVERS, "held_out": {"passed": True, "covers": COVERS}}


def _problems(raw, names=NAMES) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        SupportEntry.model_validate(raw, context=names)
    return problems(caught.value)


def test_every_problem_is_named_at_its_key_with_the_value_the_file_has():
    assert _problems({**ENTRY, "ratio": float("nan"), "measured": {"kl": [1, 2, 3]},
                      "held_out": {"covers": {**COVERS, "models": [{"fingerprint": ""}]}}}) == [
        'held_out.covers.models [{"fingerprint": ""}] is not a list of models, each with a '
        "fingerprint and a name",
        "ratio NaN is not a share from 0 to 1",
        "measured.kl [1, 2, 3] is not a finite number or an interval of two"]
    # a missing key that must be there reads as null, like the key set to null
    assert _problems({"workload": "rag"}) == ["family null is not a model family's name",
                                              "passed null is not true or false"]
    assert _problems("entry") == ['an entry must be an object, not "entry"']
    assert _problems({**ENTRY, "candidates": [{"passed": True}]}) == [
        'candidates [{"passed": true}] is not a list of candidates, each with a method']


def test_registry_names_are_checked_against_the_names_passed():
    strategy = {**ENTRY, "strategy": "deviation", "workload": "tool-docs"}
    assert _problems(strategy) == [
        'workload "tool-docs" is not one of code-qa, rag',
        'strategy "deviation" is not a rule requests compose with; choose from query, boundary']
    assert SupportEntry.model_validate(strategy).strategy == "deviation"  # no names: as written
    assert _problems({**ENTRY, "backend": "vllm"}, None) == [
        'backend "vllm" is not one of transformers, llama.cpp, openvino']  # engines: known


def test_an_entry_says_which_requests_it_speaks_for():
    entry = SupportEntry.model_validate(ENTRY, context=NAMES)
    assert entry.pair == ("transformers", "llama", "code-qa") and entry.licenses
    assert entry.models == ["m1"] and entry.languages == {"python"} and entry.band == 2048
    at_4k = SupportEntry.model_validate({**ENTRY, "covers": {
        **COVERS, "context_tokens": {"min": 1950, "max": 4090}}})
    go = SupportEntry.model_validate({**ENTRY, "covers": {**COVERS, "languages": ["go"]}})
    unsaid = SupportEntry.model_validate({**ENTRY, "covers": None, "model": "m2"})
    assert at_4k.band == 4096 and not entry.same_requests(at_4k) and not entry.same_requests(go)
    assert unsaid.models == ["m2"] and entry.same_requests(unsaid)  # says nothing: all
    assert [context_band(SupportEntry.model_validate({**ENTRY, "covers": {
        **COVERS, "context_tokens": {"max": n}}}).covers) for n in (1, 2048, 2049)] == [
        1, 2048, 4096]
    unconfirmed = SupportEntry.model_validate({**ENTRY, "held_out": {}})
    assert not unconfirmed.licenses and unconfirmed.held_out.passed is None


def test_the_shipped_file_reads_whole_and_keeps_every_key_it_has():
    data = json.loads(SHIPPED.read_text())
    assert SupportFile.problem(data) is None
    for raw in data["entries"]:
        entry = SupportEntry.model_validate(raw)  # no names: tool-docs is not in NAMES
        assert entry.model_dump(exclude_unset=True, by_alias=True) == raw


@pytest.mark.parametrize(("data", "why"), [
    ([], 'it holds a JSON array, not an object with an "entries" list'),
    ({"entries": {}}, 'it has no "entries" list'),
    ({"format": 2, "entries": []}, "format 2 is not 1, the only one this codekv reads"),
])
def test_a_file_that_is_not_a_support_file_says_why(data, why):
    assert SupportFile.problem(data) == why


def test_the_schema_loads_neither_the_evaluation_nor_torch():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, codekv.support_schema; print(' '.join(sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert not [m for m in loaded if m.startswith("codekv.eval") or m.split(".")[0] == "torch"]
