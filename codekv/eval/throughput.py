"""Requests per second over an agent session whose tasks share chunks.

The session is the reuse simulation's first one (``reuse.agent_sessions``): a fixed system
prompt, then per task a few chunks of one working set in a new order, then a new question.
Each method serves the whole session in order from a cold chunk store, so the chunks' first
prefill is paid once and every later task reads them back - what an agent calling codekv
once per task sees. Time covers building the request state up to the first token.
Per method: requests per second, the median time to first token, the chunk store's bytes at
the end and, when each method runs in its own process (``measure_isolated``, what ``codekv
eval`` does), its peak resident memory and the peak above the loaded model (Linux only).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from codekv.eval import reuse
from codekv.eval.methods import FULL, Method

QUESTION = "\n# Task {n}: explain what the code above does and where it could fail.\n"


def session_requests(source, seed: int, tasks: int, working_set: int = 24) -> list[list]:
    """The chunks of each request of one agent session (empty when the source is too small)."""
    rng = random.Random(f"reuse:{seed}")
    for session in reuse.agent_sessions(source, rng, sessions=1, tasks=tasks,
                                        working_set=working_set):
        return session
    return []


def measure(backend, index, requests: list[list], methods: list[tuple[str, float]],
            scope: str = "eval:throughput") -> list[dict]:
    """One row per (strategy, ratio), in this process; ``full`` is full prefill of the same
    tokens. Peak memory is not measured here: earlier work sets the process's high-water mark."""
    rows = [dict(serve(backend, index, requests, strategy, ratio, scope), peak_rss_mib=None,
                 peak_over_model_mib=None) for strategy, ratio in methods]
    return _with_speedups(rows)


def measure_isolated(repo: str, model: str | None, requests: list[list],
                     methods: list[tuple[str, float]], scope: str = "eval:throughput"
                     ) -> list[dict]:
    """As ``measure``, each method in a fresh process that loads the model itself, so its peak
    resident memory is its own: ``peak_over_model_mib`` is the peak above the loaded model."""
    import multiprocessing

    ids = [[chunk.id for chunk in chunks] for chunks in requests]
    rows = []
    context = multiprocessing.get_context("spawn")
    for strategy, ratio in methods:
        with context.Pool(1) as pool:
            rows.append(pool.apply(_serve_alone, (repo, model, ids, strategy, ratio, scope)))
    return _with_speedups(rows)


def serve(backend, index, requests: list[list], strategy: str, ratio: float,
          scope: str) -> dict:
    """Serve the session in order from a new, empty chunk store; the store is removed after."""
    from codekv.compose import Composer
    from codekv.stores.local import LocalKVStore

    directory = Path(tempfile.mkdtemp(prefix="codekv-eval-throughput-"))
    try:
        composer = Composer(backend, index, store=LocalKVStore(directory), scope=scope,
                            experimental=True)
        ttfts, tokens = [], 0
        started = time.perf_counter()
        for n, chunks in enumerate(requests, 1):
            query = QUESTION.format(n=n)
            if strategy == FULL:
                result = composer.full_prefill(chunks, query, prefix=reuse.SYSTEM_PROMPT)
            else:
                result = composer.compose(chunks, query, prefix=reuse.SYSTEM_PROMPT,
                                          strategy=strategy, ratio=ratio)
            ttfts.append(result.report.ttft_s)
            tokens += result.report.total_tokens
        seconds = time.perf_counter() - started
        return {
            "method": Method(strategy, ratio, "reference" if strategy == FULL else "composition"
                             ).label,
            "strategy": strategy, "ratio": ratio, "requests": len(requests), "tokens": tokens,
            "seconds": round(seconds, 2),
            "requests_per_s": len(requests) / seconds if seconds else None,
            "median_ttft_s": statistics.median(ttfts) if ttfts else None,
            "store_bytes": sum(p.stat().st_size for p in directory.rglob("*.safetensors")),
            "exact_prefix_hits": composer.counters.exact_prefix_hits,
            "composed": composer.counters.composed,
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _serve_alone(repo: str, model: str | None, ids: list[list[str]], strategy: str,
                 ratio: float, scope: str) -> dict:
    """In a child process: load the model, warm up, then serve with the peak RSS reset."""
    from codekv.eval.runner import warm_up
    from codekv.index import Index
    from codekv.models import load_backend

    backend = load_backend(model)
    index = Index(repo)
    warm_up(backend)
    resettable = _reset_peak_rss()
    loaded = _status_mib("VmRSS")
    row = serve(backend, index, ids, strategy, ratio, scope)
    peak = _status_mib("VmHWM") if resettable else None
    index.close()
    return dict(row, peak_rss_mib=peak,
                peak_over_model_mib=None if peak is None or loaded is None
                else round(peak - loaded, 1))


def _with_speedups(rows: list[dict]) -> list[dict]:
    full = next((r for r in rows if r["strategy"] == FULL), None)
    for row in rows:
        row["speedup"] = (row["requests_per_s"] / full["requests_per_s"]
                          if full and full["requests_per_s"] and row["requests_per_s"] else None)
    return rows


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)
        return True
    except OSError:
        return False


def _status_mib(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None
