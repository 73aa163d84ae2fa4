"""Render an evaluation's JSON (``codekv eval --json``) as the Markdown tables of docs/results.md.

Usage: ``python -m codekv.eval.markdown results.json > docs/results.md.tables``, or
``python -m codekv.eval.markdown --checkpoint run.jsonl`` for the tasks an unfinished run's
checkpoint holds so far (result rows and comparisons; no gate verdicts).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from codekv.eval import checkpoint
from codekv.eval.measures import Measure, ResultRow
from codekv.eval.report import ci, is_peer, is_pruning, retained
from codekv.eval.results import aggregate, comparisons


def results(data: dict) -> list[ResultRow]:
    """The result rows of an ``eval --json`` document."""
    return [ResultRow.from_json(r) for r in data["results"]]


def row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def results_tables(data: dict) -> str:
    """Composition and reference rows per workload, each mean with its 95% interval."""
    lines = []
    for workload in dict.fromkeys(r.workload for r in results(data)):
        lines += [f"### {workload}", ""]
        lines.append(row(["method", "ratio", "tasks", "ΔNLL [95% CI]", "\\|ΔNLL\\| [95% CI]",
                           "agreement", "decisive agreement", "near-ties",
                           "retention [95% CI] of solved", "edit-similarity drop [95% CI]", "KL",
                           "TTFT s", "speedup"]))
        lines.append(row(["---"] * 13))
        for r in results(data):
            if r.workload != workload or is_pruning(r) or is_peer(r):
                continue
            lines.append(row([
                r.rule or r.strategy or r.method,
                f"{r.ratio:.2f}", r.tasks, ci(r.delta_nll, r.delta_nll_ci, "+.3f"),
                ci(r.abs_delta_nll, r.abs_delta_nll_ci, ".3f"), f"{r.agreement:.2f}",
                optional(r.decisive_agreement, ".2f"), r.near_ties,
                retained(r.retention, r.retention_ci, r.solved),
                ci(r.score_drop, r.score_drop_ci, "+.1f"), f"{r.kl:.3f}",
                f"{r.ttft_s:.2f}", optional(r.speedup, ".2f") + "x",
            ]))
        lines.append("")
    return "\n".join(lines)


def comparison_tables(data: dict) -> str:
    """Rules against the baselines at the same ratio: paired differences of mean |ΔNLL|."""
    rows = data.get("comparisons") or []
    if not rows:
        return ""
    lines = [row(["workload", "rule", "baseline", "ratio", "tasks", "\\|ΔNLL\\| rule",
                   "\\|ΔNLL\\| baseline", "difference [95% CI]", "rule / baseline"]),
             row(["---"] * 9)]
    for c in rows:
        lines.append(row([c["workload"], c["strategy"], c["baseline"], f"{c['ratio']:g}",
                           c["tasks"], f"{c['mean']:.3f}", f"{c['baseline_mean']:.3f}",
                           ci(c["difference"], c["difference_ci"], "+.3f"),
                           optional(c["ratio_of_means"], ".2f")]))
    return "\n".join(lines) + "\n"


def subset_tables(data: dict) -> str:
    """Each method on subsets of the tasks: per repository they were drawn from (the one rules
    were developed on, and one they were not), and for agent sessions by whether each call's
    system prompt opened with a header of its own; mean ΔNLL, |ΔNLL| and retention with
    intervals there. Empty when no task falls in more than one subset of a kind."""
    if data.get("tasks"):
        tasks = {t["id"]: t for t in data["tasks"]}
    else:  # a checkpoint: code-qa task ids start with their repository
        tasks = {m["task"]: {"repo": m["task"].split("/")[0]} for m in data.get("measures", [])
                 if "/" in m["task"]}
    kinds = {"repository": lambda t: t.get("repo"),
             "system prompt": lambda t: None if "volatile" not in t else (
                 "a header of its own each call" if t["volatile"] else "the same each call")}
    lines = [row(["subset", "method", "tasks", "ΔNLL [95% CI]", "\\|ΔNLL\\| [95% CI]",
                   "retention [95% CI] of solved"]), row(["---"] * 6)]
    for kind, subset_of in kinds.items():
        groups: dict[str, list[Measure]] = {}
        for m in data.get("measures", []):
            label = subset_of(tasks[m["task"]]) if m["task"] in tasks else None
            if label is not None and m["kind"] in ("composition", "reference"):
                groups.setdefault(label, []).append(Measure.from_json(m))
        if len(groups) < 2:
            continue
        for label, measures in groups.items():
            for r in aggregate(measures):
                if r.method != "full":
                    lines.append(row([f"{kind}: {label}", r.method, r.tasks,
                                      ci(r.delta_nll, r.delta_nll_ci, "+.3f"),
                                      ci(r.abs_delta_nll, r.abs_delta_nll_ci, ".3f"),
                                      retained(r.retention, r.retention_ci, r.solved)]))
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def conditioning_table(data: dict) -> str:
    """What each conditioning costs offline (filling the chunk store) against what it buys;
    empty unless the run crossed several conditionings."""
    rows = [r for r in results(data) if r.kind == "composition"]
    if len({r.conditioning for r in rows}) < 2:
        return ""
    lines = [row(["workload", "method", "conditioning", "\\|ΔNLL\\| [95% CI]", "KL",
                   "offline prefill s/task", "offline tokens/task"]), row(["---"] * 7)]
    for r in sorted(rows, key=lambda r: (r.workload, r.strategy, r.ratio)):
        lines.append(row([r.workload, r.method, r.conditioning,
                           ci(r.abs_delta_nll, r.abs_delta_nll_ci, ".3f"),
                           f"{r.kl:.3f}", f"{r.offline_prefill_s:.2f}",
                           f"{r.offline_tokens:.0f}"]))
    return "\n".join(lines) + "\n"


def optional(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def pruning_tables(data: dict) -> str:
    """KV pruning baselines (kvpress) at equal KV budgets, per workload; empty without any."""
    rows = [r for r in results(data) if is_pruning(r)]
    lines = []
    for workload in dict.fromkeys(r.workload for r in rows):
        lines += [f"### {workload}: KV pruning at equal budgets", ""]
        lines.append(row(["method", "KV budget", "KV kept", "tasks", "ΔNLL", "agreement",
                           "exact match", "KL", "TTFT s", "speedup"]))
        lines.append(row(["---"] * 10))
        for r in rows:
            if r.workload == workload:
                lines.append(row([
                    r.strategy, f"{r.budget:.0%}", f"{r.kv_kept:.1%}", r.tasks,
                    f"{r.delta_nll:+.3f}", f"{r.agreement:.2f}", f"{r.exact_match:.2f}",
                    f"{r.kl:.3f}", f"{r.ttft_s:.2f}", f"{r.speedup:.2f}x",
                ]))
        lines.append("")
    return "\n".join(lines)


def peer_table(data: dict) -> str:
    """The peer library (kvboost) on the same tokens; empty when it did not run."""
    rows = [r for r in results(data) if is_peer(r)]
    if not rows:
        return ""
    lines = [row(["workload", "method", "tasks", "reused", "ΔNLL", "agreement", "exact match",
                   "KL", "TTFT s", "speedup"]), row(["---"] * 10)]
    for r in rows:
        lines.append(row([
            r.workload, r.method, r.tasks, f"{1 - r.recompute_ratio:.0%}",
            f"{r.delta_nll:+.3f}", f"{r.agreement:.2f}", f"{r.exact_match:.2f}",
            f"{r.kl:.3f}", f"{r.ttft_s:.2f}", f"{r.speedup:.2f}x",
        ]))
    return "\n".join(lines) + "\n"


def throughput_table(data: dict) -> str:
    """Requests per second over one agent session; empty when not measured."""
    rows = data.get("throughput") or []
    if not rows:
        return ""
    lines = [row(["method", "requests", "tokens", "seconds", "requests/s", "vs full",
                   "median TTFT s", "store MiB", "peak RSS MiB (over model)"]),
             row(["---"] * 9)]
    for r in rows:
        lines.append(row([
            r["method"], r["requests"], r["tokens"], f"{r['seconds']:.1f}",
            f"{r['requests_per_s']:.2f}", f"{r['speedup']:.2f}x", f"{r['median_ttft_s']:.2f}",
            f"{r['store_bytes'] / 2**20:.0f}",
            "-" if r.get("peak_rss_mib") is None
            else f"{r['peak_rss_mib']:.0f} ({r['peak_over_model_mib']:+.0f})",
        ]))
    return "\n".join(lines) + "\n"


def gate_table(data: dict) -> str:
    lines = [row(["family", "workload", "verdict", "best / closest", "ΔNLL [95% CI]",
                   "retention [95% CI] of solved", "decisive agreement",
                   "edit-similarity drop [95% CI]", "speedup"]),
             row(["---"] * 9)]
    for entry in data.get("gate", []):
        measured = entry.get("measured", {})
        lines.append(row([
            entry["family"], entry["workload"], "pass" if entry["passed"] else "fail",
            entry.get("method") or entry.get("closest") or "-",
            ci(measured.get("delta_nll"), measured.get("delta_nll_ci"), "+.3f"),
            retained(measured.get("retention"), measured.get("retention_ci"),
                     measured.get("solved")),
            optional(measured.get("decisive_agreement"), ".3f"),
            ci(measured.get("score_drop"), measured.get("score_drop_ci"), "+.1f"),
            optional(measured.get("speedup"), ".2f") + "x",
        ]))
    return "\n".join(lines)


def from_checkpoint(path: str) -> dict:
    """An unfinished run's finished tasks, shaped like ``codekv eval --json`` output."""
    contents = checkpoint.read(path)
    measures = [m for done in contents.done.values() for m in done]
    return {"command": f"the {len(contents.done)} finished tasks of a checkpoint of a run with "
                       f"configuration {json.dumps(contents.config, sort_keys=True)}",
            "results": [r.as_json() for r in aggregate(measures)],
            "comparisons": comparisons(measures),
            "measures": [m.as_json() for m in measures], "gate": []}


