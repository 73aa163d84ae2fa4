"""The chunk KV store: per-chunk transformer KV states, cached on disk for composition.

Its own namespace, shared with no exact-prefix cache. One safetensors file per entry::

    root/<sha256(scope)[:16]>/<digest[:2]>/<digest>.safetensors

Keys and values are stored as ``k.<layer>`` / ``v.<layer>``; the safetensors metadata holds
the format version, the full key fields, the provenance (JSON) and an xxh3-128 checksum over
all of them plus every tensor's name, dtype, shape and bytes (the checksum catches damaged and
truncated files; the store's privacy comes from its permissions, not from the hash; xxh3 reads
a 4K-token request's 186 MB in 0.02 s where sha256 took 0.17 s of its time to first token).
Entries are read through a memory map, without copying. ``get`` trusts nothing: a file whose key
fields differ from the requested key (digest collision, renamed or copied file), whose checksum
fails, or which does not parse is deleted, counted as corrupt, and reported as a miss, so the
caller recomputes. Entries encode the user's code: directories are 0700 and files 0600.

Writes go to a temporary file in the entry's directory, are fsynced and then ``os.replace``d,
so a crash never leaves a half-written file under a final name. A temporary file's name holds
its writer's machine (host and boot) and process id: one whose writer is gone is an orphan,
removed by ``gc`` and by eviction (which counts the others towards the size limit); one from
another machine is removed once it is an hour old.

"Last access" for LRU eviction is the file's mtime, set explicitly on put and on every hit
(atime is unreliable under relatime/noatime mounts).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import socket
import struct
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
import xxhash
from safetensors import safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from codekv.paths import private_dir

FORMAT_VERSION = "2"  # 2: xxh3-128 checksum

_SUFFIX = ".safetensors"
_TMP_PREFIX = "."
_TMP_SUFFIX = ".tmp"
_META_FORMAT = "codekv.format"
_META_KEY = "codekv.key"
_META_PROVENANCE = "codekv.provenance"
_META_LAYERS = "codekv.layers"
_META_CHECKSUM = "codekv.xxh3_128"
_MAX_HEADER = 64 * 1024 * 1024  # a safetensors header larger than this is not one of ours
# ".<digest[:16]>.<machine>-<pid>.<random>.tmp"; the machine and pid are absent in old names.
_TMP_WRITER = re.compile(r"\.[0-9a-f]{16}\.([0-9a-f]{12})-(\d+)\.[^.]+\.tmp")


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
    entries: int  # entry files on disk, all scopes
    bytes: int  # their total size
    hits: int  # gets of this object that returned an entry
    misses: int  # gets of this object that returned None (corrupt ones included)
    corrupt: int  # corrupt files this object found (and deleted) in get or gc
    orphans: int = 0  # temporary files on disk whose writer is gone (removed by gc, evict)


@runtime_checkable
class KVStore(Protocol):
    """What the composer needs; a shared (remote) store can implement it later."""

    def get(self, key: KVKey) -> KVEntry | None: ...

    def put(self, key: KVKey, entry: KVEntry) -> None: ...


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


class _Corrupt(Exception):
    """The file exists but is not a valid entry for the requested key."""


@dataclass(frozen=True)
class _File:
    path: Path
    size: int
    mtime_ns: int


class LocalKVStore:
    """A KVStore on the local disk, safe for several processes sharing one root."""

    def __init__(self, root: Path, max_bytes: int | None = None):
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.root = private_dir(Path(root))
        self.max_bytes = max_bytes
        self._hits = 0
        self._misses = 0
        self._corrupt = 0
        self._last_stamp = 0

    # -- public API -------------------------------------------------------------------------

    def get(self, key: KVKey) -> KVEntry | None:
        """The entry for ``key`` or None; never raises on a missing or corrupt file."""
        path = self._path(key)
        try:
            st = os.stat(path)
            entry = _decode(path, key)
        except OSError:  # missing, or removed by a concurrent gc since
            self._misses += 1
            return None
        except Exception:  # anything a damaged file can make the parser raise
            self._discard(path, st)
            self._corrupt += 1
            self._misses += 1
            return None
        self._hits += 1
        self._touch(path)
        return entry

    def put(self, key: KVKey, entry: KVEntry) -> None:
        """Write atomically; with ``max_bytes`` set, evict LRU entries to stay within it.

        An entry whose file alone would exceed ``max_bytes`` is not stored (it would only evict
        everything, itself included). Raises on invalid entries and on I/O errors.
        """
        data = _encode(key, entry)
        if self.max_bytes is not None and len(data) > self.max_bytes:
            return
        path = self._path(key)
        for attempt in range(3):  # a concurrent gc may remove the directories, now empty
            private_dir(path.parent.parent)
            private_dir(path.parent)
            try:
                fd, tmp = tempfile.mkstemp(
                    prefix=f"{_TMP_PREFIX}{path.stem[:16]}.{_machine()}-{os.getpid()}.",
                    suffix=_TMP_SUFFIX, dir=path.parent,
                )
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(path.parent)
        self._touch(path)
        if self.max_bytes is not None:
            self.evict(self.max_bytes)

    def contains(self, key: KVKey) -> bool:
        """Whether a file exists for ``key`` (cheap; not verified - ``get`` may still miss)."""
        return self._path(key).is_file()

    def stats(self) -> StoreStats:
        files = list(self._entries())
        return StoreStats(
            entries=len(files),
            bytes=sum(f.size for f in files),
            hits=self._hits,
            misses=self._misses,
            corrupt=self._corrupt,
            orphans=sum(_orphaned(f.path.name) is True for f in self._temporaries()),
        )

    def evict(self, max_bytes: int) -> int:
        """Delete orphaned temporary files, then least-recently-used entries until the store
        (temporary files of running writers included) holds <= ``max_bytes``."""
        removed = 0
        total = 0
        for temporary in self._temporaries():
            if _orphaned(temporary.path.name) is True and _unlink(temporary.path):
                removed += 1
            else:
                total += temporary.size
        files = sorted(self._entries(), key=lambda f: (f.mtime_ns, f.path.name))
        total += sum(f.size for f in files)
        for f in files:
            if total <= max_bytes:
                break
            if _unlink(f.path):
                removed += 1
            total -= f.size
        return removed

    def gc(
        self, keep: Callable[[dict], bool] | None = None, *, stale_after_s: float = 3600.0
    ) -> int:
        """Remove leftovers and, with ``keep``, entries whose provenance fails it.

        Leftovers are orphaned temporary files (their writer is gone; of another machine's
        writers, or unnamed ones, those older than ``stale_after_s``), entries of another
        format version, unreadable entries, and empty directories. Returns the number of files
        removed.
        """
        removed = 0
        cutoff = time.time() - stale_after_s
        for directory in self._shard_dirs():
            for item in _scandir(directory):
                if _is_tmp(item.name):
                    orphaned = _orphaned(item.name)
                    if orphaned is None:
                        orphaned = _mtime(item) <= cutoff
                    if orphaned and _unlink(Path(item.path)):
                        removed += 1
                    continue
                if not _is_entry(item.name):
                    continue
                meta = _read_meta(Path(item.path))
                if meta is None:
                    if _unlink(Path(item.path)):
                        self._corrupt += 1
                        removed += 1
                    continue
                if meta.get(_META_FORMAT) != FORMAT_VERSION:
                    removed += _unlink(Path(item.path))
                    continue
                if keep is None:
                    continue
                try:
                    provenance = json.loads(meta[_META_PROVENANCE])
                    kept = bool(keep(provenance))
                except (KeyError, ValueError):
                    kept = False
                if not kept and _unlink(Path(item.path)):
                    removed += 1
        self._remove_empty_dirs()
        return removed

    def delete_scope(self, scope: str) -> int:
        """Delete every entry of ``scope``; returns the number of entries removed."""
        scope_dir = self.root / _scope_dir(scope)
        removed = 0
        for shard in _subdirs(scope_dir):
            for item in _scandir(shard):
                path = Path(item.path)
                if _is_tmp(item.name):
                    _unlink(path)
                elif _is_entry(item.name):
                    meta = _read_meta(path)
                    # Check the recorded scope: another scope could share the 16-hex prefix.
                    if meta is not None and _recorded_scope(meta) not in (None, scope):
                        continue
                    removed += _unlink(path)
        self._remove_empty_dirs()
        return removed

    # -- internals --------------------------------------------------------------------------

    def _path(self, key: KVKey) -> Path:
        digest = key.digest()
        return self.root / _scope_dir(key.scope) / digest[:2] / f"{digest}{_SUFFIX}"

    def _touch(self, path: Path) -> None:
        """Record an access: a strictly increasing mtime within this object (LRU order)."""
        stamp = max(time.time_ns(), self._last_stamp + 1)
        self._last_stamp = stamp
        try:
            os.utime(path, ns=(stamp, stamp))
        except OSError:
            pass  # evicted or replaced meanwhile: nothing to record

    def _discard(self, path: Path, st: os.stat_result) -> None:
        """Delete a corrupt file, unless another writer has already replaced it."""
        try:
            now = os.stat(path)
        except OSError:
            return
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            _unlink(path)

    def _shard_dirs(self) -> Iterator[Path]:
        for scope_dir in _subdirs(self.root):
            yield from _subdirs(scope_dir)

    def _entries(self) -> Iterator[_File]:
        return self._files(_is_entry)

    def _temporaries(self) -> Iterator[_File]:
        return self._files(_is_tmp)

    def _files(self, wanted: Callable[[str], bool]) -> Iterator[_File]:
        for shard in self._shard_dirs():
            for item in _scandir(shard):
                if not wanted(item.name):
                    continue
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                yield _File(Path(item.path), st.st_size, st.st_mtime_ns)

    def _remove_empty_dirs(self) -> None:
        for scope_dir in _subdirs(self.root):
            for shard in _subdirs(scope_dir):
                _rmdir(shard)
            _rmdir(scope_dir)


# -- encoding ------------------------------------------------------------------------------


def _scope_dir(scope: str) -> str:
    return hashlib.sha256(scope.encode()).hexdigest()[:16]


def _checksum(meta: dict[str, str], tensors: dict[str, torch.Tensor], layers: int) -> str:
    """xxh3-128 over the metadata that matters and every tensor's name, dtype, shape, bytes."""
    digest = xxhash.xxh3_128(b"codekv.kvstore.entry\0")

    def field(data) -> None:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    for name in (_META_FORMAT, _META_KEY, _META_PROVENANCE, _META_LAYERS):
        field(meta[name].encode())
    for name in _tensor_names(layers):
        t = tensors[name]
        field(name.encode())
        field(str(t.dtype).encode())
        field(json.dumps(list(t.shape)).encode())
        field(t.contiguous().reshape(-1).view(torch.uint8).numpy())  # hashed in place, no copy
    return digest.hexdigest()


