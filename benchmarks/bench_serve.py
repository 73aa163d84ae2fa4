"""Replay recorded coding-agent prompts through ``codekv serve`` and measure what it reuses.

One ``codekv serve`` per server mode (``--modes``; the default model, transformers, 127.0.0.1,
a chunk store of its own) replays every trajectory: one API key per trajectory, so each is a
session with its own scope (exact-prefix cache, chunk store scope, shift slot). Each call goes
to every mode's server in turn, one request at a time, after all of them are idle: the machine's
load (shared) drifts alike for every mode, and work a server does after a reply (storing new
segments; an agent meanwhile reads the reply and runs its tools) is not in any call's TTFT: its
tokens are counted apart (``stored_tokens``). A call the server refuses as longer than the
model's context is skipped (in every mode) and counted.

Every call is streamed, with the recorded reply forced as the continuation
(``codekv.continuation``) and ``max_tokens`` = ``--reply-tokens``: the decode is the recorded
reply's first tokens (or all of it when shorter), the same in every mode, so the end-to-end time
is for the recorded reply's length, and the server reports each forced token's NLL under the
state it built. ΔNLL of a call served ``composed`` is its mean NLL over the first
``--nll-tokens`` minus the same call's in the ``exact-only`` mode (an exact prefix and a
prefill of the rest: full prefill's KV), with a paired bootstrap 95% interval over calls.

Modes: ``exact-only`` (llama-server without ``--cache-reuse``), ``shift-only`` (with it:
the previous request's runs shifted in order, nothing recomputed), ``compose`` (codekv, the
gate's rule: classes without evidence are computed in place) and ``compose-experimental``
(every class reused). With ``--backend llama.cpp`` and ``--llama-server`` (the binary
``make bench-peer`` builds from the same vendored llama.cpp), the real peer too:
``llama-server`` (its prompt cache, one slot) and ``llama-server-reuse`` (its
``--cache-reuse`` at ours, by default ``--min-segment-tokens``), on the same GGUF and threads.
The peer takes no forced continuation, so with it give ``--greedy``: every mode decodes its
own greedy reply, and a mode's replies are compared with the reference's (full prefill's KV)
call by call. Its tokens through the model are its ``timings.prompt_n``; its ``cache_n``
counts as exact (the plain peer's prefix) or reused (with ``--cache-reuse``: the prefix and
the runs it shifted).

    python benchmarks/bench_serve.py --data DIR --manifest benchmarks/data/replay_sources.json \\
        --out benchmarks/results/serve_replay.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay_sources as rs  # noqa: E402

from codekv.eval.stats import paired_difference  # noqa: E402

MODES = {
    "exact-only": ["--reuse", "exact-only"],
    "shift-only": ["--reuse", "shift-only"],
    "compose": [],
    "compose-experimental": ["--experimental"],
}
# llama-server's own arguments per peer mode (``--cache-reuse`` takes ours: --cache-reuse).
PEERS = {"llama-server": [], "llama-server-reuse": ["--cache-reuse"]}
REFERENCE = "exact-only"
PARTS = ("exact_prefix_tokens", "reused_tokens", "recomputed_tokens", "prefilled_tokens")


class Server:
    """``codekv serve`` as a subprocess on a free port of 127.0.0.1."""

    peer = False

    def __init__(self, args: list[str], keys: list[str], workdir: Path, model: str | None,
                 threads: int, min_segment_tokens: int, backend: str = "transformers"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "serve.log"
        command = [sys.executable, "-m", "codekv", "serve", "--port", str(self.port),
                   "--store", str(workdir / "store"), "--min-segment-tokens",
                   str(min_segment_tokens), "--backend", backend, *args]
        if model:
            command += ["--model", model]
        for key in keys:
            command += ["--api-key", key]
        env = {k: v for k, v in os.environ.items() if k not in ("CODEKV_STORE", "CODEKV_API_KEY")}
        env["OMP_NUM_THREADS"] = str(threads)  # torch's threads: on shared cores, fewer spin
        env["CODEKV_LLAMA_THREADS"] = str(threads)  # llama.cpp's, as the peer's -t
        self.process = subprocess.Popen(command, stdout=self.log.open("wb"),
                                        stderr=subprocess.STDOUT, env=env)

    def wait(self, timeout: float = 600) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("codekv serve exited:\n" + self.log.read_text()[-3000:])
            try:
                health = httpx.get(self.url + "/health", timeout=2).json()
                self.model = health["model"]
                return self
            except (httpx.HTTPError, ValueError):
                time.sleep(0.5)
        raise RuntimeError("codekv serve did not start in time:\n" + self.log.read_text()[-3000:])

    def idle(self) -> float:
        """Wait until no request runs or waits; the seconds waited."""
        started = time.perf_counter()
        while True:
            health = httpx.get(self.url + "/health", timeout=10).json()
            if not health["busy"] and not health["waiting"]:
                return time.perf_counter() - started
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Peer(Server):
    """llama-server as a subprocess on a free port of 127.0.0.1: one slot, the GGUF codekv's
    llama.cpp engine runs, flash attention off as there, the GGUF's chat template."""

    peer = True

    def __init__(self, binary: str, args: list[str], workdir: Path, gguf: str, threads: int,
                 context: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "llama-server.log"
        command = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port),
                   "-t", str(threads), "-tb", str(threads), "-c", str(context), "-np", "1",
                   "-fa", "off", "--jinja", "--no-webui", *args]
        self.process = subprocess.Popen(command, stdout=self.log.open("wb"),
                                        stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 600) -> Peer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("llama-server exited:\n" + self.log.read_text()[-3000:])
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    models = httpx.get(self.url + "/v1/models", timeout=5).json()
                    self.model = models["data"][0]["id"]
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError("llama-server did not start in time:\n"
                           + self.log.read_text()[-3000:])

    def idle(self) -> float:
        return 0.0  # nothing runs after a reply


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def peer_report(timings: dict, mode: str) -> dict:
    """llama-server's ``timings`` in the report's terms: ``prompt_n`` through the model,
    ``cache_n`` exact (its prefix) or, with ``--cache-reuse``, reused (prefix and shifted runs
    together)."""
    cached, computed = timings["cache_n"], timings["prompt_n"]
    shifted = mode == "llama-server-reuse"
    return {"status": mode, "prompt_tokens": cached + computed,
            "exact_prefix_tokens": 0 if shifted else cached,
            "reused_tokens": cached if shifted else 0, "recomputed_tokens": 0,
            "prefilled_tokens": computed}


