"""Store URLs: credentials masked wherever a URL is shown, and the Redis URL grammar.

Torch-free and client-free: the command line checks a ``--store`` value with these before it
loads anything.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote, urlsplit

from codekv.stores.base import StoreSpecError

REDIS_SCHEMES = ("redis", "rediss")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")  # a Redis Cluster: its nodes' addresses
REDIS_PORT = 6379
KV_DTYPES_NAMES = ("float16", "bfloat16")  # ?kv_dtype= : 16-bit values on the wire
# Query options the Redis client reads from a URL (redis-py's URL_QUERY_ARGUMENT_PARSERS) that
# codekv passes on, plus the credentials it accepts there and its own ``kv_dtype``.
REDIS_OPTIONS = ("socket_timeout", "socket_connect_timeout",
                 "health_check_interval", "ssl_check_hostname", "protocol",
                 "username", "password", "kv_dtype")
# In free text a password runs to the last "@" before a space (one with a space, only
# ``mask_url`` finds: it knows where the URL ends).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:]*)(:\S*)?@")
_SECRET_PARAMETER = re.compile(
    r"(?P<name>[?&;](?:[A-Za-z0-9_-]*(?:pass|pwd|secret|token|auth|key|credential)"
    r"[A-Za-z0-9_-]*))=(?P<value>[^&#\s]*)", re.IGNORECASE)


def mask_credentials(text: str) -> str:
    """``text`` with every URL's password and every password-like query parameter as ``***``:
    what errors, reports and logs may show."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@" if m.group(3)
                         else m.group(0), text)
    return _SECRET_PARAMETER.sub(lambda m: f"{m['name']}=***", text)


def _credentials(url: str) -> tuple[str, str | None, str]:
    """(what comes before the password, the password or None, what comes after it) of
    ``url``, parsed once: its credentials run from ``://`` to its last ``@``, whatever they
    hold (``@``, ``/``, spaces); a user name alone is no secret."""
    start, at = url.find("://") + 3, url.rfind("@")
    if start < 3 or at < start:
        return url, None, ""
    user, colon, password = url[start:at].partition(":")
    if not colon:
        return url, None, ""
    return url[:start] + user + ":", password, url[at:]


def mask_url(url: str) -> str:
    """``url`` with its password and password-like query parameters as ``***``: how a URL is
    shown."""
    before, password, after = _credentials(url)
    shown = url if password is None else f"{before}***{after}"
    return _SECRET_PARAMETER.sub(lambda m: f"{m['name']}=***", shown)


def mask_secrets(text: str, url: str) -> str:
    """``text`` (an error about ``url``) with ``url``'s secrets, as written and decoded, as
    ``***`` wherever they appear, and any other URL masked as ``mask_credentials`` does."""
    _, password, _ = _credentials(url)
    found = {password} if password else set()
    found |= {m["value"] for m in _SECRET_PARAMETER.finditer(url) if m["value"]}
    for secret in sorted(found | {unquote(s) for s in found}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return mask_credentials(text)


def _check_password(url: str, shown: str) -> None:
    """A password the client's URL parser reads whole: ``/``, ``?`` and ``#`` end its part."""
    _, password, _ = _credentials(url)
    if password and any(char in password for char in "/?#"):
        raise StoreSpecError(f"the password in {shown} holds '/', '?' or '#', which end that "
                             "part of a URL: percent-encode them (%2F, %3F, %23)")


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
    shown = mask_url(url)
    _check_password(url, shown)
    parts = urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES or not parts.hostname:
        raise StoreSpecError(f"not a Redis URL: {shown} (use "
                             "redis://[user:password@]host:port/db or rediss://...)")
    if "," in parts.netloc.rpartition("@")[2]:
        raise StoreSpecError(f"{shown} names several hosts: a Redis URL names one (a Redis "
                             "Cluster is redis+cluster://host:port,host:port,...)")
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
    _check_options(query, shown)


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` of each node a Redis Cluster URL names (port 6379 when left out);
    raises ``StoreSpecError`` on a bad one."""
    shown = mask_url(url)
    hosts = urlsplit(url).netloc.rpartition("@")[2]
    nodes = []
    for address in hosts.split(","):
        parts = urlsplit(f"//{address}")
        try:
            port = parts.port or REDIS_PORT
        except ValueError as error:
            raise StoreSpecError(f"bad port in {shown}: {error}") from error
        if not parts.hostname:
            raise StoreSpecError(f"node {address!r} in {shown}: expected host:port")
        nodes.append((parts.hostname, port))
    return nodes


def check_cluster_url(url: str) -> None:
    """Raise ``StoreSpecError`` (credentials masked) unless ``url`` is a Redis Cluster URL
    codekv can open: ``redis[s]+cluster://[user:password@]host:port[,host:port...]
    [?option=value...]``; any node answers for the others. A cluster has database 0 only."""
    shown = mask_url(url)
    _check_password(url, shown)
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise StoreSpecError(f"not a Redis Cluster URL: {shown} (use "
                             "redis+cluster://[user:password@]host:port,host:port,... or "
                             "rediss+cluster://...)")
    cluster_nodes(url)
    if parts.path.strip("/") not in ("", "0"):
        raise StoreSpecError(f"database {parts.path.strip('/')!r} in {shown}: a Redis Cluster "
                             "has database 0 only")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as error:
        raise StoreSpecError(f"bad query in {shown}: expected ?option=value&...") from error
    _check_options(query, shown)


def public_cluster_url(url: str) -> str:
    """A Redis Cluster ``url`` without user, password or query: ``scheme://host:port,...``."""
    nodes = ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                     for host, port in cluster_nodes(url))
    return f"{urlsplit(url).scheme}://{nodes}"


def _check_options(query: dict[str, list[str]], shown: str) -> None:
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
