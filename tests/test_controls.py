"""The gate's operating characteristics: its criteria pass rules equal to full prefill and fail
bad ones, at the design's task counts (``codekv.eval.controls``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from codekv.eval import controls
from codekv.eval.harness import EvalConfig, evaluate
from codekv.eval.support import Thresholds


def cell(delta, solved_by_full, solved, decisive=1.0, speedup=3.0, method="rule"):
    n = len(delta)
    return controls.Cell(method, np.asarray(delta, dtype=float), np.asarray(solved_by_full),
                         np.asarray(solved), np.full(n, decisive), np.full(n, speedup))


def test_a_rule_equal_to_full_prefill_passes_every_criterion_at_the_design_s_task_count():
    rng = np.random.default_rng(0)
    solved = rng.random(240) < 0.45  # about the share full prefill solves of code-qa
    exact = cell(rng.normal(0, 1e-6, 240), solved, solved)
    assert controls.pass_probability(exact, 240, draws=200) == {
        "delta_nll": 1.0, "retention": 1.0, "decisive_agreement": 1.0, "speedup": 1.0,
        "all": 1.0}
    # At the design's 200 tasks it passes only when full prefill solves 80 of them: why a
    # code-qa run draws 240 (docs/semantics.md)
    at_200 = controls.pass_probability(exact, Thresholds().min_tasks, draws=200)
    assert at_200["delta_nll"] == 1.0 and 0.3 < at_200["retention"] < 0.9


def test_the_centred_control_passes_the_delta_nll_bound_as_often_as_its_power_says():
    """A rule as noisy as the measured ones (SD 0.2 nats) and no worse on average passes the
    0.05 bound at 200 tasks with probability Φ(0.05·√200/0.2 − 1.96) = 0.94 (docs/semantics.md)."""
    rng = np.random.default_rng(1)
    solved = np.ones(300, dtype=bool)
    noisy = cell(rng.normal(0.04, 0.2, 300), solved, solved).centred()
    assert abs(noisy.delta_nll.mean()) < 1e-12 and noisy.method == "rule centred"
    expected = 0.5 * (1 + math.erf((0.05 * math.sqrt(200) / 0.2 - 1.96) / math.sqrt(2)))
    p = controls.pass_probability(noisy, 200, draws=300)["delta_nll"]
    assert abs(p - expected) < 0.08, (p, expected)
    # ... and at the old design's 100 tasks it passed far less often (0.71)
    assert controls.pass_probability(noisy, 100, draws=300)["delta_nll"] < p - 0.1


def test_rules_that_lose_quality_fail():
    rng = np.random.default_rng(2)
    solved_by_full = np.ones(240, dtype=bool)
    loses_answers = cell(rng.normal(0, 0.1, 240), solved_by_full, rng.random(240) < 0.8)
    drifts = cell(rng.normal(0.2, 0.2, 240), solved_by_full, solved_by_full)
    assert controls.pass_probability(loses_answers, 200, draws=200)["retention"] == 0.0
    assert controls.pass_probability(drifts, 200, draws=200)["delta_nll"] == 0.0
    too_few_solved = cell(np.zeros(240), rng.random(240) < 0.2, np.ones(240, dtype=bool))
    assert controls.pass_probability(too_few_solved, 200, draws=100)["retention"] == 0.0


def test_the_controls_on_a_tiny_model_pass_all_and_fail_a_broken_rule(tiny_backend, tmp_path,
                                                                       capsys):
    """Through the evaluation itself: ``all`` (every token recomputed) against a rule that is
    broken on purpose (chunk KV not re-positioned, on a model whose RoPE makes positions
    count), judged by the controls' resampling. The broken rule's ΔNLL is left out: on random
    weights its sign is chance (the criterion failing a drift is tested above)."""
    backend = tiny_backend(rope_theta=10.0, initializer_range=0.3, max_position_embeddings=512)
    config = EvalConfig(workloads=("rag",), repos=("stdlib-quick",), tasks=6, context_tokens=250,
                        max_query_tokens=100, strategies=("all", "none-norope"), pruning=(),
                        peers=(), throughput_tasks=0, reuse_tasks=0, reorder=False, prefix="")
    result = evaluate(config, backend)
    rows = {r["method"]: r for r in controls.table(result.measures, 50, draws=100)}
    assert set(rows) == {"all@1", "none-norope"}
    assert rows["all@1"]["pass"]["delta_nll"] == rows["all@1"]["pass"][
        "decisive_agreement"] == 1.0
    assert rows["none-norope"]["pass"]["decisive_agreement"] == 0.0
    assert rows["none-norope"]["pass"]["all"] == 0.0
    # the command prints the same table from the run's --json
    path = tmp_path / "run.json"
    path.write_text(json.dumps(result.as_json()))
    controls.main([str(path), "--tasks", "50", "--draws", "100", "--centre", "none-norope"])
    out = capsys.readouterr().out
    assert "| all@1 | 6 |" in out and "| none-norope centred |" in out


@pytest.mark.parametrize("name", sorted(controls.CRITERIA))
def test_every_criterion_of_the_design_is_a_control_criterion(name):
    assert name in {"delta_nll", "retention", "decisive_agreement", "speedup"}