def replay_call(server: Server, key: str, call: rs.Call, reply_tokens: int, mode: str = "",
                greedy: bool = False) -> dict:
    """One streamed request: client-side TTFT and end-to-end time, the server's report and
    (``greedy``) the reply."""
    body = {"model": server.model, "messages": call.messages, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0,
            "max_tokens": reply_tokens}
    if call.reply and not greedy:
        body["codekv"] = {"continuation": call.reply}
    started = time.perf_counter()
    first = None
    report = usage = None
    text = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      headers={"authorization": f"Bearer {key}"}, timeout=1800) as response:
        if response.status_code != 200:
            error = json.loads(response.read())["error"]
            return {"error": error.get("code") or error["message"]}
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"error": chunk["error"]["message"]}
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    text.append(choice["delta"]["content"])
            if chunk.get("usage"):
                usage = chunk["usage"]
                if not server.peer:
                    report = chunk["codekv"]
            if server.peer and chunk.get("timings"):  # the last chunk's are the totals
                report = peer_report(chunk["timings"], mode)
                usage = usage or {"completion_tokens": chunk["timings"]["predicted_n"]}
    done = time.perf_counter()
    row = {"ttft_s": (first or done) - started, "e2e_s": done - started,
           "completion_tokens": usage["completion_tokens"], "codekv": report}
    if greedy:
        row["reply"] = "".join(text)
    return row


def replay(modes: list[str], trajectories: list[rs.Trajectory], args, log) -> list[dict]:
    """Every call through every mode's server in turn, each server on its own while it works
    (all idle first), so that the machine's load drifts alike for every mode."""
    keys = [f"trajectory-{i}" for i in range(len(trajectories))]
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as workdir:
        servers = {}
        try:
            for mode in modes:
                (Path(workdir) / mode).mkdir()
                if mode in PEERS:
                    reuse = [str(args.cache_reuse or args.min_segment_tokens)] if PEERS[mode] \
                        else []
                    servers[mode] = Peer(args.llama_server, PEERS[mode] + reuse,
                                         Path(workdir) / mode, args.gguf, args.threads,
                                         args.context)
                else:
                    rule = ["--strategy", args.strategy] if mode.startswith("compose") else []
                    servers[mode] = Server(MODES[mode] + rule, keys, Path(workdir) / mode,
                                           args.model, args.threads, args.min_segment_tokens,
                                           args.backend)
            for server in servers.values():
                server.wait()
            rows = []
            for key, trajectory in zip(keys, trajectories):
                replayed = 0
                for index, call in enumerate(trajectory.calls):
                    if replayed == args.max_calls:
                        break
                    for mode, server in servers.items():
                        waited = sum(other.idle() for other in servers.values())
                        result = replay_call(server, key, call, args.reply_tokens, mode,
                                             args.greedy)
                        row = {"mode": mode, "agent": trajectory.agent,
                               "trajectory": trajectory.name, "call": index,
                               "idle_wait_s": waited, "loadavg_1m": os.getloadavg()[0],
                               **result}
                        rows.append(row)
                        log(row)
                        if "error" in result:
                            break  # too long for one mode is too long for all
                    else:
                        replayed += 1
            for server in servers.values():
                server.idle()
            return rows
        finally:
            for server in servers.values():
                server.stop()


