"""Every rule at every ratio, from several evaluation runs over the same tasks.

The evidence grid (every rule at 5, 10, 15 and 25% on a workload, 100 tasks) is too long for
one command on two cores, so it runs as slices, one ``codekv eval --json`` each. This merges
their per-task measures - after checking that they measured the same tasks the same way (full
prefill's NLL agrees task by task) - and shows each (rule, ratio) as one cell: mean |ΔNLL|
with its interval, the gate's four figures and verdict, and the paired difference to the
baselines. Each measure keeps its own run's full-prefill TTFT, so speedups stay side by side.

Usage: ``python -m codekv.eval.grid r0.05.json r0.1.json r0.15.json r0.25.json``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from codekv.eval.markdown import optional, row
from codekv.eval.measures import Measure, ResultRow
from codekv.eval.report import ci
from codekv.eval.results import aggregate, comparisons
from codekv.eval.support import Thresholds, failures, gate_entries

# Full prefill is deterministic on one model: the same task's NLL differs between runs only by
# floating-point noise (thread counts); more than this means other tasks or another model.
NLL_TOLERANCE = 1e-3
GRID_BASELINES = ("deviation", "boundary")


class GridError(ValueError):
    """The runs cannot be merged: they measured different tasks, or the same ones differently."""


def merge(runs: list[dict]) -> list[Measure]:
    """The runs' measures as one list: full prefill's once (from the first run), every other
    method's from the first run that has it."""
    if not runs:
        raise GridError("no runs to merge")
    measured = [[Measure.from_json(data) for data in run["measures"]] for run in runs]
    reference = _full_nll(measured[0])
    for index, measures in enumerate(measured[1:], 2):
        other = _full_nll(measures)
        if other.keys() != reference.keys():
            raise GridError(f"run {index} measured other tasks than run 1 "
                            f"({len(other.keys() - reference.keys())} not in run 1, "
                            f"{len(reference.keys() - other.keys())} missing)")
        far = [task for task, nll in other.items()
               if abs(nll - reference[task]) > NLL_TOLERANCE]
        if far:
            raise GridError(f"run {index}'s full prefill differs from run 1's on {len(far)} "
                            f"tasks (first {far[0]}): another model or other task texts")
    merged, seen = [], set()
    for measures in measured:
        for m in measures:
            key = (m.workload, m.task, m.method)
            if key not in seen:
                seen.add(key)
                merged.append(m)
    return merged


def _full_nll(measures: list[Measure]) -> dict[tuple[str, str], float]:
    return {(m.workload, m.task): m.nll for m in measures if m.method == "full"}


def grid_tables(measures, thresholds: Thresholds | None = None, family: str = "llama") -> str:
    """Per workload: |ΔNLL| per (rule, ratio), the gate's figures and verdict per cell and the
    cheapest passing cell, and each rule against the baselines at the same ratio."""
    thresholds = thresholds or Thresholds()
    rows = aggregate(measures)
    compared = comparisons(measures)
    out = []
    for workload in dict.fromkeys(r.workload for r in rows):
        mine = [r for r in rows if r.workload == workload]
        out += _workload_tables(workload, mine, [c for c in compared if c["workload"] == workload],
                                thresholds, family)
    return "\n".join(out)


def _workload_tables(workload: str, rows: list[ResultRow], compared: list[dict],
                     thresholds: Thresholds, family: str) -> list[str]:
    cells = {(r.rule, r.ratio): r for r in rows if _graded(r)}
    rules = list(dict.fromkeys(rule for rule, _ in cells))
    ratios = sorted({ratio for _, ratio in cells})

    def table(shown) -> list[str]:
        header = ["rule", *(f"{ratio:.0%}" for ratio in ratios)]
        lines = [row(header), row(["---"] * len(header))]
        lines += [row([rule, *(shown(rule, ratio) for ratio in ratios)]) for rule in rules]
        return lines

    out = [f"### {workload}: mean \\|ΔNLL\\| [95% CI]", ""]
    out += table(lambda rule, ratio: _abs(cells.get((rule, ratio))))
    fixed = [r for r in rows if not _graded(r) and r.method != "full"]
    if fixed:
        out += ["", "Without a ratio: " + "; ".join(f"{r.method} {_abs(r)}" for r in fixed)
                + "."]
    out += ["", f"### {workload}: the gate per cell (ΔNLL upper end / retention lower end / "
                "decisive agreement / speedup)", ""]
    out += table(lambda rule, ratio: _verdict(cells.get((rule, ratio)), thresholds))
    for entry in gate_entries(list(cells.values()), family, thresholds):  # none without cells
        out += ["", f"Over the grid, on these tasks alone: {entry['reason']}."]
    for baseline in GRID_BASELINES:
        if baseline not in rules:
            continue
        pairs = {(c["strategy"], c["ratio"]): c for c in compared if c["baseline"] == baseline}
        out += ["", f"### {workload}: against `{baseline}` at the same ratio (paired "
                    "\\|ΔNLL\\| difference [95% CI], rule / baseline)", ""]
        out += table(lambda rule, ratio, pairs=pairs: _difference(pairs.get((rule, ratio))))
    return out + [""]


def _graded(result: ResultRow) -> bool:
    """A composition rule run at a ratio (``none`` and the references have none)."""
    return result.kind == "composition" and result.ratio > 0


def _abs(cell: ResultRow | None) -> str:
    return "-" if cell is None else ci(cell.abs_delta_nll, cell.abs_delta_nll_ci, ".3f")


def _verdict(cell: ResultRow | None, thresholds: Thresholds) -> str:
    if cell is None:
        return "-"
    figures = " / ".join([
        _upper(cell.delta_nll_ci, "+.3f"),
        format(cell.retention_ci[0], ".3f") if cell.retention_ci else "-",
        optional(cell.decisive_agreement, ".1%"),
        "-" if cell.speedup is None else f"{cell.speedup:.2f}x",
    ])
    return f"{'pass' if not failures(cell, thresholds) else 'fail'} {figures}"


def _upper(interval, fmt: str) -> str:
    return format(interval[1], fmt) if interval else "-"


def _difference(pair: dict | None) -> str:
    if pair is None:
        return "-"
    shown = ci(pair["difference"], pair["difference_ci"], "+.3f")
    ratio = pair["ratio_of_means"]
    return shown if ratio is None else f"{shown} ({ratio:.2f})"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    runs = [json.loads(Path(path).read_text()) for path in argv[1:]]
    try:
        measures = merge(runs)
    except GridError as error:
        print(f"codekv.eval.grid: {error}", file=sys.stderr)
        return 1
    config = runs[0].get("config") or {}
    thresholds = Thresholds(**config.get("thresholds", {}))
    family = (runs[0].get("model") or {}).get("family", "llama")
    print("Commands:\n")
    print("\n".join(f"- `{run['command']}`" for run in runs) + "\n")
    print(grid_tables(measures, thresholds, family))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
