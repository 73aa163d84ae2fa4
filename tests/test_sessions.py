"""The agent-session workload: calls of aider-style sessions, answered from the files they
re-send, and served by the server's own pipeline against full prefill of the same tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fixtures.repos import STDLIB_FILES, indexed

from codekv.eval import sessions
from codekv.eval.workloads import approx_tokens


@pytest.fixture
def stdlib_files(git_repo, byte_counter):
    from codekv.stdlib_repo import stdlib_dir

    return indexed(git_repo, {name: (stdlib_dir() / name).read_bytes()
                              for name in STDLIB_FILES})


def test_a_task_is_a_later_call_of_a_session_answered_from_the_files_it_resends(stdlib_files):
    tasks = sessions.agent_session_tasks(12, 0, 8192, approx_tokens, stdlib_files, 256)
    assert len(tasks) == 12
    for task in tasks:
        call = task.calls[-1]
        assert task.meta["call"] >= 1 and len(task.calls) == task.meta["call"] + 1
        assert call.partial == task.query
        assert task.query.startswith(sessions.reply_start(task.source, task.meta["function"]))
        quoted = task.query.removeprefix(sessions.reply_start(task.source,
                                                              task.meta["function"]))
        files = next(m["content"] for m in call.messages
                     if m["content"].startswith(sessions.FILES_LEAD))
        # The reply quotes the file as this call re-sends it, and the answer is its next line.
        assert quoted + task.answer in files and task.answer.startswith("\n")
        assert task.answer.count("\n") == 1 and len(task.answer.strip()) >= 8
        assert task.calls[0].partial == ""  # the session's first call is served, not a task
        assert approx_tokens("".join(m["content"] for m in call.messages)) < 8192
    by_session: dict[str, list] = {}
    for task in tasks:
        by_session.setdefault(task.meta["session"], []).append(task)
    assert any(len(group) > 1 for group in by_session.values())
    for group in by_session.values():  # later calls follow the same earlier ones
        for earlier, later in zip(group, group[1:]):
            assert later.calls[:len(earlier.calls)] == earlier.calls


def test_every_other_session_opens_with_a_header_that_changes_on_each_call(stdlib_files):
    tasks = sessions.agent_session_tasks(12, 0, 8192, approx_tokens, stdlib_files, 256)
    volatile = [t for t in tasks if t.meta["volatile"]]
    assert volatile and len(volatile) < len(tasks)
    for task in tasks:
        systems = [call.messages[0]["content"] for call in task.calls]
        assert all(s.endswith(sessions.AIDER_STYLE_SYSTEM) for s in systems)
        # A volatile session's calls share no exact prefix beyond the header's first words.
        assert len(set(systems)) == (len(systems) if task.meta["volatile"] else 1)


def test_sessions_are_drawn_again_from_the_seed(stdlib_files):
    def drawn(seed):
        return [(t.id, t.query, t.answer) for t in
                sessions.agent_session_tasks(6, seed, 8192, approx_tokens, stdlib_files, 256)]

    assert drawn(0) == drawn(0) and drawn(0) != drawn(1)
    assert sessions.agent_session_tasks(6, 0, 8192, approx_tokens, stdlib_files, 256,
                                        languages=("go",)) == []


FILE_A = "def area(width, height):\n    return width * height  # in square units\n"
FILE_B = "def perimeter(width, height):\n    return 2 * (width + height)  # around it\n"


def session_task(workload="agent-session", systems=("You edit code.", "You edit code.")):
    """Two calls of a session by hand: a new turn goes in before the files it re-sends (and
    the system message changes as ``systems`` say)."""
    from codekv.eval.workloads import Task

    files = sessions.FILES_LEAD + f"a.py\n````\n{FILE_A}````\n\nb.py\n````\n{FILE_B}````\n"
    first = [{"role": "system", "content": systems[0]},
             {"role": "user", "content": files},
             {"role": "user", "content": "Add a docstring to area."}]
    second = [{"role": "system", "content": systems[1]},
              {"role": "user", "content": "Add a docstring to area."},
              {"role": "assistant", "content": "Done."}, *first[1:2],
              {"role": "user", "content": "Now rename perimeter."}]
    partial = sessions.reply_start("b.py", "perimeter") + "def perimeter(width, height):"
    calls = [sessions.SessionPrompt(first), sessions.SessionPrompt(second, partial)]
    return Task(workload, "t-1", "recall", [], partial,
                "\n    return 2 * (width + height)  # around it", "b.py",
                {"session": "s", "call": 1, "language": "python"}, calls=calls)


def test_served_calls_compose_from_the_last_prompt_and_all_is_full_prefill(tiny_model_dir,
                                                                           tmp_path):
    from codekv.eval.methods import Method
    from codekv.eval.serving import Serving, full_prefill
    from codekv.models import load_backend
    from codekv.stores.local import LocalKVStore

    backend = load_backend(str(tiny_model_dir))
    composer = SimpleNamespace(backend=backend, store=LocalKVStore(tmp_path / "kv"))
    task = session_task()
    reference = full_prefill(backend, task)
    serving = Serving([Method("all", 1.0), Method("none", 0.0)])
    results = {m.strategy: r for m, r in serving.results(composer, task)}
    for label, result in results.items():
        assert result.status == "composed", label
        assert result.report.reused_tokens + result.report.recomputed_tokens > 0
        assert result.state.length == reference.state.length
    pipeline, _ = serving.pipelines[Method("none", 0.0).label, ("last-prompt",)]
    assert pipeline.recent.prompts  # the first call was served, and kept, before the task
    torch.testing.assert_close(results["all"].state.logits, reference.state.logits,
                               rtol=1e-4, atol=1e-4)
    assert results["none"].report.reused_tokens > 0
    assert not torch.allclose(results["none"].state.logits, reference.state.logits, atol=1e-4)


def test_the_parts_workload_serves_the_same_sessions_reading_changed_segments_parts(
        tiny_model_dir, tmp_path, stdlib_files):
    """``agent-session-text-parts``, ``agent-session-parts`` and ``agent-session-runs`` draw
    the agent-session tasks and serve them reading the unchanged parts of changed text (and,
    for the second, of changed code; for the third, runs of the text between segments) as
    well: a header changed before the system prompt's text leaves the text to reuse."""
    from codekv.eval.methods import Method
    from codekv.eval.serving import Serving
    from codekv.models import load_backend
    from codekv.schema import WORKLOADS
    from codekv.stores.local import LocalKVStore

    def drawn(workload):
        tasks = WORKLOADS[workload].generate(4, 0, 8192, approx_tokens, stdlib_files, 256)
        assert tasks and all(t.workload == workload and t.id.startswith(f"{workload}-0-")
                             for t in tasks)
        return [(t.query, t.answer, [c.messages for c in t.calls]) for t in tasks]

    assert (drawn("agent-session-parts") == drawn("agent-session-text-parts")
            == drawn("agent-session-runs") == drawn("agent-session"))
    backend = load_backend(str(tiny_model_dir))
    text = ("You edit code. Answer with SEARCH/REPLACE blocks of the files in the chat, and "
            "ask when a request is ambiguous.")
    systems = (f"Request 1f.\n{text}", f"Request 20ab.\n{text}")
    reads = {"agent-session": ("last-prompt",),
             "agent-session-text-parts": ("last-prompt", "last-prompt-text-part"),
             "agent-session-parts": ("last-prompt", "last-prompt-text-part", "last-prompt-part"),
             "agent-session-runs": ("last-prompt", "last-prompt-text-part", "last-prompt-run")}
    reused = {}
    for workload, sources in reads.items():
        serving = Serving([Method("none", 0.0)])
        composer = SimpleNamespace(backend=backend, store=LocalKVStore(tmp_path / workload))
        [(_, result)] = serving.results(composer, session_task(workload, systems))
        reused[workload] = result.report.reused_tokens
        assert [key[1] for key in serving.pipelines] == [sources]
    text_tokens = len(backend.tokenize(text))
    for workload in ("agent-session-text-parts", "agent-session-parts", "agent-session-runs"):
        assert reused[workload] - reused["agent-session"] >= text_tokens - 2


def test_a_file_that_does_not_parse_is_left_out_of_every_session(git_repo, byte_counter):
    from codekv.stdlib_repo import stdlib_dir

    files = {name: (stdlib_dir() / name).read_bytes() for name in STDLIB_FILES}
    files["broken.py"] = b"def broken(:\n    return 1\n"
    index = indexed(git_repo, files)
    assert "broken.py" not in sessions._python_files(index, approx_tokens, 8192)
    tasks = sessions.agent_session_tasks(6, 0, 8192, approx_tokens, index, 256)
    assert len(tasks) == 6 and all(t.source != "broken.py" for t in tasks)
    assert not any("broken.py" in m["content"] for t in tasks for m in t.calls[-1].messages)
