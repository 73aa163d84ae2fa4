"""The evaluation's repositories: real code committed as it is installed."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pygit2
import pytest
from fixtures.needs import missing

import codekv
from codekv.eval.harness import resolve_repo
from codekv.eval.repos import deb_repo, package_repo, source_files


def committed(dest: Path) -> set[str]:
    """The paths of the files committed at ``dest``'s head."""
    repo = pygit2.Repository(str(dest))
    out = set()

    def walk(tree, prefix=""):
        for entry in tree:
            if entry.type_str == "tree":
                walk(repo[entry.id], f"{prefix}{entry.name}/")
            else:
                out.add(prefix + entry.name)

    walk(repo.head.peel(pygit2.Commit).tree)
    return out


def test_package_repo_commits_the_package_source_without_tests(tmp_path):
    dest = package_repo("codekv", tmp_path / "codekv-src")
    repo = pygit2.Repository(str(dest))
    tree = repo.head.peel(pygit2.Commit).tree
    committed = set()

    def walk(tree, prefix=""):
        for entry in tree:
            if entry.type_str == "tree":
                walk(repo[entry.id], f"{prefix}{entry.name}/")
            else:
                committed.add(prefix + entry.name)

    walk(tree)
    root = Path(codekv.__file__).parent
    expected = {f"codekv/{p.relative_to(root).as_posix()}" for p in root.rglob("*.py")
                if "__pycache__" not in p.parts}
    assert committed == expected
    assert (dest / "codekv" / "compose.py").read_bytes() == (root / "compose.py").read_bytes()
    assert package_repo("codekv", dest) == dest  # made once, then reused
    assert not (tmp_path / "codekv-src.partial").exists()


def test_package_repo_refuses_what_is_not_an_installed_package(tmp_path):
    with pytest.raises(ValueError, match="not an installed package"):
        package_repo("no_such_package_here", tmp_path / "x")
    with pytest.raises(ValueError, match="not an installed package"):
        package_repo("json.decoder", tmp_path / "y")  # a module, not a package


def test_source_files_are_the_parsed_ones_without_tests(tmp_path):
    root = tmp_path / "share" / "cobra"
    files = ["command.go", "command_test.go", "doc/man.go", "testdata/x.go", "README.md",
             "js/app.js", "js/app.min.js", "js/app.test.js", "js/__tests__/a.js", "ts/b.spec.ts"]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    found = source_files(sorted(root.rglob("*")))
    assert found == {"cobra/command.go": root / "command.go",
                     "cobra/doc/man.go": root / "doc/man.go",
                     "cobra/js/app.js": root / "js/app.js"}
    assert set(source_files(sorted(root.rglob("*")), "pkg")) == {
        "pkg/command.go", "pkg/doc/man.go", "pkg/js/app.js"}
    assert source_files([root / "README.md"]) == {}


def test_deb_repo_commits_the_source_files_an_installed_package_ships(tmp_path):
    listed = subprocess.run(["dpkg-query", "-L", "zlib1g-dev"], capture_output=True, text=True)
    if listed.returncode:
        missing("zlib1g-dev (a Debian package with C headers and examples) is not installed")
    dest = deb_repo("zlib1g-dev", tmp_path / "zlib")
    paths = committed(dest)
    assert "usr/include/zlib.h" in paths and "usr/include/zconf.h" in paths
    assert all(p.endswith((".c", ".h")) for p in paths)
    assert len(paths) == sum(line.endswith((".c", ".h")) for line in listed.stdout.splitlines())
    assert (dest / "usr/include/zlib.h").read_bytes() == Path("/usr/include/zlib.h").read_bytes()
    assert deb_repo("zlib1g-dev", dest) == dest  # made once, then reused


def test_deb_and_npm_specs_that_cannot_give_a_repository_say_why(tmp_path):
    with pytest.raises(ValueError, match="the Debian package 'no-such-package-here' is not "
                                         "installed \\(apt-get install no-such-package-here"):
        resolve_repo("deb:no-such-package-here")
    for spec in ("npm:left-pad", "npm:@scope/pkg"):
        with pytest.raises(ValueError, match=f"{spec} names no version; expected "
                                             "npm:NAME@VERSION"):
            resolve_repo(spec)


def _tarball(path: Path, files: dict[str, str]) -> None:
    """An npm tarball: every file under ``package/``, as ``npm pack`` makes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_npm_repo_commits_a_packed_package_s_sources(codekv_home):
    """The tarball ``npm pack`` would fetch, already in the codekv home: no network."""
    files = {"package.json": "{}", "index.js": "export function f() {}\n",
             "lib/util.ts": "export const g = 1;\n", "test/index.test.js": "f();\n",
             "dist/index.min.js": "f()"}
    _tarball(codekv_home / "sources" / "npm" / "scope-demo-1.2.0.tgz", files)
    dest = Path(resolve_repo("npm:@scope/demo@1.2.0"))
    assert committed(dest) == {"demo/index.js", "demo/lib/util.ts"}
    assert (dest / "demo/index.js").read_text() == files["index.js"]
    assert resolve_repo("npm:@scope/demo@1.2.0") == str(dest)
