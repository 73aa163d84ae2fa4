"""Result rows aggregate the per-task measures with intervals and keep the JSON schema;
comparisons pair rules on the tasks both ran."""

from __future__ import annotations

import json

import pytest
from fixtures.evidence import RESULT_ROW_KEYS, fake_measure

from codekv.eval.results import aggregate, comparisons


def test_rows_aggregate_tasks_and_keep_the_schema():
    measures = [fake_measure("full", 0.0, 4.0, task="a"), fake_measure("full", 0.0, 4.0, task="b"),
                fake_measure("hybrid@0.15", 0.1, 1.0, task="a", similarity=70.0, decisive=0.5),
                fake_measure("hybrid@0.15", -0.3, 3.0, task="b", status="full-prefill",
                         decisive=None)]
    full, hybrid = (row.as_json() for row in aggregate(measures))
    assert tuple(hybrid) == RESULT_ROW_KEYS
    assert hybrid["tasks"] == 2 and hybrid["method"] == "hybrid@0.15" and hybrid["ratio"] == 0.15
    assert hybrid["delta_nll"] == pytest.approx(-0.1)
    # Two tasks: the resampled means are -0.3, -0.1 or 0.1; the interval spans the extremes.
    assert hybrid["delta_nll_ci"] == pytest.approx([-0.3, 0.1])
    assert hybrid["abs_delta_nll"] == pytest.approx(0.2)
    assert hybrid["speedup"] == pytest.approx((4.0 / 1.0 + 4.0 / 3.0) / 2)  # median of tasks
    assert hybrid["fallbacks"] == 1 and full["fallbacks"] == 0
    # Full prefill scored 80 on both tasks, hybrid 70 and 80: drops of 10 and 0 points.
    assert hybrid["score_drop"] == pytest.approx(5.0)
    assert hybrid["score_drop_ci"] == pytest.approx([0.0, 10.0])
    assert full["score_drop"] == 0.0 and full["edit_similarity"] == 80.0
    # Decisive agreement: over the tasks that had decisive positions only.
    assert hybrid["decisive_agreement"] == 0.5 and hybrid["decisive_agreement_ci"] is None
    assert hybrid["decisive_positions"] == 6 and hybrid["near_ties"] == 4
    json.dumps([full, hybrid])


def test_comparisons_pair_rules_on_the_same_tasks():
    measures = [fake_measure(f"{rule}@0.15", delta, 1.0, task=task)
                for rule, deltas in (("deviation", (0.2, -0.4, 0.3)),
                                     ("query", (0.1, -0.1, 0.2)),
                                     ("boundary", (0.3, 0.3, 0.3)))
                for task, delta in zip("abc", deltas)]
    measures.append(fake_measure("query@0.15", 0.9, 1.0, task="d"))  # no partner: left out
    found = {(c["strategy"], c["baseline"]): c for c in comparisons(measures)}
    query = found[("query", "deviation")]
    assert query["tasks"] == 3
    assert query["mean"] == pytest.approx(0.4 / 3) and query["baseline_mean"] == pytest.approx(0.3)
    assert query["difference"] == pytest.approx(-0.5 / 3)  # per task: -0.1, -0.3, -0.1
    low, high = query["difference_ci"]
    assert -0.3 - 1e-12 <= low < high <= -0.1 + 1e-12
    assert query["ratio_of_means"] == pytest.approx(0.4 / 0.9)
    assert ("deviation", "deviation") not in found and ("boundary", "boundary") not in found
    assert found[("deviation", "boundary")]["difference"] == pytest.approx(0.0)
    assert found[("boundary", "query")]["difference"] == pytest.approx(0.5 / 3)
    # A rule under graph conditioning meets the baselines and itself under the default.
    measures += [fake_measure("query+graph@0.15", delta, 1.0, task=task)
                 for task, delta in zip("abc", (0.05, -0.05, 0.1))]
    found = {(c["strategy"], c["baseline"]): c for c in comparisons(measures)}
    assert {b for s, b in found if s == "query+graph"} == {"deviation", "boundary", "query"}
    assert found[("query+graph", "query")]["difference"] == pytest.approx(-0.2 / 3)
    assert ("query", "query+graph") not in found
    measures += [fake_measure("deviation+graph@0.15", 0.1, 1.0, task=task) for task in "abc"]
    pairs = [(c["strategy"], c["baseline"]) for c in comparisons(measures)]
    assert pairs.count(("deviation+graph", "deviation")) == 1


def test_shift_only_is_compared_with_none_on_the_same_tasks():
    """The chunks' KV in the previous request's order against the same KV in the request's:
    what the order alone costs, under each conditioning against its own ``none``."""
    measures = [fake_measure(method, delta, 1.0, task=task)
                for method, deltas in (("none", (0.1, -0.2)), ("shift-only", (0.4, 0.1)),
                                       ("none+none", (0.3, 0.3)),
                                       ("shift-only+none", (0.5, 0.5)))
                for task, delta in zip("ab", deltas)]
    found = {(c["strategy"], c["baseline"]): c for c in comparisons(measures)}
    assert set(found) == {("shift-only", "none"), ("shift-only+none", "none+none"),
                          ("shift-only+none", "shift-only"), ("none+none", "none")}
    assert found[("shift-only", "none")]["difference"] == pytest.approx(0.1)  # 0.3, -0.1
    assert found[("shift-only+none", "none+none")]["difference"] == pytest.approx(0.2)
