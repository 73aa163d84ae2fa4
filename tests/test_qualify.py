"""``codekv qualify``: evidence and held-out tasks from disjoint code, the user support file
(written whole, read by the gate), a resumed run, and trial runs that license nothing."""

from __future__ import annotations

import json
import os
import stat

import pygit2
import pytest
from click.testing import CliRunner
from fixtures.models import tiny_model, tiny_tokenizer
from fixtures.repos import STDLIB_FILES, GitRepo

from codekv import paths
from codekv.cli import main
from codekv.eval import qualify
from codekv.eval.support import Thresholds
from codekv.gate import GateRequest, SupportGate

# Real code, in two directories: held out by path, or split by the hash of each path.
FILES = {f"{'lib' if i % 2 else 'tools'}/{name}": name
         for i, name in enumerate((*STDLIB_FILES, "textwrap.py", "string.py", "shutil.py"))}
# Held to nothing but the task count: the tiny model passes them, so the held-out run runs.
LAX = Thresholds(min_tasks=2, max_delta_nll_high=1e3, min_retention_low=0.0, min_solved=0,
                 min_decisive_agreement=0.0, min_speedup=0.0)
GRID = ("none", "boundary@0.15")


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """Index with byte counting (the ``byte_counter`` fixture)."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random-weight Llama with room for 1,024-token contexts and peaked logits (so greedy
    positions are decisive, not near-ties)."""
    path = tmp_path_factory.mktemp("qualify-model")
    tiny_model("llama", max_position_embeddings=4096, initializer_range=1.0).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def repo(tmp_path) -> GitRepo:
    from codekv.stdlib_repo import stdlib_dir

    made = GitRepo(tmp_path / "mine")
    made.commit({path: (stdlib_dir() / name).read_bytes() for path, name in FILES.items()})
    return made


def _files(root) -> set[str]:
    """The files committed at HEAD of the repository at ``root``."""
    tree = pygit2.Repository(str(root)).head.peel(pygit2.Commit).tree
    out = set()

    def walk(tree, prefix):
        for entry in tree:
            if entry.type == pygit2.GIT_OBJECT_TREE:
                walk(entry, f"{prefix}{entry.name}/")
            else:
                out.add(prefix + entry.name)

    walk(tree, "")
    return out


def test_held_out_files_are_disjoint_from_the_evidence_files(repo):
    by_hash = qualify.sides(qualify.QualifyOptions(repos=(str(repo.root),)))
    [evidence], [held_out] = by_hash.evidence, by_hash.held_out
    assert _files(evidence) and _files(held_out)
    assert _files(evidence) & _files(held_out) == set()
    assert _files(evidence) | _files(held_out) == set(FILES)
    # the same split every time (the checkpoints' key depends on it)
    assert qualify.sides(qualify.QualifyOptions(repos=(str(repo.root),))) == by_hash
    by_path = qualify.sides(qualify.QualifyOptions(repos=(str(repo.root),),
                                                   held_out_paths=("tools",)))
    assert _files(by_path.held_out[0]) == {p for p in FILES if p.startswith("tools/")}
    assert _files(by_path.evidence[0]) == {p for p in FILES if p.startswith("lib/")}
    assert _files(qualify.sides(qualify.QualifyOptions(
        repos=(str(repo.root),), held_out_paths=("*/glob.py",))).held_out[0]) == {"tools/glob.py"}


