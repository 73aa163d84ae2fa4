"""Agents sharing one Redis chunk KV store: cross-agent hits, prefills saved, requests/s.

Run: python benchmarks/bench_shared_store.py [--agents 1 2 4] [--tasks 4] [--url redis://...]

A team's agents read one area of a repository: every agent serves one of the evaluation's
simulated agent sessions (``codekv.eval.reuse.agent_sessions``) over the same working set, with
its own picks and orders (its own seed), composing each request (system prompt, chunks, a new
question; ``anchors`` at 15%) from a shared store on one Redis. Four agent processes load the
model once; the first 1, 2 and 4 of them then serve their sessions together on an empty store:
the share of chunk reads the store served, the share served by entries another agent computed
(cross-agent hits), chunk prefills saved against agents with stores of their own, and requests
per second over all agents. Then, in this process: the time to read a 4,096-token request's
chunks from the local memory-mapped store, Redis, and Redis in 16 bits; bytes per token stored;
how far 16-bit KV moves a composed answer. Without ``--url`` it starts its own redis-server on
127.0.0.1 (emptied per run; 16-bit entries go to the next database). The default model; the
quick repository of the evaluation (a few stdlib modules). About six minutes on 2 busy cores.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from codekv.stores.redis_store import RedisKVStore

QUESTION = "\n# Task {n}: explain what the code above does and where it could fail.\n"


class TeamRandom(random.Random):
    """Every agent of the team draws the same working sets (the shuffle of files) and its own
    tasks (its own picks and orders)."""

    def __init__(self, agent: int, seed: int):
        super().__init__(f"agent:{seed}:{agent}")
        self.team = random.Random(f"team:{seed}")

    def shuffle(self, x) -> None:
        self.team.shuffle(x)


class CountingStore(RedisKVStore):
    """The shared store, recording per chunk read whether it hit and who computed it."""

    def __init__(self, url: str, agent: int):
        super().__init__(url)
        self.agent = agent
        self.reads: list[tuple[str, bool, bool]] = []  # (digest, hit, computed by another)

    def get_or_lease(self, key):
        entry = super().get_or_lease(key)
        by_other = entry is not None and entry.provenance.get("agent") != self.agent
        self.reads.append((key.digest(), entry is not None, by_other))
        return entry

    def get(self, key):
        return self.get_or_lease(key)

    def put(self, key, entry):
        entry.provenance["agent"] = self.agent
        super().put(key, entry)


def session(repo: str, agent: int, seed: int, tasks: int, backend, index) -> list[list]:
    from codekv.eval import reuse
    from codekv.eval.workloads import CodeSource

    source = CodeSource(index, lambda text: len(backend.tokenize(text)))
    for chunks in reuse.agent_sessions(source, TeamRandom(agent, seed), sessions=1, tasks=tasks):
        return chunks
    raise SystemExit(f"{repo}: no file makes an agent session")


def agent(conn, repo: str, threads: int) -> None:
    """An agent process: load the model once, then serve one session per job it is sent."""
    import torch

    torch.set_num_threads(threads)
    from codekv.compose import Composer
    from codekv.eval import reuse
    from codekv.eval.runner import warm_up
    from codekv.index import Index
    from codekv.models import load_backend

    backend = load_backend()
    index = Index(repo)
    warm_up(backend)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        url, number, seed, tasks = job
        requests = session(repo, number, seed, tasks, backend, index)
        store = CountingStore(url, number)
        composer = Composer(backend, index, store=store, scope="bench:team", experimental=True)
        began = time.perf_counter()
        for n, chunks in enumerate(requests, 1):
            composer.compose(chunks, QUESTION.format(n=n), prefix=reuse.SYSTEM_PROMPT,
                             strategy="anchors", ratio=0.15)
        conn.send({"requests": len(requests), "seconds": time.perf_counter() - began,
                   "reads": store.reads, "error": store.error,
                   "distinct": len({d for d, _, _ in store.reads})})
    index.close()


def run_agents(agents: list, url: str, n: int, seed: int, tasks: int) -> dict:
    """The first ``n`` agents, started together on an empty store."""
    import redis

    redis.Redis.from_url(url).flushdb()
    for number, (conn, _) in enumerate(agents[:n]):
        conn.send((url, number, seed, tasks))
    rows = [conn.recv() for conn, _ in agents[:n]]
    reads = [r for row in rows for r in row["reads"]]
    hits = sum(hit for _, hit, _ in reads)
    return {"agents": n, "requests": sum(row["requests"] for row in rows),
            "reads": len(reads), "hits": hits, "cross": sum(other for _, _, other in reads),
            "prefills": len(reads) - hits,
            "alone": sum(row["distinct"] for row in rows),  # each agent with its own store
            "serving_s": max(row["seconds"] for row in rows),
            "errors": [row["error"] for row in rows if row["error"]]}


def start_agents(repo: str, n: int, threads: int) -> list:
    context = multiprocessing.get_context("spawn")
    agents = []
    for _ in range(n):
        parent, child = context.Pipe()
        process = context.Process(target=agent, args=(child, repo, threads), daemon=True)
        process.start()
        agents.append((parent, process))
    for conn, _ in agents:
        if conn.recv() != "ready":
            raise SystemExit("an agent process failed to start")
    return agents


def store_load(repo: str, url: str, target: int, repeats: int) -> dict:
    """Median time to read a ``target``-token request's chunks from the local store, Redis and
    Redis in 16 bits; bytes per token; how far 16-bit KV moves a composed answer."""
    sys.path.insert(0, str(Path(__file__).parent))
    import redis
    import torch
    from bench_compose import kl, pick_chunks

    from codekv.compose import Composer
    from codekv.index import Index
    from codekv.models import load_backend
    from codekv.stores.local import LocalKVStore
    from codekv.stores.tiered import TieredKVStore

    redis.Redis.from_url(url).flushdb()
    backend = load_backend()
    index = Index(repo)
    chunks, n_tokens = pick_chunks(index, backend, target)
    directory = Path(tempfile.mkdtemp(prefix="codekv-bench-shared-"))
    parts = urlsplit(url)  # the 16-bit entries go to the next database, to count their bytes
    half = urlunsplit(parts._replace(path=f"/{int(parts.path.strip('/') or 0) + 1}",
                                     query="kv_dtype=float16"))
    RedisKVStore(half)._client.flushdb()
    stores = {"local": lambda: LocalKVStore(directory), "redis": lambda: RedisKVStore(url),
              "redis16": lambda: RedisKVStore(half)}
    question = "\n# Question: which of the functions above is called first?\n"
    try:
        # One prefill fills all three (the local store is in front, the Redis ones behind it).
        fill = TieredKVStore(stores["local"](), TieredKVStore(stores["redis"](),
                                                               stores["redis16"]()))
        Composer(backend, index, fill, scope="bench:load", experimental=True).prefill(chunks)
        composer = Composer(backend, index, fill, scope="bench:load", experimental=True)
        row: dict = {"tokens": n_tokens, "chunks": len(chunks)}
        for name, make in stores.items():
            samples = []
            for _ in range(repeats):
                composer.chunks.store = make()  # a fresh store object: nothing cached in memory
                result = composer.compose(chunks, question, strategy="none")
                assert result.report.store_misses == 0, result.report.store_error
                samples.append(result.report.timings["store_load"])
            row[name] = statistics.median(samples)
        for name in ("redis", "redis16"):
            row[f"{name}_bytes_per_token"] = stores[name]().stats().bytes / n_tokens
        answers = {}
        for name in ("redis", "redis16"):
            composer.chunks.store = stores[name]()
            answers[name] = composer.compose(chunks, question, strategy="anchors", ratio=0.15)
        fp32, fp16 = (answers[n].next_token_logits() for n in ("redis", "redis16"))
        row["kl_16_vs_32"] = kl(fp32, fp16)
        row["max_logit_diff"] = float((fp32 - fp16).abs().max())
        row["top1_agree"] = bool(torch.argmax(fp32) == torch.argmax(fp16))
        return row
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        index.close()


def start_redis(directory: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory),
         "--save", "", "--appendonly", "no", "--maxmemory", "4gb",
         "--maxmemory-policy", "allkeys-lru"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(200):
        try:
            client.ping()
            return process, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("redis-server did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tasks", type=int, default=4, help="Requests per agent session.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="Torch threads per agent.")
    parser.add_argument("--context", type=int, default=4096, help="Tokens of the load test.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--url", default=None, help="A Redis to use (db and db+1 are flushed!).")
    args = parser.parse_args()
    from codekv.eval.repos import quick_repo
    from codekv.index import Index

    repo = str(quick_repo())
    Index(repo).update()  # indexed once, before the agents open it
    directory = Path(tempfile.mkdtemp(prefix="codekv-bench-redis-"))
    process, url = (None, args.url) if args.url else start_redis(directory)
    try:
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {args.tasks} "
              f"requests per agent, anchors at 15%, {args.threads} torch thread(s) per agent")
        print(f"{'agents':>6} {'requests':>8} {'chunk reads':>11} {'store hits':>10} "
              f"{'cross-agent':>11} {'prefills':>8} {'alone':>5} {'saved':>6} {'req/s':>6} "
              f"{'load':>5}")
        agents = start_agents(repo, max(args.agents), args.threads)
        for n in args.agents:
            row = run_agents(agents, url, n, args.seed, args.tasks)
            print(f"{n:>6} {row['requests']:>8} {row['reads']:>11} "
                  f"{row['hits'] / row['reads']:>10.0%} {row['cross'] / row['reads']:>11.0%} "
                  f"{row['prefills']:>8} {row['alone']:>5} "
                  f"{1 - row['prefills'] / row['alone']:>6.0%} "
                  f"{row['requests'] / row['serving_s']:>6.2f} {os.getloadavg()[0]:>5.1f}")
            for error in row["errors"]:
                print(f"       store error: {error}")
        for conn, worker in agents:
            conn.send(None)
            worker.join()
        load = store_load(repo, url, args.context, args.repeats)
        print(f"\nstore load, {load['tokens']}-token request in {load['chunks']} chunks "
              f"(median of {args.repeats}): local memory-mapped {load['local']:.3f} s, "
              f"Redis {load['redis']:.3f} s, Redis 16-bit {load['redis16']:.3f} s "
              f"(load average {os.getloadavg()[0]:.1f})")
        print(f"bytes per token stored: fp32 {load['redis_bytes_per_token'] / 1024:.1f} KiB, "
              f"16-bit {load['redis16_bytes_per_token'] / 1024:.1f} KiB")
        print(f"anchors at 15% from 16-bit vs fp32 KV: KL {load['kl_16_vs_32']:.2e}, max logit "
              f"difference {load['max_logit_diff']:.4f}, same top-1: {load['top1_agree']}")
    finally:
        if process is not None:
            process.terminate()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
