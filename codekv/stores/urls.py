"""Store URLs: credentials masked wherever a URL is shown, and the Redis URL grammar.

Torch-free and client-free: the command line checks a ``--store`` value with these before it
loads anything.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

from codekv.stores.base import StoreSpecError

REDIS_SCHEMES = ("redis", "rediss")
REDIS_PORT = 6379
KV_DTYPES_NAMES = ("float16", "bfloat16")  # ?kv_dtype= : 16-bit values on the wire
# Query options the Redis client reads from a URL (redis-py's URL_QUERY_ARGUMENT_PARSERS) that
# codekv passes on, plus the credentials it accepts there and its own ``kv_dtype``.
REDIS_OPTIONS = ("socket_timeout", "socket_connect_timeout",
                 "health_check_interval", "ssl_check_hostname", "protocol",
                 "username", "password", "kv_dtype")
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:]*)(:[^/@\s]*)?@")
_SECRET_PARAMETER = re.compile(
    r"(?P<name>[?&;](?:[A-Za-z0-9_-]*(?:pass|pwd|secret|token|auth|key|credential)"
    r"[A-Za-z0-9_-]*))=(?P<value>[^&#\s]*)", re.IGNORECASE)


def mask_credentials(text: str) -> str:
    """``text`` with every URL's password and every password-like query parameter as ``***``:
    what errors, reports and logs may show."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@" if m.group(3)
                         else m.group(0), text)
    return _SECRET_PARAMETER.sub(lambda m: f"{m['name']}=***", text)


def public_url(url: str) -> str:
    """A Redis ``url`` without user, password or query: ``scheme://host:port/db``."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or REDIS_PORT
    db = parts.path.strip("/") or "0"
    return f"{parts.scheme}://{host}:{port}/{db}"


def check_redis_url(url: str) -> None:
    """Raise ``StoreSpecError`` (credentials masked) unless ``url`` is a Redis URL codekv can
    open: ``redis[s]://[user:password@]host[:port][/db][?option=value...]``."""
    shown = mask_credentials(url)
    parts = urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES or not parts.hostname:
        raise StoreSpecError(f"not a Redis URL: {shown} (use "
                             "redis://[user:password@]host:port/db or rediss://...)")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as error:
        raise StoreSpecError(f"bad port in {shown}: {error}") from error
    db = parts.path.strip("/")
    if db and not (db.isascii() and db.isdigit()):
        raise StoreSpecError(f"database {db!r} in {shown}: expected a number (/0, /1, ...)")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as error:
        raise StoreSpecError(f"bad query in {shown}: expected ?option=value&...") from error
    for name, values in query.items():
        if name not in REDIS_OPTIONS:
            raise StoreSpecError(f"unknown option {name!r} in {shown}: expected one of "
                                 f"{', '.join(REDIS_OPTIONS)}")
        for value in values:
            _check_option(name, value, shown)


def _check_option(name: str, value: str, shown: str) -> None:
    if name == "kv_dtype":
        if value not in KV_DTYPES_NAMES:
            raise StoreSpecError(f"kv_dtype={value}: use one of {', '.join(KV_DTYPES_NAMES)}")
        return
    if name in ("username", "password"):
        return
    try:  # the client's own parser, so that what passes here is what it accepts
        from redis.connection import URL_QUERY_ARGUMENT_PARSERS
    except ImportError:
        return  # opening the store says the client is missing
    parser = URL_QUERY_ARGUMENT_PARSERS.get(name)
    try:
        parsed = parser(value) if parser else value
    except (TypeError, ValueError):
        parsed = None
    if parsed is None or (isinstance(parsed, float) and not parsed > 0):
        kind = "a number of seconds above 0" if "timeout" in name or "interval" in name else \
            "a valid value"
        raise StoreSpecError(f"{name}={mask_credentials(value)!s} in {shown}: expected {kind}")
