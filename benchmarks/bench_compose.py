"""Time to first token: composed chunk KV vs full prefill, on a model (--model) and real code.

Run: python benchmarks/bench_compose.py [--contexts 2048 4096] [--repeats 2] [--threads 2]
         [--backend transformers llama.cpp openvino] [--model gemma3] [--probe-cost]

For each context length, chunks of the standard library (made into a git repository) are
taken in a fixed order until the context holds that many tokens; a short question follows.
The chunk store is filled first (as `codekv prefill` would), then each method is timed side by
side on the same tokens: full prefill, and composition per strategy with the store load
included in its time to first token. Prints speedups, the share of tokens recomputed and of
full prefill's attention work they do (late rows attend to more keys), KL vs full prefill,
store bytes per token, the machine's load and peak memory. ``--profile`` adds one profiled run
of each method: the share of its CPU time spent in the attention kernel. With several ``--backend``
engines, each context is measured on each engine in turn (the same chunks; each engine's own
tokenizer and full prefill), so their ratios are taken side by side. ``--probe-cost`` (llama.cpp)
times what reading the query's attention through the eval callback costs, side by side with
the same work done without it. ``--per-run`` (llama.cpp, the patched build) times each
strategy a second time with one decode per run of recomputed positions, as a stock build
does, beside its one-batch recompute.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

QUESTION = "\n# Question: which of the functions above is called first by the code below?\n"
MODULES = ["shlex.py", "textwrap.py", "fnmatch.py", "glob.py", "string.py", "tokenize.py",
           "argparse.py", "difflib.py"]


def pick_chunks(index, backend, target_tokens: int):
    chunks, total = [], 0
    for path in MODULES:
        for chunk in index.find(path):
            if chunk.kind == "module" or chunk.n_tokens < 64:
                continue
            n = len(backend.tokenize(f"# {chunk.path}\n" + index.text(chunk).decode() + "\n\n"))
            if total + n > target_tokens:
                continue
            chunks.append(chunk)
            total += n
            if total > target_tokens - 64:
                return chunks, total
    return chunks, total


def attention_seconds(run) -> tuple[float, float]:
    """(seconds in attention kernels, seconds of all CPU ops) of one profiled ``run()``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    attention = sum(e.self_cpu_time_total for e in events if "scaled_dot_product" in e.key)
    return attention / 1e6, total / 1e6


