"""Repositories the evaluation runs on, made from real code present on every machine.

- ``quick_repo``: a few standard-library modules that use each other across files (posixpath
  uses genericpath, glob uses fnmatch and os.path), indexed in seconds, for ``--quick``;
- ``package_repo``: an installed package's source (e.g. ``rich``), so code QA is judged on a
  project other than the standard library the rules were developed on.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from codekv import paths
from codekv.stdlib_repo import committed_copy, stdlib_dir

QUICK_FILES = (
    "fnmatch.py", "genericpath.py", "glob.py", "posixpath.py", "shlex.py", "string.py",
    "textwrap.py", "shutil.py", "tempfile.py",
)
# The second repository of the evidence run: a real project installed with codekv (via rich).
SECOND_REPO_PACKAGE = "rich"


def quick_repo(dest: Path | None = None, files: tuple[str, ...] = QUICK_FILES) -> Path:
    """A git repository of ``files`` copied from this Python's standard library (made once)."""
    dest = Path(dest) if dest else paths.private_dir(paths.home() / "repos") / "stdlib-quick"
    sources = {name: stdlib_dir() / name for name in files if (stdlib_dir() / name).is_file()}
    return committed_copy(dest, sources, "standard library (quick subset)")


def package_repo(package: str, dest: Path | None = None) -> Path:
    """A git repository of an installed package's .py files (its tests left out), made once
    per package version under the codekv home."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package!r} is not an installed package")
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    if dest is None:
        dest = paths.private_dir(paths.home() / "repos") / f"{package}-{version}"
    sources = {
        (Path(package) / path.relative_to(root)).as_posix(): path
        for path in sorted(root.rglob("*.py"))
        if not {"tests", "__pycache__"} & set(path.relative_to(root).parts)
    }
    return committed_copy(Path(dest), sources, f"{package} {version}")

