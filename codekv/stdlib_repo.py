"""The embedded default repository: this Python's standard library made into a git repository.

Real code no one here wrote, present on every machine with Python, so the quick start, the
benchmark and the evaluation have a repository to work on without any download.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pygit2

from codekv import paths

SIGNATURE = pygit2.Signature("codekv", "codekv@localhost", 0, 0)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(limit: int | None = None) -> list[Path]:
    """The standard library's .py files (no site-packages, no caches), in a stable order.

    Walked with ``os.walk``, not globbed: ``rglob`` spent a third of a second (on a first run's
    clock) descending into site-packages only to drop what it found there.
    """
    files = []
    for directory, subdirectories, names in os.walk(stdlib_dir()):
        subdirectories[:] = [d for d in subdirectories if d not in ("site-packages", "__pycache__")]
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(".py") and os.path.isfile(path):
                files.append(Path(path))
    files.sort()
    return files[:limit] if limit else files


def make_stdlib_repo(dest: Path | None = None, limit: int | None = None) -> Path:
    """Copy the stdlib's .py files into ``dest`` and commit them; reuse it when already made."""
    if dest is None:
        dest = paths.private_dir(paths.home() / "repos") / f"stdlib-{limit or 'all'}"
    root = stdlib_dir()
    sources = {source.relative_to(root).as_posix(): source for source in stdlib_files(limit)}
    return committed_copy(Path(dest), sources, "standard library")


def committed_copy(dest: Path, sources: dict[str, Path | bytes], message: str) -> Path:
    """``dest`` as a git repository of ``sources`` (repository path -> a file, or its bytes),
    made once: built under a staging name and renamed, so an interrupted build is never taken
    as made."""
    if (dest / ".git").is_dir():
        return dest
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    repo = pygit2.init_repository(str(staging), initial_head="main")
    for directory in sorted({(staging / relative).parent for relative in sources}):
        directory.mkdir(parents=True, exist_ok=True)
    # Copying is system calls (sendfile): threads overlap them; staging holds only the copies,
    # so one add_all stages them all.
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda item: (staging / item[0]).write_bytes(item[1])
                      if isinstance(item[1], bytes) else shutil.copyfile(item[1],
                                                                         staging / item[0]),
                      sources.items()))
    repo.index.add_all()
    repo.index.write()
    tree = repo.index.write_tree()
    repo.create_commit("HEAD", SIGNATURE, SIGNATURE, message, tree, [])
    staging.rename(dest)
    return dest
