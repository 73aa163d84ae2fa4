"""Loading a model on llama.cpp: the GGUF file as it is (no conversion)."""

from __future__ import annotations

from pathlib import Path

from codekv.backends.engines import ModelLoadError
from codekv.models import cached_digest


def load(model: Path, dtype: str = "float32", device: str | None = None):
    """A ``LlamaCppBackend`` for a GGUF file (``dtype`` and ``device`` are transformers')."""
    gguf = Path(model)
    if not (gguf.is_file() and gguf.suffix == ".gguf"):
        raise ModelLoadError(f"{model} is not a GGUF file (the llama.cpp engine runs GGUF)")
    try:
        from codekv.backends.llamacpp import LlamaCppBackend
    except ImportError as error:
        raise ModelLoadError(str(error)) from error
    try:
        return LlamaCppBackend(gguf, gguf_digest=cached_digest(gguf))
    except (ImportError, ValueError) as error:
        raise ModelLoadError(f"cannot load {gguf} on llama.cpp: {error}") from error
