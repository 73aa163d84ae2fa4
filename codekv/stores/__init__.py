"""Which chunk KV store a spec names: the registry of store URL schemes, and the defaults.

A store spec is one of

- a directory: the local store there (``codekv.stores.local``);
- a URL of a registered scheme, such as a Redis URL ``redis://[user:password@]host:port/db``
  (``rediss://`` for TLS; query options such as ``?socket_timeout=2`` reach the client) or a
  Redis Cluster's ``redis+cluster://[user:password@]host:port[,host:port...]``: that shared
  store alone;
- ``local,<url>``: the local store first, the shared one behind it (``codekv.stores.tiered``: a
  shared hit is copied to the local disk; when the server is down the local store still serves).

Anything with ``://`` or starting with a registered scheme and ``:`` is a URL, never a
directory: a mistyped URL is an error, not a folder. ``$CODEKV_STORE`` holds the spec the CLI
and ``Composer`` use when none is given.

A new store is one module - a ``codekv.stores.base.KVStore`` whose constructor takes its URL -
and one line in ``STORES``. This module imports no store module (nor torch) until one is
opened: the command line checks a spec with it before anything loads.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from codekv import paths
from codekv.stores.base import StoreSpecError, StoreUnavailable
from codekv.stores.urls import (
    CLUSTER_SCHEMES,
    REDIS_SCHEMES,
    check_cluster_url,
    check_redis_url,
    mask_url,
)

if TYPE_CHECKING:
    from codekv.stores.base import KVStore

__all__ = ["STORES", "StoreKind", "StoreSpecError", "StoreUnavailable", "check_spec",
           "default_holder", "default_kv_store", "default_scope", "is_shared_spec",
           "open_kv_store", "store_class"]

STORE_ENV = "CODEKV_STORE"
SCOPE_ENV = "CODEKV_SCOPE"
LOCAL = "local"
HOLDER_FILE = "kv-holder"  # in the codekv home: this home's name in the claims it records


def _any_url(url: str) -> None:
    """The check a store without its own gets: a URL that parses."""
    try:
        urlsplit(url).port  # noqa: B018 - raises on a port that is not a number
    except ValueError as error:
        raise StoreSpecError(f"bad port in {mask_url(url)}: {error}") from error


@dataclass(frozen=True)
class StoreKind:
    """A registered store: its class as ``"module:Class"`` (imported when a store is opened:
    store modules may need an optional extra), the check its URL gets when an option is parsed,
    and the extra its module needs."""

    store: str
    check: Callable[[str], None] = _any_url
    extra: str | None = None


STORES: dict[str, StoreKind] = {
    **dict.fromkeys(REDIS_SCHEMES, StoreKind("codekv.stores.redis_store:RedisKVStore",
                                             check_redis_url, extra="shared")),
    **dict.fromkeys(CLUSTER_SCHEMES, StoreKind("codekv.stores.redis_cluster:RedisClusterKVStore",
                                               check_cluster_url, extra="shared")),
}


def is_shared_spec(spec: str | Path) -> bool:
    """Whether ``spec`` names a shared store (a URL, possibly after ``local,``)."""
    if not isinstance(spec, str):
        return False
    schemes = "|".join(re.escape(s) for s in STORES)
    return re.match(rf"(local,|[A-Za-z][A-Za-z0-9+.-]*://|(?:{schemes}):)", spec) is not None


def check_spec(spec: str) -> list[str]:
    """The parts of a shared-store spec (``[url]`` or ``["local", url]``); raises
    ``StoreSpecError`` (credentials masked) on anything else."""
    head, comma, rest = spec.partition(",")
    if comma and head.strip() == LOCAL:
        url = rest.strip()
        parts = [LOCAL, url]
    elif "://" in head or not comma:  # a URL may list several hosts (a cluster's nodes)
        url = spec.strip()
        parts = [url]
    else:
        raise StoreSpecError(f"not a store: {mask_url(spec)} (use a directory, a store "
                             "URL, or local,<url>)")
    kind = STORES.get(url.partition(":")[0])
    if kind is None:
        raise StoreSpecError(f"not a store URL: {mask_url(url)} (use a directory, "
                             "redis://[user:password@]host:port/db, rediss://..., or "
                             f"local,<url>; schemes: {', '.join(STORES)})")
    kind.check(url)
    return parts


def store_class(url: str) -> type[KVStore]:
    """The class of the registered store ``url`` names, imported now."""
    scheme = url.partition(":")[0]
    kind = STORES[scheme]
    module, _, name = kind.store.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as error:
        if kind.extra is None:
            raise
        raise StoreSpecError(f"the {scheme} store needs the {kind.extra!r} extra: "
                             f"pip install 'codekv[{kind.extra}]'") from error


def open_kv_store(spec: str | Path, local: Callable[[], KVStore] | None = None) -> KVStore:
    """The store ``spec`` names; ``local`` makes the local store ``local,<url>`` puts first."""
    from codekv.stores.local import LocalKVStore

    if not is_shared_spec(spec):
        if str(spec) == LOCAL and local is not None:
            return local()
        return LocalKVStore(Path(spec))
    parts = check_spec(str(spec))
    shared = store_class(parts[-1])(parts[-1])
    if len(parts) == 1:
        return shared
    if local is None:
        raise StoreSpecError("'local,<url>' needs a local store to put first")
    from codekv.stores.tiered import TieredKVStore

    return TieredKVStore(local(), shared)


def default_kv_store(root: Path | None = None, spec: str | None = None) -> KVStore:
    """The chunk KV store under ``root`` (default: the codekv home), LRU-bounded by
    ``$CODEKV_KV_MAX_BYTES`` (default 20 GiB): fp32 KV of the default model is 45 KiB/token.

    ``spec`` (else ``$CODEKV_STORE``) names a shared store instead, or ``local,<url>`` both.
    """
    from codekv.stores.local import LocalKVStore

    limit = paths.kv_max_bytes()

    def local() -> LocalKVStore:
        return LocalKVStore((root or paths.home()) / "kv", max_bytes=limit)

    spec = spec or os.environ.get(STORE_ENV)
    return open_kv_store(spec, local) if spec else local()


def default_scope(index) -> str:
    """One scope per repository: a request only ever sees chunk KV of its own repository.

    ``$CODEKV_SCOPE`` names it instead: clones on several machines share a store's entries
    only under one name (their paths differ), and a Redis ACL user is given per scope.
    """
    scope = os.environ.get(SCOPE_ENV)
    if scope:
        try:
            scope.encode()
        except UnicodeEncodeError:
            raise paths.SettingError(
                f"{SCOPE_ENV}={os.fsencode(scope)!r} is not UTF-8 text: name the scope in UTF-8 "
                "(such as team-a)") from None
        return scope
    if index is None:
        return "default"
    return "repo:" + hashlib.sha256(str(Path(index.root)).encode()).hexdigest()[:16]


def default_holder(home: Path | None = None) -> str:
    """This codekv home's name in the claims it records on a scope: random, made once and kept
    in the home (two machines' homes at the same path are two holders)."""
    path = (home or paths.home()) / HOLDER_FILE
    try:
        holder = path.read_text().strip()
    except FileNotFoundError:
        holder = ""
    if _HOLDER.fullmatch(holder):
        return holder
    made = path.with_name(f".{HOLDER_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    paths.private_file(made, (secrets.token_hex(16) + "\n").encode())
    try:
        if holder:  # not a name codekv made: replaced
            os.replace(made, path)
        else:
            os.link(made, path)  # atomic: of two first uses, one name wins
    except FileExistsError:
        pass
    finally:
        made.unlink(missing_ok=True)
    return path.read_text().strip()


_HOLDER = re.compile(r"[0-9a-f]{32}")
