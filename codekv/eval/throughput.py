"""Requests per second over an agent session whose tasks share chunks.

The session is the reuse simulation's first one (``reuse.agent_sessions``): a fixed system
prompt, then per task a few chunks of one working set in a new order, then a new question.
Each method serves the whole session in order from a cold chunk store, so the chunks' first
prefill is paid once and every later task reads them back - what an agent calling codekv
once per task sees. Time covers building the request state up to the first token.
Per method: requests per second, the median time to first token, the chunk store's bytes at
the end, and the process's peak resident memory during the method (Linux: the high-water mark
is reset before each method; elsewhere not measured).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from codekv.eval import reuse

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
    """One row per (strategy, ratio); strategy ``full`` is full prefill of the same tokens."""
    from codekv.compose import Composer
    from codekv.kvstore import LocalKVStore

    rows = []
    for strategy, ratio in methods:
        directory = Path(tempfile.mkdtemp(prefix="codekv-eval-throughput-"))
        try:
            store = LocalKVStore(directory)
            composer = Composer(backend, index, store=store, scope=scope, experimental=True)
            _reset_peak_rss()
            ttfts, tokens = [], 0
            started = time.perf_counter()
            for n, chunks in enumerate(requests, 1):
                query = QUESTION.format(n=n)
                if strategy == "full":
                    result = composer.full_prefill(chunks, query, prefix=reuse.SYSTEM_PROMPT)
                else:
                    result = composer.compose(chunks, query, prefix=reuse.SYSTEM_PROMPT,
                                              strategy=strategy, ratio=ratio)
                ttfts.append(result.report.ttft_s)
                tokens += result.report.total_tokens
            seconds = time.perf_counter() - started
            rows.append({
                "method": strategy if strategy in ("full", "none") else f"{strategy}@{ratio:g}",
                "strategy": strategy, "ratio": ratio, "requests": len(requests),
                "tokens": tokens, "seconds": round(seconds, 2),
                "requests_per_s": len(requests) / seconds if seconds else None,
                "median_ttft_s": statistics.median(ttfts) if ttfts else None,
                "store_bytes": sum(p.stat().st_size for p in directory.rglob("*.safetensors")),
                "peak_rss_mib": _peak_rss_mib(),
                "exact_prefix_hits": composer.counters.exact_prefix_hits,
                "composed": composer.counters.composed,
            })
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    full = next((r for r in rows if r["strategy"] == "full"), None)
    for row in rows:
        row["speedup"] = (row["requests_per_s"] / full["requests_per_s"]
                          if full and full["requests_per_s"] and row["requests_per_s"] else None)
    return rows


def _reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)
    except OSError:
        pass


def _peak_rss_mib() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None
