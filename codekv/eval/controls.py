"""The gate's operating characteristics: how often each criterion passes a rule, at a task count.

A criterion that passes a rule equal to full prefill one time in ten, or a bad rule half the
time, licenses by luck. So each criterion of the design (``codekv.eval.support.Thresholds``)
is run on resampled cells: ``tasks`` tasks drawn with replacement from a measured cell's paired
per-task measures, many times, and the share of draws that pass is that criterion's pass
probability for a rule like the measured one at that task count. The controls:

- positive: ``all`` (full prefill recomputed through the composing path: equal to it up to
  the engine's floor), and ``centred``: a measured rule's ΔNLL with its mean taken away, i.e.
  a rule whose answers move as much as that rule's but are no worse on average (what the
  ΔNLL criterion must pass);
- negative: ``none`` (nothing recomputed) and ``random`` (a random share recomputed), which
  measurably lose quality at 2K and beyond and must fail.

``python -m codekv.eval.controls results.json`` prints the table for an ``eval --json`` file
(``--checkpoint FILE``: for an unfinished run's tasks so far).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from codekv.eval.measures import Measure
from codekv.eval.stats import bootstrap_ci, wilson_ci
from codekv.eval.support import CRITERIA, Thresholds

DRAWS = 1000
SAMPLES = 1000  # bootstrap resamples per draw's interval (the gate's own use 4,000)
DESIGNED = Thresholds()  # the gate design's criteria


@dataclass(frozen=True)
class Cell:
    """One method's paired per-task measures on one workload, in task order, beside full
    prefill's for the same tasks."""

    method: str
    delta_nll: np.ndarray
    solved_by_full: np.ndarray  # bool per task
    solved: np.ndarray  # bool per task: the method's greedy answer is the expected one
    decisive_agreement: np.ndarray  # per task; NaN where every position was a near-tie
    speedup: np.ndarray  # full prefill's TTFT over the method's, per task

    @classmethod
    def of(cls, method: str, pairs: list[tuple[Measure, Measure]]) -> Cell:
        return cls(method,
                   np.array([m.delta_nll for _, m in pairs]),
                   np.array([bool(f.answer_exact) for f, _ in pairs]),
                   np.array([bool(m.answer_exact) for _, m in pairs]),
                   np.array([math.nan if m.decisive_agreement is None
                             else m.decisive_agreement for _, m in pairs]),
                   np.array([f.ttft_s / m.ttft_s if m.ttft_s > 0 else math.nan
                             for f, m in pairs]))

    def centred(self) -> Cell:
        """The positive control built from this cell: the same per-task ΔNLL spread about a
        mean of zero (a rule as noisy as this one and no worse on average)."""
        return Cell(f"{self.method} centred", self.delta_nll - self.delta_nll.mean(),
                    self.solved_by_full, self.solved, self.decisive_agreement, self.speedup)

    def take(self, rows: np.ndarray) -> Cell:
        return Cell(self.method, self.delta_nll[rows], self.solved_by_full[rows],
                    self.solved[rows], self.decisive_agreement[rows], self.speedup[rows])


@dataclass(frozen=True)
class Summary:
    """A resampled cell as the design's criteria read a result row."""

    delta_nll_ci: tuple[float, float] | None
    solved: int
    retention_ci: tuple[float, float] | None
    decisive_agreement: float | None
    speedup: float | None

    @classmethod
    def of(cls, cell: Cell, seed: int) -> Summary:
        kept = cell.solved[cell.solved_by_full]
        decisive = cell.decisive_agreement[~np.isnan(cell.decisive_agreement)]
        speedup = cell.speedup[~np.isnan(cell.speedup)]
        return cls(bootstrap_ci(cell.delta_nll, samples=SAMPLES, seed=seed), len(kept),
                   wilson_ci(int(kept.sum()), len(kept)),
                   float(decisive.mean()) if len(decisive) else None,
                   float(np.median(speedup)) if len(speedup) else None)


