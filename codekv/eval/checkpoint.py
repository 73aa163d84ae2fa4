"""Finished tasks' measures on disk, one JSON line per task, so an interrupted evaluation
resumes where it stopped instead of starting over (the evidence run takes over an hour).

The first line records the configuration; a checkpoint written by another configuration is
refused rather than mixed in. A line cut short by the interruption is dropped on opening, so
its task simply runs again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from codekv.eval.measures import Measure


class CheckpointMismatch(ValueError):
    """The checkpoint belongs to an evaluation with another configuration."""


class Checkpoint:
    def __init__(self, path: str | Path, config: dict):
        self.path = Path(path)
        self.config = json.loads(json.dumps(config))  # as it reads back
        self.done: dict[str, list[Measure]] = {}
        records = self._read() if self.path.exists() else None
        if records is None:
            self._rewrite([])
            return
        header, *tasks = records
        if header.get("config") != self.config:
            raise CheckpointMismatch(
                f"{self.path} was written by an evaluation with another configuration; "
                "remove it or point --checkpoint elsewhere")
        for record in tasks:
            self.done[record["task"]] = [Measure.from_json(m) for m in record["measures"]]
        self._rewrite(tasks)  # drops a line cut short by the interruption

    def add(self, task_id: str, measures: list[Measure]) -> None:
        line = json.dumps({"task": task_id, "measures": [m.as_json() for m in measures]},
                          allow_nan=False)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done[task_id] = list(measures)

    def _read(self) -> list[dict] | None:
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                break  # the interrupted write: it and anything after it are not kept
        return records or None

    def _rewrite(self, tasks: list[dict]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        lines = [json.dumps({"config": self.config}), *(json.dumps(t) for t in tasks)]
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, self.path)

