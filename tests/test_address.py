"""One address syntax for ``show``, ``compose``, ``depends_on``, ``used_by`` and the Python API:
parsing, resolution to a definition's span, and the errors that say what to write instead."""

import pytest
from click.testing import CliRunner
from fixtures.repos import C_TWO_MAINS, PYTHON_CLASS

import codekv.index
import codekv.tokens
from codekv.address import AddressError, parse
from codekv.cli import main
from codekv.compose import Composer
from codekv.gate import SupportGate
from codekv.index import Index
from codekv.stores.local import LocalKVStore
from codekv.tokens import CounterSpec

BYTES = CounterSpec("bytes")
LONG = "def long():\n" + "".join(f"    x{i} = {i}\n" for i in range(30)) + "    return x0\n"
FILES = {
    "src/db.py": "def connect(url):\n    return url\n",
    "a::b.py": "def f():\n    return 1\n",
    "dup.c": C_TWO_MAINS,
    "person.py": PYTHON_CLASS,
    "app.py": "from person import Person\n\n\ndef run():\n    return Person('Bo').greet()\n",
    "long.py": LONG,
}


@pytest.fixture
def index(git_repo):
    git_repo.commit(FILES)
    # Person fits in one chunk, long() does not.
    index = Index(git_repo.root, counter=BYTES, budget=250)
    index.update(workers=1)
    yield index
    index.close()


def _parsed(text, root=None):
    address = parse(text, {"src/db.py", "a::b.py", "a"}.__contains__, root)
    return address.path, address.qualname, address.line


def test_parse():
    files = {"src/db.py", "a::b.py", "a"}.__contains__
    assert _parsed("./src/db.py::connect") == _parsed("src//db.py::connect") == (
        "src/db.py", "connect", None,
    )
    assert _parsed("/repo/src/db.py::Pool.get@12", root="/repo") == ("src/db.py", "Pool.get", 12)
    # The longest part before a `::` that is a file is the path.
    assert _parsed("a::b.py") == ("a::b.py", None, None)
    assert _parsed("a::b.py::f") == ("a::b.py", "f", None)
    assert _parsed("a::g") == ("a", "g", None)
    assert parse("0123456789abcdef01234567", files).chunk_id == "0123456789abcdef01234567"
    with pytest.raises(AddressError, match="no indexed file 'nope.py'"):
        parse("nope.py::f", files)


def test_paths_are_normalised_everywhere(index):
    (connect,) = index.find("src/db.py", "connect")
    for address in ("src/db.py::connect", "./src/db.py::connect",
                    f"{index.root}/src/db.py::connect", connect.id):
        assert index.resolve(address) == connect
    (f,) = index.find("a::b.py")
    assert index.resolve("a::b.py") == index.resolve("a::b.py::f") == f


def test_same_name_definitions_are_ambiguous_until_a_line_is_given(index):
    with pytest.raises(AddressError) as error:
        index.resolve("dup.c::main")
    assert str(error.value) == (
        "dup.c::main is ambiguous: 2 definitions share the name; address one of them as "
        "dup.c::main@3 (function, lines 3-5), dup.c::main@8 (function, lines 8-10)"
    )
    first, second = (c for c in index.find("dup.c") if c.qualname == "main")
    assert index.resolve("dup.c::main@3") == first
    assert index.resolve("dup.c::main@9") == second  # any line the definition spans
    with pytest.raises(AddressError, match="no definition dup.c::main holds line 6"):
        index.resolve("dup.c::main@6")


def test_a_method_inside_its_class_chunk(index):
    (person,) = index.find("person.py", "Person")
    greet = index.resolve("person.py::Person.greet")
    method = b'def greet(self):\n        return f"Hello, {self.name}"'
    assert index.text(greet) == method
    assert (greet.kind, greet.qualname, greet.parent, greet.name) == (
        "method", "Person.greet", "Person", "greet",
    )
    assert (greet.start_line, greet.end_line, greet.n_tokens) == (7, 8, len(method))
    assert greet.id not in {c.id for c in index.chunks()}
    assert [(a.kind, a.name) for a in greet.anchors] == [
        ("def", "greet"), ("return", "return_statement"),
    ]
    assert index.lookup("person.py::Person.greet").chunks == [greet]
    # The graph links chunks; a span inside one is used where the names it defines are.
    def names(chunks):
        return {f"{c.path}::{c.qualname}" for c in chunks}

    assert names(index.used_by("person.py::Person")) == {"app.py::run", "person.py::main"}
    assert names(index.used_by("person.py::Person.greet")) == {"app.py::run", "person.py::main"}
    assert index.used_by("person.py::Person.__init__") == []
    (run,) = index.find("app.py", "run")
    assert index.depends_on("app.py::run") == index.depends_on(run) == [person]


def test_a_split_definition_is_one_span_of_its_parts(index):
    parts = index.find("long.py", "long")
    assert [c.part for c in parts] == [1, 2]
    target = index.lookup("long.py::long")
    assert target.chunks == parts
    assert index.text(target.span) == LONG.rstrip().encode()


def test_unknown_names_say_what_there_is(index):
    with pytest.raises(AddressError, match="no chunk 0123456789abcdef01234567 in the index"):
        index.resolve("0123456789abcdef01234567")
    with pytest.raises(AddressError, match=r"no chunk matches 'person.py::Person.gret'.*"
                                           r"did you mean Person.greet"):
        index.resolve("person.py::Person.gret")


def test_compose_resolves_addresses_like_show(index, tiny_backend, tmp_path):
    backend = tiny_backend("llama")
    composer = Composer(backend, index=index, store=LocalKVStore(tmp_path / "kv"),
                        gate=SupportGate([], "test"), experimental=True)
    query = "What does greet return?"
    result = composer.full_prefill(["./person.py::Person.greet"], query)
    method = 'def greet(self):\n        return f"Hello, {self.name}"'
    expected = backend.tokenize(f"# person.py\n{method}\n\n") + backend.tokenize(query)
    assert result.token_ids == expected
    with pytest.raises(AddressError, match="ambiguous"):
        composer.compose(["dup.c::main"], query)


def test_show_lists_the_candidates(git_repo, tmp_path, monkeypatch):
    monkeypatch.setattr(codekv.index, "default_counter_spec", lambda: BYTES)
    monkeypatch.setattr(codekv.tokens, "default_counter_spec", lambda: BYTES)
    git_repo.commit(FILES)
    store = str(tmp_path / "store")
    result = CliRunner().invoke(main, ["show", str(git_repo.root), "dup.c::main", "--store", store])
    assert result.exit_code == 1
    assert "dup.c::main@3 (function, lines 3-5), dup.c::main@8" in result.output
    result = CliRunner().invoke(main, ["show", str(git_repo.root), "person.py::Person.greet",
                                       "--store", store])
    assert result.exit_code == 0, result.output
    assert "person.py::Person.greet" in result.output and "def greet(self):" in result.output
    assert "def __init__" not in result.output
