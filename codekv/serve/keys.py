"""API keys: which are accepted at start-up, and the chunk store scope each one names.

A scope's name is in every store key, visible to anyone who can list the store; it is an HMAC
of the API key under a secret kept owner-only beside the local store (or given in
``$CODEKV_KEY_SECRET``), so the store reveals nothing that would let one guess or test a key.
The secret stays, so a restarted server finds its scopes' entries again; servers that share a
store from different homes share scopes when given the same ``$CODEKV_KEY_SECRET``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

SECRET_ENV = "CODEKV_KEY_SECRET"
SECRET_FILE = "serve-key-secret"


def key_refusal(key: str) -> str | None:
    """Why ``key`` could never match what a client sends, or None: ``Authorization: Bearer
    KEY`` carries printable ASCII, and the space around a header's value is not part of it."""
    if key != key.strip():
        return "starts or ends with a space"
    if not all("!" <= char <= "~" for char in key):
        return "holds a space, a control character or a character that is not ASCII"
    return None


def key_secret(directory: Path) -> bytes:
    """``$CODEKV_KEY_SECRET``, else the secret in ``directory`` (made once, owner-only)."""
    given = os.environ.get(SECRET_ENV)
    if given:
        return given.encode()
    path = directory / SECRET_FILE
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        made = directory / f".{SECRET_FILE}.{os.getpid()}"
        fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_hex(32) + "\n")
        try:
            os.link(made, path)  # whole or absent; another server's, made first, wins
        except FileExistsError:
            pass
        finally:
            made.unlink()
    return bytes.fromhex(path.read_text().strip())


def scope_of_key(key: str, secret: bytes) -> str:
    """The chunk store scope of ``key``: the key itself is never stored."""
    return "serve:" + hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:16]
