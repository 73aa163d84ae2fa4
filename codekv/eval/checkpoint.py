"""Finished tasks' measures on disk, one JSON line per task, so an interrupted evaluation
resumes where it stopped instead of starting over (the evidence run takes over an hour).

The first line records the configuration; a checkpoint written by another configuration is
refused rather than mixed in. The number of tasks may change: each line records its task's
digest (``Task.digest``), and a finished task is reused only for the same task, so a run that
turns out to need more tasks is resumed with more. A last line cut short by the interruption
is dropped on opening, so its task simply runs again. Anything else that is not a checkpoint -
a file of another kind, a line damaged in the middle - is refused and left as it is: a task is
never dropped silently, and no other file is ever overwritten.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from codekv.eval.measures import Measure

# Settings that say where results go, not what is measured: a resumed run may change them.
UNKEYED = ("store", "checkpoint", "shard")
# Recorded, but a resumed run may change it: its finished tasks are matched by their digests.
COUNT = "tasks"


class CheckpointError(ValueError):
    """The file is not a checkpoint a run can resume from (the message says why and where)."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint belongs to an evaluation with another configuration."""


def config_key(config: dict) -> dict:
    """What a checkpoint records of an evaluation's configuration (``EvalConfig.as_json``)."""
    return {k: v for k, v in config.items() if k not in UNKEYED}


@dataclass
class Contents:
    """A checkpoint as read: its configuration, each finished task's measures, and whether its
    last line was cut short (then it is not among them)."""

    config: dict
    done: dict[str, list[Measure]] = field(default_factory=dict)
    records: dict[str, dict] = field(default_factory=dict)  # the finished tasks' lines, parsed
    cut_short: bool = False


def read(path: str | Path) -> Contents:
    """The checkpoint at ``path``; raises ``CheckpointError`` naming what is wrong where."""
    path = Path(path)
    refuse = "; it was left as it is: move it away or point --checkpoint at another file"
    try:
        text = path.read_bytes().decode()
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path} is not an evaluation checkpoint (not UTF-8 text)"
                              + refuse) from error
    except OSError as error:
        raise CheckpointError(f"{path} cannot be read ({error.strerror})") from error
    lines = text.split("\n")
    cut = lines.pop()  # after the last newline: empty, or a line the interruption cut short
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise CheckpointError(f"{path} is not an evaluation checkpoint (no header line)" + refuse)
    (_, first), *tasks = numbered
    header = _json(first)
    if not (isinstance(header, dict) and isinstance(header.get("config"), dict)):
        raise CheckpointError(f"{path} is not an evaluation checkpoint (its first line is not "
                              'a {"config": ...} header)' + refuse)
    contents = Contents(header["config"], cut_short=bool(cut.strip()))
    for number, line in tasks:
        record = _json(line)
        task, measures = _task(record)
        if task is None:
            raise CheckpointError(
                f"{path}, line {number}: not a finished task's record (expected "
                '{"task": ID, "measures": [...]}); the tasks after it would be lost, so the '
                "checkpoint is refused as it is: repair or delete that line")
        contents.done[task] = measures
        contents.records[task] = record
    return contents


