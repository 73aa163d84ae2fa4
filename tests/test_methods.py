"""The evaluated methods: ratios only where they mean something, strategies from the
selection registry, each crossed with every conditioning."""

from __future__ import annotations

import click
import pytest

from codekv import schema
from codekv.conditioning import CONDITIONINGS
from codekv.eval import command, methods
from codekv.selection import STRATEGIES


def test_methods_use_ratios_only_where_they_mean_something():
    composed = methods.composition_methods(("none", "boundary", "hybrid"), (0.0, 0.1, 0.25))
    labels = [m.label for m in composed]
    assert labels == ["none", "boundary@0.1", "boundary@0.25", "hybrid@0.1", "hybrid@0.25"]
    pruned = methods.pruning_methods(("snapkv", "h2o"), (0.25, 0.5))
    assert [m.label for m in pruned] == ["snapkv@kv0.25", "snapkv@kv0.5", "h2o@kv0.25",
                                         "h2o@kv0.5"]
    assert [m.label for m in methods.peer_methods(ratio=0.2)] == ["kvboost@0.2",
                                                                  "kvboost-passage@0.2"]


def test_a_strategy_may_name_its_own_ratio():
    """``NAME@RATIO`` runs that rule at that ratio only, beside the grid of the others."""
    composed = methods.composition_methods(("boundary", "query@0.25", "none@0.3"), (0.1, 0.15))
    assert [m.label for m in composed] == ["boundary@0.1", "boundary@0.15", "query@0.25",
                                           "none"]
    assert command._strategies("query@0.25,boundary") == ("query@0.25", "boundary")
    for bad, message in (("query@x", "numbers"), ("query@1.5", "between 0 and 1"),
                         ("query@0", "above 0"), ("alll@0.2", "unknown strategies"),
                         (",", "unknown strategies")):
        with pytest.raises(click.BadParameter, match=message):
            command._strategies(bad)


def test_evaluated_strategies_come_from_the_selection_registry():
    """Every registered strategy is evaluated by default except the gate's controls (the one
    that is full prefill at a higher cost, the random one), which run when asked; the gate may
    pick all of those but the baseline without re-positioning."""
    assert set(methods.PARTIAL_STRATEGIES) == set(STRATEGIES) - {"all", "random"}
    assert set(methods.CONTROLS) == {"all", "random"}
    assert set(schema.GATE_STRATEGIES) == set(STRATEGIES) - {"all", "random", "none-norope"}
    assert {m.strategy for m in methods.composition_methods()} == set(methods.PARTIAL_STRATEGIES)
    assert command._names("none,hybrid") == ("none", "hybrid")
    assert command._names("none,all,random") == ("none", "all", "random")
    assert [m.label for m in methods.composition_methods(("all", "random@0.15"))] == [
        "all@1", "random@0.15"]  # all recomputes every token, whatever the run's ratios


def test_conditioning_crosses_every_strategy():
    from codekv.eval.harness import EvalConfig

    composed = methods.composition_methods(("none", "query@0.15"), (0.1,), ("prefix", "graph"))
    assert [m.label for m in composed] == ["none", "query@0.15", "none+graph",
                                           "query+graph@0.15"]
    assert command._names("graph,none", CONDITIONINGS, "conditionings") == ("graph", "none")
    with pytest.raises(click.BadParameter, match="unknown conditionings"):
        command._names("neighbours", CONDITIONINGS, "conditionings")
    assert "--conditioning" not in command.canonical_command(EvalConfig())
    assert "--conditioning prefix,graph " in command.canonical_command(
        EvalConfig(conditioning=("prefix", "graph")))


def test_shift_only_is_an_evaluated_baseline_the_gate_never_picks():
    """``shift-only`` runs at ratio 0 under every conditioning, is accepted by --strategies,
    and is no gate candidate even when its figures would pass."""
    from fixtures.evidence import fake_row

    from codekv.eval.support import gate_entries

    composed = methods.composition_methods(("shift-only", "none"), (0.1,),
                                           ("prefix", "none"))
    assert [m.label for m in composed] == ["shift-only", "none", "shift-only+none", "none+none"]
    assert command._strategies("shift-only,query@0.15") == ("shift-only", "query@0.15")
    assert "shift-only" not in schema.GATE_STRATEGIES
    rows = [fake_row("shift-only", speedup=9.0, recompute=0.0),
            fake_row("boundary@0.15", delta=0.2)]
    [entry] = gate_entries(rows, "llama")
    assert not entry["passed"] and [c["method"] for c in entry["candidates"]] == [
        "boundary@0.15"]