@pytest.mark.parametrize(("options", "why"), [
    (dict(held_out_paths=("*.py",)), r"leaves no code file on the evidence side \(of 8\)"),
    (dict(held_out_paths=("docs",)), "leaves no code file on the held-out side"),
    (dict(held_out_repos=("SAME",)), "is both a --repo and a --held-out-repo"),
    (dict(held_out_repos=("SAME",), held_out_paths=("tools",)), "give one of them"),
    (dict(held_out_repos=("COPY",)), "the held-out repositories hold 8 code files the "
                                     "evidence repositories hold too, such as "),
])
def test_held_out_tasks_that_would_not_be_held_out_are_refused(repo, options, why):
    copy = GitRepo(repo.root.parent / "copy")  # the same files: a fork holds the same code
    copy.commit({path: (repo.root / path).read_bytes() for path in FILES})
    named = {"SAME": str(repo.root / "lib"), "COPY": str(copy.root)}
    options = {key: tuple(named.get(v, v) for v in value) for key, value in options.items()}
    with pytest.raises(qualify.QualifyError, match=why):
        qualify.sides(qualify.QualifyOptions(repos=(str(repo.root),), **options))
    with pytest.raises(qualify.QualifyError, match="is not inside a git repository"):
        qualify.sides(qualify.QualifyOptions(repos=(str(repo.root.parent),)))


def test_a_trial_run_is_confirmed_on_held_out_tasks_and_licenses_nothing(repo, model_dir,
                                                                         monkeypatch):
    import codekv.eval.runner

    options = qualify.QualifyOptions(repos=(str(repo.root),), held_out_paths=("tools",),
                                     model=str(model_dir), tasks=2, context_tokens=1024,
                                     strategies=GRID, thresholds=LAX)
    outcome = qualify.run(options, "codekv qualify ...")
    [entry] = outcome.entries
    assert entry["passed"] is False and entry["held_out"]["passed"] is True  # confirmed...
    assert entry["trial"] == ["max_delta_nll_high 1000 is above the gate's 0.05",
                              "min_retention_low 0 is below the gate's 0.85",
                              "min_solved 0 is below the gate's 80",
                              "min_decisive_agreement 0 is below the gate's 0.95",
                              "min_speedup 0 is below the gate's 2",
                              "--min-tasks 2 is below the gate's 200"]
    assert entry["held_out"]["repos"] == list(outcome.sides.held_out)
    assert "--seed 0 " in entry["generated_by"] and "--seed 1 " in entry["held_out"][
        "generated_by"]  # the eval commands that reproduce each run
    assert entry["qualified_by"] == "codekv qualify ..."
    # ... and written to the user file, whole, owner-only; the gate reads it and refuses
    user_file = paths.user_support_file()
    assert outcome.user_file == user_file
    assert stat.S_IMODE(user_file.stat().st_mode) == 0o600
    assert json.loads(user_file.read_text())["entries"] == [entry]
    fingerprint = outcome.model["fingerprint"]
    verdict = SupportGate.load().verdict("llama", "code-qa", request=GateRequest(
        fingerprint, frozenset({"python"}), 600))
    assert not verdict.allowed
    assert verdict.reason.startswith("unsupported: llama/code-qa is from a trial run, not "
                                     "evidence: max_delta_nll_high 1000 is above")
    # Run again: every task comes from the checkpoints, none is measured again.
    measured = []
    real = codekv.eval.runner.run_task
    monkeypatch.setattr(codekv.eval.runner, "run_task",
                        lambda *args, **kwargs: measured.append(args[1].id) or real(*args,
                                                                                      **kwargs))
    again = qualify.run(options, "codekv qualify ...")
    assert measured == []
    assert again.evidence.resumed_tasks == 2 and again.held_out.resumed_tasks == 2
    assert again.workdir == outcome.workdir
    assert [e["held_out"]["measured"] for e in again.entries] == [
        entry["held_out"]["measured"]]
    # More tasks (full prefill solved too few): the same qualification, the finished ones kept.
    more = qualify.run(qualify.QualifyOptions(**{**vars(options), "tasks": 3}), "codekv ...")
    assert more.workdir == outcome.workdir and more.evidence.resumed_tasks == 2
    assert measured == [task.id for task in more.evidence.tasks[2:] + more.held_out.tasks[2:]]
    measured.clear()
    # Other settings are another qualification: its own checkpoints, measured afresh.
    other = qualify.run(qualify.QualifyOptions(**{**vars(options), "seed": 5}), "codekv ...")
    assert other.workdir != outcome.workdir and set(measured) == {
        task.id for task in other.evidence.tasks + other.held_out.tasks}


