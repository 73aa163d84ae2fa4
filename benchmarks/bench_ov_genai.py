"""The peer on OpenVINO: OpenVINO GenAI's ``LLMPipeline`` with its prefix cache (what a user
would run instead of ``codekv serve --backend openvino``) against ``codekv``'s request pipeline
on the openvino engine, on the same replayed aider-style sessions, call by call, one thread each.

Each call of each session (``generated_aider_session`` over an installed package's source, one
no evaluation uses) is rendered once by codekv (``chat_prompt``: the model's chat template) and
that text goes to every mode in turn, one at a time, the others idle, so the machine's load
drifts alike for all of them:

- ``genai-prefix-cache``: ``openvino_genai.LLMPipeline`` in a worker process of its own venv
  (``--genai-python``; the two environments never mix), given the raw string with its chat
  template off (``apply_chat_template=False``). It runs the continuous-batching pipeline, as
  ``LLMPipeline`` on a CPU does by default, with the scheduler config GenAI itself uses there
  (prefix caching on, the batch's tokens unlimited), stated explicitly, and a KV cache of
  ``--genai-cache-gb``; ``INFERENCE_NUM_THREADS`` = ``--threads``, inference precision f32 and
  KV cache precision f32 (``KV_CACHE_PRECISION``, ``KEY_CACHE_PRECISION`` and
  ``VALUE_CACHE_PRECISION``: the CPU plugin's default is u8). One pipeline serves every
  session: its prefix cache is global.
- ``codekv-exact-only``: codekv's ``Pipeline`` reusing the exact prefix alone (``--reuse
  exact-only``): full prefill's KV, the reference each mode's greedy reply is compared with.
- ``codekv-compose``: the same, composing, as ``benchmarks/profile_serve.py`` does: no gate
  (``SupportGate([])``, ``experimental``), rule ``none``, segments from the scope's last prompt.

Both codekv pipelines share the one model (``load_backend(engine="openvino")``, threads from
``torch.set_num_threads``) and one scope across the sessions (as GenAI has one cache).

TTFT is from the rendered prompt text handed over to the first reply token chosen, tokenizing
included: GenAI's is ``generate()`` called to the first token its streamer receives
(``StreamerBase.write``); codekv's is ``Pipeline.prefill`` called (its ``outcome.ttft_s``, the
server's TTFT less queueing) to the argmax of the state's logits taken. Each mode then decodes
greedily up to ``--reply-tokens`` tokens or the model's end tokens (codekv's
``end_token_ids``, given to GenAI as ``stop_token_ids``); codekv's ``Pipeline.done`` (keeping
the prompt, storing segments), which the server runs after the reply, is timed apart. Each
GenAI call reports its prompt's token ids as its tokenizer reads the same text (encoded after
the timed call), checked against codekv's, and the count its pipeline ran.

The IR: the default model (SmolLM2-135M-Instruct's GGUF, as the transformers engine converts
it) exported by optimum-intel with f32 weights, its tokenizer and detokenizer converted by
openvino-tokenizers. The converted copy's tokenizer files name ``CodeLlamaTokenizer``, which
transformers 5.5 (optimum-intel's) rebuilds as a SentencePiece-style (Metaspace) tokenizer, so
the IR's tokenizer would map every space and newline to ``<|endoftext|>``; ``--export-ir``
exports from a copy whose tokenizer says what it is (byte-level BPE, GPT-2 style, no token
added in front, as the model's own release has it), and codekv's reads the same ids. Setup,
once::

    python3 -m venv .venv-genai
    .venv-genai/bin/pip install torch==2.13.0  # the CPU wheel; unpinned, a CUDA build comes
    .venv-genai/bin/pip install torch==2.13.0 openvino==2026.4.1 openvino-genai==2026.4.1.0 \\
        openvino-tokenizers==2026.4.1.0 'optimum-intel[openvino]==2.2.0'
    .venv-genai/bin/pip uninstall -y torchvision  # PyPI's does not load beside this torch
    .venv/bin/python benchmarks/bench_ov_genai.py --export-ir

The benchmark (two sessions of six calls, one thread each)::

    nice -n 10 .venv/bin/python benchmarks/bench_ov_genai.py --sessions requests,httpx \\
        --turns 6 --threads 1 --json benchmarks/results/ov_genai_peer.json

``--genai-prefix-cache off`` (with ``--modes genai-prefix-cache``) runs the peer without its
cache (rows ``genai-no-prefix-cache``): the control that shows its cache hit on the calls after
the first. Each row also has the tokens its prompt shares with the previous call's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

GENAI, EXACT, COMPOSE = "genai-prefix-cache", "codekv-exact-only", "codekv-compose"
MODES = (GENAI, EXACT, COMPOSE)
GENAI_UNCACHED = "genai-no-prefix-cache"  # GENAI's name with --genai-prefix-cache off
REFERENCE = EXACT
GENAI_PYTHON = ".venv-genai/bin/python"
GENAI_IR = ".venv-genai/smollm2-ir"
EXPORT_HF = ".venv-genai/smollm2-hf"
WARM_UP = ("<|im_start|>user\nName three colours, one per line.<|im_end|>\n"
           "<|im_start|>assistant\n")
SCOPE = "bench-ov-genai"
# The files of the converted model the export reads besides the tokenizer's.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "chat_template.jinja")


# -- the GenAI worker (runs under --genai-python: the standard library and openvino_genai) ----
def worker(args) -> int:
    """Serve JSON lines from stdin: each a prompt, answered on stdout by its TTFT, prompt
    tokens and greedy reply; anything the runtime prints goes to stderr."""
    import openvino_genai as genai

    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    scheduler = genai.SchedulerConfig()
    scheduler.enable_prefix_caching = args.genai_prefix_cache == "on"
    scheduler.max_num_batched_tokens = 2 ** 64 - 1  # as GenAI's LLMPipeline on a CPU by default
    scheduler.cache_size = args.genai_cache_gb
    precision = args.kv_precision
    properties = {"INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": "f32",
                  "KV_CACHE_PRECISION": precision, "KEY_CACHE_PRECISION": precision,
                  "VALUE_CACHE_PRECISION": precision}
    started = time.perf_counter()
    pipe = genai.LLMPipeline(args.genai_ir, "CPU", scheduler_config=scheduler, **properties)
    tokenizer = pipe.get_tokenizer()

    class FirstToken(genai.StreamerBase):
        def __init__(self, started: float):
            super().__init__()
            self.started, self.first, self.ids = started, None, []

        def write(self, token):
            if self.first is None:
                self.first = time.perf_counter() - self.started
            self.ids += list(token) if isinstance(token, list) else [int(token)]
            return genai.StreamingStatus.RUNNING

        def end(self):
            pass

    versions = {name: metadata.version(name) for name in
                ("openvino", "openvino-genai", "openvino-tokenizers")}
    out.write(json.dumps({"ready": True, "load_s": round(time.perf_counter() - started, 2),
                          "versions": versions, "properties": properties,
                          "scheduler": {"enable_prefix_caching": scheduler.enable_prefix_caching,
                                        "max_num_batched_tokens": "unlimited",
                                        "cache_size_gb": scheduler.cache_size}}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        config = pipe.get_generation_config()
        config.max_new_tokens = request["max_new_tokens"]
        config.do_sample = False
        config.apply_chat_template = False
        config.stop_token_ids = set(request["stop_token_ids"])
        streamer = FirstToken(time.perf_counter())
        result = pipe.generate([request["prompt"]], config, streamer)
        e2e = time.perf_counter() - streamer.started
        metrics = result.perf_metrics
        ids = [int(i) for i in tokenizer.encode(request["prompt"]).input_ids.data[0]]
        out.write(json.dumps({
            "ttft_s": streamer.first, "e2e_s": e2e, "reply_ids": streamer.ids,
            "reply_text": result.texts[0], "prompt_ids": ids,
            "perf_ttft_s": metrics.get_ttft().mean / 1000,
            "perf_input_tokens": metrics.get_num_input_tokens()}) + "\n")
    return 0


class GenAIWorker:
    """The worker process, one request at a time."""

    def __init__(self, args):
        command = [args.genai_python, str(Path(__file__).resolve()), "--worker",
                   "--genai-ir", args.genai_ir, "--threads", str(args.threads),
                   "--genai-prefix-cache", args.genai_prefix_cache,
                   "--genai-cache-gb", str(args.genai_cache_gb),
                   "--kv-precision", args.kv_precision]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, bufsize=1)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the GenAI worker ended (exit {self.process.wait()})")
        return json.loads(line)

    def ask(self, prompt: str, max_new_tokens: int, stop_token_ids: list[int]) -> dict:
        self.process.stdin.write(json.dumps({"prompt": prompt, "max_new_tokens": max_new_tokens,
                                             "stop_token_ids": stop_token_ids}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()


# -- exporting the IR (runs under codekv's venv, the export under --genai-python's) ----------
def export_ir(args) -> int:
    """The default model's converted copy, with a byte-level BPE tokenizer config, exported by
    optimum-intel (f32 weights, tokenizer and detokenizer) to ``--genai-ir``."""
    from codekv.models import load_backend

    source = Path(load_backend().tokenizer.name_or_path)
    target = Path(args.export_hf)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in MODEL_FILES:
        if (source / name).exists():
            (target / name).symlink_to(source / name)
    tokenizer = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = len(tokenizer["model"]["vocab"])
    tokenizer["model"]["byte_fallback"] = False  # byte-level: every byte has its token
    tokenizer["decoder"] = {"type": "ByteLevel", "add_prefix_space": True,
                            "trim_offsets": True, "use_regex": True}
    tokenizer["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True,
                                   "trim_offsets": False, "use_regex": True}  # adds no token
    # The conversion's CodeLlama fill-in tokens lie past the model's vocabulary.
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["id"] < vocab]
    (target / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False),
                                           encoding="utf-8")
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>",
        "add_bos_token": False, "add_prefix_space": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 8192}, indent=2))
    command = [str(Path(args.genai_python).parent / "optimum-cli"), "export", "openvino",
               "-m", str(target), "--task", "text-generation-with-past",
               "--weight-format", "fp32", args.genai_ir]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return 0


# -- the benchmark (runs under codekv's venv) -------------------------------------------------
def package_dir(name: str) -> Path:
    """A directory, or an installed package's."""
    if Path(name).is_dir():
        return Path(name)
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name}: neither a directory nor an installed package")
    return Path(list(spec.submodule_search_locations)[0])


