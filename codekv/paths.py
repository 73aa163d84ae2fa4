"""Where codekv keeps its files: one private directory per user.

Directories codekv creates are owner-only (0700) and so are its files (0600): cached KV and
chunk text encode the user's code. A directory the user names (``$CODEKV_HOME``, ``--store``,
``$CODEKV_MODEL_CACHE``) that already exists keeps its mode; a warning says when other users
may read it (codekv's own subdirectories and files in it are still owner-only).
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

log = logging.getLogger("codekv")
_warned: set[Path] = set()


KV_MAX_BYTES_ENV = "CODEKV_KV_MAX_BYTES"
DEFAULT_KV_MAX_BYTES = 20 << 30
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


class SettingError(ValueError):
    """An environment setting codekv reads is unusable; the message says what it expects."""


class UnusableDirectoryError(SettingError):
    """A directory codekv was told to use is not one (a regular file, say)."""


def check_environment() -> None:
    """Check codekv's environment settings at start-up, before anything slow runs."""
    for name in ("CODEKV_HOME", "CODEKV_MODEL_CACHE"):
        value = os.environ.get(name)
        if value and os.path.lexists(value) and not os.path.isdir(value):
            raise UnusableDirectoryError(
                f"{name}={value} is not a directory: point it at a directory (created if missing)"
            )
    kv_max_bytes()


def parse_size(text: str) -> int:
    """Bytes in ``"1048576"``, ``"512M"``, ``"20G"``, ``"1.5GiB"`` (K, M, G, T: powers of 1024)."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size")
    number, unit = match.groups()
    return int(float(number) * 1024 ** " kmgt".index(unit.lower() or " "))


def kv_max_bytes() -> int:
    """The chunk KV store's size limit: ``$CODEKV_KV_MAX_BYTES``, else 20 GiB."""
    value = os.environ.get(KV_MAX_BYTES_ENV, "").strip()
    if not value:
        return DEFAULT_KV_MAX_BYTES
    try:
        return parse_size(value)
    except ValueError:
        raise SettingError(
            f"{KV_MAX_BYTES_ENV}={value!r} is not a size: give a number of bytes, or one with "
            "K, M, G or T (powers of 1024), such as 20G"
        ) from None


def home() -> Path:
    """The codekv directory: ``$CODEKV_HOME``, else ``$XDG_CACHE_HOME/codekv``, else
    ``~/.cache/codekv``."""
    root = os.environ.get("CODEKV_HOME")
    if root:
        return user_dir(Path(root), "CODEKV_HOME")
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return private_dir(Path(cache) / "codekv")


USER_SUPPORT_FILE = "support.json"


def user_support_file() -> Path:
    """The user's support file (written by ``codekv qualify``): the gate reads it beside the
    shipped one, and its entries win for the models they were measured on."""
    return home() / USER_SUPPORT_FILE


def private_dir(path: Path) -> Path:
    """A directory of codekv's own: each missing level is created 0700; an existing one is
    left as it is."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.is_dir():
        if probe.exists() or probe.is_symlink():
            raise UnusableDirectoryError(f"{probe} exists and is not a directory")
        missing.append(probe)
        probe = probe.parent
    for level in reversed(missing):
        try:
            level.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process
            if not level.is_dir():
                raise UnusableDirectoryError(f"{level} exists and is not a directory") from None
            continue
        level.chmod(0o700)  # the umask may have taken owner bits away
    return path


def user_dir(path: Path, name: str) -> Path:
    """A directory the user chose: made owner-only when missing, else kept with its mode (a
    warning, once per process, when other users may read or enter it)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UnusableDirectoryError(
            f"{name}={path} is not a directory: point it at a directory (created if missing)"
        )
    if not path.is_dir():
        return private_dir(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077 and path not in _warned:
        _warned.add(path)
        log.warning(
            "%s=%s is open to other users (mode %04o); codekv keeps its own files in it "
            "owner-only, but `chmod 700 %s` keeps even their names private",
            name, path, mode, path,
        )
    return path


def private_file(path: Path, data: bytes) -> None:
    """Write ``path`` owner-only (0600) and atomically: a temporary file, then a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def model_cache() -> Path:
    """Converted models and tokenizers: ``$CODEKV_MODEL_CACHE``, else ``<home>/models``.

    Derived from installed packages only (no user data), so test sessions and several homes
    may share one; converting the default GGUF takes ~20 s.
    """
    root = os.environ.get("CODEKV_MODEL_CACHE")
    return user_dir(Path(root), "CODEKV_MODEL_CACHE") if root else private_dir(home() / "models")