def _tensor_names(layers: int) -> list[str]:
    return [f"k.{i}" for i in range(layers)] + [f"v.{i}" for i in range(layers)]


def _prepare(t: torch.Tensor, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} is not a tensor")
    if t.dim() != 3:
        raise ValueError(f"{what} must be [kv_heads, n_tokens, head_dim], got {tuple(t.shape)}")
    t = t.detach().to("cpu").contiguous()
    # safetensors refuses tensors that share storage (views into a larger cache): copy those.
    if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.nbytes:
        t = t.clone()
    return t


def _encode(key: KVKey, entry: KVEntry) -> bytes:
    if len(entry.keys) != len(entry.values) or not entry.keys:
        raise ValueError("an entry needs the same number (>= 1) of key and value layers")
    layers = len(entry.keys)
    tensors: dict[str, torch.Tensor] = {}
    for i, (k, v) in enumerate(zip(entry.keys, entry.values, strict=True)):
        tensors[f"k.{i}"] = _prepare(k, f"keys[{i}]")
        tensors[f"v.{i}"] = _prepare(v, f"values[{i}]")
    meta = {
        _META_FORMAT: FORMAT_VERSION,
        _META_KEY: json.dumps(asdict(key), sort_keys=True),
        _META_PROVENANCE: json.dumps(entry.provenance, sort_keys=True),
        _META_LAYERS: str(layers),
    }
    meta[_META_CHECKSUM] = _checksum(meta, tensors, layers)
    return st_save(tensors, metadata=meta)


