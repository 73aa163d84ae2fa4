"""The standard library made into a git repository: exactly its .py files, committed clean."""

import pygit2

from codekv.stdlib_repo import make_stdlib_repo, stdlib_dir, stdlib_files


def test_stdlib_files_are_the_sorted_py_files_outside_site_packages_and_caches():
    root = stdlib_dir()
    files = stdlib_files()
    assert files == sorted(files) and len(files) > 500
    assert all(p.suffix == ".py" and p.is_file() for p in files)
    assert not any({"site-packages", "__pycache__"} & set(p.relative_to(root).parts)
                   for p in files)
    assert root / "json" / "decoder.py" in files
    assert stdlib_files(10) == files[:10]


def test_the_repository_holds_exactly_those_files_and_is_clean(tmp_path):
    root = stdlib_dir()
    files = stdlib_files(60)
    repo = pygit2.Repository(str(make_stdlib_repo(tmp_path / "stdlib", limit=60)))
    tree = repo.head.peel(pygit2.Commit).tree
    committed = {}

    def walk(tree, prefix=""):
        for entry in tree:
            if entry.type == pygit2.GIT_OBJECT_TREE:
                walk(entry, prefix + entry.name + "/")
            else:
                committed[prefix + entry.name] = str(entry.id)

    walk(tree)
    assert committed == {
        p.relative_to(root).as_posix(): str(pygit2.hash(p.read_bytes())) for p in files
    }
    assert repo.status() == {}
    assert make_stdlib_repo(tmp_path / "stdlib", limit=60) == tmp_path / "stdlib"  # reused