def kl(reference: torch.Tensor, other: torch.Tensor) -> float:
    p, q = torch.log_softmax(reference, -1), torch.log_softmax(other, -1)
    return float((p.exp() * (p - q)).sum())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--strategies", nargs="+", default=["none", "boundary", "anchors"])
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2,
                        help="torch's threads and llama.cpp's ($CODEKV_LLAMA_THREADS): full "
                             "prefill and composition run on the same ones")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one run per method: attention kernel's share of time")
    parser.add_argument("--backend", nargs="+", default=["transformers"],
                        choices=["transformers", "llama.cpp", "openvino"])
    parser.add_argument("--model", default=None,
                        help="a named model (smollm2, gemma3), a GGUF file or a model directory "
                             "[the default model]")
    parser.add_argument("--probe-cost", action="store_true",
                        help="llama.cpp: the query probe's cost against the same decode without "
                             "the eval callback")
    parser.add_argument("--per-run", action="store_true",
                        help="llama.cpp: also recompute one decode per run of positions (a "
                             "stock build's way), beside the one-batch recompute")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["CODEKV_LLAMA_THREADS"] = str(args.threads)  # read when llama.cpp loads

    from codekv.index import Index
    from codekv.models import load_backend
    from codekv.stdlib_repo import make_stdlib_repo

    backends = [load_backend(args.model, engine=name) for name in args.backend]
    index = Index(make_stdlib_repo())
    index.update()
    for backend in backends:
        print(f"{backend.info.engine}: model {backend.info.family} {backend.info.dtype}")
    print(f"threads {args.threads}, ratio {args.ratio}, repeats {args.repeats} (median "
          f"reported), load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for target in args.contexts:
        chunks, _ = pick_chunks(index, backends[0], target)
        for backend in backends:
            measure(backend, index, chunks, args)
            if args.probe_cost and backend.info.engine == "llama.cpp":
                probe_cost(backend, index, chunks, args)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak memory (RSS) {peak:.0f} MiB")
    return 0


def measure(backend, index, chunks, args) -> None:
    """Full prefill and each strategy on ``chunks``, side by side on one engine."""
    from codekv.compose import Composer
    from codekv.stores.local import LocalKVStore

    store_dir = Path(tempfile.mkdtemp(prefix="codekv-bench-kv-"))
    composer = Composer(backend, index, LocalKVStore(store_dir), experimental=True)
    t0 = time.perf_counter()
    composer.prefill(chunks)
    fill_s = time.perf_counter() - t0
    query = QUESTION
    full_times, results = [], {}
    reference = None
    for _ in range(args.repeats):
        full = composer.full_prefill(chunks, query)
        full_times.append(full.report.ttft_s)
        reference = full.next_token_logits()
    full_s = statistics.median(full_times)
    ways = [""]
    if args.per_run and getattr(backend, "scattered_batches", False):
        ways.append(" per run")
    scatter = getattr(backend, "_scatter", None)
    for suffix in ways:
        if suffix:
            backend._scatter = None  # one decode per run, as a stock build recomputes
        for name in args.strategies:
            if suffix and name == "none":
                continue  # nothing recomputed
            times = []
            for _ in range(args.repeats):
                # A fresh store object each time: entries are read from disk, not memory.
                composer.chunks.store = LocalKVStore(store_dir)
                result = composer.compose(chunks, query, strategy=name, ratio=args.ratio)
                assert result.report.chunk_misses == 0, "store should be warm"
                times.append(result.report.ttft_s)
            results[name + suffix] = (statistics.median(times), result)
    if len(ways) > 1:
        backend._scatter = scatter
    if args.profile:
        print("  attention kernel (torch.profiler, one run each): seconds, share of CPU time")
        for name in ["full", *args.strategies]:
            def run(name=name):
                if name == "full":
                    return composer.full_prefill(chunks, query)
                return composer.compose(chunks, query, strategy=name, ratio=args.ratio)
            attention, total = attention_seconds(run)
            print(f"    {name:<12} {attention:6.2f} s of {total:6.2f} s ({attention / total:.0%})")
    stats = LocalKVStore(store_dir).stats()
    n_tokens = full.report.context_tokens
    print(f"\n{backend.info.engine}: context {n_tokens} tokens in {len(chunks)} chunks "
          f"(store filled in {fill_s:.1f} s), load average {os.getloadavg()[0]:.1f}")
    print(f"  {'method':<20} {'ttft_s':>8} {'speedup':>8} {'recompute':>10} {'attention':>10} "
          f"{'KL':>8} {'top1':>5}  phases")
    print(f"  {'full':<20} {full_s:8.2f} {1.0:8.1f}x {'100%':>10} {'100%':>10} {0.0:8.4f} "
          f"{'yes':>5}")
    for name, (ttft, result) in results.items():
        report = result.report
        logits = result.next_token_logits()
        agree = "yes" if int(reference.argmax()) == int(logits.argmax()) else "no"
        print(f"  {name:<20} {ttft:8.2f} {full_s / ttft:8.1f}x "
              f"{report.recompute_ratio:10.1%} {report.recompute_attention:10.1%} "
              f"{kl(reference, logits):8.4f} "
              f"{agree:>5}  {report.timings}")
    total_tokens = sum(
        len(backend.tokenize(f"# {c.path}\n" + index.text(c).decode() + "\n\n"))
        for c in chunks
    )
    print(f"  store: {stats.entries} entries, {stats.bytes / 1e6:.1f} MB, "
          f"{stats.bytes / max(1, total_tokens) / 1024:.1f} KiB per token")
    shutil.rmtree(store_dir, ignore_errors=True)


def probe_cost(backend, index, chunks, args) -> None:
    """llama.cpp's query probe against the same work without the eval callback, medians of
    ``--repeats`` runs each, interleaved. End to end: ``query_relevance`` (states placed in the
    probe context, K-shift, query decoded with the callback reading the probe layers' softmax)
    against building the ``none`` request (the same placing and decode in the request context,
    which has no callback). The query decode alone, the states already placed: request
    context; probe context with the callback attached but idle (one Python call per graph
    node); probe context reading the layers."""
    from codekv.backends.llamacpp import REQUEST
    from codekv.compose import query_probe_layers

    parts, ids = [], []
    for chunk in chunks:
        piece = backend.tokenize(f"# {chunk.path}\n" + index.text(chunk).decode() + "\n\n")
        parts.append(backend.reposition(backend.prefill_chunk(piece), len(ids)))
        ids += piece
    query = backend.tokenize(QUESTION)
    layers = query_probe_layers(backend.info.n_layers)
    t0 = time.perf_counter()
    ctx, reader = backend._probe()
    made_s = time.perf_counter() - t0

    def timed(run) -> float:
        t = time.perf_counter()
        run()
        return time.perf_counter() - t

    def decode(context, arm: bool) -> float:
        L = backend._L
        mem = L.llama_get_memory(context)
        L.llama_memory_clear(mem, False)
        backend._place(parts, context, mem)
        backend._decode(ids[-1:], len(ids) - 1, 2, logits="none", ctx=context)  # the K-shift
        L.llama_memory_seq_rm(mem, 2, -1, -1)
        if arm:
            reader.arm(layers, len(ids))
        try:
            return timed(lambda: backend._decode(query, len(ids), REQUEST, logits="none",
                                                 ctx=context))
        finally:
            reader.disarm()

    runs: dict[str, list[float]] = {}
    measures = {
        "none request (no callback)": lambda: timed(
            lambda: backend.recompute(ids, parts, [], query)),
        "query_relevance (reading)": lambda: timed(
            lambda: backend.query_relevance(parts, query, layers)),
        "decode, request context": lambda: decode(backend._ctx, False),
        "decode, probe idle": lambda: decode(ctx, False),
        "decode, probe reading": lambda: decode(ctx, True),
    }
    for _ in range(args.repeats):
        for name, run in measures.items():
            runs.setdefault(name, []).append(run())
    print(f"  probe cost (llama.cpp, {len(ids)} context + {len(query)} query tokens, layers "
          f"{layers[0]}..{layers[-1]}; probe context made in {made_s:.2f} s):")
    for name, times in runs.items():
        print(f"    {name:<28} {statistics.median(times) * 1000:9.1f} ms  "
              f"(runs: {', '.join(f'{t * 1000:.0f}' for t in times)})")


if __name__ == "__main__":
    sys.exit(main())
