"""What a store holds: keys, entries and the one byte format every store writes.

An entry is safetensors bytes: keys and values as ``k.<layer>`` / ``v.<layer>``, and metadata
holding the format version, the full key fields, the provenance (JSON) and an xxh3-128
checksum over all of them plus every tensor's name, dtype, shape and bytes (the checksum catches
damaged and truncated values; a store's privacy comes from its permissions, not from the hash;
xxh3 reads a 4K-token request's 186 MB in 0.02 s where sha256 took 0.17 s of its time to first
token). A local file and a shared store's value are the same bytes.

Decoding trusts nothing a writer of the scope could get wrong or forge: a value whose key
fields differ from the requested key, whose checksum fails, whose tensors are not finite or do
not form one ``[kv_heads, n_tokens, head_dim]`` layout across layers, keys and values, raises
``CorruptEntry``; the store deletes it and answers a miss, so the caller recomputes.

torch is imported only to encode or decode tensors: reading headers (``gc``, ``stats``) needs
none.
"""

from __future__ import annotations

import hashlib
import json
import struct
from array import array
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = "2"  # 2: xxh3-128 checksum

META_FORMAT = "codekv.format"
META_KEY = "codekv.key"
META_PROVENANCE = "codekv.provenance"
META_LAYERS = "codekv.layers"
META_CHECKSUM = "codekv.xxh3_128"
MAX_HEADER = 64 * 1024 * 1024  # a safetensors header larger than this is not one of ours


@dataclass(frozen=True)
class KVKey:
    """Everything that decides whether cached KV is valid for a chunk in a request.

    ``scope`` isolates tenants (e.g. ``"repo:<hash of repo root>"``); a request only sees
    entries of its own scope. ``model`` and ``tokenizer`` are opaque fingerprints.
    """

    scope: str
    model: str
    tokenizer: str
    chunk: str
    token_hash: str

    def __post_init__(self) -> None:
        for f in fields(self):
            if not isinstance(getattr(self, f.name), str):
                raise TypeError(f"KVKey.{f.name} must be a str")

    def digest(self) -> str:
        """sha256 over every field and FORMAT_VERSION (a format change orphans old entries)."""
        payload = ["codekv.kvstore", FORMAT_VERSION, *(getattr(self, f.name) for f in fields(self))]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


@dataclass
class KVEntry:
    """Per-layer KV of one chunk, each tensor ``[kv_heads, n_tokens, head_dim]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    provenance: dict  # JSON-serialisable; comes back through json (tuples become lists)


@dataclass(frozen=True)
class StoreStats:
    entries: int  # entries stored, in every scope this client can see (or the one asked for)
    bytes: int  # their total size
    hits: int  # gets of this object that returned an entry
    misses: int  # gets of this object that returned None (corrupt ones included)
    corrupt: int  # bad entries this object found (and deleted) in get, gc or ``reject``
    orphans: int = 0  # temporary files on disk whose writer is gone (removed by gc, evict)


class CorruptEntry(ValueError):
    """Stored bytes that are not a valid entry for the requested key."""


class BadEntry(ValueError):
    """A valid entry that does not fit the request: another model's layout or dtype, another
    token count than the key's tokens. The reader rejects it like a corrupt one."""


def token_hash(token_ids: list[int]) -> str:
    """sha256 of token ids as little-endian int64 (independent of the host's byte order)."""
    ids = array("q", token_ids)
    if ids.itemsize != 8:  # pragma: no cover - 'q' is 8 bytes on every supported platform
        raise RuntimeError("array('q') is not 64-bit here")
    if struct.pack("=H", 1) != struct.pack("<H", 1):  # pragma: no cover - big-endian hosts
        ids.byteswap()
    digest = hashlib.sha256(b"codekv.tokens.v1\0")
    digest.update(len(ids).to_bytes(8, "little"))
    digest.update(ids.tobytes())
    return digest.hexdigest()


# -- encoding ------------------------------------------------------------------------------


