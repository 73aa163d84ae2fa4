"""The gate's verdicts follow the thresholds on intervals, a support file keeps the entries a
run did not measure again, and held-out tasks confirm or refuse a pass."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from click.testing import CliRunner
from fixtures.checks import in_time
from fixtures.evidence import COVERS, evidence_document, fake_measure, fake_row
from fixtures.repos import HAND, indexed

from codekv.cli import main
from codekv.compose import Passage
from codekv.eval import workloads
from codekv.eval.measures import ResultRow
from codekv.eval.results import aggregate
from codekv.eval.support import (
    SupportFileError,
    Thresholds,
    confirm_entries,
    coverage,
    failures,
    gate_entries,
    read_support_document,
    support_document,
    write_json,
)
from codekv.gate import SupportGate
from codekv.support_schema import DESIGN


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """Every test here indexes with byte counting (the ``byte_counter`` fixture)."""


def test_thresholds_each_fail_a_row():
    t = Thresholds()
    assert failures(fake_row("hybrid@0.15", delta=0.03, agreement=0.95, speedup=2.0, drop=5.0),
                    t) == []  # the edit-similarity drop is reported, judged by no criterion
    # The interval's upper end decides: a mean of 0.031 is not within 0.05 at +-0.02.
    assert failures(fake_row("hybrid@0.15", delta=0.031), t) == ["delta NLL CI high 0.051 > 0.05"]
    assert failures(fake_row("hybrid@0.15", delta=-0.5), t) == []  # better than full prefill
    # Retention: the interval's lower end, over enough tasks that full prefill solves.
    assert failures(fake_row("hybrid@0.15", retention=0.9), t) == []
    assert failures(fake_row("hybrid@0.15", retention=0.89), t) == [
        "retention CI low 0.840 < 0.85"]
    assert failures(fake_row("hybrid@0.15", solved=79), t) == [
        "full prefill solves 79 tasks (need 80)"]
    assert failures(fake_row("hybrid@0.15", agreement=0.949), t) == [
        "decisive agreement 0.949 < 0.95"]
    assert failures(fake_row("hybrid@0.15", speedup=1.99), t) == ["speedup 1.99x < 2.0x"]
    # a miss that rounds to the bound is shown with the digits that make it one
    assert failures(fake_row("hybrid@0.15", speedup=1.9996), t) == ["speedup 1.9996x < 2.0x"]
    assert failures(fake_row("hybrid@0.15", agreement=0.9499), t) == [
        "decisive agreement 0.9499 < 0.95"]
    assert failures(fake_row("hybrid@0.15", tasks=199), t) == ["only 199 tasks (need 200)"]
    assert failures(fake_row("hybrid@0.15", fallbacks=1), t) == [
        "1 requests fell back to full prefill"]
    no_intervals = dataclasses.replace(fake_row("hybrid@0.15"), delta_nll_ci=None,
                                       retention_ci=None, decisive_agreement=None)
    assert failures(no_intervals, t) == ["delta NLL CI high inf > 0.05",
                                         "retention CI low -inf < 0.85",
                                         "decisive agreement n/a < 0.95"]


def test_an_entry_records_the_design_it_was_judged_under_and_only_that_design_licenses():
    document = evidence_document([fake_row("query@0.15")])
    [entry] = document["entries"]
    assert entry["design"] == DESIGN and entry["thresholds"]["min_tasks"] == 200
    confirm_entries(document, [fake_row("query@0.15")], "llama", HELD_OUT)
    gate = SupportGate(document["entries"], "t")
    assert gate.verdict("llama", "code-qa").allowed
    assert gate.pairs()[0]["design"] == DESIGN  # what `codekv support --json` shows
    for earlier in (None, "first"):  # before designs were named, or another one
        old = {**entry, "design": earlier} if earlier else {
            k: v for k, v in entry.items() if k != "design"}
        verdict = SupportGate([old], "t").verdict("llama", "code-qa")
        assert not verdict.allowed and f"not {DESIGN}; it licenses nothing until re-earned" in (
            verdict.reason)
        # ... and a held-out run never confirms it: it is re-earned from its evidence
        assert confirm_entries({"entries": [old]}, [fake_row("query@0.15")], "llama",
                               HELD_OUT) == []


def test_gate_picks_the_cheapest_passing_strategy():
    rows = [
        fake_row("full", speedup=1.0, recompute=1.0),
        fake_row("none-norope", delta=0.0),  # a baseline: never a candidate, even when it "passes"
        fake_row("none", delta=0.3, agreement=0.7, speedup=9.0),
        fake_row("boundary@0.05", agreement=0.9),
        fake_row("boundary@0.15", delta=0.01),
        fake_row("hybrid@0.1", delta=0.03, speedup=2.5),
        fake_row("anchors@0.25", delta=0.0),
    ]
    [entry] = gate_entries(rows, "llama")
    assert entry["passed"] is True
    assert (entry["strategy"], entry["ratio"], entry["method"]) == ("hybrid", 0.1, "hybrid@0.1")
    assert entry["conditioning"] == "prefix"
    assert entry["measured"]["delta_nll"] == 0.03
    assert entry["thresholds"]["min_decisive_agreement"] == 0.95
    assert [c["method"] for c in entry["candidates"]] == [
        "none", "boundary@0.05", "boundary@0.15", "hybrid@0.1", "anchors@0.25"]


def test_gate_without_a_passing_strategy_says_why_and_the_gate_refuses(tmp_path):
    rows = [
        fake_row("none", delta=0.3, workload="rag"),
        fake_row("boundary@0.15", delta=0.08, workload="rag"),
        fake_row("hybrid@0.15", delta=0.02, speedup=1.5, workload="rag"),
        fake_row("hybrid@0.15", delta=0.01, workload="tool-docs"),
    ]
    rag, tools = gate_entries(rows, "llama")
    assert rag["passed"] is False and rag["strategy"] is None
    assert rag["closest"] == "hybrid@0.15"
    assert "speedup 1.50x < 2.0x" in rag["reason"]
    assert tools["passed"] is True
    path = tmp_path / "support.json"
    write_json(path, support_document([rag, tools], "codekv eval ...", {"family": "llama"}, {}))
    gate = SupportGate.load(path)
    assert "not confirmed on held-out tasks" in gate.verdict("llama", "tool-docs").reason
    assert gate.verdict("llama", "rag").reason == ("unsupported: llama/rag failed its evaluation "
                                                   "(hybrid@0.15: speedup 1.50x < 2.0x)")
    assert not gate.verdict("llama", "code-qa").allowed  # never evaluated: no evidence
    assert not gate.verdict("gemma3", "tool-docs").allowed
    [graph] = gate_entries([fake_row("hybrid+graph@0.05")], "llama")
    assert (graph["method"], graph["strategy"], graph["conditioning"]) == (
        "hybrid+graph@0.05", "hybrid", "graph")


def test_a_new_run_keeps_the_entries_it_did_not_measure_again(tmp_path):
    """Workloads, engines and models evaluated by separate runs share one support file; each
    entry names its own command and model, and only an entry for the same engine, family,
    workload and model is replaced (the gate tells models apart by the entry's own)."""
    model = {"family": "llama", "fingerprint": "m1"}
    code, rag = gate_entries([fake_row("hybrid@0.15", delta=0.01, workload="code-qa"),
                              fake_row("none", delta=0.3, workload="rag")], "llama", model="m1")
    path = tmp_path / "support.json"
    write_json(path, support_document([code, rag], "codekv eval --workload code-qa --workload "
                                      "rag", model, {}))
    [rag_again] = gate_entries([fake_row("hybrid@0.15", delta=0.01, workload="rag")], "llama",
                               model="m1")
    merged = support_document([rag_again], "codekv eval --workload rag", model, {},
                              read_support_document(path))
    by_workload = {entry["workload"]: entry for entry in merged["entries"]}
    assert set(by_workload) == {"code-qa", "rag"} and len(merged["entries"]) == 2
    assert by_workload["code-qa"]["generated_by"] == ("codekv eval --workload code-qa "
                                                      "--workload rag")
    assert by_workload["rag"]["generated_by"] == "codekv eval --workload rag"
    assert by_workload["rag"]["passed"] is True  # the new run's verdict, not the old one
    write_json(path, merged)
    assert "passed its evaluation" in SupportGate.load(path).verdict("llama", "code-qa").reason
    # Another engine's run (its own model): every transformers entry stays as it was.
    [llama_cpp] = gate_entries([fake_row("query@0.15", delta=0.2)], "llama", model="g1",
                               engine="llama.cpp")
    both = support_document([llama_cpp], "codekv eval --backend llama.cpp", {
        "family": "llama", "fingerprint": "g1"}, {}, read_support_document(path))
    assert both["entries"][:2] == read_support_document(path)["entries"]
    assert [(e["backend"], e["workload"], e["model"]) for e in both["entries"]] == [
        ("transformers", "code-qa", "m1"), ("transformers", "rag", "m1"),
        ("llama.cpp", "code-qa", "g1")]
    assert both["model"]["fingerprint"] == "g1"  # the top level says who wrote last
    # Another model of the same engine and family: kept beside, not replacing, m1's entry.
    [rag_m2] = gate_entries([fake_row("none", delta=0.3, workload="rag")], "llama", model="m2")
    other = support_document([rag_m2], "codekv eval", {"family": "llama", "fingerprint": "m2"},
                             {}, both)
    assert [(e["backend"], e["workload"], e["model"]) for e in other["entries"]] == [
        *[(e["backend"], e["workload"], e["model"]) for e in both["entries"]],
        ("transformers", "rag", "m2")]
    problems = SupportGate(other["entries"], "t").problems
    assert not [p for ps in problems for p in ps if "same engine, model and workload" in p]


def test_an_entry_for_other_languages_is_kept_beside_this_one(tmp_path):
    """A go run adds a go entry beside the python one for the same pair and model; a second
    go run replaces the go entry only (one entry per model and set of languages)."""
    model = {"family": "llama", "fingerprint": "m1"}

    def entry(languages, delta):
        [made] = gate_entries([fake_row("query@0.15", delta=delta, workload="code-qa")], "llama")
        return {**made, "covers": {**COVERS["code-qa"], "languages": languages}}

    python = support_document([entry(["python"], 0.01)], "codekv eval --repo stdlib", model, {})
    both = support_document([entry(["go"], 0.02)], "codekv eval --language go", model, {},
                            python)
    assert [(e["covers"]["languages"], e["generated_by"]) for e in both["entries"]] == [
        (["python"], "codekv eval --repo stdlib"), (["go"], "codekv eval --language go")]
    assert SupportGate(both["entries"], "t").problems == [[], []]
    again = support_document([entry(["go"], 0.03)], "codekv eval --language go --seed 1", model,
                             {}, both)
    assert [(e["covers"]["languages"], e["measured"]["delta_nll"]) for e in again["entries"]] \
        == [(["python"], 0.01), (["go"], 0.03)]


def test_held_out_tasks_confirm_only_the_entry_for_their_languages():
    document = evidence_document([fake_row("query@0.15", workload="code-qa")])
    [python] = document["entries"]
    go = {**python, "covers": {**python["covers"], "languages": ["go"]}}
    document["entries"].append(go)
    go_run = HELD_OUT | {"covers": {"code-qa": {**COVERS["code-qa"], "languages": ["go"]}}}
    assert confirm_entries(document, [fake_row("query@0.15")], "llama", go_run) == [
        "llama/code-qa: confirmed on held-out tasks with query@0.15"]
    assert "held_out" not in python and go["held_out"]["passed"] is True
    assert go["held_out"]["covers"]["languages"] == ["go"]


def test_a_run_at_longer_contexts_is_kept_beside_the_2k_entry_and_confirmed_alone(tmp_path):
    """Evidence at 4K adds an entry beside the 2K one (one entry per context band); held-out
    tasks at 4K confirm the 4K entry only."""
    model = {"family": "llama", "fingerprint": "m1"}

    def entry(longest, delta):
        [made] = gate_entries([fake_row("query@0.15", delta=delta, workload="code-qa")], "llama",
                              model="m1")
        return {**made, "covers": {**COVERS["code-qa"],
                                   "context_tokens": {"min": longest // 2 - 80, "max": longest}}}

    at_2k = support_document([entry(1980, 0.01)], "codekv eval --context-tokens 2048", model, {})
    both = support_document([entry(4070, 0.02)], "codekv eval --context-tokens 4096", model, {},
                            at_2k)
    assert [e["covers"]["context_tokens"]["max"] for e in both["entries"]] == [1980, 4070]
    assert SupportGate(both["entries"], "t").problems == [[], []]
    run_4k = HELD_OUT | {"covers": {"code-qa": {
        **COVERS["code-qa"], "context_tokens": {"min": 1990, "max": 4081}}}}
    assert confirm_entries(both, [fake_row("query@0.15")], "llama", run_4k) == [
        "llama/code-qa: confirmed on held-out tasks with query@0.15"]
    short, long = both["entries"]
    assert "held_out" not in short and long["held_out"]["passed"] is True


HELD_OUT = {"command": "codekv eval --repo package:click ...", "engine": "transformers",
            "repos": ["package:click"], "seed": 0, "seconds": 1.0, "machine": {},
            "covers": COVERS}


def test_coverage_is_what_the_composed_tasks_measured(git_repo):
    """The model, the languages of the code in the contexts, and the shortest and longest
    context of each workload's composed tasks (references and baselines do not count)."""
    chunks = indexed(git_repo, {**HAND, "main.go": "package main\n\nfunc main() {\n}\n"}).chunks()
    go = [c for c in chunks if c.language == "go"]
    tasks = [workloads.Task("code-qa", "a", "completion", chunks, "", "", ""),
             workloads.Task("rag", "b", "quote", [Passage("text", "p")], "", "", "")]
    measures = [fake_measure("query@0.15", 0.0, 1.0, "code-qa", task="a"),
                fake_measure("none", 0.0, 1.0, "code-qa", task="a"),
                fake_measure("full", 0.0, 1.0, "code-qa", task="a"),
                fake_measure("query@0.15", 0.0, 1.0, "rag", task="b")]
    measures[1].context_tokens, measures[2].context_tokens = 1500, 4000
    assert go and {c.language for c in chunks} == {"go", "python"}
    model = {"fingerprint": "f1", "name": "a model", "family": "llama"}
    covers = coverage(measures, tasks, model)
    assert covers == {
        "code-qa": {"models": [{"fingerprint": "f1", "name": "a model"}],
                    "languages": ["go", "python"], "context_tokens": {"min": 900, "max": 1500},
                    "source": "measured: the run's composed tasks"},
        "rag": {"models": [{"fingerprint": "f1", "name": "a model"}], "languages": None,
                "context_tokens": {"min": 900, "max": 900},
                "source": "measured: the run's composed tasks"}}
    entries = [{**entry, "covers": covers[entry["workload"]]}
               for entry in gate_entries(aggregate(measures), "llama", model="f1")]
    assert SupportGate(entries, "t").problems == [[], []]  # the gate reads what eval writes


def test_coverage_counts_each_task_s_own_language(git_repo):
    """A task's language is its query's, measured per task: covered even where no context
    chunk is of that language."""
    chunks = [c for c in indexed(git_repo, HAND).chunks() if c.kind != "text"]
    task = workloads.Task("code-qa", "a", "completion", chunks, "", "", "", {"language": "go"})
    covers = coverage([fake_measure("query@0.15", 0.0, 1.0, "code-qa", task="a")], [task],
                      {"fingerprint": "f1", "name": None})
    assert covers["code-qa"]["languages"] == ["go", "python"]


def test_held_out_tasks_confirm_the_cheapest_strategy_that_passes_them_too():
    """query-cost passed the evidence and is cheaper, but misses a bound on held-out tasks;
    query passed both, so it becomes the rule (the decision session 6 made by hand)."""
    document = evidence_document([fake_row("query-cost@0.15", recompute=0.13),
                          fake_row("query@0.15", delta=0.01), fake_row("boundary@0.15", delta=0.2)])
    [entry] = document["entries"]
    assert entry["method"] == "query-cost@0.15"
    assert entry["candidates"][1]["measured"]["delta_nll"] == 0.01  # kept for every candidate
    held_out = [fake_row("query-cost@0.15", recompute=0.13, retention=0.88),
                fake_row("query@0.15"),
                fake_row("boundary@0.15")]  # boundary "passes" here, but failed its evidence
    lines = confirm_entries(document, held_out, "llama", HELD_OUT)
    assert lines == ["llama/code-qa: confirmed on held-out tasks with query@0.15"]
    assert (entry["strategy"], entry["ratio"], entry["method"]) == ("query", 0.15, "query@0.15")
    assert entry["measured"]["delta_nll"] == 0.01  # the evidence run's, for the chosen rule
    block = entry["held_out"]
    assert block["passed"] is True and block["method"] == "query@0.15"
    assert block["generated_by"] == HELD_OUT["command"] and block["repos"] == ["package:click"]
    assert [(c["method"], c["passed"]) for c in block["candidates"]] == [
        ("query-cost@0.15", False), ("query@0.15", True)]
    assert block["candidates"][0]["failures"] == ["retention CI low 0.830 < 0.85"]
    verdict = SupportGate(document["entries"], "t").verdict("llama", "code-qa")
    assert verdict.allowed and (verdict.strategy, verdict.ratio) == ("query", 0.15)


def test_held_out_tasks_that_no_candidate_passes_leave_the_pair_unsupported():
    document = evidence_document([fake_row("query@0.15"),
                                  fake_row("none", delta=0.3, workload="rag")])
    code, rag = document["entries"]
    assert confirm_entries(document, [fake_row("query@0.15", delta=0.04)], "llama", HELD_OUT) == [
        "llama/code-qa: not confirmed on held-out tasks (query@0.15: delta NLL CI high 0.060 "
        "> 0.05)"]
    assert code["passed"] is True and code["held_out"]["passed"] is False
    assert code["held_out"]["closest"] == "query@0.15"
    assert "on held-out tasks no strategy meets the thresholds" in code["reason"]
    gate = SupportGate(document["entries"], "t")
    assert gate.verdict("llama", "code-qa").reason == (
        "unsupported: llama/code-qa failed on held-out tasks (query@0.15: delta NLL CI high "
        "0.060 > 0.05)")
    assert "held_out" not in rag  # failed its evidence: nothing to confirm
    # Another family's or engine's rows confirm nothing.
    before = json.dumps(document)
    assert confirm_entries(document, [fake_row("query@0.15")], "gemma3", HELD_OUT) == []
    assert confirm_entries(document, [fake_row("query@0.15")], "llama",
                           HELD_OUT | {"engine": "llama.cpp"}) == []
    assert json.dumps(document) == before


def test_write_gate_refuses_to_replace_a_file_that_is_not_a_support_file(tmp_path):
    assert read_support_document(tmp_path / "absent.json") is None
    notes = tmp_path / "notes.json"
    for text in ("not json", '{"entries": "x"}', "[]"):
        notes.write_text(text)
        with pytest.raises(SupportFileError, match="move it away"):
            read_support_document(notes)
    result = CliRunner().invoke(main, ["eval", "--quick", "--write-gate", str(notes)])
    assert result.exit_code != 0 and "not a codekv support file" in result.output
    assert notes.read_text() == "[]"  # untouched, and refused before any model loads
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(SupportFileError, match="not a regular file .* move it away"):
        in_time(lambda: read_support_document(fifo))


def test_shipped_support_file_is_a_generated_document():
    gate = SupportGate.load()
    assert gate.source == "codekv/data/support.json"
    from importlib import resources

    data = json.loads(resources.files("codekv").joinpath("data", "support.json").read_text())
    assert data["generated_by"].startswith("codekv eval")
    for entry in data["entries"]:
        # older files stamp the command once, for every entry
        assert entry.get("generated_by", data["generated_by"]).startswith("codekv eval")
        assert set(entry) >= {"family", "workload", "passed", "strategy", "ratio", "thresholds",
                              "measured", "reason"}
        if entry.get("design") != DESIGN:  # judged by earlier criteria: it licenses nothing
            assert not gate.verdict(entry["family"], entry["workload"],
                                    entry.get("backend", "transformers")).allowed or any(
                e.get("design") == DESIGN for e in data["entries"] if e is not entry)
            continue
        measured = ResultRow.from_json(entry["measured"] | {"fallbacks": 0})
        expected = not failures(measured, Thresholds.of(entry["thresholds"])) if entry[
            "passed"] else False
        assert entry["passed"] == expected


def test_what_the_writer_writes_reads_back_whole_through_the_schema():
    """Every entry the evaluation writes (passed, failed, confirmed or not) is one the gate's
    ``SupportEntry`` reads with no problem, and reads back to exactly what was written."""
    from codekv.gate import read_entry

    document = evidence_document([fake_row("query@0.15", delta=0.01),
                                  fake_row("none", delta=0.3, workload="rag")])
    confirm_entries(document, [fake_row("query@0.15")], "llama", HELD_OUT)
    code, rag = document["entries"]
    assert code["held_out"]["passed"] is True and rag["passed"] is False
    assert SupportGate(document["entries"], "t").problems == [[], []]
    written = json.loads(json.dumps(document))
    for entry in written["entries"]:
        assert read_entry(entry).model_dump(exclude_unset=True, by_alias=True) == entry
