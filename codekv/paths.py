"""Where codekv keeps its files: one private directory per user."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The codekv directory: ``$CODEKV_HOME``, else ``$XDG_CACHE_HOME/codekv``, else
    ``~/.cache/codekv``.

    Created owner-only (0700): cached KV and chunk text encode the user's code.
    """
    root = os.environ.get("CODEKV_HOME")
    if root:
        path = Path(root)
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(cache) / "codekv"
    return private_dir(path)


def private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


def model_cache() -> Path:
    """Converted models and tokenizers: ``$CODEKV_MODEL_CACHE``, else ``<home>/models``.

    Derived from installed packages only (no user data), so test sessions and several homes
    may share one; converting the default GGUF takes ~20 s.
    """
    root = os.environ.get("CODEKV_MODEL_CACHE")
    return private_dir(Path(root)) if root else private_dir(home() / "models")
