"""Where a served call's time goes: an aider-style session over standard-library files through
``codekv serve``'s pipeline in process (segments from the scope's last prompt, as the shipped
licence reuses), each call's outcome printed, and ``cProfile`` around the last call's prefill.

    python benchmarks/profile_serve.py --backend llama.cpp --files fnmatch.py,genericpath.py
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from codekv.eval.sessions import aider_session
from codekv.gate import SupportGate
from codekv.models import load_backend
from codekv.schema import LAST_PROMPT
from codekv.serve.chat import chat_prompt
from codekv.serve.engine import Pipeline
from codekv.stdlib_repo import stdlib_dir
from codekv.stores.local import LocalKVStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="transformers")
    parser.add_argument("--files", default="fnmatch.py,genericpath.py",
                        help="Standard-library files in the session's chat, comma-separated.")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--strategy", default="auto",
                        help="The rule (experimental: without evidence) [the default rule].")
    parser.add_argument("--rows", type=int, default=25, help="Profile rows printed.")
    args = parser.parse_args()
    files = args.files.split(",")
    backend = load_backend(args.backend)
    session = aider_session("profile", {f: (stdlib_dir() / f).read_text() for f in files},
                            files, turns=args.calls)
    name, _, ratio = args.strategy.partition("@")
    pipeline = Pipeline(backend, LocalKVStore(Path(tempfile.mkdtemp())),
                        SupportGate([], "profiling"), experimental=True, strategy=name,
                        ratio=float(ratio) if ratio else None, sources=(LAST_PROMPT,))
    profile = cProfile.Profile()
    for number, call in enumerate(session.calls):
        prompt = chat_prompt(backend, call.messages)
        last = number == len(session.calls) - 1
        if last:
            profile.enable()
        served = pipeline.prefill("profile", prompt)
        if last:
            profile.disable()
        o = served.outcome
        print(f"call {number + 1}: {o.status}, {o.prompt_tokens} tokens: exact "
              f"{o.exact_prefix_tokens}, reused {o.reused_tokens}, recomputed "
              f"{o.recomputed_tokens}, prefilled {o.prefilled_tokens}; segments {o.segments} "
              f"({o.segments_from_last_prompt} from the last prompt); TTFT {o.ttft_s:.1f} s",
              flush=True)
        pipeline.done("profile", served)
        if last:
            started = time.perf_counter()
            backend.full_prefill(served.ids)
            print(f"its full prefill: {time.perf_counter() - started:.1f} s")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.rows)


if __name__ == "__main__":
    main()
