"""The embedded default repository: this Python's standard library made into a git repository.

Real code no one here wrote, present on every machine with Python, so the quick start, the
benchmark and the evaluation have a repository to work on without any download.
"""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pygit2

from codekv import paths

SIGNATURE = pygit2.Signature("codekv", "codekv@localhost", 0, 0)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(limit: int | None = None) -> list[Path]:
    """The standard library's .py files (no site-packages, no caches), in a stable order."""
    root = stdlib_dir()
    files = sorted(
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "__pycache__" not in p.parts and p.is_file()
    )
    return files[:limit] if limit else files


def make_stdlib_repo(dest: Path | None = None, limit: int | None = None) -> Path:
    """Copy the stdlib's .py files into ``dest`` and commit them; reuse it when already made."""
    if dest is None:
        dest = paths.private_dir(paths.home() / "repos") / f"stdlib-{limit or 'all'}"
    dest = Path(dest)
    if (dest / ".git").is_dir():
        return dest
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    root = stdlib_dir()
    repo = pygit2.init_repository(str(staging), initial_head="main")
    for source in stdlib_files(limit):
        relative = source.relative_to(root)
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        repo.index.add(relative.as_posix())
    repo.index.write()
    tree = repo.index.write_tree()
    repo.create_commit("HEAD", SIGNATURE, SIGNATURE, "standard library", tree, [])
    staging.rename(dest)
    return dest
