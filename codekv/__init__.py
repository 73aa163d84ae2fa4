"""codekv: reuse the KV state of code a coding agent has already read.

The names below load on first use: importing a submodule (``codekv.gate``, the engine
registry) does not load the index's parsers, git or sqlite.
"""

from importlib import import_module

_EXPORTS = {
    "AddressError": "codekv.address",
    "Anchor": "codekv.chunks",
    "Chunk": "codekv.chunks",
    "Index": "codekv.index",
    "IndexSummary": "codekv.index",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'codekv' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
