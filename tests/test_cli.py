"""The ``codekv`` command line: ``index`` (JSON and table), ``show``, ``gc``, its errors, and
what happens when two runs overlap or one is killed midway."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures.checks import imported_by
from fixtures.evidence import TEST_MODEL, covering

import codekv
from codekv.cli import main
from codekv.index import INDEX_FILE, Index
from codekv.support_schema import DESIGN
from codekv.tokens import CounterSpec

BYTES = CounterSpec("bytes")
FILES = {
    "util.py": "def helper(x):\n    return x + 1\n",
    "app.py": "from util import helper\n\n\ndef run(x):\n    if x:\n        return helper(x)\n",
    ".env": "TOKEN=hunter2\n",
}
SUMMARY_KEYS = {
    "files",
    "parsed",
    "reused",
    "skipped",
    "chunks",
    "anchors",
    "graph_nodes",
    "graph_edges",
    "seconds",
}

# Runs the CLI in a fresh process with byte counting (no tokenizer conversion); ``--slow``
# writes small batches with a pause after each, so a test can kill it between two.
DRIVER = """
import sys, time
import codekv.index, codekv.index_db, codekv.tokens
bytes_spec = lambda: codekv.tokens.CounterSpec("bytes")
codekv.index.default_counter_spec = codekv.tokens.default_counter_spec = bytes_spec
if "--slow" in sys.argv:
    sys.argv.remove("--slow")
    codekv.index.BATCH = 4
    put = codekv.index_db.IndexStore.put_analyses
    def slow_put(self, *args):
        put(self, *args)
        time.sleep(0.05)
    codekv.index_db.IndexStore.put_analyses = slow_put
import codekv
from codekv.cli import main
main(sys.argv[1:], prog_name="codekv")
"""


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """The CLI's default counter is the model tokenizer (seconds to convert): count bytes."""


@pytest.fixture
def repo(git_repo):
    git_repo.commit(FILES)
    return git_repo


@pytest.fixture
def store(tmp_path):
    return tmp_path / "store"


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def index_json(repo, store, *options) -> dict:
    result = cli("index", repo.root, "--store", store, "--json", "--workers", 1, *options)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def test_index_json(repo, store):
    summary = index_json(repo, store)
    assert SUMMARY_KEYS <= set(summary)
    assert summary["files"] == 3
    assert (summary["parsed"], summary["reused"]) == (2, 0)
    assert summary["skipped"] == {"secret": 1}
    # util.py: helper; app.py: the import line, run.
    assert summary["chunks"] == {"function": 2, "module": 1}
    assert summary["anchors"] == {
        "def": 2,
        "call": 1,
        "branch": 1,
        "return": 2,
        "import": 1,
        "use": 1,
    }
    assert (summary["graph_nodes"], summary["graph_edges"]) == (3, 1)
    assert isinstance(summary["seconds"], float) and summary["seconds"] >= 0
    assert (store / INDEX_FILE).is_file()

    again = index_json(repo, store)
    assert (again["parsed"], again["reused"]) == (0, 2)
    assert again["chunks"] == summary["chunks"] and again["anchors"] == summary["anchors"]


def test_index_table(repo, store):
    result = cli("index", repo.root, "--store", store, "--workers", 1)
    assert result.exit_code == 0, result.output
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│┃║ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    assert rows["files scanned"] == "3"
    assert rows["parsed"] == "2"
    assert rows["skipped: secret"] == "1"
    assert rows["chunks: function"] == "2"
    assert rows["anchors: use"] == "1"
    assert rows["graph edges"] == "1"


def test_show_prints_chunk_and_neighbours(repo, store):
    index_json(repo, store)
    result = cli("show", repo.root, "app.py::run", "--store", store)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "def run(x):" in out and "return helper(x)" in out
    assert "depends on: util.py::helper" in out
    assert "used by: -" in out
    assert "from util import" not in out  # another chunk

    helper = cli("show", repo.root, "util.py::helper", "--store", store)
    assert "used by: app.py::run" in helper.stdout