# -- the summary ---------------------------------------------------------------------------------
def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(rows: list[dict], nll_tokens: int) -> list[dict]:
    """One line per (agent, mode): token shares, tokens through the model, latencies, ΔNLL."""
    reference = {(r["trajectory"], r["call"]): r for r in rows
                 if r["mode"] == REFERENCE and "error" not in r}
    out = []
    keys = sorted({(r["agent"], r["mode"]) for r in rows},
                  key=lambda k: (k[0], [*MODES, *PEERS].index(k[1])))
    for agent, mode in keys:
        mine = [r for r in rows if r["agent"] == agent and r["mode"] == mode]
        served = [r for r in mine if "error" not in r]
        # A call too long is refused by the first mode's server and not sent to the others.
        skipped = {(r["trajectory"], r["call"]) for r in rows if r["agent"] == agent
                   and r.get("error") == "context_length_exceeded"}
        failed = [r for r in mine if "error" in r
                  and r.get("error") != "context_length_exceeded"]
        prompt = sum(r["codekv"]["prompt_tokens"] for r in served)
        shares = {p: sum(r["codekv"][p] for r in served) / prompt if prompt else None
                  for p in PARTS}
        through = sum(r["codekv"]["prefilled_tokens"] + r["codekv"]["recomputed_tokens"]
                      for r in served)
        stored = sum(r["codekv"].get("stored_tokens", 0) for r in served)
        ttft = [r["ttft_s"] for r in served]
        composed_nll, reference_nll = [], []
        for r in served:
            ref = reference.get((r["trajectory"], r["call"]))
            if r["codekv"]["status"] != "composed" or ref is None:
                continue
            mine_nll = r["codekv"].get("continuation_nll") or []
            ref_nll = ref["codekv"].get("continuation_nll") or []
            n = min(nll_tokens, len(mine_nll), len(ref_nll))
            if n:
                composed_nll.append(sum(mine_nll[:n]) / n)
                reference_nll.append(sum(ref_nll[:n]) / n)
        delta, interval = (paired_difference(composed_nll, reference_nll) if composed_nll
                           else (None, None))
        replies = [(r["reply"], reference[(r["trajectory"], r["call"])]["reply"])
                   for r in served if "reply" in r
                   and (r["trajectory"], r["call"]) in reference]
        out.append({
            "agent": agent, "mode": mode, "calls": len(served), "skipped_too_long": len(skipped),
            "failed": len(failed), "prompt_tokens": prompt,
            "median_prompt_tokens": statistics.median(
                [r["codekv"]["prompt_tokens"] for r in served]) if served else None,
            **{f"share_{p.removesuffix('_tokens')}": s for p, s in shares.items()},
            "through_model_tokens": through, "stored_tokens": stored,
            "composed_calls": sum(1 for r in served if r["codekv"]["status"] == "composed"),
            "ttft_median_s": statistics.median(ttft) if ttft else None,
            "ttft_p90_s": quantile(ttft, 0.9),
            "e2e_median_s": statistics.median([r["e2e_s"] for r in served]) if served else None,
            "delta_nll": delta, "delta_nll_ci": interval, "delta_nll_calls": len(composed_nll),
            "same_reply": sum(mine == theirs for mine, theirs in replies) if replies else None,
            "replies_compared": len(replies),
        })
    return out


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _same(s: dict) -> str:
    if not s.get("replies_compared"):
        return "–"
    return f"{s['same_reply']} of {s['replies_compared']}"


