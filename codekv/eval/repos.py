"""Repositories the evaluation runs on, made from real code present on every machine.

- ``quick_repo``: a few standard-library modules that use each other across files (posixpath
  uses genericpath, glob uses fnmatch and os.path), indexed in seconds, for ``--quick``;
- ``package_repo``: an installed package's source (e.g. ``rich``), so code QA is judged on a
  project other than the standard library the rules were developed on;
- ``deb_repo``: the source files an installed Debian package ships (``golang-*-dev`` under
  /usr/share/gocode, ``librust-*-dev`` under /usr/share/cargo/registry, C headers and sources),
  for code QA in the other languages the index parses (``benchmarks/sources.sh`` installs the
  ones the evidence uses);
- ``npm_repo``: an npm package's published files, from the tarball ``npm pack`` fetches.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from codekv import paths
from codekv.grammars import language_for_path
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


# Test code is left out: the tasks are about a project's own code, as with ``package_repo``.
_TEST_DIRS = frozenset({"test", "tests", "testdata", "__tests__", "__pycache__", "node_modules"})
# Source archives a package may ship instead of a tree (``shutil.unpack_archive`` formats).
_ARCHIVES = (".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".zip")
_TEST_FILE = re.compile(r"(_test\.go|\.(test|spec)\.[cm]?[jt]sx?|\.min\.js)$")


def source_files(files: list[Path], name: str | None = None) -> dict[str, Path]:
    """``files`` the index parses, tests and minified bundles left out, by repository path:
    their path under the directory holding them all, after ``name`` (default: that
    directory's name: ``cobra/command.go``)."""
    kept = [f for f in files if language_for_path(f.name) is not None and f.is_file()
            and not _TEST_FILE.search(f.name)]
    if not kept:
        return {}
    root = Path(os.path.commonpath([f.parent for f in kept]))
    out = {}
    for path in sorted(kept):
        relative = PurePosixPath(name or root.name, path.relative_to(root).as_posix())
        if not _TEST_DIRS & set(relative.parts):
            out[relative.as_posix()] = path
    return out


def deb_repo(package: str, dest: Path | None = None) -> Path:
    """A git repository of the source files an installed Debian package ships (or, where it
    ships none, of the source archives it ships: ``bsh-src``), made once per package version
    under the codekv home."""
    try:
        query = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", package],
                               capture_output=True, text=True)
    except FileNotFoundError as error:
        raise ValueError(f"deb:{package} needs dpkg-query, which is not installed (a Debian "
                         "system)") from error
    status, _, version = query.stdout.partition("\t")
    if query.returncode or not status.endswith(" installed"):
        raise ValueError(f"the Debian package {package!r} is not installed (apt-get install "
                         f"{package}; benchmarks/sources.sh installs the evaluation's)")
    listing = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    shipped = [Path(line) for line in listing if line.startswith("/")]
    if dest is None:
        dest = paths.private_dir(paths.home() / "repos") / f"deb-{package}-{_safe(version)}"
    if (Path(dest) / ".git").is_dir():
        return Path(dest)
    with tempfile.TemporaryDirectory() as unpacked:
        sources = source_files(shipped)
        if not sources:  # a source package that ships its tree as an archive (bsh-src)
            for archive in (f for f in shipped if f.name.endswith(_ARCHIVES) and f.is_file()):
                shutil.unpack_archive(archive, Path(unpacked) / archive.name)
            sources = source_files(sorted(Path(unpacked).rglob("*")), package)
        if not sources:
            raise ValueError(f"the Debian package {package!r} ships no source file the index "
                             "parses")
        return committed_copy(Path(dest), sources, f"{package} {version}")


def npm_repo(spec: str, dest: Path | None = None) -> Path:
    """A git repository of an npm package's published source files (``NAME@VERSION``), from
    the tarball ``npm pack`` fetches (once, into the codekv home)."""
    name, _, version = spec.rpartition("@")
    if not name or not version:
        raise ValueError(f"npm:{spec} names no version; expected npm:NAME@VERSION")
    folder = paths.private_dir(paths.home() / "sources" / "npm")
    tarball = folder / f"{name.lstrip('@').replace('/', '-')}-{_safe(version)}.tgz"
    if dest is None:
        dest = paths.private_dir(paths.home() / "repos") / f"npm-{tarball.stem}"
    if (Path(dest) / ".git").is_dir():
        return Path(dest)
    if not tarball.is_file():
        _npm_pack(f"{name}@{version}", tarball)
    with tempfile.TemporaryDirectory() as unpacked, tarfile.open(tarball) as archive:
        archive.extractall(unpacked, filter="data")
        sources = source_files(sorted(Path(unpacked).rglob("*")), name.rpartition("/")[2])
        if not sources:
            raise ValueError(f"the npm package {name}@{version} ships no source file the "
                             "index parses")
        return committed_copy(Path(dest), sources, f"{name} {version} (npm)")


def _npm_pack(spec: str, tarball: Path) -> None:
    """``npm pack SPEC`` into ``tarball`` (renamed there only once complete)."""
    with tempfile.TemporaryDirectory(dir=tarball.parent) as staging:
        try:
            packed = subprocess.run(["npm", "pack", spec, "--pack-destination", staging],
                                    capture_output=True, text=True)
        except FileNotFoundError as error:
            raise ValueError(f"npm:{spec} needs npm, which is not installed") from error
        made = sorted(Path(staging).glob("*.tgz"))
        if packed.returncode or len(made) != 1:
            why = (packed.stderr.strip().splitlines() or ["no tarball"])[-1]
            raise ValueError(f"npm pack {spec} failed: {why}")
        made[0].rename(tarball)


def _safe(version: str) -> str:
    return re.sub(r"[^\w.+-]", "_", version)
