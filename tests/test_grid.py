"""``codekv.eval.grid``: slices of the evidence grid merge only when they measured the same
tasks the same way, and each (rule, ratio) cell shows what its own run measured."""

from __future__ import annotations

import json

import pytest
from fixtures.evidence import fake_measure

from codekv.eval import grid
from codekv.eval.support import Thresholds

TASKS = "abc"


def _run(deltas: dict[str, tuple[float, ...]], tasks: str = TASKS, full_nll: float = 1.0):
    measures = [fake_measure("full", 0.0, 4.0, "code-qa", task) for task in tasks]
    for m in measures:
        m.nll = full_nll
    measures += [fake_measure(method, delta, 1.0, "code-qa", task)
                 for method, values in deltas.items() for task, delta in zip(tasks, values)]
    return {"command": f"codekv eval --strategies {','.join(deltas)}",
            "measures": [m.as_json() for m in measures]}


SLICE_10 = {"deviation@0.1": (0.2, 0.1, 0.3), "query@0.1": (0.0, 0.02, -0.02), "none": (0.4,) * 3}
SLICE_25 = {"query@0.25": (0.01, 0.01, 0.01), "query@0.1": (0.9, 0.9, 0.9)}


def test_merge_keeps_each_method_from_the_first_run_that_has_it():
    merged = grid.merge([_run(SLICE_10), _run(SLICE_25)])
    methods = [(m.method, m.task) for m in merged]
    assert len(methods) == len(set(methods)) == 3 * 5  # full, deviation, query x2, none
    assert {m.delta_nll for m in merged if m.method == "query@0.1"} == {0.0, 0.02, -0.02}


@pytest.mark.parametrize(("other", "message"), [
    (_run(SLICE_25, tasks="abd"), "run 2 measured other tasks than run 1 (1 not in run 1, 1 "
                                  "missing)"),
    (_run(SLICE_25, full_nll=1.01), "run 2's full prefill differs from run 1's on 3 tasks"),
])
def test_runs_of_other_tasks_do_not_merge(other, message):
    with pytest.raises(grid.GridError, match=message.replace("(", r"\(").replace(")", r"\)")):
        grid.merge([_run(SLICE_10), other])


def test_each_cell_shows_its_rule_at_its_ratio():
    tables = grid.grid_tables(grid.merge([_run(SLICE_10), _run(SLICE_25)]),
                              Thresholds(min_tasks=3, min_solved=0))
    # Three tasks: the resampled means reach the extremes (each has probability 1/27 > 2.5%).
    assert "| rule | 10% | 25% |" in tables
    assert "| deviation | 0.200 [0.100, 0.300] | - |" in tables
    assert "| query | 0.013 [0.000, 0.020] | 0.010 [0.010, 0.010] |" in tables
    assert "Without a ratio: none 0.400 [0.400, 0.400]." in tables
    assert "| deviation | fail +0.300 / - / 100.0% / 4.00x | - |" in tables  # none solved
    assert "| query | pass +0.020 / - / 100.0% / 4.00x | pass +0.010 / - / 100.0% / " \
           "4.00x |" in tables
    # the cheaper of the two passing cells
    assert "Over the grid, on these tasks alone: query@0.1 meets every threshold." in tables
    # |query| - |deviation| per task: -0.2, -0.08, -0.28; ratio of means 0.0133 / 0.2.
    assert "| query | -0.187 [-0.280, -0.080] (0.07) | - |" in tables
    assert "against `boundary`" not in tables  # not in the grid
    only_none = grid.grid_tables(grid.merge([_run({"none": (0.4,) * 3})]))
    assert "Without a ratio: none" in only_none and "Over the grid" not in only_none


def test_the_command_prints_the_grid_or_says_why_not(tmp_path, capsys):
    paths = []
    for name, run in (("r10", _run(SLICE_10)), ("r25", _run(SLICE_25)),
                      ("other", _run(SLICE_25, tasks="xyz"))):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(run))
    assert grid.main(["grid", str(paths[0]), str(paths[1])]) == 0
    out = capsys.readouterr().out
    assert "- `codekv eval --strategies query@0.25,query@0.1`" in out
    assert "### code-qa: the gate per cell" in out
    assert grid.main(["grid", str(paths[0]), str(paths[2])]) == 1
    assert "codekv.eval.grid: run 2 measured other tasks" in capsys.readouterr().err