def table(summary: list[dict]) -> str:
    """The markdown table: shares in percent, through the model relative to exact-only."""
    base = {s["agent"]: s for s in summary if s["mode"] == REFERENCE}
    lines = ["| agent | mode | calls (skipped) | median prompt | exact / reused / recomputed / "
             "prefilled % | through model (vs exact-only) | stored after reply | TTFT median "
             "(p90) s | e2e median s | ΔNLL [95% CI] (calls) | greedy reply as the "
             "reference's |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        ref = base.get(s["agent"])
        ratio = (s["through_model_tokens"] / ref["through_model_tokens"]
                 if ref and ref["through_model_tokens"] else None)
        shares = " / ".join(_fmt(100 * s[f"share_{p}"] if s[f"share_{p}"] is not None
                                 else None, 0)
                            for p in ("exact_prefix", "reused", "recomputed", "prefilled"))
        ci = s["delta_nll_ci"]
        nll = ("–" if s["delta_nll"] is None else
               f"{s['delta_nll']:+.3f} [{_fmt(ci[0], 3) if ci else '–'}, "
               f"{_fmt(ci[1], 3) if ci else '–'}] ({s['delta_nll_calls']})")
        lines.append(
            f"| {s['agent']} | {s['mode']} | {s['calls']} ({s['skipped_too_long']}) | "
            f"{_fmt(s['median_prompt_tokens'], 0)} | {shares} | {s['through_model_tokens']} "
            f"({_fmt(ratio)}x) | {s['stored_tokens']} | {_fmt(s['ttft_median_s'])} "
            f"({_fmt(s['ttft_p90_s'])}) | {_fmt(s['e2e_median_s'])} | {nll} | "
            f"{_same(s)} |")
    return "\n".join(lines)


# -- loading -------------------------------------------------------------------------------------
def load_trajectories(args) -> list[rs.Trajectory]:
    trajectories: list[rs.Trajectory] = []
    if args.manifest:
        manifest = json.loads(Path(args.manifest).read_text())
        for entry in manifest["trajectories"]:
            if args.agents and entry["agent"] not in args.agents:
                continue
            local = Path(args.data) / entry["local"]
            if not local.exists():
                print(f"missing {local}: see {args.manifest} for how to get it", file=sys.stderr)
                continue
            origin = {k: entry[k] for k in ("repository", "commit", "path")}
            demos = entry.get("demos", True)
            if not demos:
                origin["demonstration"] = "left out"
            loaded = rs.load(entry["agent"], local, origin, demos)
            for trajectory in loaded:
                trajectory.name = f"{entry['repository'].split('/')[-1]}/{trajectory.name}"
            trajectories += loaded[:entry.get("sessions", len(loaded))]
    for directory in args.generated:
        if args.shape == "swe-agent":
            trajectories.append(rs.generated_swe_agent_session(
                Path(directory), turns=args.max_calls, window=args.window))
            continue
        trajectories.append(rs.generated_aider_session(
            Path(directory), turns=args.max_calls, chat_files=args.chat_files,
            max_file_chars=args.max_file_chars, volatile=args.volatile))
    if args.per_agent:
        counts: dict[str, int] = {}
        kept = []
        for trajectory in trajectories:
            counts[trajectory.agent] = counts.get(trajectory.agent, 0) + 1
            if counts[trajectory.agent] <= args.per_agent:
                kept.append(trajectory)
        trajectories = kept
    return trajectories


def machine() -> dict:
    load = os.getloadavg()
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "loadavg_at_start": [round(x, 2) for x in load]}


