"""How fast ``codekv index`` is on the standard library: cold, nothing changed, one file changed.

Usage: ``python benchmarks/bench_index.py [--repeat N] [--workers N] [--limit N] [--bytes]
[--first-run]``.

Everything happens under a fresh ``CODEKV_HOME`` in a temporary directory. Each phase runs in
its own Python process, as ``codekv index`` would, and reports two times: the wall time of the
whole process (interpreter start and imports included) and of ``Index.update()`` alone, plus the
peak RSS of that process and of its worker processes (``RUSAGE_CHILDREN``: the largest one).
The tokenizer is built from the model's GGUF file once before timing (well under a second,
cached in the model cache) and that build is not counted in these phases.

``--first-run`` also times what a user's first ``codekv index --stdlib`` costs: one CLI process
in a fresh home with no model cache, so making the standard library's git repository and
building the tokenizer are counted, against the 10 s target.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The file edited for the one-file-change phase: mid-sized, imported by several others.
CHANGED_FILE = "json/decoder.py"
EDIT = b"\n\ndef _codekv_bench_added(value):\n    return JSONDecodeError(str(value), '', 0)\n"


def _phase(repo: str, workers: int | None, use_bytes: bool) -> None:
    """Child side: one ``Index.update()``, reported as one JSON line on stdout."""
    started = time.perf_counter()
    from codekv.index import Index
    from codekv.tokens import CounterSpec

    counter = CounterSpec("bytes") if use_bytes else None
    index = Index(repo, counter=counter)
    opened = time.perf_counter()
    summary = index.update(workers=workers)
    updated = time.perf_counter()
    index.close()
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN
    )
    report = {
        "update_s": updated - opened,
        "open_s": opened - started,
        "files": summary.files,
        "parsed": summary.parsed,
        "chunks": sum(summary.chunks.values()),
        "uses": summary.anchors.get("use", 0),
        "edges": summary.graph_edges,
        "rss_main_mib": _peak_rss_mib(me),
        "rss_worker_mib": children.ru_maxrss / 1024,  # KiB on Linux: the largest worker
        "cpu_main_s": me.ru_utime + me.ru_stime,
        "cpu_workers_s": children.ru_utime + children.ru_stime,
        "counter": index.counter.kind,
    }
    print(json.dumps(report))


def _peak_rss_mib(usage) -> float:
    """This process's peak RSS. ``ru_maxrss`` would do, except that a process started by
    fork+exec inherits its parent's peak there, so Linux's per-process VmHWM is read first."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return usage.ru_maxrss / 1024


def _run_phase(repo: Path, env: dict, args) -> dict:
    command = [sys.executable, __file__, "--phase", str(repo)]
    if args.workers:
        command += ["--workers", str(args.workers)]
    if args.bytes:
        command.append("--bytes")
    started = time.perf_counter()
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["wall_s"] = time.perf_counter() - started
    return report


def _edit(repo: Path, round_: int) -> None:
    """Change one file in the working tree (a new edit each round, so it is never cached)."""
    path = repo / CHANGED_FILE
    if not path.is_file():  # --limit left it out: any file will do
        path = sorted(repo.rglob("*.py"))[0]
    path.write_bytes(path.read_bytes() + EDIT.replace(b"added", f"added_{round_}".encode()))


TARGETS = {"cold": 10.0, "no-change": 0.5, "one-file": 1.0}  # seconds, wall
FIRST_RUN_TARGET = 10.0