def _checksum(meta: dict[str, str], tensors: dict[str, torch.Tensor], layers: int) -> str:
    """xxh3-128 over the metadata that matters and every tensor's name, dtype, shape, bytes."""
    import torch

    digest = xxhash.xxh3_128(b"codekv.kvstore.entry\0")

    def field(data) -> None:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    for name in (META_FORMAT, META_KEY, META_PROVENANCE, META_LAYERS):
        field(meta[name].encode())
    for name in tensor_names(layers):
        t = tensors[name]
        field(name.encode())
        field(str(t.dtype).encode())
        field(json.dumps(list(t.shape)).encode())
        field(t.contiguous().reshape(-1).view(torch.uint8).numpy())  # hashed in place, no copy
    return digest.hexdigest()


def tensor_names(layers: int) -> list[str]:
    return [f"k.{i}" for i in range(layers)] + [f"v.{i}" for i in range(layers)]


def _prepare(t: torch.Tensor, what: str) -> torch.Tensor:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} is not a tensor")
    if t.dim() != 3:
        raise ValueError(f"{what} must be [kv_heads, n_tokens, head_dim], got {tuple(t.shape)}")
    t = t.detach().to("cpu").contiguous()
    # safetensors refuses tensors that share storage (views into a larger cache): copy those.
    if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.nbytes:
        t = t.clone()
    return t


def encode_entry(key: KVKey, entry: KVEntry) -> bytes:
    """``entry`` as the bytes of one store value (a local file or a shared store's value)."""
    from safetensors.torch import save as st_save

    if len(entry.keys) != len(entry.values) or not entry.keys:
        raise ValueError("an entry needs the same number (>= 1) of key and value layers")
    layers = len(entry.keys)
    tensors: dict[str, torch.Tensor] = {}
    for i, (k, v) in enumerate(zip(entry.keys, entry.values, strict=True)):
        tensors[f"k.{i}"] = _prepare(k, f"keys[{i}]")
        tensors[f"v.{i}"] = _prepare(v, f"values[{i}]")
    meta = {
        META_FORMAT: FORMAT_VERSION,
        META_KEY: json.dumps(asdict(key), sort_keys=True),
        META_PROVENANCE: json.dumps(entry.provenance, sort_keys=True),
        META_LAYERS: str(layers),
    }
    meta[META_CHECKSUM] = _checksum(meta, tensors, layers)
    return st_save(tensors, metadata=meta)


def parse_header(head: bytes) -> tuple[int, dict]:
    """(header length, header JSON) of a safetensors value's first bytes."""
    if len(head) < 8:
        raise CorruptEntry("short value")
    n = int.from_bytes(head[:8], "little")
    if n > MAX_HEADER or len(head) < 8 + n:
        raise CorruptEntry("bad header length")
    header = json.loads(head[8 : 8 + n])
    if not isinstance(header, dict):
        raise CorruptEntry("header is not an object")
    return n, header


def decode_file(path, key: KVKey) -> KVEntry:
    """The entry in file ``path``, memory-mapped (entries are replaced by rename, never
    rewritten in place, so a mapping stays valid); raises on anything that is not ``key``'s
    valid entry."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        layers = _checked_layers(meta, key, set(f.keys()))
        tensors = {name: f.get_tensor(name) for name in tensor_names(layers)}
    return _verified(meta, tensors, layers)


def decode_bytes(data: bytes, key: KVKey) -> KVEntry:
    """The entry encoded in ``data`` (a value read from a shared store), verified like a file;
    raises on anything that is not ``key``'s valid entry."""
    from safetensors.torch import load as st_load

    _, header = parse_header(data[: 8 + int.from_bytes(data[:8], "little")])
    meta = header.get("__metadata__")
    layers = _checked_layers(meta, key, set(header) - {"__metadata__"})
    return _verified(meta, st_load(data), layers)


