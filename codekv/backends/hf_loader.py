"""Loading a model on transformers: a local Hugging Face directory, or a GGUF converted once.

A GGUF loads in ~20 s (de-quantisation); the converted copy kept under the codekv home loads in
under a second. The copy is keyed by the GGUF's sha256, the transformers version and the dtype:
a copy read by another transformers version once silently used the wrong RoPE base.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from importlib import metadata
from pathlib import Path

from codekv import paths
from codekv.backends.engines import ModelLoadError
from codekv.gguf_vocab import leading_ids
from codekv.models import cached_digest


def quiet_transformers() -> None:
    """Silence transformers' logging and progress bars (the GGUF loader prints hundreds)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def load(model: Path, dtype: str = "float32", device: str | None = None):
    """An ``HFBackend`` for a GGUF file (converted once) or a local Hugging Face directory."""
    import torch

    from codekv.backends.hf import HFBackend

    quiet_transformers()
    path = Path(model)
    leading = None  # a directory's tokenizer says what it puts first
    if path.is_file() and path.suffix == ".gguf":
        directory, weights = _converted(path, dtype)
        leading = leading_ids(path)  # as llama.cpp reads the GGUF
    elif path.is_dir() and (path / "config.json").is_file():
        directory, weights = path, None
    else:
        raise ModelLoadError(
            f"{model} is neither a GGUF file nor a local Hugging Face model directory "
            "(codekv never downloads models)"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        loaded = AutoModelForCausalLM.from_pretrained(
            str(directory), dtype=getattr(torch, dtype), local_files_only=True
        )
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot load {directory}: {error}") from error
    if device:
        loaded = loaded.to(device)
    return HFBackend(loaded, tokenizer, weights_fingerprint=weights, leading_ids=leading)


def _converted(gguf: Path, dtype: str) -> tuple[Path, str]:
    """The converted copy of a GGUF file (made on first use) and its weights fingerprint.

    A file that is no readable GGUF is a ``ModelLoadError`` and leaves nothing in the cache."""
    digest = cached_digest(gguf)
    version = metadata.version("transformers")
    weights = f"gguf:{digest}:{dtype}"
    target = paths.model_cache() / f"{digest[:16]}-tf{version}-{dtype}"
    if (target / "codekv.json").is_file():
        return target, weights
    tokenizer, model = _read_gguf(gguf, dtype)
    staging = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        paths.private_dir(staging)
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        (staging / "codekv.json").write_text(json.dumps(
            {"gguf": str(gguf), "sha256": digest, "transformers": version, "dtype": dtype}))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, weights


def _read_gguf(gguf: Path, dtype: str):
    """The tokenizer and de-quantised model of a GGUF file."""
    import torch

    # The GGUF de-quantiser's own progress bar (tqdm reads TQDM_DISABLE only at import time).
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress_bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(progress_bar, disable=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype)
        )
    # The GGUF reader raises whatever its parsing meets in a broken file (ValueError,
    # KeyError, IndexError, struct and numpy errors): any of them means "not a usable GGUF".
    except Exception as error:  # noqa: BLE001
        raise ModelLoadError(
            f"{gguf} is not a readable GGUF model ({type(error).__name__}: {error}); "
            "expected a complete GGUF file of a causal language model"
        ) from error
    finally:
        gguf_utils.tqdm = progress_bar
    if model.config.model_type == "gemma3_text":
        tokenizer = _gemma_fixed(gguf, model)
    return tokenizer, model


def _gemma_fixed(gguf: Path, model):
    """Gemma's tokenizer as llama.cpp reads the GGUF (transformers' has no merges), and the
    end of a turn (``<end_of_turn>``) among the generation config's end tokens, as Gemma's own
    generation config has it."""
    from codekv.gguf_vocab import gemma_tokenizer_from_gguf

    tokenizer = gemma_tokenizer_from_gguf(gguf)
    ends = [tokenizer.eos_token_id]
    turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    if turn is not None and turn != tokenizer.unk_token_id:
        ends.append(turn)
    model.generation_config.eos_token_id = ends
    return tokenizer
