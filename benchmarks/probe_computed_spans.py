"""Which tokens a served call computes: a generated aider-style session through ``codekv
serve``'s pipeline in process, each call's count, and the last call's computed stretches as
text (what the composed state did not take from the last prompt or the exact prefix).

By default the gate decides, as the server as shipped; ``--sources`` with ``--experimental``
reads the named sources without evidence (``last-prompt,last-prompt-text-part,last-prompt-run``:
what the runs' evidence measures).

    SP=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    python benchmarks/probe_computed_spans.py --generated $SP/requests --calls 5 --volatile
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import codekv.serve.engine as engine_module
from codekv.eval.sessions import generated_aider_session
from codekv.gate import SupportGate
from codekv.models import load_backend
from codekv.schema import SOURCES
from codekv.serve.chat import chat_prompt
from codekv.serve.engine import Pipeline
from codekv.stores.local import LocalKVStore


def stretches(positions: list[int]) -> list[tuple[int, int]]:
    """Consecutive positions as ``[start, end)`` stretches."""
    out: list[list[int]] = []
    for position in sorted(positions):
        if out and out[-1][1] == position:
            out[-1][1] += 1
        else:
            out.append([position, position + 1])
    return [(start, end) for start, end in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generated", required=True, help="a package directory")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--chat-files", type=int, default=2)
    parser.add_argument("--max-file-chars", type=int, default=4000)
    parser.add_argument("--volatile", action="store_true", help="a header of its own per call")
    parser.add_argument("--sources", default=",".join(SOURCES))
    parser.add_argument("--experimental", action="store_true")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--min-segment-tokens", type=int, default=32)
    args = parser.parse_args()

    backend = load_backend(None, engine="transformers")
    session = generated_aider_session(Path(args.generated), turns=args.calls,
                                      chat_files=args.chat_files,
                                      max_file_chars=args.max_file_chars, volatile=args.volatile)
    pipeline = Pipeline(backend, LocalKVStore(Path(tempfile.mkdtemp())), SupportGate.load(),
                        experimental=args.experimental, strategy=args.strategy,
                        min_segment_tokens=args.min_segment_tokens,
                        sources=tuple(args.sources.split(",")))
    seen: dict = {}
    compose_state = engine_module.compose_state

    def watched(backend_, context_ids, *rest, in_place=(), **options):
        seen.update(context=len(context_ids), in_place=list(in_place))
        return compose_state(backend_, context_ids, *rest, in_place=in_place, **options)

    engine_module.compose_state = watched
    for number, call in enumerate(session.calls):
        seen.clear()
        served = pipeline.prefill("probe", chat_prompt(backend, call.messages))
        outcome = served.outcome
        print(f"call {number + 1}: {outcome.status}, {outcome.prompt_tokens} tokens, "
              f"{outcome.prefilled_tokens + outcome.recomputed_tokens} computed "
              f"(exact {outcome.exact_prefix_tokens}, reused {outcome.reused_tokens}; "
              f"from the last prompt {outcome.segments_from_last_prompt} segments, "
              f"{outcome.parts_from_last_prompt} parts, {outcome.runs_from_last_prompt} runs), "
              f"TTFT {outcome.ttft_s:.2f} s")
        if number == len(session.calls) - 1 and seen:
            ids = served.ids
            for start, end in stretches(seen["in_place"]):
                print(f"  [{start}, {end}) {end - start} tokens: "
                      f"{backend.detokenize(ids[start:end])!r:.160}")
            print(f"  [{seen['context']}, {len(ids)}) the request: "
                  f"{backend.detokenize(ids[seen['context']:])!r:.160}")
        pipeline.done("probe", served)


if __name__ == "__main__":
    main()