def test_show_writes_long_lines_whole_when_not_a_terminal(git_repo, store):
    """CliRunner's output is not a terminal (as a pipe): no line of code is cut at 80 columns."""
    wide = "return " + " + ".join(f"term_{i}" for i in range(30))  # 300 columns
    tabbed = "return '" + "y" * 90 + "'"  # after two tabs, each 4 columns wide
    git_repo.commit({"wide.py": f"def wide(term_0):\n\tif term_0:\n\t\t{tabbed}\n\t{wide}\n"})
    result = cli("show", git_repo.root, "wide.py::wide", "--store", store)
    assert result.exit_code == 0, result.output
    assert wide in result.stdout and tabbed in result.stdout


def test_show_whole_file_and_unknown_target(repo, store):
    result = cli("show", repo.root, "app.py", "--store", store)
    assert result.exit_code == 0, result.output
    assert "from util import helper" in result.stdout and "def run(x):" in result.stdout
    missing = cli("show", repo.root, "app.py::nope", "--store", store)
    assert missing.exit_code == 1
    assert "no chunk matches 'app.py::nope'" in missing.output


def test_show_follows_edits_made_after_indexing(repo, store):
    index_json(repo, store)
    repo.write({"app.py": FILES["app.py"].replace("helper(x)", "helper(x + 2)")})
    result = cli("show", repo.root, "app.py::run", "--store", store)
    assert result.exit_code == 0, result.output
    assert "helper(x + 2)" in result.stdout


def test_gc(repo, store):
    index_json(repo, store)
    repo.commit({"util.py": "def helper(x):\n    return x + 2\n"})
    assert index_json(repo, store)["parsed"] == 1
    result = cli("gc", repo.root, "--store", store)
    assert result.exit_code == 0, result.output
    assert "removed 1 unreachable blob entries" in result.stdout
    assert "removed 0 " in cli("gc", repo.root, "--store", store).stdout
    assert index_json(repo, store)["parsed"] == 0


@pytest.mark.parametrize("command", ["index", "show", "gc"])
def test_not_a_repository(tmp_path, store, command):
    plain = tmp_path / "plain"
    plain.mkdir()
    args = [command, plain] + (["x.py"] if command == "show" else []) + ["--store", store]
    result = cli(*args)
    assert result.exit_code == 1
    assert f"Error: {plain} is not inside a git repository" in result.output
    assert "Traceback" not in result.output


def test_corrupt_database_then_rebuild(repo, store):
    index_json(repo, store)
    (store / INDEX_FILE).write_bytes(b"\x13garbage" * 1024)
    result = cli("index", repo.root, "--store", store, "--json")
    assert result.exit_code == 1
    assert "unreadable" in result.output and "codekv index --rebuild" in result.output
    for command in (["show", repo.root, "app.py"], ["gc", repo.root]):
        assert cli(*command, "--store", store).exit_code == 1

    rebuilt = index_json(repo, store, "--rebuild")
    assert (rebuilt["parsed"], rebuilt["reused"], rebuilt["graph_edges"]) == (2, 0, 1)
    assert index_json(repo, store)["parsed"] == 0


def test_damaged_pages_are_an_error_not_a_traceback(git_repo, store):
    git_repo.commit({f"m{i}.py": f"def f{i}():\n    return {i}\n" * 20 for i in range(30)})
    index_json(git_repo, store)
    database = store / INDEX_FILE
    data = bytearray(database.read_bytes())
    data[3 * 4096 :] = b"\xa5" * (len(data) - 3 * 4096)
    database.write_bytes(bytes(data))
    git_repo.commit({"new.py": "x = 1\n"})
    result = cli("index", git_repo.root, "--store", store, "--workers", 1)
    assert result.exit_code == 1, result.output
    assert "codekv index --rebuild" in result.output
    assert index_json(git_repo, store, "--rebuild")["parsed"] == 31


# -- separate processes ------------------------------------------------------------------


def many_files(git_repo, count: int) -> None:
    body = "def f{i}_{j}(x):\n    if x > {j}:\n        return g{i}(x)\n    return x\n\n\n"
    files = {
        f"pkg/m{i}.py": "".join(body.format(i=i, j=j) for j in range(12)) + f"def g{i}(x):\n"
        "    return x\n"
        for i in range(count)
    }
    git_repo.commit(files)


