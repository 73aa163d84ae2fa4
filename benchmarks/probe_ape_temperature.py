"""Probe: does an APE-style attention temperature on reused chunk keys bring composition closer
to full prefill?

Run: python benchmarks/probe_ape_temperature.py [--workloads tool-docs code-qa] [--tasks 12]
         [--seed 1] [--temperatures 1 0.9 0.8] [--methods none query@0.15]

APE (arXiv 2502.05431) attends to chunks encoded apart with a lower temperature, sharpening
the attention that later tokens pay them. Here the keys of every reused chunk token are divided
by the temperature once the request's context is composed (the system prompt's are not: it is
an exact prefix), so the query, the recomputed rows and every generated token see
``q.k / (sqrt(d) * T)`` for reused tokens and the usual logits elsewhere; recomputed tokens get
fresh, unscaled keys. APE's second knob, a scale on the chunks' share of the softmax, needs a
bias every later decoding step would have to add, and is not probed.

Each task is scored as ``codekv eval`` scores it (same tasks for a seed, the default system
prompt, full prefill of the same tokens as the truth); every temperature runs on the same
tasks, and each is compared with T = 1 pairwise: mean ΔNLL and |ΔNLL| with 95% bootstrap
intervals, and the paired difference of |ΔNLL| against T = 1. A probe, not a feature: codekv
has no temperature option unless this shows one helps.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean

import torch


class TemperedKeys:
    """The backend, with the keys of reused chunk tokens divided by ``temperature`` when a
    request's context KV is joined (the first ``exact_tokens``, the system prompt, untouched)."""

    def __init__(self, backend):
        self.backend = backend
        self.temperature = 1.0
        self.exact_tokens = 0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def concat(self, parts):
        context = self.backend.concat(parts)
        if self.temperature == 1.0:
            return context
        keys = [key.clone() for key in context.keys]
        for key in keys:
            key[:, self.exact_tokens:] /= self.temperature
        return type(context)(keys, context.values, context.start)


@dataclass
class Tempered:
    """Each method at each temperature, labelled ``rule+T0.9@ratio`` (conditioning unchanged)."""

    methods: list
    temperatures: list[float]
    tasks: int | None = None
    offline: dict = field(default_factory=dict)

    def count(self, workload: str) -> int:
        return len(self.methods) * len(self.temperatures)

    def results(self, composer, task, prefix=None):
        from codekv.eval.methods import Method

        backend = composer.backend
        backend.exact_tokens = len(composer.build_request(task.context, task.query,
                                                          prefix).prefix_ids)
        composer.prefill(task.context, prefix)
        for temperature in self.temperatures:
            backend.temperature = temperature
            for method in self.methods:
                label = Method(method.strategy, method.ratio, conditioning=f"T{temperature:g}")
                yield label, composer.compose(task.context, task.query, prefix,
                                              strategy=method.strategy, ratio=method.ratio)
        backend.temperature = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["tool-docs", "code-qa"])
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1, help="1: not the evidence run's tasks")
    parser.add_argument("--context-tokens", type=int, default=2048)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.9, 0.8])
    parser.add_argument("--methods", nargs="+", default=["none", "query@0.15"])
    args = parser.parse_args()
    torch.set_num_threads(2)

    from codekv.compose import Composer
    from codekv.eval import runner
    from codekv.eval.harness import EvalConfig, _indexes, _tasks
    from codekv.eval.methods import Method, split_entry
    from codekv.eval.results import mean_ci
    from codekv.eval.stats import paired_difference
    from codekv.models import load_backend
    from codekv.stores.local import LocalKVStore

    if 1.0 not in args.temperatures:
        parser.error("the temperatures must include 1 (the comparison)")
    backend = TemperedKeys(load_backend())
    config = EvalConfig(workloads=tuple(args.workloads), tasks=args.tasks, seed=args.seed,
                        context_tokens=args.context_tokens)
    indexes = _indexes(config, lambda text: None)
    notes: list[str] = []
    tasks = _tasks(config, indexes, lambda text: len(backend.tokenize(text)), notes)
    methods = []
    for entry in args.methods:
        name, ratio = split_entry(entry)
        methods.append(Method(name, ratio or 0.0))
    tempered = Tempered(methods, args.temperatures)
    store = LocalKVStore(Path(tempfile.mkdtemp(prefix="codekv-probe-temperature-")))
    composers = {spec: Composer(backend, index, store, experimental=True)
                 for spec, index in {**indexes, None: None}.items()}
    runner.warm_up(backend.backend)
    measures = []
    for number, task in enumerate(tasks, 1):
        composer = composers[task.meta.get("repo")]  # a code task reads its own repository
        measures += runner.run_task(composer, task, [tempered], prefix=config.prefix)
        print(f"[{number}/{len(tasks)}] {task.id}", flush=True)
    for note in notes:
        print("note:", note)
    print(f"\n{len(tasks)} tasks (seed {args.seed}), {args.context_tokens}-token contexts, "
          "the default system prompt; 95% bootstrap intervals over tasks")
    print(f"{'workload':10} {'method':20} {'ΔNLL [95% CI]':>26} {'|ΔNLL| [95% CI]':>24} "
          f"{'decisive':>8}   |ΔNLL| minus T=1's [95% CI]")
    for workload in args.workloads:
        mine = [m for m in measures if m.workload == workload]
        for method in methods:
            base = {m.task: abs(m.delta_nll) for m in mine
                    if m.method == Method(method.strategy, method.ratio,
                                          conditioning="T1").label}
            for temperature in args.temperatures:
                label = Method(method.strategy, method.ratio,
                               conditioning=f"T{temperature:g}").label
                rows = [m for m in mine if m.method == label]
                if not rows:
                    continue
                delta, delta_ci = mean_ci([m.delta_nll for m in rows])
                absolute, absolute_ci = mean_ci([abs(m.delta_nll) for m in rows])
                decisive = [m.decisive_agreement for m in rows
                            if m.decisive_agreement is not None]
                paired = ""
                if temperature != 1.0:
                    difference, interval = paired_difference(
                        [abs(m.delta_nll) for m in rows], [base[m.task] for m in rows])
                    paired = f"{difference:+.3f} {_interval(interval)}"
                print(f"{workload:10} {label:20} {delta:+.3f} {_interval(delta_ci):>19} "
                      f"{absolute:.3f} {_interval(absolute_ci):>18} "
                      f"{fmean(decisive) if decisive else float('nan'):8.3f}   {paired}")
    return 0


def _interval(interval) -> str:
    return f"[{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "[n/a]"


if __name__ == "__main__":
    raise SystemExit(main())