def _json(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def _task(record) -> tuple[str | None, list[Measure]]:
    """A task line's id and measures; (None, []) when it is not one."""
    if not (isinstance(record, dict) and isinstance(record.get("task"), str)
            and isinstance(record.get("measures"), list)):
        return None, []
    try:
        return record["task"], [Measure.from_json(m) for m in record["measures"]]
    except (TypeError, AttributeError):  # not a measure's fields
        return None, []


class Checkpoint:
    """The checkpoint of a run with configuration ``config`` (see ``key``): read back when
    ``path`` holds one, else started there."""

    def __init__(self, path: str | Path, config: dict):
        self.path = Path(path)
        self.config = json.loads(json.dumps(config))  # as it reads back
        self.done: dict[str, list[Measure]] = {}
        self._records: dict[str, dict] = {}
        self._count = self.config.get(COUNT)  # the task count its digest-less lines belong to
        if not self.path.exists() or self.path.stat().st_size == 0:  # nothing to lose
            self._rewrite()
            return
        contents = read(self.path)
        check(self.path, contents, self.config)
        self.done, self._records = contents.done, contents.records
        self._count = contents.config.get(COUNT)
        if contents.cut_short:
            self._rewrite()  # drops the line cut short by the interruption

    def resume(self, tasks) -> dict[str, list[Measure]]:
        """The finished measures of those of ``tasks`` the checkpoint holds. A task whose digest
        differs from its line's is refused; lines from before digests were recorded are trusted
        for a run of the task count that wrote them, and gain their digests."""
        count = self.config.get(COUNT)
        finished, dated = {}, False
        for task in tasks:
            record = self._records.get(task.id)
            if record is None:
                continue
            digest = task.digest()
            if "digest" not in record and self._count == count:
                record["digest"], dated = digest, True
            if record.get("digest") != digest:
                raise CheckpointMismatch(self._mismatch(task.id, record))
            finished[task.id] = self.done[task.id]
        undated = [task for task, record in self._records.items() if "digest" not in record]
        if undated and self._count != count:
            raise CheckpointMismatch(self._mismatch(undated[0], self._records[undated[0]]))
        if dated or self._count != count:
            self._count = count
            self._rewrite()
        return finished

    def add(self, task_id: str, measures: list[Measure], digest: str) -> None:
        record = {"task": task_id, "digest": digest, "measures": [m.as_json() for m in measures]}
        with open(self.path, "a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done[task_id], self._records[task_id] = list(measures), record

    def _mismatch(self, task_id: str, record: dict) -> str:
        if "digest" not in record:
            return (f"{self.path} was written by a run of {self._count} tasks before checkpoints "
                    f"recorded what each task was; it resumes only a run of {self._count} tasks "
                    f"(--tasks {self._count})")
        return (f"{self.path}: task {task_id} is not the task the checkpoint measured under that "
                "id (another version of its repository or of the task generator); remove it or "
                "point --checkpoint elsewhere")

    def _rewrite(self) -> None:
        config = {**self.config, COUNT: self._count} if COUNT in self.config else self.config
        _write(self.path, config, self._records.values())


def _write(path: Path, config: dict, records) -> None:
    """The checkpoint at ``path``, whole: written beside it, then renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(line, allow_nan=False) + "\n"
                           for line in [{"config": config}, *records]))
    os.replace(tmp, path)


def check(path: Path, contents: Contents, config: dict) -> None:
    """Refuse a checkpoint written by an evaluation with another configuration (the task count
    aside: ``Checkpoint.resume`` matches the tasks)."""
    if _uncounted(contents.config) != _uncounted(json.loads(json.dumps(config))):
        raise CheckpointMismatch(
            f"{path} was written by an evaluation with another configuration; "
            "remove it or point --checkpoint elsewhere")


def _uncounted(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != COUNT}


def verify(path: str | Path, config: dict) -> None:
    """Before a run starts (and its model loads): refuse a ``--checkpoint`` it could not resume
    from. Writes nothing."""
    path = Path(path)
    if path.exists() and path.stat().st_size:
        check(path, read(path), config)


def merge(out: str | Path, paths: list[str | Path]) -> int:
    """Join the checkpoints of one run's shards (``--shard``) into ``out``, a new file: one
    configuration, each task once (a task in several files must be the same task, by its
    digest). Returns how many tasks it holds; the inputs are left as they are."""
    out = Path(out)
    if os.path.lexists(out):
        raise CheckpointError(f"{out} exists; the merged checkpoint goes to a new file")
    contents = [read(path) for path in paths]
    records: dict[str, dict] = {}
    for path, read_back in zip(paths, contents):
        if read_back.config != contents[0].config:
            raise CheckpointMismatch(f"{path} was written by an evaluation with another "
                                     f"configuration than {paths[0]}: only one run's shards "
                                     "merge")
        for task, record in read_back.records.items():
            held = records.setdefault(task, record)
            if held.get("digest", held) != record.get("digest", record):
                raise CheckpointMismatch(f"{path}: task {task} is not the task another file "
                                         "measured under that id")
    _write(out, contents[0].config, records.values())
    return len(records)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Join the checkpoints of one run's shards.")
    parser.add_argument("command", choices=["merge"])
    parser.add_argument("out", help="the merged checkpoint (a new file)")
    parser.add_argument("checkpoints", nargs="+", help="the shards' checkpoints")
    args = parser.parse_args(argv)
    try:
        count = merge(args.out, args.checkpoints)
    except CheckpointError as error:
        parser.exit(1, f"error: {error}\n")
    print(f"{args.out}: {count} tasks from {len(args.checkpoints)} checkpoints")


if __name__ == "__main__":
    main()
