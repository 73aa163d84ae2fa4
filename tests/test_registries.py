"""The extension points: a throwaway engine, workload and language, each one new module plus
its registry line, are picked up by the command line and the backend contract tests with no
other change. The registrations run in fresh processes, as a registry line would at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.models import tiny_model_file

from codekv.eval.workloads import generate
from codekv.schema import WORKLOADS, Workload, workload_of

ROOT = Path(__file__).resolve().parents[1]

TOY_ENGINE = '''
"""A throwaway engine: transformers under another name."""
from dataclasses import replace

from codekv.backends import hf_loader


def load(model, dtype, device):
    backend = hf_loader.load(model, dtype, device)
    backend.info = replace(backend.info, engine="toy")
    return backend
'''
TOY_WORKLOAD = '''
"""A throwaway workload: one note per task, quoted back."""
from codekv.compose import Passage
from codekv.eval.workloads import Task


def generate(n, seed, context_tokens, count, index, max_query_tokens):
    return [Task("toy", f"toy-{seed}-{i}", "quote",
                 [Passage(f"Toy note {seed}.{i} says hello.", f"note{i}", kind="toy-note")],
                 "Quote the note:", " Toy", f"note{i}") for i in range(n)]
'''
TOY_LANGUAGE = '''
"""A throwaway language: Python's grammar under .toy, with a query of its own."""
from pathlib import Path

import tree_sitter_python

from codekv.grammars import LanguageSpec

TOY = LanguageSpec(
    name="toy", extensions=(".toy",), load=tree_sitter_python.language,
    function_types=frozenset({"function_definition"}),
    class_types=frozenset({"class_definition"}), queries=Path(__file__).parent)
'''
# Definitions and calls only: a Python file would also get branch, return and assign anchors.
TOY_QUERY = """
(function_definition name: (identifier) @name) @definition.function
(call function: (identifier) @name) @call
"""
REGISTRY_LINES = '''
from codekv.backends.engines import Engine, register as register_engine
from codekv.schema import Workload, register as register_workload
from codekv.grammars import register as register_language

import toy_language