def spawn(tmp_path, repo, store, *extra) -> subprocess.Popen:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    args = [sys.executable, str(script), "index", str(repo.root), "--store", str(store)]
    return subprocess.Popen(
        [*args, "--json", "--workers", "1", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def snapshot(index: Index):
    files = [(f.path, f.blob_hash, f.language) for f in index.files()]
    chunks = [
        (c.path, c.id, c.kind, c.qualname, c.start_byte, c.end_byte, c.n_tokens, c.anchors)
        for c in index.chunks()
    ]
    edges = sorted(index.graph.graph.edges)
    return files, chunks, edges


def clean_snapshot(repo, tmp_path):
    clean = Index(repo.root, store=tmp_path / "clean", counter=BYTES)
    summary = clean.update(workers=1)
    result = snapshot(clean), summary
    clean.close()
    return result


def test_two_processes_at_once(git_repo, tmp_path, store):
    many_files(git_repo, 60)
    first, second = spawn(tmp_path, git_repo, store), spawn(tmp_path, git_repo, store)
    summaries = []
    for process in (first, second):
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        summaries.append(json.loads(out))
    # One holds the lock and parses everything; the other then finds it all done.
    assert sorted(s["parsed"] for s in summaries) == [0, 60]
    assert summaries[0]["chunks"] == summaries[1]["chunks"] == {"function": 60 * 13}

    expected, clean_summary = clean_snapshot(git_repo, tmp_path)
    index = Index(git_repo.root, store=store, counter=BYTES)
    assert snapshot(index) == expected
    assert index.update(workers=1).parsed == 0
    index.close()
    assert summaries[0]["graph_edges"] == clean_summary.graph_edges == 60 * 12


def test_killed_midway_then_completed(git_repo, tmp_path, store):
    many_files(git_repo, 120)
    process = spawn(tmp_path, git_repo, store, "--slow")
    written = 0
    deadline = time.monotonic() + 30
    try:
        while written < 8 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            written = blobs_written(store / INDEX_FILE)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read()
    written = blobs_written(store / INDEX_FILE)
    assert 8 <= written < 120, "the run must be killed with some, not all, blobs stored"

    index = Index(git_repo.root, store=store, counter=BYTES)
    summary = index.update(workers=1)
    assert (summary.parsed, summary.reused) == (120 - written, written)
    expected, clean_summary = clean_snapshot(git_repo, tmp_path)
    assert snapshot(index) == expected
    assert (summary.chunks, summary.anchors) == (clean_summary.chunks, clean_summary.anchors)
    index.close()


def blobs_written(database) -> int:
    if not database.exists():
        return 0
    connection = sqlite3.connect(database, timeout=10)
    try:
        return connection.execute("SELECT count(*) FROM blobs WHERE status = 'ok'").fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet
        return 0
    finally:
        connection.close()


def test_show_accepts_a_dotted_path(repo, store):
    result = cli("show", repo.root, "./app.py::run", "--store", store)
    assert result.exit_code == 0, result.output
    assert "def run(x):" in result.stdout


def test_gc_keeps_blobs_of_the_budget_it_is_given(repo, store):
    """Blobs are keyed by chunker (budget included): gc with the index's budget keeps them,
    gc with another budget counts them as unreachable."""
    assert index_json(repo, store, "--budget", 256)["parsed"] == 2
    assert "removed 0 " in cli("gc", repo.root, "--store", store, "--budget", 256).stdout
    assert index_json(repo, store, "--budget", 256)["parsed"] == 0
    assert "removed 2 " in cli("gc", repo.root, "--store", store).stdout
    assert index_json(repo, store, "--budget", 256)["parsed"] == 2


def test_the_command_line_does_not_load_torch():
    """``codekv --help`` and the name registries stay fast: no torch until a model is used."""
    assert "torch" not in imported_by("codekv.cli", "codekv.selection", "codekv.eval.methods")


# -- input validation: a clear error before anything slow runs, never a traceback ----------


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model is a failure here: validation must refuse the input before it."""
    import codekv.models

    def load_backend(model=None, engine="transformers"):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(codekv.models, "load_backend", load_backend)


def assert_clean_error(result, exit_code: int, *phrases: str) -> None:
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    for phrase in phrases:
        assert phrase in result.output


@pytest.mark.parametrize("ratio", ["inf", "nan", "-1", "2", "-inf"])
def test_ratio_must_be_a_share(repo, store, no_model, ratio):
    result = cli("compose", repo.root, "--store", store, "--chunk", "app.py::run",
                 "--query", "q", f"--ratio={ratio}")
    assert_clean_error(result, 2, "not a share from 0 to 1")


@pytest.mark.parametrize("budget", ["0", "-5"])
@pytest.mark.parametrize("command", ["index", "gc"])
def test_budget_must_be_positive(repo, store, command, budget):
    result = cli(command, repo.root, "--store", store, f"--budget={budget}")
    assert_clean_error(result, 2, "--budget")
    assert not store.exists()


@pytest.mark.parametrize("value", ["abc", "-1", "20 potatoes", "1e9"])
def test_kv_size_limit_is_checked_at_start_up(repo, store, no_model, monkeypatch, value):
    monkeypatch.setenv("CODEKV_KV_MAX_BYTES", value)
    for args in (["compose", repo.root, "--chunk", "app.py", "--query", "q"], ["index", repo.root]):
        result = cli(*args, "--store", store)
        assert_clean_error(result, 1, "CODEKV_KV_MAX_BYTES", "such as 20G")


def test_kv_size_limit_takes_units(repo, store, monkeypatch):
    from codekv.stores import default_kv_store

    monkeypatch.setenv("CODEKV_KV_MAX_BYTES", "20G")
    assert index_json(repo, store)["parsed"] == 2
    assert default_kv_store(store).max_bytes == 20 << 30


def test_home_that_is_a_file_is_an_error_at_start_up(repo, tmp_path, monkeypatch):
    (tmp_path / "home-file").write_text("")
    monkeypatch.setenv("CODEKV_HOME", str(tmp_path / "home-file"))
    result = cli("index", repo.root)
    assert_clean_error(result, 1, "CODEKV_HOME=", "is not a directory")


def _compose_backend(monkeypatch, backend, before=None):
    """``load_backend`` returning a tiny model, after running ``before`` (an edit, say)."""
    import codekv.models

    def load_backend(model=None, engine="transformers"):
        if before is not None:
            before()
        return backend

    monkeypatch.setattr(codekv.models, "load_backend", load_backend)


def test_compose_reads_a_file_edited_while_the_model_loads(repo, store, tiny_backend, monkeypatch):
    import pygit2

    from codekv.stores import default_kv_store

    edited = FILES["util.py"].replace("x + 1", "x + 41")
    _compose_backend(monkeypatch, tiny_backend("llama"), lambda: repo.write({"util.py": edited}))
    index_json(repo, store)
    result = cli("compose", repo.root, "--store", store, "--chunk", "util.py::helper",
                 "--query", "what?", "--experimental", "--max-new-tokens", 1, "--json")
    assert result.exit_code == 0, result.output
    blobs = []
    default_kv_store(store).gc(lambda provenance: blobs.append(provenance.get("blob")) or True)
    assert blobs == [str(pygit2.hash(edited.encode()))]


def test_a_file_changed_after_indexing_is_a_clear_error(repo, store, monkeypatch):
    from codekv import gitrepo

    index_json(repo, store)

    def changed(self, file):
        raise gitrepo.MissingBlobError(f"{file.path} changed on disk since it was indexed")

    monkeypatch.setattr(gitrepo.BlobReader, "read", changed)
    result = cli("show", repo.root, "app.py::run", "--store", store)
    assert_clean_error(result, 1, "app.py changed on disk since it was indexed")


def test_compose_json_is_strict(repo, store, tiny_backend, monkeypatch):
    """Strict parsers refuse NaN and Infinity: the output never holds them."""
    from codekv import cli as cli_module

    _compose_backend(monkeypatch, tiny_backend("llama"))
    result = cli("compose", repo.root, "--store", store, "--chunk", "util.py::helper",
                 "--query", "what?", "--experimental", "--max-new-tokens", 1, "--json", "--check",
                 "--strategy", "boundary", "--ratio", "0")

    def refuse(constant):
        raise ValueError(f"{constant} in the JSON output")

    assert result.exit_code == 0, result.output
    output = json.loads(result.stdout, parse_constant=refuse)
    assert output["report"]["ratio"] == 0
    assert cli_module._finite({"a": [1.0, float("nan")], "b": float("-inf"), "c": "x"}) == {
        "a": [1.0, None], "b": None, "c": "x"
    }


def test_prefill_and_compose_share_a_conditioning(repo, store, tiny_backend, monkeypatch):
    """``prefill --prefix P --conditioning graph`` stores what ``compose`` with the same
    options reads; another conditioning is another entry for a chunk that uses something."""
    _compose_backend(monkeypatch, tiny_backend("llama"))
    options = ["--store", store, "--prefix", "You answer questions.\n"]
    for computed, cached in ((3, 0), (0, 3)):  # run, helper and app.py's import line
        result = cli("prefill", repo.root, *options, "--conditioning", "graph")
        assert result.exit_code == 0, result.output
        assert f"computed {computed}, already cached {cached};" in " ".join(result.output.split())

    def compose(conditioning):
        result = cli("compose", repo.root, *options, "--conditioning", conditioning,
                     "--chunk", "util.py::helper", "--chunk", "app.py::run", "--query", "what?",
                     "--experimental", "--strategy", "none", "--max-new-tokens", 1, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["report"]

    graph = compose("graph")
    assert (graph["conditioning"], graph["store_hits"], graph["store_misses"]) == ("graph", 2, 0)
    prefix = compose("prefix")  # run uses helper: after the prefix alone it is a new entry
    assert (prefix["conditioning"], prefix["store_hits"], prefix["store_misses"]) == (
        "prefix", 1, 1)
    result = cli("compose", repo.root, "--store", store, "--conditioning", "neighbours",
                 "--chunk", "app.py::run", "--query", "q")
    assert result.exit_code == 2 and "neighbours" in result.output


def test_support_shows_where_composition_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("CODEKV_SUPPORT", raising=False)
    query = {"delta_nll": -0.004, "delta_nll_ci": [-0.044, 0.036]}
    entries = [
        covering({"family": "llama", "workload": "code-qa", "passed": True, "strategy": "query",
                  "ratio": 0.15, "method": "query@0.15", "measured": query,
                  "reason": "meets all", "generated_by": "codekv eval --tasks 100",
                  "created": "2026-12-01T00:00:00Z",
                  "held_out": {"passed": True, "generated_by": "codekv eval --repo x",
                               "measured": {"delta_nll": 0.01, "delta_nll_ci": [-0.02, 0.04]}}},
                 languages=["python", "go"], max_tokens=4096),
        {"family": "llama", "workload": "rag", "passed": True, "method": "query@0.25",
         "design": DESIGN},
        {"backend": "llama.cpp", "family": "llama", "workload": "tool-docs", "passed": False,
         "method": None, "closest": "boundary@0.15"},
        {"family": "llama", "workload": "agent-session", "passed": True, "method": "none",
         "design": DESIGN, "held_out": {"passed": False, "closest": "none"}},
    ]
    path = tmp_path / "support.json"
    path.write_text(json.dumps({"format": 1, "entries": entries}))
    data = json.loads(cli("support", "--file", path, "--json").stdout)
    assert data["source"] == str(path)
    code, rag, docs, session = data["pairs"]
    assert (code["supported"], code["method"], code["reason"]) == (True, "query@0.15", "meets all")
    assert code["evidence"]["command"] == "codekv eval --tasks 100" and code["design"] == DESIGN
    assert code["source"] == rag["source"] == "store"  # chunks computed alone, not a last prompt
    assert code["held_out"]["command"] == "codekv eval --repo x" and code["held_out"]["passed"]
    assert session["held_out"]["passed"] is False and not session["supported"]
    assert rag["supported"] is False and rag["held_out"] is None
    assert rag["reason"] == ("unsupported: llama/rag passed its evaluation but was not confirmed "
                             "on held-out tasks")
    assert (docs["engine"], docs["supported"], docs["design"]) == ("llama.cpp", False, "first")
    assert code["covers"] == {"models": [{"fingerprint": TEST_MODEL, "name": "a test model"}],
                              "languages": ["go", "python"],
                              "context_tokens": {"min": None, "max": 4096}}
    assert code["evidence"]["covers"] == code["held_out"]["covers"] == entries[0]["covers"]
    assert rag["covers"] is None and rag["evidence"]["covers"] is None
    text = cli("support", "--file", path).stdout
    assert "-0.004 [-0.044, +0.036]" in text and "+0.010 [-0.020, +0.040]" in text
    row = " ".join(text.split("llama/code-qa")[1].split("\n")[0].split())
    assert row.startswith(f"│ support.json │ composed │ query@0.15 │ {DESIGN} │ a test model │ "
                          "go, python │ up to 4,096 │")
    assert f"covers a test model (fingerprint {TEST_MODEL})" in text
    words = " ".join(text.split())
    assert (f"│ llama/rag │ support.json │ full prefill │ query@0.25 │ {DESIGN} │ not said │ - │ "
            "- │") in words
    # An entry of the first design (it names none) says so: it licenses nothing.
    assert "│ full prefill │ closest boundary@0.15 │ first │" in words
    assert "llama/tool-docs on llama.cpp: unsupported: llama/tool-docs on llama.cpp failed" in text
    assert "closest boundary@0.15" in text
    # Passed its evidence, refused held out: the rule is named with the refusal.
    assert (f"│ llama/agent-session │ support.json │ full prefill │ none, failed held out │ "
            f"{DESIGN} │") in (
        " ".join(text.split()))
    # The shipped file by default; a broken file is a clear error.
    assert "codekv/data/support.json" in cli("support").stdout
    path.write_text("{")
    assert_clean_error(CliRunner().invoke(main, ["support", "--file", str(path)]), 1,
                       "cannot read the support file")


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} in the JSON output")

    return json.loads(text, parse_constant=refuse)


def test_support_shows_an_invalid_entry_and_why(tmp_path, monkeypatch):
    """An entry the schema refuses is listed as full prefill with its problems, text and JSON,
    and its NaN measurements never reach the JSON output."""
    shipped = json.loads((Path(codekv.__file__).parent / "data" / "support.json").read_text())
    [code] = [e for e in shipped["entries"] if e.get("backend") == "llama.cpp"
              and e["family"] == "llama"]
    shipped["entries"] = [code, *(e for e in shipped["entries"] if e is not code)]
    assert code["workload"] == "code-qa" and code["closest"] == "query@0.25"
    code.update(strategy="deviation")
    code["measured"]["kl"] = float("nan")
    path = tmp_path / "support.json"
    path.write_text(json.dumps(shipped))
    monkeypatch.setenv("CODEKV_SUPPORT", str(path))
    data = _strict_json(cli("support", "--json").stdout)
    pair = data["pairs"][0]
    assert (pair["engine"], pair["supported"], pair["method"]) == ("llama.cpp", False, None)
    assert pair["problems"] == [
        "strategy 'deviation' needs per-token KV deviation, which llama.cpp cannot give",
        "measured.kl NaN is not a finite number"]
    assert pair["evidence"]["measured"]["kl"] is None
    text = " ".join(cli("support").stdout.split())
    assert "query@0.25" not in text.split("llama/rag")[0]  # the rule column says why instead
    assert ("│ llama/code-qa on llama.cpp │ support.json │ full prefill │ invalid entry │ - │"
            in text)
    assert (f"llama/code-qa on llama.cpp: unsupported: the entry for llama/code-qa on llama.cpp "
            f"in {path} is invalid: strategy 'deviation' needs") in text


@pytest.mark.parametrize(("content", "why"), [
    (None, "No such file or directory"), ("dir", "Is a directory"), ("", "the file is empty"),
    ("{", "not JSON"), ("[]", "it holds a JSON array"),
])
def test_a_broken_support_file_is_named_not_replaced(repo, store, tiny_backend, monkeypatch,
                                                     tmp_path, content, why):
    """``$CODEKV_SUPPORT`` naming a file that is not a support file: ``support`` is a clear
    error; ``compose`` falls back to full prefill with the reason (the shipped file, which
    would compose this request, is not used instead)."""
    path = tmp_path / "support.json"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    monkeypatch.setenv("CODEKV_SUPPORT", str(path))
    expected = f"cannot read the support file $CODEKV_SUPPORT={path}: "
    for args in (["support"], ["support", "--json"]):
        assert_clean_error(cli(*args), 1, expected, why)
    _compose_backend(monkeypatch, tiny_backend("llama"))
    result = cli("compose", repo.root, "--store", store, "--chunk", "util.py::helper",
                 "--query", "what?", "--max-new-tokens", 1, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["report"]
    assert report["status"] == "full-prefill"
    assert report["fallback_reason"].startswith("unsupported: " + expected)
    assert why in report["fallback_reason"]
    assert f"codekv: {expected}" in result.stderr


@pytest.mark.parametrize("command", ["compose", "prefill"])
def test_a_scope_that_is_not_utf8_is_refused_before_the_model_loads(repo, store, no_model,
                                                                    monkeypatch, command):
    monkeypatch.setenv("CODEKV_SCOPE", os.fsdecode(b"team-\xff\xfe"))
    args = ["--chunk", "app.py::run", "--query", "q"] if command == "compose" else []
    result = cli(command, repo.root, "--store", store, *args)
    assert_clean_error(result, 1, "CODEKV_SCOPE=b'team-\\xff\\xfe' is not UTF-8 text")
    assert "longer than the model's positions" not in result.output


def test_prefill_counts_only_chunks_longer_than_the_model(repo, store, tiny_backend,
                                                          monkeypatch):
    """A chunk the model's positions cannot hold is counted as such; the others are stored."""
    from codekv.compose import Composer
    from codekv.gate import SupportGate

    backend = tiny_backend("llama", max_position_embeddings=32)
    _compose_backend(monkeypatch, backend)
    index_json(repo, store)
    index = Index(repo.root, store=store, counter=BYTES)
    composer = Composer(backend, index, store / "kv", gate=SupportGate([], "test"))
    lengths = [len(composer.build_request([chunk]).pieces[0].ids) for chunk in index.chunks()]
    index.close()
    too_long = sum(n > 32 for n in lengths)
    assert 0 < too_long < len(lengths)
    result = cli("prefill", repo.root, "--store", store)
    assert result.exit_code == 0, result.output
    assert (f"computed {len(lengths) - too_long}, already cached 0, {too_long} longer than the "
            "model's positions") in " ".join(result.output.split())


def test_max_new_tokens_is_a_count(repo, store, no_model):
    result = cli("compose", repo.root, "--store", store, "--chunk", "app.py::run",
                 "--query", "q", "--max-new-tokens", -5)
    assert_clean_error(result, 2, "--max-new-tokens", "-5 is not in the range x>=0")


def test_a_full_prefill_report_names_no_rule(repo, store, tiny_backend, monkeypatch, tmp_path):
    """Without evidence ``auto`` falls back: the report has no strategy, ratio or conditioning
    (the default rule it would have used is not what ran), in JSON and in the table."""
    monkeypatch.setenv("CODEKV_SUPPORT", str(tmp_path / "support.json"))
    (tmp_path / "support.json").write_text(json.dumps({"format": 1, "entries": []}))
    _compose_backend(monkeypatch, tiny_backend("llama"))
    args = ["compose", repo.root, "--store", store, "--chunk", "util.py::helper", "--query", "q",
            "--max-new-tokens", 1]
    report = json.loads(cli(*args, "--json").stdout)["report"]
    assert report["status"] == "full-prefill"
    assert (report["strategy"], report["ratio"], report["conditioning"]) == (None, None, None)
    assert report["fallback_reason"].startswith("unsupported: no evidence for llama/code-qa")
    table = " ".join(cli(*args).stdout.split())
    assert "│ strategy │ - │" in table and "│ query │" not in table
    composed = json.loads(cli(*args, "--json", "--experimental").stdout)["report"]
    assert (composed["status"], composed["strategy"], composed["ratio"]) == (
        "composed", "query", 0.15)  # the best measured rule (compose.DEFAULT_STRATEGIES)


def test_compose_errors_keep_their_quotes(repo, store, tiny_backend, monkeypatch):
    _compose_backend(monkeypatch, tiny_backend("llama"))
    index_json(repo, store)
    result = cli("compose", repo.root, "--store", store, "--chunk", "nosuch.py", "--query", "q")
    assert_clean_error(result, 1)
    assert result.output.strip() == ("Error: no indexed file 'nosuch.py' in the address "
                                     "'nosuch.py'")
    result = cli("compose", repo.root, "--store", store, "--chunk", "app.py::nosuch",
                 "--query", "q")
    assert result.output.strip() == ("Error: no chunk matches 'app.py::nosuch': no definition "
                                     "'nosuch' in app.py")


def test_python_dash_m_codekv_runs_the_command_line():
    """``python -m codekv`` is the same command line as the ``codekv`` script."""
    done = subprocess.run([sys.executable, "-m", "codekv", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: codekv ")
    assert "compose" in done.stdout and "serve" in done.stdout
