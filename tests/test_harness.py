"""The evaluation harness: tasks split between repositories, and the baselines it skips
with a note saying why."""

from __future__ import annotations

import pytest
from fixtures.evidence import fake_measure
from fixtures.repos import STDLIB_FILES, indexed

from codekv.eval import pruning, workloads
from codekv.stdlib_repo import stdlib_dir


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """Every test here indexes with byte counting (the ``byte_counter`` fixture)."""


def test_without_kvpress_pruning_is_skipped_with_a_note(tiny_backend, monkeypatch):
    monkeypatch.setattr(pruning, "load", lambda: None)
    assert "kvpress is not installed" in pruning.unavailable(tiny_backend("llama"))


def test_code_qa_tasks_are_split_between_repositories(tmp_path, byte_counter):
    from fixtures.repos import GitRepo

    from codekv.eval.harness import EvalConfig, _tasks

    indexes = {}
    for name in ("first", "second"):
        repo = GitRepo(tmp_path / name)
        indexes[name] = indexed(repo, {f: (stdlib_dir() / f).read_bytes() for f in STDLIB_FILES})
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


def test_baselines_without_a_system_prompt_are_skipped_with_one(tiny_backend):
    from codekv.eval.harness import EvalConfig, _runners

    notes = []
    kinds = _runners(EvalConfig(pruning=("snapkv",), peers=()), tiny_backend("llama"), [], notes)
    assert [type(r).__name__ for r in kinds] == ["Composition", "Reordered"]
    assert "--prefix none" in notes[0]


def test_a_context_past_the_models_positions_is_refused_before_any_prefill(tiny_backend,
                                                                           monkeypatch):
    """The positions a model's files declare may be unreadable: the check after loading
    counts the system prompt too."""
    from codekv.eval.harness import AGENT_PROMPT, EvalConfig, evaluate
    from codekv.eval.preflight import EvalOptionError

    backend = tiny_backend("llama")  # 256 positions

    def prefill(*args, **kwargs):
        raise AssertionError("prefill ran")

    monkeypatch.setattr(backend, "full_prefill", prefill)
    prompt = len(backend.tokenize(AGENT_PROMPT))
    config = EvalConfig(workloads=("tool-docs",), repos=("stdlib-quick",), tasks=1,
                        context_tokens=200, max_query_tokens=16)
    with pytest.raises(EvalOptionError) as refused:
        evaluate(config, backend)
    assert str(refused.value) == (
        f"--context-tokens 200 is too long for the model: a request adds a {prompt}-token "
        "system prompt, a query of up to 16 tokens and an answer of up to 32, and the model "
        f"has 256 positions; expected --context-tokens of at most {256 - prompt - 16 - 32}")


def test_a_workload_without_any_task_is_refused(tiny_backend, monkeypatch):
    """No tool fits half of a 40-token context: nothing would be measured."""
    from codekv.eval.harness import EvalConfig, evaluate
    from codekv.eval.preflight import EvalOptionError

    backend = tiny_backend("llama")
    config = EvalConfig(workloads=("tool-docs",), repos=("stdlib-quick",), tasks=2,
                        context_tokens=40, max_query_tokens=16, prefix="")
    with pytest.raises(EvalOptionError, match="^tool-docs: no task could be made from "
                                              "stdlib-quick with "
                                              "--context-tokens 40; expected"):
        evaluate(config, backend)


def _solving(n: int, solved: int, workload: str = "code-qa") -> list:
    return [fake_measure("full", 0.0, 4.0, workload, f"t{i}", "full-prefill",
                         100.0 if i < solved else 50.0) for i in range(n)]


@pytest.mark.parametrize(("seen", "solved", "tasks", "says"), [
    (49, 5, 300, None),  # too few seen to project
    (50, 14, 300, None),  # 84 projected: enough
    (73, 14, 300, "solved 14 of the first 73 tasks; at that rate 300 tasks hold about 57 "
                  "solved ones, fewer than the 80 the retention bound needs. Stop and run the "
                  "same command with --tasks 510"),
    (50, 0, 300, "solved none of the first 50 tasks"),
])
def test_a_run_on_course_to_too_few_solved_tasks_says_so_early(seen, solved, tasks, says):
    """The verdict would refuse the run hours later (``full prefill solves N tasks``); the
    projection says how many tasks would do, once the rate has 50 tasks behind it."""
    from codekv.eval.harness import EvalConfig, _too_few_solved

    config = EvalConfig(workloads=("code-qa", "rag"), tasks=tasks)
    told = _too_few_solved(config, _solving(seen, solved) + _solving(seen, seen, "rag"))
    assert "rag" not in told  # judged per workload: rag's full prefill solves them all
    if says is None:
        assert "code-qa" not in told
    else:
        assert says in told["code-qa"]


def test_the_projection_is_told_once_while_the_run_goes_on(tiny_backend, tmp_path, monkeypatch):
    from codekv.compose import Passage
    from codekv.eval import harness, runner
    from codekv.eval.methods import Method

    monkeypatch.setattr(harness, "PROJECTED_AFTER", 1)
    quote = Passage("def area(w, h):\n    return w * h\n", "a")
    tasks = [workloads.Task("rag", f"t{i}", "quote", [quote], "def area(", " w, h)", "a")
             for i in range(2)]
    told = []
    harness._measure(harness.EvalConfig(workloads=("rag",), tasks=2, store=str(tmp_path)),
                     tiny_backend("llama"), {}, tasks, [runner.Composition([Method("none")])],
                     [], None, told.append)
    assert told == ["rag: full prefill solved none of the first 1 tasks, so retention cannot "
                    "be judged: the model cannot do them"]


def test_the_run_s_temporary_store_is_bounded_like_the_default_one(tiny_backend, monkeypatch):
    """500 tasks at 8K would otherwise keep ~150 GB of chunk KV that no later task reads."""
    from codekv import paths
    from codekv.compose import Passage
    from codekv.eval import harness, runner
    from codekv.eval.methods import Method
    from codekv.stores.local import LocalKVStore

    monkeypatch.setenv(paths.KV_MAX_BYTES_ENV, "123456")
    opened = []
    init = LocalKVStore.__init__

    def spy(self, root, max_bytes=None):
        opened.append(max_bytes)
        init(self, root, max_bytes)

    monkeypatch.setattr(LocalKVStore, "__init__", spy)
    task = workloads.Task("rag", "t0", "quote", [Passage("def area(w, h):\n", "a")],
                          "def area(", " w, h)", "a")
    harness._measure(harness.EvalConfig(workloads=("rag",), tasks=1), tiny_backend("llama"),
                     {}, [task], [runner.Composition([Method("none")])], [], None)
    assert opened == [123456]