register_engine(Engine("toy", "toy_engine:load", ("hf-directory",), about="a throwaway"))
register_workload(Workload("toy", "toy_workload:generate", "toy-note"))
register_language(toy_language.TOY)
'''
# The command line in a fresh process after the registry lines, counting bytes (no tokenizer).
DRIVER = """
import sys
import codekv_toys
import codekv.index, codekv.tokens
bytes_spec = lambda: codekv.tokens.CounterSpec("bytes")
codekv.index.default_counter_spec = codekv.tokens.default_counter_spec = bytes_spec
from codekv.cli import main
main(sys.argv[1:], prog_name="codekv")
"""
TOY_SOURCE = "def greet(name):\n    if name:\n        return shout(name)\n\n\ndef shout(x):\n" \
             "    return x\n"


@pytest.fixture
def toys(tmp_path) -> Path:
    """The three toy modules, the toy query file and the registry lines, importable."""
    directory = tmp_path / "toys"
    directory.mkdir()
    for name, text in (("toy_engine.py", TOY_ENGINE), ("toy_workload.py", TOY_WORKLOAD),
                       ("toy_language.py", TOY_LANGUAGE), ("toy.scm", TOY_QUERY),
                       ("codekv_toys.py", REGISTRY_LINES), ("driver.py", DRIVER)):
        (directory / name).write_text(textwrap.dedent(text))
    return directory


def run(toys: Path, *args, code: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(toys), str(ROOT)]))
    command = ["-c", code] if code else [str(toys / "driver.py")]
    return subprocess.run([sys.executable, *command, *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600)


def test_the_command_line_runs_a_registered_engine(toys, git_repo, tmp_path):
    git_repo.commit({"util.py": "def helper(x):\n    return x + 1\n"})
    model = tiny_model_file("hf-directory", tmp_path)
    listed = run(toys, "compose", "--help")
    assert "[transformers|llama.cpp|openvino|toy]" in listed.stdout, listed.stderr
    assert "openvino extra); toy (a throwaway)." in " ".join(listed.stdout.split())
    composed = run(toys, "compose", git_repo.root, "--chunk", "util.py", "--query", "what?",
                   "--backend", "toy", "--model", model, "--max-new-tokens", 1, "--json",
                   "--store", tmp_path / "store")
    assert composed.returncode == 0, composed.stderr
    report = json.loads(composed.stdout)["report"]
    # Loaded by the toy loader, and gated by the toy engine's own (absent) evidence.
    assert report["fallback_reason"].startswith("unsupported: no evidence for llama/code-qa "
                                                "on toy")
    unknown = run(toys, "compose", git_repo.root, "--chunk", "util.py", "--query", "what?",
                  "--backend", "vllm")
    assert unknown.returncode == 2 and "'vllm' is not one of" in unknown.stderr


def test_eval_takes_a_registered_workload(toys):
    code = ("import codekv_toys, json\nfrom codekv.eval.command import eval_command\n"
            "ctx = eval_command.make_context('eval', ['--workload', 'toy', '--workload', 'rag'])\n"
            "print(json.dumps(ctx.params['workloads']))")
    parsed = run(toys, code=code)
    assert parsed.returncode == 0, parsed.stderr
    assert json.loads(parsed.stdout) == ["toy", "rag"]
    listed = run(toys, "eval", "--help")
    listed = listed.stdout.replace("\n", "").replace(" ", "")
    assert ("code-qa|rag|tool-docs|agent-session|agent-session-parts|"
            "agent-session-text-parts|agent-session-runs|toy") in listed


def test_a_registered_workload_generates_and_is_gated_by_its_chunk_kind(toys, monkeypatch):
    monkeypatch.syspath_prepend(str(toys))
    monkeypatch.setitem(WORKLOADS, "toy", Workload("toy", "toy_workload:generate", "toy-note"))
    tasks = generate("toy", 2, 7, 512)
    assert [(t.workload, t.id, t.context_names()) for t in tasks] == [
        ("toy", "toy-7-0", ["note0"]), ("toy", "toy-7-1", ["note1"])]
    assert workload_of("toy-note") == "toy"
    with pytest.raises(ValueError, match="unknown workload 'nope'; choose from code-qa, rag, "
                                         "tool-docs, agent-session, agent-session-parts, "
                                         "agent-session-text-parts, agent-session-runs, "
                                         "toy"):
        generate("nope", 1, 0, 512)


def test_the_index_chunks_a_registered_language_with_its_own_query(toys, git_repo, tmp_path):
    git_repo.commit({"main.toy": TOY_SOURCE, "plain.py": TOY_SOURCE})
    store = tmp_path / "store"
    indexed = run(toys, "index", git_repo.root, "--store", store, "--json", "--workers", 1)
    assert indexed.returncode == 0, indexed.stderr
    shown = run(toys, "show", git_repo.root, "main.toy::greet", "--store", store)
    assert shown.returncode == 0, shown.stderr
    assert "def greet(name):" in shown.stdout
    code = (f"import codekv_toys\nfrom codekv.index import Index\nfrom codekv.tokens import "
            f"CounterSpec\nindex = Index({str(git_repo.root)!r}, store={str(store)!r}, "
            f"counter=CounterSpec('bytes'))\n"
            "for c in index.chunks():\n"
            "    print(c.path, c.language, c.kind, c.qualname,"
            " sorted({a.kind for a in index.anchors(c)}))")
    listed = run(toys, code=code)
    assert listed.returncode == 0, listed.stderr
    lines = sorted(listed.stdout.splitlines())
    # Its own query: defs, calls and the uses the graph resolves; no Python branch or return.
    assert lines[:2] == ["main.toy toy function greet ['call', 'def', 'use']",
                         "main.toy toy function shout ['def']"]
    assert "branch" in lines[2] and lines[2].startswith("plain.py python function greet")


def test_the_backend_contract_tests_run_on_a_registered_engine(toys):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(toys), str(ROOT)]))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "codekv_toys", "-q", "-rA", "-p",
         "no:cacheprovider", str(ROOT / "tests" / "test_backends.py"), "-k", "toy"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    passed = [line for line in result.stdout.splitlines() if line.startswith("PASSED")]
    assert any("test_each_engine_implements_the_whole_protocol[toy]" in p for p in passed)
    assert any("test_composer_and_evaluation_use_only_declared_members[toy]" in p
               for p in passed)