def _parse_header(head: bytes) -> tuple[int, dict]:
    """(header length, header JSON) of a safetensors file's first bytes."""
    if len(head) < 8:
        raise _Corrupt("short file")
    n = int.from_bytes(head[:8], "little")
    if n > _MAX_HEADER or len(head) < 8 + n:
        raise _Corrupt("bad header length")
    header = json.loads(head[8 : 8 + n])
    if not isinstance(header, dict):
        raise _Corrupt("header is not an object")
    return n, header


def _decode(path: Path, key: KVKey) -> KVEntry:
    """The entry in ``path``, memory-mapped (entries are replaced by rename, never rewritten in
    place, so a mapping stays valid); raises on anything that is not ``key``'s valid entry."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        layers = _checked_layers(meta, key, set(f.keys()))
        tensors = {name: f.get_tensor(name) for name in _tensor_names(layers)}
    return _verified(meta, tensors, layers)


def decode_bytes(data: bytes, key: KVKey) -> KVEntry:
    """The entry encoded in ``data`` (a value read from a shared store), verified like a file;
    raises on anything that is not ``key``'s valid entry."""
    _, header = _parse_header(data[: 8 + int.from_bytes(data[:8], "little")])
    meta = header.get("__metadata__")
    layers = _checked_layers(meta, key, set(header) - {"__metadata__"})
    return _verified(meta, st_load(data), layers)


