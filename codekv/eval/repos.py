"""The small repository ``--quick`` evaluates on: a few standard-library modules, real code that
uses itself across files (posixpath uses genericpath, glob uses fnmatch and os.path), indexed in
seconds instead of the whole library's minute."""

from __future__ import annotations

import shutil
from pathlib import Path

import pygit2

from codekv import paths
from codekv.stdlib_repo import SIGNATURE, stdlib_dir

QUICK_FILES = (
    "fnmatch.py", "genericpath.py", "glob.py", "posixpath.py", "shlex.py", "string.py",
    "textwrap.py", "shutil.py", "tempfile.py",
)


def quick_repo(dest: Path | None = None, files: tuple[str, ...] = QUICK_FILES) -> Path:
    """A git repository of ``files`` copied from this Python's standard library (made once)."""
    dest = Path(dest) if dest else paths.private_dir(paths.home() / "repos") / "stdlib-quick"
    if (dest / ".git").is_dir():
        return dest
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    repo = pygit2.init_repository(str(staging), initial_head="main")
    for name in files:
        source = stdlib_dir() / name
        if source.is_file():
            shutil.copyfile(source, staging / name)
            repo.index.add(name)
    repo.index.write()
    tree = repo.index.write_tree()
    repo.create_commit("HEAD", SIGNATURE, SIGNATURE, "standard library (quick subset)", tree, [])
    staging.rename(dest)
    return dest
