"""codekv: reuse the KV state of code a coding agent has already read."""

from codekv.address import AddressError
from codekv.chunks import Anchor, Chunk
from codekv.index import Index, IndexSummary

__all__ = ["AddressError", "Anchor", "Chunk", "Index", "IndexSummary"]
__version__ = "0.1.0"
