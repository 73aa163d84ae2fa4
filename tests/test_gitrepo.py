"""What ``scan`` lists: HEAD plus the working tree with git's blob hashes, minus what must not
be indexed (ignored and secret-looking files), each skip counted by its reason."""

from collections import Counter

import pygit2
import pytest

from codekv import gitrepo
from codekv.gitrepo import NotARepositoryError, SourceFile
from codekv.index import Index
from codekv.tokens import CounterSpec

BYTES = CounterSpec("bytes")

SECRETS = {
    ".env": "API_TOKEN=hunter2\n",
    "id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
    "certs/x.pem": "-----BEGIN CERTIFICATE-----\n",
    "config/secrets.json": '{"password": "hunter2"}\n',
}


def _by_path(snapshot):
    return {f.path: f for f in snapshot.files}


def _blob(content: str) -> str:
    return str(pygit2.hash(content.encode()))


def test_worktree_files_are_hashed_like_git(git_repo):
    """A modified tracked file and an untracked one carry the hash git would give the bytes
    on disk; an untouched file keeps HEAD's; a file deleted from disk is gone."""
    git_repo.commit({"a.py": "x = 1\n", "b.py": "y = 2\n", "gone.py": "z = 0\n"})
    git_repo.write({"a.py": "x = 3\n", "pkg/new.py": "z = 4\n", "gone.py": None})
    files = _by_path(gitrepo.scan(git_repo.repo))
    assert files == {
        "a.py": SourceFile("a.py", _blob("x = 3\n"), "python", "worktree"),
        "b.py": SourceFile("b.py", _blob("y = 2\n"), "python", "head"),
        "pkg/new.py": SourceFile("pkg/new.py", _blob("z = 4\n"), "python", "worktree"),
    }


def test_unborn_head_lists_untracked_files(git_repo):
    git_repo.write({"main.py": "print(1)\n", "notes.txt": "hi\n"})
    files = _by_path(gitrepo.scan(git_repo.repo))
    assert {p: (f.language, f.origin) for p, f in files.items()} == {
        "main.py": ("python", "worktree"),
        "notes.txt": ("text", "worktree"),
    }


def test_symlinks_are_not_indexed(git_repo):
    git_repo.commit({"real.py": "x = 1\n"})
    (git_repo.root / "link.py").symlink_to("real.py")
    assert sorted(_by_path(gitrepo.scan(git_repo.repo))) == ["real.py"]


def _swap_for_link(git_repo, directory: str, target) -> None:
    """Replace a tracked directory by a symlink (``rm -rf conf && ln -s /etc conf``)."""
    import shutil

    shutil.rmtree(git_repo.root / directory)
    (git_repo.root / directory).symlink_to(target, target_is_directory=True)