def _first_run(tmp: Path) -> dict:
    """``codekv index --stdlib --json`` in a fresh home, the model cache inside it (empty)."""
    env = dict(os.environ, CODEKV_HOME=str(tmp / "first-run-home"))
    env.pop("CODEKV_MODEL_CACHE", None)
    command = [sys.executable, "-c", "from codekv.cli import main; main()",
               "index", "--stdlib", "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "seconds": summary["seconds"], "files": summary["files"],
            "parsed": summary["parsed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the three phases")
    parser.add_argument("--workers", type=int, default=None, help="parser processes")
    parser.add_argument("--limit", type=int, default=None, help="only the first N stdlib files")
    parser.add_argument("--bytes", action="store_true", help="count bytes, not tokens")
    parser.add_argument("--first-run", action="store_true",
                        help="also time `codekv index --stdlib` in a fresh home, no model cache")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        _phase(args.phase, args.workers, args.bytes)
        return

    from codekv import paths
    from codekv.stdlib_repo import make_stdlib_repo
    from codekv.tokens import default_counter_spec

    # The built tokenizer lives in the model cache, which stays where it is (built once per
    # machine); everything else goes to a fresh home.
    model_cache = str(paths.model_cache())
    with tempfile.TemporaryDirectory(prefix="codekv-bench-") as tmp:
        env = dict(os.environ, CODEKV_HOME=str(Path(tmp) / "home"),
                   CODEKV_MODEL_CACHE=model_cache)
        os.environ.update(CODEKV_HOME=env["CODEKV_HOME"], CODEKV_MODEL_CACHE=model_cache)
        repo = make_stdlib_repo(Path(tmp) / "stdlib", limit=args.limit)
        files = list(repo.rglob("*.py"))
        source_mib = sum(p.stat().st_size for p in files) / (1 << 20)
        started = time.perf_counter()
        spec = None if args.bytes else default_counter_spec()
        warmed = time.perf_counter() - started
        if spec is None:
            note = "bytes (--bytes)"
        elif spec.kind == "tokenizer":
            note = (f"the default model's tokenizer; its model cache ({model_cache}) was "
                    f"warmed first ({warmed:.1f} s) and is not counted")
        else:
            note = "bytes (the default model is not installed)"
        print(f"repository: the standard library, {len(files)} .py files, {source_mib:.1f} MiB")
        print(f"token counter: {note}")
        print(
            f"cores: {len(os.sched_getaffinity(0))}, workers: {args.workers or 'default'}; "
            f"load average at start: {os.getloadavg()[0]:.2f} (other work on the machine "
            "stretches wall times; CPU seconds less so)"
        )
        print("wall: the whole `Index(...).update()` process, interpreter start included; "
              "update: the call alone")
        print("main MiB: peak RSS of that process; worker MiB: of its largest worker")
        print()
        header = (
            f"{'round':>5} {'phase':<10} {'wall s':>7} {'update s':>8} {'files':>6} "
            f"{'parsed':>6} {'chunks':>7} {'uses':>7} {'main MiB':>8} {'worker MiB':>10} "
            f"{'main cpu s':>10} {'workers cpu s':>13}"
        )
        print(header)
        rows = []
        for round_ in range(1, args.repeat + 1):
            database = Path(env["CODEKV_HOME"]) / "index.sqlite"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{database}{suffix}").unlink(missing_ok=True)
            for phase in TARGETS:
                if phase == "one-file":
                    _edit(repo, round_)
                report = _run_phase(repo, env, args)
                rows.append((phase, report))
                print(
                    f"{round_:>5} {phase:<10} {report['wall_s']:>7.2f} {report['update_s']:>8.2f} "
                    f"{report['files']:>6} {report['parsed']:>6} {report['chunks']:>7} "
                    f"{report['uses']:>7} {report['rss_main_mib']:>8.0f} "
                    f"{report['rss_worker_mib']:>10.0f} {report['cpu_main_s']:>10.2f} "
                    f"{report['cpu_workers_s']:>13.2f}",
                    flush=True,
                )
        if args.first_run:
            load = os.getloadavg()[0]
            first = _first_run(Path(tmp))
            verdict = "meets" if first["wall_s"] <= FIRST_RUN_TARGET else "misses"
            print()
            print(f"first run (`codekv index --stdlib --json`, fresh home, no model cache; "
                  f"load average at start {load:.2f}): wall {first['wall_s']:.2f} s, reported "
                  f"seconds {first['seconds']:.2f}, {first['files']} files, {first['parsed']} "
                  f"parsed ({verdict} the {FIRST_RUN_TARGET:g} s target)", flush=True)
        print()
        print(f"best of {args.repeat}:")
        for phase, target in TARGETS.items():
            reports = [r for p, r in rows if p == phase]
            wall = min(r["wall_s"] for r in reports)
            update = min(r["update_s"] for r in reports)
            verdict = "meets" if wall <= target else "misses"
            print(f"  {phase:<10} wall {wall:6.2f} s, update {update:6.2f} s "
                  f"({verdict} the {target:g} s target)")


if __name__ == "__main__":
    main()
