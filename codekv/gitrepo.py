"""The files of a git repository as codekv sees them: HEAD's tree plus the working tree's
modified and untracked files, each with the blob hash git would give it.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pygit2

from codekv import grammars

MAX_FILE_BYTES = 1 << 20

# Secret-looking files are never indexed unless asked: their KV would encode the secret.
# Globs over the path's last components (``*`` stays within one), case-insensitive; names
# alone unless they hold a ``/`` (``.docker/config.json``).
SECRET_PATTERNS = (
    # environment files
    ".env", ".env.*", "*.env", ".envrc",
    # private keys and key stores
    "*.pem", "*.key", "*.p8", "*.p12", "*.pfx", "*.ppk", "*.keystore", "*.jks", "*.kdbx",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*deploy_key", "*deploy-key",
    "*private*.asc", "*secret*.asc", "secring.*",
    # tools' credential files
    ".netrc", "_netrc", ".git-credentials", ".htpasswd", ".pgpass", ".npmrc", ".pypirc",
    ".s3cfg", ".boto", ".dockercfg", ".vault-token", ".docker/config.json", ".kube/config",
    "*.tfstate", "*.tfstate.backup", "*.tfvars", "*.secret", "*.secrets",
    # data files named for credentials: "credentials.yml" is a secret, "credentials.py" code
    *(
        stem + suffix
        for stem in ("credentials", "*_credentials", "*-credentials", "secrets", "*_secrets",
                     "*-secrets", "kubeconfig", "*.kubeconfig")
        for suffix in ("", ".json", ".yml", ".yaml", ".toml", ".ini", ".cfg", ".conf", ".xml",
                       ".properties", ".txt")
    ),
    *(
        stem + suffix
        for stem in ("*service-account*", "*service_account*")
        for suffix in (".json", ".yml", ".yaml", ".toml")
    ),
)


class NotARepositoryError(Exception):
    """The path is not inside a git repository."""


@dataclass(frozen=True)
class SourceFile:
    path: str  # repository-relative, POSIX separators
    blob_hash: str
    language: str  # a grammar name, or "text"
    origin: str  # "head" or "worktree"


@dataclass
class Snapshot:
    root: Path
    files: list[SourceFile] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    skipped_paths: dict[str, str] = field(default_factory=dict)  # path -> reason


def _glob_regex(pattern: str) -> str:
    return "".join(
        "[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char) for char in pattern
    )


# One compiled pattern, matched against the lowercased last two components of each path:
# checked for every file of every update.
_SECRET_TAIL = re.compile(r"(?:[^/]*/)?(?:" + "|".join(map(_glob_regex, SECRET_PATTERNS)) + ")")


def is_secret(path: str) -> bool:
    return _SECRET_TAIL.fullmatch("/".join(path.lower().rsplit("/", 2)[-2:])) is not None


def open_repository(path: str | Path) -> pygit2.Repository:
    found = pygit2.discover_repository(str(path))
    if found is None:
        raise NotARepositoryError(f"{path} is not inside a git repository")
    repo = pygit2.Repository(found)
    if repo.is_bare:
        raise NotARepositoryError(f"{path} is a bare repository: codekv indexes a working tree")
    return repo


def language_of(path: str) -> str:
    spec = grammars.language_for_path(path)
    return spec.name if spec is not None else "text"


def scan(
    repo: pygit2.Repository, include_secrets: bool = False, include_ignored: bool = False
) -> Snapshot:
    """List the files to index with their blob hashes; nothing is read but headers and status.

    A working-tree path that resolves outside the repository (a tracked directory replaced by
    a symlink to ``/etc``, say) is skipped as ``outside-repository``: codekv indexes the
    repository's files, never what its links point to.
    """
    root = Path(repo.workdir)
    real_root = root.resolve()
    snapshot = Snapshot(root)
    entries: dict[str, tuple[str, str]] = {}  # path -> (blob hash, origin)
    if not repo.head_is_unborn:
        tree = repo.head.peel(pygit2.Commit).tree
        submodules: list[str] = []
        _walk(tree, "", entries, submodules)
        for path in submodules:  # another repository's commit: its files are not this one's
            _skip(snapshot, path, "submodule")
    # Status lists only paths that differ from HEAD somewhere: hash what is on disk now.
    for path, flag in repo.status(untracked_files="all", ignored=True).items():
        if flag & pygit2.GIT_STATUS_IGNORED and not include_ignored:
            _skip(snapshot, path.rstrip("/"), "ignored")
            continue
        if path.endswith("/") and (root / path / ".git").exists():
            # An untracked repository inside this one: git leaves it out (it would be a
            # submodule), and its .git holds objects and config, not this repository's code.
            _skip(snapshot, path.rstrip("/"), "nested-repository")
            continue
        for file_path in _expand(root, path):
            full = root / file_path
            if full.is_symlink() or not full.is_file():
                entries.pop(file_path, None)
            elif not _inside(real_root, full):
                entries.pop(file_path, None)
                _skip(snapshot, file_path, "outside-repository")
            else:
                entries[file_path] = (str(pygit2.hashfile(str(full))), "worktree")
    for path in sorted(entries):
        blob_hash, origin = entries[path]
        if not include_secrets and is_secret(path):
            _skip(snapshot, path, "secret")
            continue
        snapshot.files.append(SourceFile(path, blob_hash, language_of(path), origin))
    return snapshot


def _inside(real_root: Path, path: Path) -> bool:
    """Whether ``path`` resolves inside the repository: any of its components may be a link."""
    return Path(os.path.realpath(path)).is_relative_to(real_root)


def _expand(root: Path, path: str) -> list[str]:
    """Status names an ignored directory as ``dir/``: list its files, none inside a ``.git``."""
    if not path.endswith("/"):
        return [path]
    found = (p.relative_to(root) for p in (root / path).rglob("*") if p.is_file())
    return sorted(p.as_posix() for p in found if ".git" not in p.parts)


def _walk(tree: pygit2.Tree, prefix: str, entries: dict, submodules: list[str]) -> None:
    """The tree's files into ``entries``, its submodules' paths into ``submodules``."""
    for entry in tree:
        path = prefix + entry.name
        if entry.type == pygit2.GIT_OBJECT_TREE:
            _walk(entry, path + "/", entries, submodules)
        elif entry.filemode == pygit2.GIT_FILEMODE_COMMIT:
            submodules.append(path)
        elif entry.type == pygit2.GIT_OBJECT_BLOB and entry.filemode != pygit2.GIT_FILEMODE_LINK:
            entries[path] = (str(entry.id), "head")
        # Symlinks are not files of this repository.


def _skip(snapshot: Snapshot, path: str, reason: str) -> None:
    snapshot.skipped[reason] += 1
    snapshot.skipped_paths[path] = reason


class BlobReader:
    """Reads file contents by blob hash: from the object database, else the working tree."""

    def __init__(self, repo_path: str):
        self.repo = pygit2.Repository(repo_path)
        self.root = Path(self.repo.workdir)
        self.real_root = self.root.resolve()

    def read(self, file: SourceFile) -> bytes:
        if file.origin == "worktree":
            full = self.root / file.path
            # Checked again here: a directory may have become a link since the scan.
            if full.is_symlink() or not _inside(self.real_root, full):
                raise OutsideRepositoryError(f"{file.path} resolves outside the repository")
            data = full.read_bytes()
            if str(pygit2.hash(data)) != file.blob_hash:
                raise MissingBlobError(
                    f"{file.path} changed on disk since it was indexed: index it again"
                )
            return data
        try:
            return self.repo[file.blob_hash].data
        except KeyError:
            raise MissingBlobError(f"blob {file.blob_hash} of {file.path} is missing") from None


class MissingBlobError(Exception):
    """A blob named by the tree is not in the object database (a shallow or damaged clone)."""


class OutsideRepositoryError(MissingBlobError):
    """A working-tree path leads out of the repository through a symlink."""


def skip_reason(data: bytes, max_file_bytes: int | None = None) -> str | None:
    """Why a file's contents are not indexed, or None to index it.

    The size limit defaults to ``MAX_FILE_BYTES`` as it is when called, so setting the module
    attribute (before forking workers) changes it.
    """
    limit = MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
    if len(data) > limit:
        return "too-large"
    if b"\0" in data[:8192]:
        return "binary"
    return None