@pytest.fixture
def outside(tmp_path):
    """A directory outside the repository holding a file the repository also names."""
    path = tmp_path / "etc"
    path.mkdir()
    (path / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    return path


def test_directory_replaced_by_link_out_of_the_repository_is_skipped(git_repo, outside):
    git_repo.commit({"conf/passwd": "user:x\n", "app.py": "x = 1\n"})
    _swap_for_link(git_repo, "conf", outside)
    snapshot = gitrepo.scan(git_repo.repo)
    assert sorted(_by_path(snapshot)) == ["app.py"]
    assert snapshot.skipped_paths == {"conf/passwd": "outside-repository"}

    index = Index(git_repo.root, counter=BYTES)
    summary = index.update(workers=1)
    assert summary.skipped == {"outside-repository": 1}
    assert index.chunks("conf/passwd") == []
    assert all(b"root:x" not in index.text(c) for c in index.chunks())
    index.close()


def test_link_to_a_directory_inside_the_repository_is_followed(git_repo):
    git_repo.commit({"conf/x.py": "x = 1\n", "other/x.py": "x = 2\n"})
    _swap_for_link(git_repo, "conf", "other")
    files = _by_path(gitrepo.scan(git_repo.repo))
    assert files["conf/x.py"] == SourceFile("conf/x.py", _blob("x = 2\n"), "python", "worktree")


def test_reading_refuses_a_path_that_left_the_repository_since_the_scan(git_repo, outside):
    """Same bytes outside as inside, so the blob hash check alone would let the read pass."""
    git_repo.commit({"conf/passwd": "user:x\n"})
    content = (outside / "passwd").read_text()
    git_repo.write({"conf/passwd": content})
    index = Index(git_repo.root, counter=BYTES)
    index.update(workers=1)
    (chunk,) = index.chunks("conf/passwd")
    _swap_for_link(git_repo, "conf", outside)
    with pytest.raises(gitrepo.OutsideRepositoryError, match="outside the repository"):
        index.text(chunk)
    index.close()


@pytest.fixture
def guarded_repo(git_repo):
    """Ignored files (one by pattern, a directory), secrets untracked and one committed."""
    git_repo.commit({".gitignore": "*.log\nbuild/\n", "app.py": "x = 1\n", ".env": "A=1\n"})
    files = dict(SECRETS)
    files.pop(".env")  # committed above: tracked secrets are skipped too
    git_repo.write(
        {**files, "debug.log": "trace\n", "build/gen.py": "y = 1\n", "build/more.py": "z = 1\n"}
    )
    return git_repo


def test_ignored_and_secret_files_are_skipped_by_reason(guarded_repo):
    snapshot = gitrepo.scan(guarded_repo.repo)
    assert sorted(_by_path(snapshot)) == [".gitignore", "app.py"]
    # An ignored directory is one entry: status does not list inside it.
    assert snapshot.skipped == Counter({"secret": 4, "ignored": 2})
    assert snapshot.skipped_paths == {
        ".env": "secret",
        "id_rsa": "secret",
        "certs/x.pem": "secret",
        "config/secrets.json": "secret",
        "debug.log": "ignored",
        "build": "ignored",
    }


def test_include_secrets_and_ignored(guarded_repo):
    with_secrets = gitrepo.scan(guarded_repo.repo, include_secrets=True)
    assert set(SECRETS) <= set(_by_path(with_secrets))
    assert with_secrets.skipped == Counter({"ignored": 2})
    assert _by_path(with_secrets)[".env"].origin == "head"

    with_ignored = _by_path(gitrepo.scan(guarded_repo.repo, include_ignored=True))
    assert with_ignored["build/gen.py"] == SourceFile(
        "build/gen.py", _blob("y = 1\n"), "python", "worktree"
    )
    assert with_ignored["debug.log"].blob_hash == _blob("trace\n")
    assert "build/more.py" in with_ignored and ".env" not in with_ignored


def test_index_skips_secrets_unless_asked(guarded_repo):
    plain = Index(guarded_repo.root, counter=BYTES)
    summary = plain.update(workers=1)
    assert summary.skipped == {"secret": 4, "ignored": 2}
    assert plain.chunks(".env") == []
    plain.close()

    bold = Index(guarded_repo.root, counter=BYTES, include_secrets=True, include_ignored=True)
    summary = bold.update(workers=1)
    assert summary.skipped == {}
    (env,) = bold.chunks(".env")
    assert bold.text(env) == b"A=1\n"
    assert [c.qualname for c in bold.chunks("config/secrets.json")] == [None]
    assert bold.text(bold.chunks("build/gen.py")[0]) == b"y = 1"  # python chunks end at code
    bold.close()


@pytest.mark.parametrize(
    "path",
    [
        ".env",
        ".env.local",
        "deploy/prod.env",
        "x.pem",
        "id_rsa",
        "id_ed25519.pub",
        "secrets.json",
        "a/b/credentials.json",
        "server.key",
        ".netrc",
        ".git-credentials",
        "web/.htpasswd",
        "infra/terraform.tfstate",
        "infra/terraform.tfstate.backup",
        # tokens and keys of cloud tools, CI and package managers
        "aws_credentials",
        "config/credentials.yml",
        "ops/service-account.json",
        "gcloud/application_default_credentials.json",
        "deploy_key",
        "keys/server.ppk",
        ".envrc",
        "kubeconfig",
        "home/.docker/config.json",
        ".kube/config",
        "private.asc",
        "Credentials.YAML",
    ],
)
def test_secret_names(path):
    assert gitrepo.is_secret(path)


@pytest.mark.parametrize(
    "path",
    [
        "environment.py",
        "env.py",
        "secrets.py",
        "keys.py",
        "pem/reader.py",
        "docs/credentials.md",
        "keyboard.c",
        "infra/main.tf",
        ".gitignore",
        # code and docs named for what they handle
        "credentials.py",
        "auth/aws_credentials.go",
        "service_account.py",
        "deploy_key.rs",
        "config.json",
        "docker/config.json",
        "kube/config.go",
        "public.asc",
    ],
)
def test_ordinary_names_are_not_secret(path):
    assert not gitrepo.is_secret(path)


def test_skip_reason():
    assert gitrepo.skip_reason(b"x = 1\n") is None
    assert gitrepo.skip_reason(b"PK\x03\x04\x00\x00") == "binary"
    assert gitrepo.skip_reason(b"a" * 11, max_file_bytes=10) == "too-large"
    assert gitrepo.skip_reason(b"a" * 10, max_file_bytes=10) is None


def test_size_limit_follows_module_attribute(monkeypatch):
    """The default is read when called, so tests and callers can lower it."""
    monkeypatch.setattr(gitrepo, "MAX_FILE_BYTES", 4)
    assert gitrepo.skip_reason(b"12345") == "too-large"
    assert gitrepo.skip_reason(b"1234") is None


def test_not_a_repository(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(NotARepositoryError, match="plain is not inside a git repository"):
        gitrepo.open_repository(plain)
    with pytest.raises(NotARepositoryError, match="not inside a git repository"):
        Index(tmp_path / "does-not-exist", counter=BYTES)


def test_bare_repository_is_refused(tmp_path):
    pygit2.init_repository(str(tmp_path / "bare.git"), bare=True)
    with pytest.raises(NotARepositoryError, match="bare repository"):
        gitrepo.open_repository(tmp_path / "bare.git")


def test_nested_repository_is_not_indexed(git_repo):
    """An untracked clone inside the repository is not its code, and its .git (objects,
    config with remote URLs) must never be read as text."""
    from fixtures.repos import GitRepo

    git_repo.commit({".gitignore": "vendor/\n", "a.py": "x = 1\n"})
    GitRepo(git_repo.root / "lib").commit({"b.py": "y = 1\n"})
    GitRepo(git_repo.root / "vendor" / "dep").commit({"c.py": "z = 1\n"})
    snapshot = gitrepo.scan(git_repo.repo)
    assert sorted(_by_path(snapshot)) == [".gitignore", "a.py"]
    assert snapshot.skipped_paths == {"lib": "nested-repository", "vendor": "ignored"}
    # Asked for ignored files: the nested clone's files, but nothing inside its .git.
    with_ignored = sorted(_by_path(gitrepo.scan(git_repo.repo, include_ignored=True)))
    assert with_ignored == [".gitignore", "a.py", "vendor/dep/c.py"]


def test_a_submodule_is_skipped_and_said_to_be(git_repo, tmp_path):
    """A submodule is another repository's commit, not files of this one: not indexed, and
    counted among the skipped files like the others (the index summary shows it)."""
    import subprocess

    from fixtures.repos import GitRepo

    GitRepo(tmp_path / "dep").commit({"c.py": "z = 1\n"})
    git_repo.commit({"a.py": "x = 1\n"})
    git = ["git", "-C", str(git_repo.root), "-c", "protocol.file.allow=always", "-c",
           "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "submodule", "--quiet", "add", str(tmp_path / "dep"), "vendor/dep"],
                   check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "dep"], check=True)
    assert git_repo.repo.head.peel(pygit2.Commit).tree["vendor/dep"].filemode == (
        pygit2.GIT_FILEMODE_COMMIT)
    snapshot = gitrepo.scan(git_repo.repo)
    assert sorted(_by_path(snapshot)) == [".gitmodules", "a.py"]
    assert snapshot.skipped_paths == {"vendor/dep": "submodule"}
    index = Index(git_repo.root, counter=BYTES)
    summary = index.update(workers=1)
    assert (summary.files, summary.skipped) == (3, {"submodule": 1})
    index.close()
