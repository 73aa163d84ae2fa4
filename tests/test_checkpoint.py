"""An interrupted evaluation resumes from its checkpoint, and never mixes configurations or
tasks."""

from __future__ import annotations

import json

import pytest
from fixtures.evidence import fake_measure

from codekv.compose import Composer, Passage
from codekv.eval import runner, workloads
from codekv.eval.checkpoint import Checkpoint, CheckpointError, CheckpointMismatch, merge
from codekv.eval.methods import Method
from codekv.stores.local import LocalKVStore

CONFIG = {"tasks": 2, "ratios": [0.15], "seed": 0}


def tasks(n: int = 2, answer: str = " w, h)") -> list[workloads.Task]:
    a = Passage("def area(w, h):\n    return w * h\n", "a")
    b = Passage("the quick brown fox jumps over the lazy dog", "b")
    return [workloads.Task("rag", f"t{i}", "quote", [a, b][::1 - 2 * (i % 2)], "def area(",
                           answer, "a") for i in range(n)]


def save(checkpoint: Checkpoint):
    return lambda task, done: checkpoint.add(task.id, done, task.digest())


def test_a_resumed_run_measures_only_the_missing_tasks(tiny_backend, tmp_path):
    composer = Composer(tiny_backend("llama"), None, store=LocalKVStore(tmp_path / "kv"),
                        experimental=True)
    runners = [runner.Composition([Method("none"), Method("boundary", 0.3)])]
    path = tmp_path / "run.jsonl"
    first = Checkpoint(path, CONFIG)
    # Interrupted after the first task: only its line made it to disk.
    measured = runner.run(lambda task: composer, tasks()[:1], runners, on_task=save(first))
    resumed = Checkpoint(path, CONFIG)
    assert list(resumed.resume(tasks())) == ["t0"]

    asked = []

    def composer_for(task):
        asked.append(task.id)
        return composer

    steps = []
    again = runner.run(composer_for, tasks(), runners, done=resumed.resume(tasks()),
                       on_task=save(resumed),
                       progress=lambda text, step: steps.append(step))
    assert asked == ["t1"]  # t0 came from the checkpoint
    assert [m.as_json() for m in again[:3]] == [m.as_json() for m in measured]
    assert [m.task for m in again] == ["t0"] * 3 + ["t1"] * 3
    assert sum(steps) == runner.requests(tasks(), runners)  # the progress total still adds up
    assert list(Checkpoint(path, CONFIG).done) == ["t0", "t1"]


def test_a_line_cut_short_is_dropped_and_its_task_runs_again(tmp_path):
    path = tmp_path / "run.jsonl"
    Checkpoint(path, CONFIG)
    with open(path, "a") as f:
        f.write('{"task": "t0", "measures": [{"work')  # killed mid-write
    reopened = Checkpoint(path, CONFIG)
    assert reopened.done == {}
    assert path.read_text().splitlines() == [json.dumps({"config": CONFIG})]


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path):
    path = tmp_path / "run.jsonl"
    Checkpoint(path, CONFIG)
    with pytest.raises(CheckpointMismatch, match="another configuration"):
        Checkpoint(path, {**CONFIG, "seed": 1})
    assert json.loads(path.read_text())["config"] == CONFIG  # left as it was


def _measured(path, n: int) -> None:
    """A checkpoint of a run of ``n`` tasks that finished them all."""
    checkpoint = Checkpoint(path, {**CONFIG, "tasks": n})
    for task in tasks(n):
        checkpoint.add(task.id, [fake_measure("none", 0.1, 1.0, task=task.id)], task.digest())


def test_a_run_that_needs_more_tasks_resumes_with_more(tmp_path):
    """The design takes more tasks where full prefill solves fewer than it needs: the same
    command with a larger ``--tasks`` keeps the finished ones (the generators draw tasks one
    after another, so the first ones are the same) and measures the rest."""
    path = tmp_path / "run.jsonl"
    _measured(path, 2)
    more = Checkpoint(path, {**CONFIG, "tasks": 4})
    assert list(more.resume(tasks(4))) == ["t0", "t1"]
    assert json.loads(path.read_text().splitlines()[0])["config"]["tasks"] == 4
    assert list(Checkpoint(path, CONFIG).resume(tasks(2))) == ["t0", "t1"]  # and back