def pass_probability(cell: Cell, tasks: int, thresholds: Thresholds = DESIGNED,
                     draws: int = DRAWS, seed: int = 0) -> dict[str, float]:
    """Each criterion's pass probability (and every criterion's together, ``all``) for a rule
    like ``cell`` judged on ``tasks`` tasks drawn from its own."""
    rng = np.random.default_rng(seed)
    passed = {name: 0 for name in (*CRITERIA, "all")}
    for draw in range(draws):
        sample = Summary.of(cell.take(rng.integers(0, len(cell.delta_nll), size=tasks)), draw)
        results = [check(sample, thresholds) is None for check in CRITERIA.values()]
        for name, ok in zip(CRITERIA, results, strict=True):
            passed[name] += ok
        passed["all"] += all(results)
    return {name: float(count) / draws for name, count in passed.items()}


def cells(measures: list[Measure], workload: str | None = None) -> list[Cell]:
    """Every composition method's cell of ``measures`` (one workload's), paired with full
    prefill on the tasks both ran."""
    full = {(m.workload, m.task): m for m in measures if m.method == "full"}
    grouped: dict[str, list[tuple[Measure, Measure]]] = {}
    for m in measures:
        if m.kind != "composition" or (workload and m.workload != workload):
            continue
        if (m.workload, m.task) in full:
            grouped.setdefault(m.method, []).append((full[(m.workload, m.task)], m))
    return [Cell.of(method, pairs) for method, pairs in grouped.items()]


def table(measures: list[Measure], tasks: int, thresholds: Thresholds = DESIGNED,
          draws: int = DRAWS, centre: tuple[str, ...] = ()) -> list[dict]:
    """One row per cell (and a centred row for each method in ``centre``): its measured means
    and, under ``pass``, each criterion's pass probability at ``tasks`` tasks."""
    rows = []
    for cell in cells(measures):
        for judged in (cell, *([cell.centred()] if cell.method in centre else [])):
            kept = judged.solved[judged.solved_by_full]
            rows.append({
                "method": judged.method, "measured_tasks": len(judged.delta_nll),
                "delta_nll": float(judged.delta_nll.mean()),
                "delta_nll_sd": float(judged.delta_nll.std(ddof=1)),
                "solved_share": float(judged.solved_by_full.mean()),
                "retention": float(kept.mean()) if len(kept) else None,
                "tasks": tasks, "pass": pass_probability(judged, tasks, thresholds, draws)})
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| cell | measured tasks | ΔNLL (SD) | full prefill solves | retention | "
            "P(pass) ΔNLL | retention | decisive | speedup | all |")
    out = [head, "|" + " --- |" * 10]
    for r in rows:
        retention = "n/a" if r["retention"] is None else f"{r['retention']:.3f}"
        out.append(f"| {r['method']} | {r['measured_tasks']} | {r['delta_nll']:+.3f} "
                   f"({r['delta_nll_sd']:.3f}) | {r['solved_share']:.0%} | {retention} | "
                   + " | ".join(f"{r['pass'][k]:.2f}" for k in (*CRITERIA, "all")) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    from codekv.eval.markdown import arguments, loaded

    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=DESIGNED.min_tasks,
                        help="the task count to judge at [the design's min_tasks]")
    parser.add_argument("--draws", type=int, default=DRAWS)
    parser.add_argument("--centre", default="",
                        help="methods whose ΔNLL to also judge centred on zero, comma-separated")
    args = parser.parse_args(argv)
    data = loaded(parser, args)
    measures = [Measure.from_json(m) for m in data["measures"]]
    centre = tuple(name for name in args.centre.split(",") if name)
    print(f"Pass probability at {args.tasks} tasks, {args.draws} draws each\n")
    print(markdown(table(measures, args.tasks, draws=args.draws, centre=centre)))


if __name__ == "__main__":
    main()
