"""Finished tasks' measures on disk, one JSON line per task, so an interrupted evaluation
resumes where it stopped instead of starting over (the evidence run takes over an hour).

The first line records the configuration; a checkpoint written by another configuration is
refused rather than mixed in. A last line cut short by the interruption is dropped on opening,
so its task simply runs again. Anything else that is not a checkpoint - a file of another kind,
a line damaged in the middle - is refused and left as it is: a task is never dropped silently,
and no other file is ever overwritten.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from codekv.eval.measures import Measure

# Settings that say where results go, not what is measured: a resumed run may change them.
UNKEYED = ("store", "checkpoint")


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
    lines: list[str] = field(default_factory=list)  # the finished tasks' lines, as written
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
        task, measures = _task(_json(line))
        if task is None:
            raise CheckpointError(
                f"{path}, line {number}: not a finished task's record (expected "
                '{"task": ID, "measures": [...]}); the tasks after it would be lost, so the '
                "checkpoint is refused as it is: repair or delete that line")
        contents.done[task] = measures
        contents.lines.append(line)
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
        if not self.path.exists() or self.path.stat().st_size == 0:  # nothing to lose
            self._rewrite([])
            return
        contents = read(self.path)
        check(self.path, contents, self.config)
        self.done = contents.done
        if contents.cut_short:
            self._rewrite(contents.lines)  # drops the line cut short by the interruption

    def add(self, task_id: str, measures: list[Measure]) -> None:
        line = json.dumps({"task": task_id, "measures": [m.as_json() for m in measures]},
                          allow_nan=False)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done[task_id] = list(measures)

    def _rewrite(self, lines: list[str]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(line + "\n" for line in [json.dumps({"config": self.config}),
                                                        *lines]))
        os.replace(tmp, self.path)


def check(path: Path, contents: Contents, config: dict) -> None:
    """Refuse a checkpoint written by an evaluation with another configuration."""
    if contents.config != json.loads(json.dumps(config)):
        raise CheckpointMismatch(
            f"{path} was written by an evaluation with another configuration; "
            "remove it or point --checkpoint elsewhere")


def verify(path: str | Path, config: dict) -> None:
    """Before a run starts (and its model loads): refuse a ``--checkpoint`` it could not resume
    from. Writes nothing."""
    path = Path(path)
    if path.exists() and path.stat().st_size:
        check(path, read(path), config)