def _checked_layers(meta, key: KVKey, tensor_names: set[str]) -> int:
    """The layer count of an entry whose metadata says it is ``key``'s, in this format, with
    exactly the tensors that count implies; raises otherwise."""
    if not isinstance(meta, dict) or meta.get(_META_FORMAT) != FORMAT_VERSION:
        raise _Corrupt("not a codekv entry of this format")
    if json.loads(meta[_META_KEY]) != asdict(key):
        raise _Corrupt("entry belongs to another key")
    layers = int(meta[_META_LAYERS])
    if layers < 1 or tensor_names != set(_tensor_names(layers)):
        raise _Corrupt("unexpected tensor names")
    return layers


def encode_entry(key: KVKey, entry: KVEntry) -> bytes:
    """``entry`` as the bytes of one store value (a local file or a shared store's value)."""
    return _encode(key, entry)


def _verified(meta: dict, tensors: dict[str, torch.Tensor], layers: int) -> KVEntry:
    if any(t.dim() != 3 for t in tensors.values()):
        raise _Corrupt("tensor of wrong rank")
    if _checksum(meta, tensors, layers) != meta[_META_CHECKSUM]:
        raise _Corrupt("checksum mismatch")
    provenance = json.loads(meta[_META_PROVENANCE])
    return KVEntry(
        keys=[tensors[f"k.{i}"] for i in range(layers)],
        values=[tensors[f"v.{i}"] for i in range(layers)],
        provenance=provenance,
    )


def _read_meta(path: Path) -> dict | None:
    """An entry's metadata from its header alone (no tensor I/O); None if unreadable."""
    try:
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                return None
            n = int.from_bytes(prefix, "little")
            if n > _MAX_HEADER:
                return None
            _, header = _parse_header(prefix + f.read(n))
    except (OSError, ValueError, _Corrupt):
        return None
    meta = header.get("__metadata__")
    return meta if isinstance(meta, dict) else None


def header_meta(head: bytes) -> dict | None:
    """An entry's metadata from its first bytes (8 + the header length); None if unreadable."""
    try:
        _, header = _parse_header(head)
    except (ValueError, _Corrupt):
        return None
    meta = header.get("__metadata__")
    return meta if isinstance(meta, dict) else None


def header_length(prefix: bytes) -> int | None:
    """The safetensors header length in an entry's first 8 bytes; None if not one of ours."""
    if len(prefix) < 8:
        return None
    n = int.from_bytes(prefix[:8], "little")
    return n if n <= _MAX_HEADER else None


def entry_format(meta: dict) -> str | None:
    return meta.get(_META_FORMAT)


def entry_provenance(meta: dict) -> dict | None:
    try:
        provenance = json.loads(meta[_META_PROVENANCE])
    except (KeyError, ValueError, TypeError):
        return None
    return provenance if isinstance(provenance, dict) else None


def _recorded_scope(meta: dict) -> str | None:
    try:
        return json.loads(meta[_META_KEY])["scope"]
    except (KeyError, ValueError, TypeError):
        return None


# -- filesystem helpers ----------------------------------------------------------------------


def _is_entry(name: str) -> bool:
    return name.endswith(_SUFFIX) and not name.startswith(_TMP_PREFIX)


def _is_tmp(name: str) -> bool:
    return name.startswith(_TMP_PREFIX) and name.endswith(_TMP_SUFFIX)


@functools.cache
def _machine() -> str:
    """This machine since its last boot: a store may be shared by several (a network disk),
    and after a reboot an old writer's pid may belong to another process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return hashlib.sha256(f"{socket.gethostname()}\0{boot}".encode()).hexdigest()[:12]


def _orphaned(name: str) -> bool | None:
    """Whether a temporary file's writer is gone; None when that cannot be told (written on
    another machine, or named before writers were recorded)."""
    match = _TMP_WRITER.fullmatch(name)
    if match is None or match.group(1) != _machine():
        return None
    try:
        os.kill(int(match.group(2)), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process
        return False
    return False


def _scandir(directory: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return [e for e in it if e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _subdirs(directory: Path) -> list[Path]:
    try:
        with os.scandir(directory) as it:
            return sorted(Path(e.path) for e in it if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _mtime(item: os.DirEntry) -> float:
    try:
        return item.stat(follow_symlinks=False).st_mtime
    except OSError:
        return float("inf")


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def _rmdir(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty, or already gone


def _fsync_dir(path: Path) -> None:
    """Make the rename durable; best effort (not every filesystem allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
