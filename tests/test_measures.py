"""Evaluation records are plain data: results are read without loading a model."""

from __future__ import annotations

import json

from fixtures.checks import imported_by
from fixtures.evidence import fake_measure

from codekv.eval.measures import Measure, ResultRow
from codekv.eval.results import aggregate


def test_reading_results_does_not_import_torch():
    """The grid, the Markdown tables and checkpoints run where no model is installed."""
    loaded = imported_by("codekv.eval.grid", "codekv.eval.markdown", "codekv.eval.checkpoint",
                         "codekv.eval.measures")
    assert "torch" not in loaded and "transformers" not in loaded


def test_rows_and_measures_read_back_as_written():
    measures = [fake_measure("full", 0.0, 4.0, task="a"), fake_measure("full", 0.0, 4.0, task="b"),
                fake_measure("query@0.15", 0.1, 1.0, task="a", decisive=None),
                fake_measure("query@0.15", -0.2, 2.0, task="b")]
    measures[2].kv_bytes, measures[2].full_kv_bytes = 300, 1200
    for m in measures:
        data = json.loads(json.dumps(m.as_json()))
        assert Measure.from_json(data) == m
    assert measures[2].as_json()["kv_kept"] == 0.25
    for row in aggregate(measures):
        assert ResultRow.from_json(json.loads(json.dumps(row.as_json()))) == row


def test_a_row_of_an_older_file_reads_missing_keys_as_none():
    row = ResultRow.from_json({"workload": "rag", "method": "none", "tasks": 3, "extra": 1})
    assert (row.workload, row.tasks, row.rule, row.kind) == ("rag", 3, None, None)
