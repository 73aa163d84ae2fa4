"""The chunk KV store on the local disk: one entry file per chunk, safe for several processes.

    root/<sha256(scope)[:16]>/<digest[:2]>/<digest>.safetensors
    root/<sha256(scope)[:16]>/claims/<holder>     a holder's claim on the scope (its mtime)

Entries are read through a memory map, without copying. ``get`` trusts nothing: a file whose key
fields differ from the requested key (digest collision, renamed or copied file), whose checksum
or values fail (``codekv.stores.entry``), or which does not parse is deleted, counted as
corrupt, and reported as a miss, so the caller recomputes. Entries encode the user's code:
directories are 0700 and files 0600.

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
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from codekv.paths import private_dir
from codekv.stores.base import AccessClock, KVStore
from codekv.stores.entry import (
    FORMAT_VERSION,
    KVEntry,
    KVKey,
    StoreStats,
    decode_file,
    encode_entry,
    entry_format,
    entry_provenance,
    header_length,
    header_meta,
    recorded_scope,
)

_SUFFIX = ".safetensors"
_TMP_PREFIX = "."
_TMP_SUFFIX = ".tmp"
_CLAIMS = "claims"  # a directory beside a scope's shards (two hex digits: never this name)
_HOLDER = re.compile(r"[A-Za-z0-9._-]{1,64}")
# ".<digest[:16]>.<machine>-<pid>.<random>.tmp"; the machine and pid are absent in old names.
_TMP_WRITER = re.compile(r"\.[0-9a-f]{16}\.([0-9a-f]{12})-(\d+)\.[^.]+\.tmp")


@dataclass(frozen=True)
class _File:
    path: Path
    size: int
    mtime_ns: int


class LocalKVStore(KVStore):
    """A KVStore on the local disk, safe for several processes sharing one root."""

    def __init__(self, root: Path, max_bytes: int | None = None):
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.root = private_dir(Path(root))
        self.max_bytes = max_bytes
        self._hits = 0
        self._misses = 0
        self._corrupt = 0
        self._clock = AccessClock()

    def __repr__(self) -> str:
        return f"LocalKVStore({str(self.root)!r})"

    # -- public API -------------------------------------------------------------------------

    @property
    def location(self) -> str:
        return str(self.root)

    @property
    def corrupt(self) -> int:
        return self._corrupt

    def get(self, key: KVKey) -> KVEntry | None:
        """The entry for ``key`` or None; never raises on a missing or corrupt file."""
        path = self._path(key)
        try:
            st = os.stat(path)
            entry = decode_file(path, key)
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
        data = encode_entry(key, entry)
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

    def reject(self, key: KVKey) -> None:
        if _unlink(self._path(key)):
            self._corrupt += 1

    def stats(self, scope: str | None = None) -> StoreStats:
        files = list(self._entries(scope))
        return StoreStats(
            entries=len(files),
            bytes=sum(f.size for f in files),
            hits=self._hits,
            misses=self._misses,
            corrupt=self._corrupt,
            orphans=sum(_orphaned(f.path.name) is True for f in self._temporaries(scope)),
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

    def gc(self, keep: Callable[[dict], bool] | None = None, *, scope: str | None = None,
           stale_after_s: float = 3600.0) -> int:
        """Remove leftovers and, with ``keep``, entries whose provenance fails it.

        Leftovers are orphaned temporary files (their writer is gone; of another machine's
        writers, or unnamed ones, those older than ``stale_after_s``), entries of another
        format version, unreadable entries, and empty directories. Returns the number of files
        removed.
        """
        removed = 0
        cutoff = time.time() - stale_after_s
        for directory in self._shard_dirs(scope):
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
                if entry_format(meta) != FORMAT_VERSION:
                    removed += _unlink(Path(item.path))
                    continue
                if scope is not None and recorded_scope(meta) != scope:
                    continue  # another scope sharing the 16-hex directory name
                if keep is None:
                    continue
                provenance = entry_provenance(meta)
                kept = provenance is not None and bool(keep(provenance))
                if not kept and _unlink(Path(item.path)):
                    removed += 1
        self._remove_empty_dirs()
        return removed

    def delete_scope(self, scope: str) -> int:
        """Delete every entry of ``scope``; returns the number of entries removed."""
        removed = 0
        for shard in self._shard_dirs(scope):
            for item in _scandir(shard):
                path = Path(item.path)
                if _is_tmp(item.name):
                    _unlink(path)
                elif _is_entry(item.name):
                    meta = _read_meta(path)
                    # Check the recorded scope: another scope could share the 16-hex prefix.
                    if meta is not None and recorded_scope(meta) not in (None, scope):
                        continue
                    removed += _unlink(path)
        for holder in self.claims(scope):
            _unlink(self._claims_dir(scope) / holder)
        self._remove_empty_dirs()
        return removed

    def claim(self, scope: str, holder: str) -> None:
        """A file per holder whose mtime is the claim's time and whose text is the scope."""
        if not _HOLDER.fullmatch(holder):
            raise ValueError(f"holder {holder!r}: expected 1-64 of A-Z a-z 0-9 . _ -")
        directory = private_dir(private_dir(self.root / _scope_dir(scope)) / _CLAIMS)
        path = directory / holder
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(scope)
        os.utime(path)

    def claims(self, scope: str) -> dict[str, float]:
        found = {}
        for item in _scandir(self._claims_dir(scope)):
            try:
                if Path(item.path).read_text() == scope:
                    found[item.name] = _mtime(item)
            except (OSError, UnicodeDecodeError):
                continue
        return found

    # -- internals --------------------------------------------------------------------------

    def _claims_dir(self, scope: str) -> Path:
        return self.root / _scope_dir(scope) / _CLAIMS

    def _path(self, key: KVKey) -> Path:
        digest = key.digest()
        return self.root / _scope_dir(key.scope) / digest[:2] / f"{digest}{_SUFFIX}"

    def _touch(self, path: Path) -> None:
        """Record an access: a strictly increasing mtime within this object (LRU order)."""
        stamp = self._clock.stamp() * 1000
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

    def _shard_dirs(self, scope: str | None = None) -> Iterator[Path]:
        """Entry directories, of one scope's directory when given (claims are not entries)."""
        scope_dirs = _subdirs(self.root) if scope is None else [self.root / _scope_dir(scope)]
        for scope_dir in scope_dirs:
            yield from (d for d in _subdirs(scope_dir) if d.name != _CLAIMS)

    def _entries(self, scope: str | None = None) -> Iterator[_File]:
        return self._files(_is_entry, scope)

    def _temporaries(self, scope: str | None = None) -> Iterator[_File]:
        return self._files(_is_tmp, scope)

    def _files(self, wanted: Callable[[str], bool], scope: str | None = None) -> Iterator[_File]:
        for shard in self._shard_dirs(scope):
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


# -- filesystem helpers ----------------------------------------------------------------------


def _scope_dir(scope: str) -> str:
    return hashlib.sha256(scope.encode()).hexdigest()[:16]


def _read_meta(path: Path) -> dict | None:
    """An entry's metadata from its header alone (no tensor I/O); None if unreadable."""
    try:
        with open(path, "rb") as f:
            prefix = f.read(8)
            n = header_length(prefix)
            if n is None:
                return None
            return header_meta(prefix + f.read(n))
    except OSError:
        return None


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
