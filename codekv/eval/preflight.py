"""What an evaluation checks before it spends time: options that would run for minutes and
then fail, or succeed with nothing measured, are refused first, each error naming the value
and what is expected.

Lengths are checked against the model's positions twice: before it loads, against the
positions its files declare (a GGUF's ``context_length``, a Hugging Face ``config.json``'s
``max_position_embeddings``), and right after it loads, before any prefill, with the system
prompt's exact token count.
"""

from __future__ import annotations

import json
import struct

# Below this, no workload's context holds a task (its chunks or passages would not fit).
MIN_CONTEXT_TOKENS = 128


class EvalOptionError(ValueError):
    """An option the evaluation cannot run with; the message names it and what it expects."""


def declared_positions(model: str | None) -> int | None:
    """The positions ``model`` (a GGUF file, a Hugging Face directory or a model name; None:
    the default model) declares, read from its files without loading it; None when they
    cannot be read (the check after loading decides then)."""
    from codekv.gguf_vocab import read_metadata
    from codekv.models import ModelLoadError, resolve_model

    try:
        path = resolve_model(model or None)
        if path.is_dir():
            config = json.loads((path / "config.json").read_text())
            value = (config.get("text_config") or config).get("max_position_embeddings")
        else:
            arch = read_metadata(path, "general.architecture").get("general.architecture")
            key = f"{arch}.context_length"
            value = read_metadata(path, key).get(key)
    except (OSError, ValueError, AttributeError, struct.error, ModelLoadError):  # loading says why
        return None
    return value if isinstance(value, int) and value > 0 else None


def check_positions(config, positions: int | None, prefix_tokens: int = 0) -> None:
    """Refuse ``config.context_tokens`` when a request could run past the model's
    ``positions``: system prompt + context + query + answer, or for agent sessions (whose
    context is the whole prompt, the begun reply included, and leaves room for the answer)
    the context alone. Before the model loads, the prompt is not counted yet
    (``prefix_tokens`` 0)."""
    from codekv.eval.runner import ANSWER_TOKENS
    from codekv.schema import FROM_LAST_PROMPT, WORKLOADS

    if positions is None:
        return
    if any(WORKLOADS[w].source not in FROM_LAST_PROMPT for w in config.workloads):
        other = prefix_tokens + config.max_query_tokens + ANSWER_TOKENS
    else:
        other = 0
    if config.context_tokens + other > positions:
        if other:
            prompt = f"a {prefix_tokens}-token system prompt, " if prefix_tokens else ""
            adds = (f"a request adds {prompt}a query of up to {config.max_query_tokens} tokens "
                    f"and an answer of up to {ANSWER_TOKENS}, and ")
        else:
            adds = ""
        raise EvalOptionError(
            f"--context-tokens {config.context_tokens} is too long for the model: {adds}"
            f"the model has {positions} positions; expected --context-tokens of at most "
            f"{positions - other}")


def check_tasks(config, workload: str, made: int) -> None:
    """Refuse a workload that could make no task: nothing would be measured."""
    from codekv.schema import WORKLOADS

    if made or not config.tasks:
        return
    where = f" from {', '.join(config.repos)}" if WORKLOADS[workload].needs_index else ""
    raise EvalOptionError(
        f"{workload}: no task could be made{where} with --context-tokens "
        f"{config.context_tokens}; expected material whose chunks fit half of the context "
        "(a longer --context-tokens, or another --repo)")