def load(results: str | None, checkpoint_path: str | None) -> dict:
    """A results file (``codekv eval --json``) or a checkpoint's finished tasks, shaped alike;
    ``ValueError`` says why a file cannot be read as one."""
    if checkpoint_path is not None:
        return from_checkpoint(checkpoint_path)  # CheckpointError is a ValueError
    try:
        data = json.loads(Path(results).read_text())
    except OSError as error:
        raise ValueError(f"{results}: {error.strerror or error}") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{results}: not a results file (not JSON: {error})") from error
    if not isinstance(data, dict) or not isinstance(data.get("measures"), list):
        raise ValueError(f"{results}: not a results file (no list of measures)")
    return data


def arguments(description: str) -> argparse.ArgumentParser:
    """The two ways to name a run's measures: a results file, or ``--checkpoint``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("results", nargs="?", help="a `codekv eval --json` file")
    parser.add_argument("--checkpoint", help="or an unfinished run's checkpoint (its tasks so far)")
    return parser


def loaded(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The run ``args`` name; a usage error (exit status 2) where they name none, both or a
    file that is not one."""
    if (args.results is None) == (args.checkpoint is None):
        parser.error("name a results file or --checkpoint, one of them")
    try:
        return load(args.results, args.checkpoint)
    except ValueError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__.splitlines()[0])
    data = loaded(parser, parser.parse_args(argv))
    print(f"Command: `{data['command']}`\n")
    print(gate_table(data))
    print()
    print(results_tables(data))
    compared = comparison_tables(data)
    if compared:
        print(f"### Rules against baselines at the same ratio\n\n{compared}")
    for title, table in (("Per subset of the tasks", subset_tables(data)),
                         ("Conditioning: offline cost and quality", conditioning_table(data))):
        if table:
            print(f"### {title}\n\n{table}")
    pruning = pruning_tables(data)
    if pruning:
        print(pruning)
    for title, table in (("Peer library", peer_table(data)),
                         ("Throughput", throughput_table(data))):
        if table:
            print(f"### {title}\n\n{table}")
    reuse = data.get("reuse")
    if reuse:
        print(f"Reuse on simulated agent sessions ({reuse['sessions']} sessions x "
              f"{reuse['tasks_per_session']} tasks, {reuse['prefill_tokens']} prefill tokens): "
              f"an exact prefix cache could reuse {reuse['exact_prefix_share']:.1%}, chunk "
              f"composition {reuse['composition_share']:.1%} "
              f"({reuse['composition_share_after_recompute']:.1%} after recomputing "
              f"{reuse['recompute_ratio']:.0%}).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