def test_a_finished_task_whose_content_changed_is_refused(tmp_path):
    """Same id, another task (a new version of the repository): its measures are not this
    task's, so the checkpoint is refused and left as it is."""
    path = tmp_path / "run.jsonl"
    _measured(path, 2)
    text = path.read_text()
    with pytest.raises(CheckpointMismatch, match="task t0 is not the task the checkpoint"):
        Checkpoint(path, {**CONFIG, "tasks": 3}).resume(tasks(3, answer=" width, height)"))
    assert path.read_text() == text


def test_a_checkpoint_from_before_digests_resumes_its_own_task_count_only(tmp_path):
    """Lines written before digests were recorded are the tasks of their run's count: trusted
    for that count (and given their digests), refused for another."""
    path = tmp_path / "run.jsonl"
    old = "\n".join([json.dumps({"config": CONFIG}), _record("t0"), _record("t1")]) + "\n"
    path.write_text(old)
    with pytest.raises(CheckpointMismatch, match=r"run of 2 tasks before .* \(--tasks 2\)"):
        Checkpoint(path, {**CONFIG, "tasks": 3}).resume(tasks(3))
    assert path.read_text() == old
    assert list(Checkpoint(path, CONFIG).resume(tasks(2))) == ["t0", "t1"]
    digests = [json.loads(line).get("digest") for line in path.read_text().splitlines()[1:]]
    assert digests == [task.digest() for task in tasks(2)]
    assert list(Checkpoint(path, {**CONFIG, "tasks": 3}).resume(tasks(3))) == ["t0", "t1"]


def test_the_evaluation_counts_the_tasks_it_resumed(tiny_backend, tmp_path):
    """A resumed run's seconds and load cover only the tasks it measured itself; the result
    (and the support file) says how many came from the checkpoint."""
    from codekv.eval.harness import EvalConfig, _measure

    config = EvalConfig(workloads=("rag",), tasks=2, checkpoint=str(tmp_path / "run.jsonl"),
                        store=str(tmp_path / "kv"))
    runners = [runner.Composition([Method("none")])]
    backend = tiny_backend("llama")
    measures, resumed = _measure(config, backend, {}, tasks()[:1], runners, [], None)
    assert resumed == 0 and [m.task for m in measures] == ["t0", "t0"]
    measures, resumed = _measure(config, backend, {}, tasks(), runners, [], None)
    assert resumed == 1 and [m.task for m in measures] == ["t0", "t0", "t1", "t1"]


def test_the_shards_of_a_run_merge_into_its_checkpoint(tiny_backend, tmp_path):
    """N processes share a run (``--shard K/N``), each with its own checkpoint; merged, the
    checkpoint resumes the whole run with nothing left to measure."""
    from codekv.eval.harness import EvalConfig, _measure

    backend, three = tiny_backend("llama"), tasks(3)
    runners = [runner.Composition([Method("none")])]

    def config(**settings) -> EvalConfig:
        return EvalConfig(workloads=("rag",), tasks=3, store=str(tmp_path / "kv"), **settings)

    shards = [tmp_path / f"shard{k}.jsonl" for k in (0, 1)]
    for k, path in enumerate(shards):
        measures, _ = _measure(config(shard=(k, 2), checkpoint=str(path)), backend, {}, three,
                               runners, [], None)
        assert {m.task for m in measures} == {task.id for task in three[k::2]}
    assert merge(tmp_path / "run.jsonl", shards) == 3
    measures, resumed = _measure(config(checkpoint=str(tmp_path / "run.jsonl")), backend, {},
                                 three, runners, [], None)
    assert resumed == 3 and [m.task for m in measures] == ["t0", "t0", "t1", "t1", "t2", "t2"]


def test_merging_refuses_what_is_not_one_runs_shards(tmp_path):
    _measured(tmp_path / "a.jsonl", 2)
    _measured(tmp_path / "b.jsonl", 2)
    assert merge(tmp_path / "ab.jsonl", [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]) == 2
    with pytest.raises(CheckpointError, match="exists"):  # never over another file
        merge(tmp_path / "ab.jsonl", [tmp_path / "a.jsonl"])
    Checkpoint(tmp_path / "seed.jsonl", {**CONFIG, "seed": 1})
    with pytest.raises(CheckpointMismatch, match="another configuration than"):
        merge(tmp_path / "x.jsonl", [tmp_path / "a.jsonl", tmp_path / "seed.jsonl"])
    changed = Checkpoint(tmp_path / "changed.jsonl", CONFIG)
    [task, _] = tasks(2, answer=" width, height)")
    changed.add(task.id, [fake_measure("none", 0.1, 1.0, task=task.id)], task.digest())
    with pytest.raises(CheckpointMismatch, match="task t0 is not the task another file"):
        merge(tmp_path / "y.jsonl", [tmp_path / "a.jsonl", tmp_path / "changed.jsonl"])
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "y.jsonl").exists()


