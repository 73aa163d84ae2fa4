"""What the evaluation compares, by name, derived from the registries and importable without
torch: the command line lists and checks these names before anything heavy loads.

- ``composition``: codekv's selection strategies (``codekv.selection.STRATEGIES``) at recompute
  ratios, except one that recomputes everything (it is full prefill at a higher cost; the
  reference row measures that), and ``shift-only``: the chunks' stored KV shifted into place
  in the order an earlier request held them, nothing recomputed (what an engine's KV shift can
  reuse when it cannot reorder, llama-server's ``--cache-reuse``; docs/semantics.md). It is a
  baseline, never a gate candidate: it answers with the chunks in another order;
- ``pruning``: KV pruning rules (``RULES``, run through kvpress by ``codekv.eval.pruning``) at
  KV budgets, the share of context KV kept;
- ``peer``: the peer library's variants (``PEERS``, run by ``codekv.eval.peer``).

The pruning rules, one entry each (kvpress defaults unless said):

- ``snapkv``: SnapKVPress, the last 64 context tokens' attention, pooled.
- ``streamingllm``: StreamingLLMPress, 4 sink tokens and the most recent ones.
- ``h2o``: ObservedAttentionPress (H2O-like: the mean attention each key receives from every
  context query). It needs the prefill's attention weights, which SDPA does not return; they
  are computed as eager attention would (timed as this method's cost), rather than running
  another, eager, prefill.
- ``pyramidkv``: PyramidKVPress with ``beta=2``: at kvpress's ``beta=20`` the smallest layer
  budget falls under the observation window for every context below ~1,300 kept tokens, and
  kvpress then falls back to SnapKV's uniform budget - which would make it a copy of snapkv;
  at ``beta=2`` the pyramid holds from 128 kept tokens (every context here).
- ``anchor-preserving``: the attention sinks and SnapKV's window, then the request's code
  anchors, then the rest by SnapKV's score (``codekv.eval.anchor_press``); only for requests
  that have anchors (elsewhere it is snapkv).

The observation window is ``min(64, n_context // 8)`` tokens, so short test contexts work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from codekv.conditioning import DEFAULT_CONDITIONING
from codekv.schema import rule_name
from codekv.selection import STRATEGIES as SELECTION

FULL = "full"  # the reference: full prefill of the same tokens
# The rules evaluated at recompute ratios: every selection rule but the one that recomputes all.
PARTIAL_STRATEGIES = tuple(name for name, cls in SELECTION.items()
                           if not cls.recomputes_all and not cls.control)
# The gate's controls, run when asked (``--strategies all,random@0.15``), never by default:
# ``all`` equals full prefill (the positive control), ``random`` must fail (a negative one).
CONTROLS = tuple(name for name, cls in SELECTION.items() if cls.control or cls.recomputes_all)
# The evaluation's own baseline (``codekv.eval.runner.Composition``): the strategy ``none``
# over the chunks in the previous request's order (``runner.reordered``).
SHIFT_ONLY = "shift-only"
EVAL_STRATEGIES = (*PARTIAL_STRATEGIES, *CONTROLS, SHIFT_ONLY)  # what --strategies accepts
RATIOS = (0.0, 0.05, 0.10, 0.15, 0.25)
BUDGETS = (0.25, 0.5)  # share of the context KV kept
PEERS = ("kvboost", "kvboost-passage")
WINDOW = 64
PYRAMID_BETA = 2


@dataclass(frozen=True)
class Rule:
    name: str
    make: Callable  # (kvpress, compression_ratio, n_context, pruning.Anchors) -> press
    needs_attention: bool = False  # the prefill's full attention weights
    needs_anchors: bool = False  # without anchors it equals another rule: not run


def _window(n_context: int) -> int:
    return min(WINDOW, max(1, n_context // 8))


def _anchor_press(kvpress, ratio, n, anchors):
    from codekv.eval.anchor_press import AnchorPreservingPress

    return AnchorPreservingPress(
        compression_ratio=ratio, inner=kvpress.SnapKVPress(window_size=_window(n)),
        key_anchors=anchors.key, anchors=anchors.every)


RULES = {rule.name: rule for rule in (
    Rule("snapkv", lambda kv, ratio, n, a: kv.SnapKVPress(ratio, window_size=_window(n))),
    Rule("streamingllm", lambda kv, ratio, n, a: kv.StreamingLLMPress(ratio)),
    Rule("h2o", lambda kv, ratio, n, a: kv.ObservedAttentionPress(ratio), needs_attention=True),
    Rule("pyramidkv", lambda kv, ratio, n, a: kv.PyramidKVPress(
        ratio, window_size=_window(n), beta=PYRAMID_BETA)),
    Rule("anchor-preserving", _anchor_press, needs_anchors=True),
)}
PRUNING_RULES = tuple(RULES)


def ratio_free(strategy: str) -> bool:
    """Whether a composition strategy recomputes a fixed share (none), so runs at ratio 0."""
    return strategy == SHIFT_ONLY or SELECTION[strategy].ratio_free


@dataclass(frozen=True)
class Method:
    """One row of the evaluation: a strategy, pruning rule or peer variant at one ratio;
    a composition strategy also under one chunk-KV conditioning (``codekv.conditioning``)."""

    strategy: str
    ratio: float = 0.0  # composition and peers: share recomputed; pruning: share of KV kept
    kind: str = "composition"  # or "reference", "pruning", "peer"
    conditioning: str = DEFAULT_CONDITIONING

    @property
    def rule(self) -> str:
        return (rule_name(self.strategy, self.conditioning) if self.kind == "composition"
                else self.strategy)

    @property
    def label(self) -> str:
        if self.kind == "reference" or (self.kind == "composition"
                                        and ratio_free(self.strategy)):
            return self.rule
        if self.kind == "pruning":
            return f"{self.strategy}@kv{self.ratio:g}"
        return f"{self.rule}@{self.ratio:g}"


REFERENCE = Method(FULL, 1.0, "reference")
# Full prefill of the same chunks in another order: how much chunk order alone moves answers.
FULL_REORDERED = Method("full-reordered", 1.0, "reference")


def split_entry(entry: str) -> tuple[str, float | None]:
    """``NAME`` (at every ratio of the run) or ``NAME@RATIO`` (at that ratio only)."""
    name, at, ratio = entry.partition("@")
    return name, float(ratio) if at else None


def composition_methods(strategies=PARTIAL_STRATEGIES, ratios=RATIOS,
                        conditionings=(DEFAULT_CONDITIONING,)) -> list[Method]:
    """Each strategy at each ratio where the ratio means something (none: only at 0); an
    entry ``NAME@RATIO`` at that ratio only, so an evidence run can skip a grid's corners.
    Each under every conditioning, the default's methods first."""
    out = []
    for conditioning in conditionings:
        for entry in strategies:
            name, fixed = split_entry(entry)
            if ratio_free(name):
                out.append(Method(name, 0.0, conditioning=conditioning))
            elif name in SELECTION and SELECTION[name].recomputes_all:
                out.append(Method(name, 1.0, conditioning=conditioning))
            elif fixed is not None:
                out.append(Method(name, fixed, conditioning=conditioning))
            else:
                out.extend(Method(name, r, conditioning=conditioning) for r in ratios if r > 0)
    return list(dict.fromkeys(out))


def pruning_methods(names=PRUNING_RULES, budgets=BUDGETS) -> list[Method]:
    """Each pruning rule at each KV budget (the share of context KV kept)."""
    return [Method(name, budget, "pruning") for name in names for budget in budgets]


def peer_methods(names=PEERS, ratio: float = 0.15) -> list[Method]:
    """Each peer variant at its recompute ratio."""
    return [Method(name, ratio, "peer") for name in names]