def _checked_layers(meta, key: KVKey, names: set[str]) -> int:
    """The layer count of an entry whose metadata says it is ``key``'s, in this format, with
    exactly the tensors that count implies; raises otherwise."""
    if not isinstance(meta, dict) or meta.get(META_FORMAT) != FORMAT_VERSION:
        raise CorruptEntry("not a codekv entry of this format")
    if json.loads(meta[META_KEY]) != asdict(key):
        raise CorruptEntry("entry belongs to another key")
    layers = int(meta[META_LAYERS])
    if layers < 1 or names != set(tensor_names(layers)):
        raise CorruptEntry("unexpected tensor names")
    return layers


def _verified(meta: dict, tensors: dict[str, torch.Tensor], layers: int) -> KVEntry:
    if any(t.dim() != 3 for t in tensors.values()):
        raise CorruptEntry("tensor of wrong rank")
    if _checksum(meta, tensors, layers) != meta[META_CHECKSUM]:
        raise CorruptEntry("checksum mismatch")
    provenance = json.loads(meta[META_PROVENANCE])
    if not isinstance(provenance, dict):
        raise CorruptEntry("provenance is not an object")
    entry = KVEntry(
        keys=[tensors[f"k.{i}"] for i in range(layers)],
        values=[tensors[f"v.{i}"] for i in range(layers)],
        provenance=provenance,
    )
    check_values(entry)
    return entry


def check_values(entry: KVEntry) -> None:
    """Raise ``CorruptEntry`` unless the entry is one layout: every layer's keys one shape and
    dtype, its values another (one dtype with the keys, the same heads and tokens), and every
    floating value finite. A checksum only proves the bytes are the writer's; this is what a
    reader checks of the writer itself."""
    first_key, first_value = entry.keys[0], entry.values[0]
    if first_key.dtype != first_value.dtype or first_key.shape[:2] != first_value.shape[:2]:
        raise CorruptEntry("keys and values of different dtypes, heads or tokens")
    for k, v in zip(entry.keys, entry.values, strict=True):
        if k.shape != first_key.shape or v.shape != first_value.shape:
            raise CorruptEntry("layers of different shapes")
        if k.dtype != first_key.dtype or v.dtype != first_key.dtype:
            raise CorruptEntry("layers of different dtypes")
    if first_key.is_floating_point():
        if not all(all_finite(t) for t in (*entry.keys, *entry.values)):
            raise CorruptEntry("a value that is NaN or infinite")


def all_finite(tensor) -> bool:
    """Whether every value of a floating ``tensor`` is finite, for the cost of one sum: a NaN or
    an infinity makes the float32 sum non-finite, and finite KV values are far too small to
    overflow it (if they did, the entry would only be recomputed). A 4K-token entry of the
    default model (189 MB) sums in ~16 ms; ``isfinite(t).all()`` took ~365 ms."""
    import torch

    return bool(torch.isfinite(tensor.sum(dtype=torch.float32)))


def header_meta(head: bytes) -> dict | None:
    """An entry's metadata from its first bytes (8 + the header length); None if unreadable."""
    try:
        _, header = parse_header(head)
    except (ValueError, CorruptEntry):
        return None
    meta = header.get("__metadata__")
    return meta if isinstance(meta, dict) else None


def header_length(prefix: bytes) -> int | None:
    """The safetensors header length in an entry's first 8 bytes; None if not one of ours."""
    if len(prefix) < 8:
        return None
    n = int.from_bytes(prefix[:8], "little")
    return n if n <= MAX_HEADER else None


def entry_format(meta: dict) -> str | None:
    return meta.get(META_FORMAT)


def entry_provenance(meta: dict) -> dict | None:
    try:
        provenance = json.loads(meta[META_PROVENANCE])
    except (KeyError, ValueError, TypeError):
        return None
    return provenance if isinstance(provenance, dict) else None


def recorded_scope(meta: dict) -> str | None:
    try:
        return json.loads(meta[META_KEY])["scope"]
    except (KeyError, ValueError, TypeError):
        return None