@pytest.mark.llamacpp
def test_a_model_on_llama_cpp_is_qualified_for_llama_cpp_only(repo, tiny_gguf):
    options = qualify.QualifyOptions(repos=(str(repo.root),), held_out_paths=("tools",),
                                     model=str(tiny_gguf), engine="llama.cpp", tasks=2,
                                     context_tokens=512, strategies=("none",), thresholds=LAX)
    outcome = qualify.run(options, "codekv qualify --backend llama.cpp ...")
    [entry] = outcome.entries
    assert (entry["backend"], entry["trial"][-1]) == ("llama.cpp",
                                                      "--min-tasks 2 is below the gate's 200")
    assert outcome.model["engine"] == "llama.cpp"
    asked = GateRequest(outcome.model["fingerprint"], frozenset({"python"}), 200)
    gate = SupportGate.load()
    assert gate.verdict("llama", "code-qa", "llama.cpp", asked).reason.startswith(
        "unsupported: llama/code-qa on llama.cpp is from a trial run, not evidence")
    assert "the llama/code-qa evidence is for SmolLM2" in gate.verdict(
        "llama", "code-qa", request=asked).reason  # transformers: the shipped entry's model


def test_the_user_file_is_replaced_whole_and_keeps_other_models_entries(monkeypatch):
    def entry(fingerprint, method, languages=("python",)):
        return {"family": "llama", "workload": "code-qa", "passed": False, "method": method,
                "covers": {"models": [{"fingerprint": fingerprint, "name": None}],
                           "languages": list(languages),
                           "context_tokens": {"min": None, "max": 2048}}}

    path = paths.user_support_file()
    qualify.install(path, [entry("a", "none"), entry("b", "none"), entry("a", "none", ["go"])])
    qualify.install(path, [entry("a", "boundary@0.15", ["python", "rust"])])
    assert [(e["covers"]["models"][0]["fingerprint"], e["method"], e["covers"]["languages"])
            for e in json.loads(path.read_text())["entries"]] == [
        ("b", "none", ["python"]), ("a", "none", ["go"]),  # another model; other languages
        ("a", "boundary@0.15", ["python", "rust"])]
    before = path.read_bytes()

    def interrupted(source, target):
        raise OSError("interrupted")

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(OSError, match="interrupted"):
        qualify.install(path, [entry("a", "query@0.15")])
    assert path.read_bytes() == before  # never half a file
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


