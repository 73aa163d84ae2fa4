"""The evaluation's workloads are reproducible and their answers are real: code QA drawn
from a repository, passages (RAG) and tool documentation."""

from __future__ import annotations

import pytest
from conftest import HAND, STDLIB_FILES, indexed

from codekv.compose import Passage
from codekv.eval import workloads
from codekv.eval.tooldocs import tool_docs


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """Every test here indexes with byte counting (conftest's ``byte_counter``)."""


def test_completion_task_is_the_line_using_a_definition_of_another_chunk(git_repo):
    index = indexed(git_repo, HAND)
    [task] = workloads.code_qa(index, 1, seed=0, context_tokens=400, definition_share=0.0)
    assert task.kind == "completion"
    assert task.query == "# app.py\ndef run(value):\n    doubled = value * 2\n"
    assert task.answer == "    return helper(doubled)"
    assert task.meta["definition"] == "util.py::helper"
    assert "util.py::helper" in task.context_names()
    assert "app.py::run" not in task.context_names()  # the query is its text


def test_definition_question_is_answered_by_the_code(git_repo):
    index = indexed(git_repo, HAND)
    tasks = workloads.code_qa(index, 2, seed=0, context_tokens=400, definition_share=1.0)
    by_source = {t.source: t for t in tasks}
    helper = by_source["util.py::helper"]
    assert helper.kind == "returns"
    assert helper.query == ("# Question: in util.py, what does helper() return?\n"
                            "# Answer: helper() returns")
    assert helper.answer == " x + 1"
    run = by_source["app.py::run"]  # two returns-free questions: its one call comes first
    assert (run.kind, run.answer) in {("calls", " helper"), ("returns", " helper(doubled)")}


def test_code_qa_is_deterministic_and_answers_occur_in_the_source(stdlib_index, git_repo):
    first = workloads.code_qa(stdlib_index, 6, seed=3, context_tokens=900)
    again = workloads.code_qa(stdlib_index, 6, seed=3, context_tokens=900)
    other = workloads.code_qa(stdlib_index, 6, seed=4, context_tokens=900)
    assert [t.as_json() for t in first] == [t.as_json() for t in again]
    assert [t.as_json() for t in first] != [t.as_json() for t in other]
    assert len(first) == 6 and {t.kind for t in first} >= {"completion"}
    files = {name: (git_repo.root / name).read_text() for name in STDLIB_FILES}
    source = workloads.CodeSource(stdlib_index, workloads.approx_tokens)
    for task in first:
        context = {workloads.item_name(c): source.text(c) for c in task.context}
        assert task.meta["definition"] in context
        if task.kind == "completion":
            path = task.source.split("::")[0]
            body = task.query.split("\n", 1)[1]  # after the "# path" header
            assert body + task.answer + "\n" in files[path]
            assert task.meta["name"] in task.answer and task.meta["name"] not in body
            assert task.source not in context
        else:
            assert task.answer.strip() in context[task.source]
        assert sum(workloads.approx_tokens(text) for text in context.values()) <= 900


def test_rag_is_deterministic_and_quotes_one_passage_of_the_context():
    first = workloads.rag(5, seed=1, context_tokens=1024)
    assert [t.as_json() for t in first] == [t.as_json() for t in workloads.rag(5, 1, 1024)]
    assert [t.as_json() for t in first] != [t.as_json() for t in workloads.rag(5, 2, 1024)]
    for task in first:
        start = task.query.split('\n"', 1)[1]  # the quoted start of the sentence
        holding = [p for p in task.context if start + task.answer in p.text]
        assert [p.name for p in holding] == [task.source]
        assert sum(start in p.text for p in task.context) == 1
        assert all(isinstance(p, Passage) and p.kind == "passage" for p in task.context)


def test_tool_docs_are_deterministic_and_ask_for_a_real_option():
    docs = {f"python -m {d.module}": d for d in tool_docs()}
    assert "python -m json.tool" in docs  # argparse help of a stdlib command line
    first = workloads.tool_doc_tasks(6, seed=0, context_tokens=1024)
    assert [t.as_json() for t in first] == [
        t.as_json() for t in workloads.tool_doc_tasks(6, 0, 1024)]
    for task in first:
        doc = docs[task.source]
        option = task.answer.strip()
        assert option in {o.name for o in doc.options}
        [passage] = [p for p in task.context if p.name == task.source]
        assert passage.kind == "tool-doc" and option in passage.text
        assert f"`{task.source}`" in task.query