def until_end(ids: list[int], ends: set[int]) -> list[int]:
    for i, token in enumerate(ids):
        if token in ends:
            return ids[:i]
    return ids


def codekv_call(pipeline, backend, prompt, reply_tokens: int, ends: set[int]) -> dict:
    """One request as the server serves it: prefill (or compose), greedy reply, ``done``."""
    started = time.perf_counter()
    served = pipeline.prefill(SCOPE, prompt)
    state = served.state
    token = int(state.logits.argmax())
    ttft = time.perf_counter() - started
    reply: list[int] = []
    while len(reply) < reply_tokens and token not in ends:
        reply.append(token)
        if len(reply) < reply_tokens:
            backend.extend(state, [token])
            token = int(state.logits.argmax())
    e2e = time.perf_counter() - started
    kept = time.perf_counter()
    pipeline.done(SCOPE, served)
    return {"ttft_s": ttft, "e2e_s": e2e, "done_s": time.perf_counter() - kept,
            "reply_ids": reply, "prompt_tokens": len(served.ids),
            "codekv": served.outcome.as_json()}


def summarize(rows: list[dict], modes: list[str]) -> list[dict]:
    from bench_serve import quantile  # beside this file; not in the worker (it needs httpx)

    reference = {(r["session"], r["call"]): r["reply_ids"] for r in rows
                 if r["mode"] == REFERENCE}
    out = []
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        compared = [r for r in mine if (r["session"], r["call"]) in reference]
        same = sum(r["reply_ids"] == reference[(r["session"], r["call"])] for r in compared)
        ttft = [r["ttft_s"] for r in mine]
        summary = {
            "mode": mode, "calls": len(mine),
            "ttft_median_s": statistics.median(ttft) if ttft else None,
            "ttft_p90_s": quantile(ttft, 0.9),
            "ttft_later_median_s": statistics.median([r["ttft_s"] for r in mine if r["call"]])
            if any(r["call"] for r in mine) else None,
            "median_prompt_tokens": statistics.median([r["prompt_tokens"] for r in mine])
            if mine else None,
            "same_reply": same, "replies_compared": len(compared)}
        if mode in (GENAI, GENAI_UNCACHED):
            summary["prompt_ids_as_codekv"] = sum(r["prompt_ids_match"] for r in mine)
        out.append(summary)
    return out