def test_qualify_from_the_command_line(repo, model_dir, tmp_path):
    """A trial on the tiny model end to end: the estimate, the summary, the user file that
    ``codekv support`` lists; then what it refuses, each before the model loads."""
    args = ["qualify", "--model", str(model_dir), "--repo", str(repo.root), "--held-out-path",
            "tools", "--tasks", "2", "--min-tasks", "2", "--context-tokens", "1024",
            "--strategies", ",".join(GRID), "--language", "python"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "Estimate from the first task measured" in result.stderr
    out = " ".join(result.stdout.split())
    assert "rules none, boundary@0.15: up to 8 requests" in out
    assert "llama/code-qa: each rule's 95% intervals over the tasks" in out
    assert "evidence (held-out tasks from the files matching tools):" in out
    assert "the entry covers: " + str(model_dir) in out and "; python code; contexts " in out
    assert "TRIAL RUN, NOT EVIDENCE (--min-tasks 2 is below the gate's 200)" in out
    assert "the gate now: falls back to full prefill (unsupported: llama/code-qa is from a " in out
    [entry] = json.loads(paths.user_support_file().read_text())["entries"]
    assert entry["qualified_by"] == (f"codekv qualify --model {model_dir} --repo {repo.root} "
                                     "--held-out-path tools --workload code-qa --language "
                                     "python --tasks 2 "
                                     "--context-tokens 1024 --strategies none,boundary@0.15 "
                                     "--min-tasks 2")
    assert entry["generated_by"].startswith("codekv eval --repo ")  # what reproduces each run
    assert " --language python " in entry["generated_by"]
    assert "--seed 0 " in entry["generated_by"] and "held_out" not in entry  # nothing passed
    listed = json.loads(CliRunner().invoke(main, ["support", "--json"]).stdout)
    [mine] = [pair for pair in listed["pairs"] if pair["user_file"]]
    assert mine["file"] == str(paths.user_support_file()) and mine["supported"] is False
    assert mine["covers"]["models"][0]["name"] == str(model_dir)
    # Refused: tasks the thresholds cannot count as evidence; too little code; a corrupt file.
    fewer = CliRunner().invoke(main, [*args, "--min-tasks", "100"])
    assert fewer.exit_code == 1 and "--tasks 2 is below --min-tasks 100" in fewer.output
    thin = CliRunner().invoke(main, [*args, "--min-tasks", "300", "--tasks", "300",
                                     "--context-tokens", "2048"])
    assert thin.exit_code == 1 and "code-qa: the evidence side gives only " in thin.output
    assert "the thresholds need 300 (--min-tasks)" in thin.output
    user_file = paths.user_support_file()
    user_file.write_text("[]")
    corrupt = CliRunner().invoke(main, args)
    assert corrupt.exit_code == 1 and f"cannot read the user support file {user_file}" in (
        corrupt.output)
    assert "it was left as it is" in corrupt.output and user_file.read_text() == "[]"
    assert "Traceback" not in corrupt.output + fewer.output + thin.output


def qualify_shipped():
    from pathlib import Path

    return Path(qualify.__file__).parent.parent / "data" / "support.json"


def test_the_default_grid_is_what_passed_or_came_closest_plus_baselines():
    shipped = [listed.entry for listed in SupportGate.load(qualify_shipped()).listed]
    code = [entry for entry in shipped if entry.workload == "code-qa"]
    # What passed its evidence (docs/results.md): SmolLM2's query-deep@0.3 and @0.35 (only
    # @0.35 confirmed held out), Gemma 3's query@0.25 and query-deep@0.35 on transformers.
    passed = {method for entry in code for method in entry.passed_methods()}
    assert passed == {"query-deep@0.3", "query-deep@0.35", "query@0.25"}
    closest = {entry.closest for entry in code if entry.closest}
    assert "query@0.25" in closest  # llama.cpp, OpenVINO, 8K (Go, TypeScript, 4K: query-deep)
    grid = qualify.default_grid(("code-qa",))
    assert grid[:2] == ("none", "boundary@0.15")
    assert set(grid[2:]) == (closest | passed) - set(grid[:2])
    # Passages passed with query-deep@0.35; tool docs came closest with it.
    for workload in ("rag", "tool-docs"):
        assert qualify.default_grid((workload,)) == (*qualify.BASELINE_RULES, "query-deep@0.35")
    assert qualify.laxer(Thresholds()) == []


def test_the_time_left_counts_only_requests_measured_in_this_session():
    from codekv.eval.qualify_command import Estimate, duration

    now = [0.0]
    estimate = Estimate(clock=lambda: now[0])
    assert estimate.left(10) is None  # nothing measured yet: no figure
    estimate.step("Evaluating", 0)
    now[0] = 0.5
    estimate.step("code-qa-0-0 (from the checkpoint)", 4)  # read back: took no time
    now[0] = 6.5
    estimate.step("code-qa-0-1", 2)  # 6 s for 2 requests (and the task's full prefill)
    now[0] = 7.0
    estimate.step("code-qa-0-1 done in 6.5s", 0)
    now[0] = 10.0
    estimate.step("code-qa-0-2", 1)
    assert estimate.left(10) == pytest.approx(30.0)  # 9 s for 3 requests
    now[0] = 100.0  # indexing, task generation: not a request's cost
    estimate.step("Evaluating", 0)
    now[0] = 103.0
    estimate.step("code-qa-1-0", 1)
    assert estimate.left(4) == pytest.approx(12.0)
    assert [duration(s) for s in (None, 42, 150, 7200)] == ["estimating", "42s", "2m", "2h00m"]