def main(argv: list[str] | None = None) -> int:
    import wsgiref

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", help="JSON list of recorded trajectories (see "
                                           "benchmarks/data/replay_sources.json)")
    parser.add_argument("--agents", type=lambda text: text.split(","), default=None,
                        help="Comma-separated agents of the manifest to replay [all]")
    parser.add_argument("--data", default=".", help="Directory the manifest's 'local' paths "
                                                    "are under.")
    parser.add_argument("--generated", action="append", default=None,
                        help="A package directory to build a session from (--shape) "
                             "(repeatable) [the standard library's wsgiref]; 'none' for none.")
    parser.add_argument("--shape", choices=("aider", "swe-agent"), default="aider",
                        help="What a generated session looks like: aider's (files re-sent after "
                             "a growing history) or SWE-agent's (file windows as observations, "
                             "all but the last five collapsed) [aider].")
    parser.add_argument("--window", type=int, default=100,
                        help="Lines of a file a SWE-agent-style observation shows [100].")
    parser.add_argument("--chat-files", type=int, default=3,
                        help="Files in each generated session's chat (the largest that fit "
                             "--max-file-chars) [3].")
    parser.add_argument("--max-file-chars", type=int, default=7000,
                        help="The largest file a generated session puts in its chat [7000]: "
                             "with --chat-files, how long its prompts run.")
    parser.add_argument("--volatile", action="store_true",
                        help="Open each generated call's system prompt with a header of its "
                             "own (a request id and the time), as agents and proxies write.")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"Comma-separated server modes, of {', '.join(MODES)}.")
    parser.add_argument("--max-calls", type=int, default=6,
                        help="Calls replayed per trajectory (the first that fit the context).")
    parser.add_argument("--per-agent", type=int, default=0,
                        help="Trajectories per agent source (0: all).")
    parser.add_argument("--reply-tokens", type=int, default=32,
                        help="max_tokens: the recorded reply's first tokens are decoded.")
    parser.add_argument("--nll-tokens", type=int, default=16,
                        help="Reply tokens ΔNLL is measured over.")
    parser.add_argument("--model", default=None, help="Model for the server [its default].")
    parser.add_argument("--min-segment-tokens", type=int, default=256,
                        help="Every server's --min-segment-tokens: the smallest segment "
                             "composed, and the shortest run shift-only moves (llama.vim's "
                             "advice for --cache-reuse is 256).")
    parser.add_argument("--cache-reuse", type=int, default=None,
                        help="llama-server-reuse's --cache-reuse [--min-segment-tokens].")
    parser.add_argument("--threads", type=int, default=1,
                        help="Each server's threads (torch's OMP_NUM_THREADS, codekv's "
                             "$CODEKV_LLAMA_THREADS, llama-server's -t and -tb).")
    parser.add_argument("--backend", default="transformers",
                        choices=["transformers", "llama.cpp"], help="codekv's engine.")
    parser.add_argument("--strategy", default="auto",
                        help="The compose modes' rule (codekv serve --strategy) [auto: the "
                             "gate's; with --experimental, its default where none licenses].")
    parser.add_argument("--llama-server", default=None,
                        help="The llama-server binary for the peer modes (make bench-peer).")
    parser.add_argument("--gguf", default=None,
                        help="The peer's GGUF [the default model's, codekv's llama.cpp one].")
    parser.add_argument("--context", type=int, default=8192,
                        help="The peer's context (-c) [8192, the default model's].")
    parser.add_argument("--greedy", action="store_true",
                        help="Decode each mode's own greedy reply (no forced continuation) "
                             "and compare it with the reference's; the peer needs it.")
    parser.add_argument("--out", default="benchmarks/results/serve_replay.json")
    parser.add_argument("--summarize", metavar="ROWS",
                        help="Only print the table of a run's rows file (.rows.jsonl), "
                             "finished or not.")
    args = parser.parse_args(argv)
    if args.summarize:
        rows = [json.loads(line) for line in Path(args.summarize).read_text().splitlines()]
        print(table(summarize(rows, args.nll_tokens)))
        return 0
    if args.generated is None:
        args.generated = [str(Path(wsgiref.__file__).parent)]
    args.generated = [g for g in args.generated if g != "none"]
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES and m not in PEERS]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}: expected "
                     f"{', '.join([*MODES, *PEERS])}")
    if any(m in PEERS for m in modes):
        if args.backend != "llama.cpp" or not args.llama_server or not args.greedy:
            parser.error("the llama-server modes need --backend llama.cpp, --llama-server "
                         "(make bench-peer builds it) and --greedy")
        if args.gguf is None:
            from codekv.tokens import default_gguf_path

            args.gguf = str(default_gguf_path())
    if REFERENCE not in modes:
        parser.error(f"--modes must include {REFERENCE}: ΔNLL and the ratios are against it")
    trajectories = load_trajectories(args)
    if not trajectories:
        parser.error("no trajectories: give --manifest (with --data) or --generated")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows_path = out.with_suffix(".rows.jsonl")
    with rows_path.open("w") as rows_file:
        def log(row: dict) -> None:
            rows_file.write(json.dumps(row) + "\n")
            rows_file.flush()
            report = row.get("codekv") or {}
            print(f"{row['mode']:>20} {row['agent']:>15} {row['trajectory'][:28]:>28} "
                  f"#{row['call']:<3} {row.get('error') or report.get('status'):>22} "
                  f"prompt={report.get('prompt_tokens')} ttft={row.get('ttft_s', 0):.2f}s",
                  flush=True)

        started = time.time()
        rows = replay(modes, trajectories, args, log)
    summary = summarize(rows, args.nll_tokens)
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "machine": machine(), "wall_s": round(time.time() - started, 1),
        "loadavg_1m_median": statistics.median(r["loadavg_1m"] for r in rows),
        "settings": {k: v for k, v in vars(args).items()},
        "trajectories": [{"agent": t.agent, "name": t.name, "origin": t.origin,
                          "calls_recorded": len(t.calls)} for t in trajectories],
        "summary": summary,
    }
    out.write_text(json.dumps(result, indent=2))
    print(table(summary))
    print(f"wrote {out} and {rows_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