def _record(task: str) -> str:
    return json.dumps({"task": task, "measures": [fake_measure("none", 0.1, 1.0, task=task)
                                                  .as_json()]})


NOT_CHECKPOINTS = {
    "a README": ("# codekv\n\n" + "Chunk KV composition for agents. " * 600 + "\n").encode(),
    "binary": bytes(range(256)) * 8,
    "a JSON list": b"[1, 2, 3]\n",
    "an object without a configuration": b'{"tasks": 2}\n',
}


@pytest.mark.parametrize("kind", NOT_CHECKPOINTS)
def test_a_file_that_is_not_a_checkpoint_is_refused_and_left_byte_for_byte(tmp_path, kind):
    path = tmp_path / "notes.md"
    path.write_bytes(NOT_CHECKPOINTS[kind])
    with pytest.raises(CheckpointError, match="is not an evaluation checkpoint") as refused:
        Checkpoint(path, CONFIG)
    assert str(path) in str(refused.value) and "left as it is" in str(refused.value)
    assert path.read_bytes() == NOT_CHECKPOINTS[kind]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left either


@pytest.mark.parametrize("damage", ['{"task": "t1", "meas', '{"measures": []}', "[1, 2]",
                                    '{"task": "t1", "measures": [{"workload": "rag"}]}'])
def test_a_damaged_line_before_other_tasks_is_refused_not_dropped(tmp_path, damage):
    """The tasks after it would disappear from the result (and the file) without a word."""
    path = tmp_path / "run.jsonl"
    text = "\n".join([json.dumps({"config": CONFIG}), _record("t0"), damage, _record("t2")]) + "\n"
    path.write_text(text)
    with pytest.raises(CheckpointError, match=r"run.jsonl, line 3: not a finished task's record"):
        Checkpoint(path, CONFIG)
    assert path.read_text() == text


def test_only_the_last_line_may_be_cut_short(tmp_path):
    path = tmp_path / "run.jsonl"
    header = json.dumps({"config": CONFIG})
    path.write_text("\n".join([header, _record("t0"), "", _record("t1")]) + "\n"
                    + _record("t2")[:30])
    reopened = Checkpoint(path, CONFIG)
    assert list(reopened.done) == ["t0", "t1"]
    assert reopened.done["t1"][0].delta_nll == 0.1
    assert path.read_text().splitlines() == [header, _record("t0"), _record("t1")]
    path.write_text("")  # an empty file holds nothing to lose: it becomes the checkpoint
    assert Checkpoint(path, CONFIG).done == {} and path.read_text() == header + "\n"


def test_a_store_that_cannot_keep_a_task_s_chunks_stops_the_run_losing_nothing(
        tiny_backend, tmp_path, monkeypatch):
    """A full disk: the composed requests would recompute the chunks the store failed to keep
    and time that, so the task is not measured; the checkpoint keeps the tasks before it, and
    the same run, with space again, resumes there."""
    from codekv.eval.harness import EvalConfig, _measure

    cat = Passage("a cat sat on the warm mat and slept all day", "cat")
    two = [*tasks(1), workloads.Task("rag", "t1", "quote", [cat], "a cat sat", " on", "cat")]
    config = EvalConfig(workloads=("rag",), tasks=2, checkpoint=str(tmp_path / "run.jsonl"),
                        store=str(tmp_path / "kv"))
    runners = [runner.Composition([Method("none")])]
    backend = tiny_backend("llama")
    put = LocalKVStore.put
    full = [False]

    def put_or_fail(self, key, entry):
        if full[0]:
            raise OSError(28, "No space left on device")
        put(self, key, entry)

    monkeypatch.setattr(LocalKVStore, "put", put_or_fail)
    _measure(config, backend, {}, two[:1], runners, [], None)
    full[0] = True
    with pytest.raises(runner.UnkeptChunks, match="^t1: the chunk store could not keep the "
                                                  r"task's chunks \(OSError: a full disk\?\)"):
        _measure(config, backend, {}, two, runners, [], None)
    full[0] = False
    measures, resumed = _measure(config, backend, {}, two, runners, [], None)
    assert resumed == 1 and [m.task for m in measures] == ["t0", "t0", "t1", "t1"]