def table(summary: list[dict]) -> str:
    from bench_serve import _fmt  # beside this file; not in the worker (it needs httpx)

    lines = ["| mode | calls | TTFT median s | TTFT p90 s | TTFT median, calls 2+ s | "
             "median prompt tokens | greedy reply as exact-only's | prompt ids as codekv's |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        same = ("reference" if s["mode"] == REFERENCE else
                f"{s['same_reply']} of {s['replies_compared']}" if s["replies_compared"]
                else "–")
        ids = (f"{s['prompt_ids_as_codekv']} of {s['calls']}" if "prompt_ids_as_codekv" in s
               else "–")
        lines.append(f"| {s['mode']} | {s['calls']} | {_fmt(s['ttft_median_s'])} | "
                     f"{_fmt(s['ttft_p90_s'])} | {_fmt(s['ttft_later_median_s'])} | "
                     f"{_fmt(s['median_prompt_tokens'], 0)} | {same} | {ids} |")
    return "\n".join(lines)


def machine(threads: int) -> dict:
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "nice": os.nice(0), "threads": threads,
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}


def run(args) -> int:
    import torch

    torch.set_num_threads(args.threads)  # the openvino engine's INFERENCE_NUM_THREADS too
    from codekv.eval.sessions import generated_aider_session
    from codekv.gate import SupportGate
    from codekv.models import load_backend
    from codekv.schema import LAST_PROMPT
    from codekv.serve import COMPOSE as REUSE_COMPOSE
    from codekv.serve import EXACT_ONLY
    from codekv.serve.chat import chat_prompt
    from codekv.serve.engine import Pipeline
    from codekv.serve.shift import common_prefix
    from codekv.stores.local import LocalKVStore

    modes = [m for m in MODES if m in args.modes.split(",")]
    if not modes or len(modes) != len(args.modes.split(",")):
        raise SystemExit(f"--modes: some of {', '.join(MODES)}")
    started_at = time.time()
    info = machine(args.threads)
    sessions = [generated_aider_session(package_dir(name), turns=args.turns,
                                        chat_files=args.chat_files,
                                        max_file_chars=args.max_file_chars)
                for name in args.sessions.split(",")]
    loading = time.perf_counter()
    # Without a codekv mode, the transformers engine renders and tokenizes (the same tokenizer
    # and template) without the openvino engine's memory.
    codekv_modes = [m for m in modes if m != GENAI]
    backend = load_backend(engine="openvino" if codekv_modes else "transformers")
    print(f"codekv: {backend.info.engine}, {backend.info.family} "
          f"{backend.info.fingerprint[:16]} loaded in {time.perf_counter() - loading:.1f} s",
          flush=True)
    ends = set(backend.end_token_ids)
    budget = args.prefix_budget_mib * 2 ** 20
    workdir = Path(tempfile.mkdtemp(prefix="bench-ov-genai-"))
    gate = SupportGate([], "bench_ov_genai")
    pipelines = {}
    if EXACT in modes:
        pipelines[EXACT] = Pipeline(backend, LocalKVStore(workdir / "exact"), gate,
                                    reuse=EXACT_ONLY, prefix_budget_bytes=budget)
    if COMPOSE in modes:
        pipelines[COMPOSE] = Pipeline(backend, LocalKVStore(workdir / "compose"), gate,
                                      experimental=True, strategy="none",
                                      sources=(LAST_PROMPT,), reuse=REUSE_COMPOSE,
                                      prefix_budget_bytes=budget)
    peer = GenAIWorker(args) if GENAI in modes else None
    names = {**{m: m for m in modes},
             GENAI: GENAI if args.genai_prefix_cache == "on" else GENAI_UNCACHED}
    rows: list[dict] = []
    try:
        if peer is not None:
            print(f"genai: loaded in {peer.ready['load_s']} s, {peer.ready['versions']}",
                  flush=True)
            peer.ask(WARM_UP, 2, sorted(ends))  # first-inference costs, in neither table
        if codekv_modes:
            warm = Pipeline(backend, LocalKVStore(workdir / "warm"), gate, reuse=EXACT_ONLY)
            codekv_call(warm, backend, chat_prompt(backend, [
                {"role": "user", "content": "Name three colours, one per line."}]), 2, ends)
        previous: list[int] = []
        for session in sessions:
            for index, call in enumerate(session.calls):
                prompt = chat_prompt(backend, call.messages)
                ids, _ = backend.tokenize_prompt(prompt.text, prompt.markers)
                shared = common_prefix(previous, ids)
                previous = ids
                for mode in modes:
                    if mode == GENAI:
                        answer = peer.ask(prompt.text, args.reply_tokens, sorted(ends))
                        prompt_ids = answer.pop("prompt_ids")
                        result = {**answer, "prompt_tokens": len(prompt_ids),
                                  "prompt_ids_match": prompt_ids == ids,
                                  "reply_ids": until_end(answer["reply_ids"], ends)}
                    else:
                        result = codekv_call(pipelines[mode], backend, prompt,
                                             args.reply_tokens, ends)
                    result["reply_text"] = backend.detokenize(result["reply_ids"])
                    row = {"mode": names[mode], "session": session.name, "call": index,
                           "codekv_prompt_tokens": len(ids),
                           "shared_prefix_with_previous": shared,
                           "loadavg_1m": os.getloadavg()[0], **result}
                    rows.append(row)
                    extra = ""
                    if mode == GENAI:
                        extra = (f", its count {row['perf_input_tokens']}, ids as codekv's "
                                 f"{row['prompt_ids_match']}")
                    elif "codekv" in row:
                        o = row["codekv"]
                        extra = (f", {o['status']}: exact {o['exact_prefix_tokens']}, reused "
                                 f"{o['reused_tokens']}, prefilled {o['prefilled_tokens']}")
                    print(f"{session.name} call {index + 1} {names[mode]}: {row['prompt_tokens']} "
                          f"tokens ({shared} as the previous prompt's){extra}; TTFT "
                          f"{row['ttft_s']:.2f} s; reply {row['reply_text']!r}", flush=True)
    finally:
        if peer is not None:
            peer.close()
        shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(rows, [names[m] for m in modes])
    print(table(summary))
    if args.json:
        info["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        report = {
            "command": " ".join([sys.executable, *sys.argv]),
            "settings": {k: v for k, v in vars(args).items() if k not in ("worker",
                                                                          "export_ir")},
            "machine": info, "wall_s": round(time.time() - started_at, 1),
            "loadavg_1m_median": statistics.median(r["loadavg_1m"] for r in rows)
            if rows else None,
            "codekv": {"engine": backend.info.engine, "family": backend.info.family,
                       "fingerprint": backend.info.fingerprint,
                       "openvino": metadata.version("openvino")},
            "genai": peer.ready if peer is not None else None,
            "summary": summary, "table": table(summary), "rows": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, ensure_ascii=False))
        print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="requests,httpx",
                        help="Installed packages (or directories) whose source makes one "
                             "generated aider-style session each, comma-separated.")
    parser.add_argument("--turns", type=int, default=6, help="Calls per session.")
    parser.add_argument("--chat-files", type=int, default=2)
    parser.add_argument("--max-file-chars", type=int, default=4000)
    parser.add_argument("--reply-tokens", type=int, default=16,
                        help="Greedy reply tokens per call, at most.")
    parser.add_argument("--threads", type=int, default=1, help="Threads of each engine.")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"Of {', '.join(MODES)}, comma-separated.")
    parser.add_argument("--prefix-budget-mib", type=int, default=512,
                        help="Each codekv pipeline's exact-prefix cache budget (an agent's "
                             "next call reuses its last prompt's).")
    parser.add_argument("--genai-python", default=GENAI_PYTHON,
                        help="The python of the venv with openvino-genai (and optimum-intel).")
    parser.add_argument("--genai-ir", default=GENAI_IR, help="The IR GenAI runs.")
    parser.add_argument("--genai-prefix-cache", choices=("on", "off"), default="on")
    parser.add_argument("--genai-cache-gb", type=int, default=1,
                        help="GenAI's KV cache (its prefix cache lives in it).")
    parser.add_argument("--kv-precision", default="f32",
                        help="GenAI's KV cache precision (the CPU plugin's default is u8).")
    parser.add_argument("--json", help="Write the per-call rows and the summary here.")
    parser.add_argument("--export-ir", action="store_true",
                        help="Export the default model to --genai-ir (once) and exit.")
    parser.add_argument("--export-hf", default=EXPORT_HF,
                        help="Where --export-ir lays the model with its tokenizer config.")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.export_ir:
        return export_ir(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
