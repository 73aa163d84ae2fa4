"""The evaluation's workloads are reproducible and their answers are real: code QA drawn
from a repository, passages (RAG) and tool documentation."""

from __future__ import annotations

import json

import pytest
from fixtures.repos import HAND, HAND_BY_LANGUAGE, STDLIB_FILES, indexed

from codekv.compose import Passage
from codekv.eval import workloads


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """Every test here indexes with byte counting (the ``byte_counter`` fixture)."""


def test_completion_task_is_the_line_using_a_definition_of_another_chunk(git_repo):
    index = indexed(git_repo, HAND)
    [task] = workloads.code_qa(index, 1, seed=0, context_tokens=400, shares=(0.0, 0.0))
    assert task.kind == "completion"
    assert task.query == "# app.py\ndef run(value):\n    doubled = value * 2"
    assert task.answer == "\n    return helper(doubled)"  # the line's newline starts it
    assert task.meta["definition"] == "util.py::helper"
    assert "util.py::helper" in task.context_names()
    assert "app.py::run" not in task.context_names()  # the query is its text


def test_definition_question_is_answered_by_the_code(git_repo):
    index = indexed(git_repo, HAND)
    tasks = workloads.code_qa(index, 2, seed=0, context_tokens=400, shares=(0.0, 1.0))
    by_source = {t.source: t for t in tasks}
    helper = by_source["util.py::helper"]
    assert helper.kind == "returns"
    assert helper.query == ("# Question: in util.py, what does helper() return?\n"
                            "# Answer: helper() returns")
    assert helper.answer == " x + 1"
    run = by_source["app.py::run"]  # two returns-free questions: its one call comes first
    assert (run.kind, run.answer) in {("calls", " helper"), ("returns", " helper(doubled)")}


def test_a_recall_task_asks_for_a_line_of_a_function_in_the_context(git_repo):
    index = indexed(git_repo, HAND)
    drawn = workloads.code_qa(index, 4, seed=0, context_tokens=400, shares=(1.0, 0.0))
    tasks = [t for t in drawn if t.kind == "recall"]  # the rest: functions too short for one
    assert tasks
    for task in tasks:
        chunk = next(c for c in task.context if workloads.item_name(c) == task.source)
        header, _, cue = task.query.partition("\n")
        assert header == f"# {chunk.path}"
        # the lines before the answer, then the answer's line, are the chunk's text verbatim
        assert cue + task.answer in HAND[chunk.path] and task.answer.startswith("\n")
        assert task.answer.count("\n") == 1 and len(task.answer.strip()) >= 8


@pytest.mark.parametrize("shares", [(0.0, 0.0), (1.0, 0.0)], ids=["completion", "recall"])
def test_a_one_line_answer_starts_where_the_tokenizer_would_cut(git_repo, shares):
    """Query and answer tokenized apart are the same tokens as their text tokenized whole: a
    query ending in a bare newline (the answer's indentation apart) is not, and a model reading
    it starts a new line of its own (session 15: full prefill then solved no completion)."""
    from fixtures.models import tiny_tokenizer

    tokenizer = tiny_tokenizer(1)
    index = indexed(git_repo, HAND)
    tasks = [t for t in workloads.code_qa(index, 4, seed=0, context_tokens=400, shares=shares)
             if t.kind in ("completion", "recall")]
    assert tasks
    for task in tasks:
        apart = tokenizer.encode(task.query) + tokenizer.encode(task.answer)
        assert apart == tokenizer.encode(task.query + task.answer)
        old_query, old_answer = task.query + "\n", task.answer.removeprefix("\n")
        assert (tokenizer.encode(old_query) + tokenizer.encode(old_answer)
                != tokenizer.encode(old_query + old_answer))


# Hand-checked against HAND_BY_LANGUAGE: the query after the file's header, the answer line.
COMPLETIONS = {
    "go": ("func run(value int) int {\n\tdoubled := value * 2\n", "\treturn helper(doubled)",
           "util.go::helper"),
    "rust": ("fn run(value: i32) -> i32 {\n    let doubled = value * 2;\n",
             "    return helper(doubled);", "src/util.rs::helper"),
    "java": ("    int run(int value) {\n        int doubled = value * 2;\n",
             "        return Util.helper(doubled);", "src/geo/Util.java::Util"),
    "c": ("int run(int value) {\n    int doubled = value * 2;\n", "    return helper(doubled);",
          "util.c::helper"),
    "cpp": ("int run(geo::Box box) {\n    int doubled = box.n * 2;\n",
            "    return box.get() + doubled;", "util.cpp::geo.Box.get"),
    "javascript": ("export function run(value) {\n  const doubled = value * 2;\n",
                   "  return helper(doubled);", "util.js::helper"),
    "typescript": ("export function run(value: number): number {\n  const doubled = value * 2;\n",
                   "  return helper(doubled);", "util.ts::helper"),
}


@pytest.mark.parametrize("language", sorted(COMPLETIONS))
def test_a_completion_in_each_language_is_written_in_its_comments(git_repo, language):
    index = indexed(git_repo, HAND_BY_LANGUAGE[language])
    [task] = workloads.code_qa(index, 1, seed=0, context_tokens=400, shares=(0.0, 0.0))
    body, answer, definition = COMPLETIONS[language]
    path = task.source.split("::")[0]
    assert task.kind == "completion" and task.meta["language"] == language
    assert task.query == f"// {path}\n{body}".removesuffix("\n")
    assert task.answer == "\n" + answer
    assert task.meta["definition"] == definition and definition in task.context_names()
    assert {c.language for c in task.context} == {language}


# (language, the function asked about, its question's subject, the returned expression)
RETURNS = [
    ("go", "util.go::helper", "helper()", "x + 1"),
    ("rust", "src/util.rs::Counter.get", "Counter::get()", "self.n"),  # no `;` in the answer
    ("java", "src/geo/App.java::App.twice", "App.twice()", "value * 2"),
    ("c", "util.c::helper", "helper()", "x + 1"),
    ("cpp", "util.cpp::geo.Box.get", "geo::Box::get()", "n + 1"),
    ("javascript", "util.js::helper", "helper()", "x + 1"),
    ("typescript", "util.ts::helper", "helper()", "x + 1"),
]


@pytest.mark.parametrize(("language", "source", "subject", "returned"), RETURNS)
def test_a_definition_question_in_each_language_names_it_that_language_s_way(
        git_repo, language, source, subject, returned):
    index = indexed(git_repo, HAND_BY_LANGUAGE[language])
    tasks = workloads.code_qa(index, 12, seed=0, context_tokens=400, shares=(0.0, 1.0))
    asked = {t.source: t for t in tasks if t.kind == "returns"}
    task = asked[source]
    path = source.split("::")[0]
    assert task.query == (f"// Question: in {path}, what does {subject} return?\n"
                          f"// Answer: {subject} returns")
    assert task.answer == " " + returned and task.meta["language"] == language


def test_a_crlf_file_s_answer_ends_with_its_line(git_repo):
    files = {name: text.replace("\n", "\r\n") for name, text in HAND_BY_LANGUAGE["go"].items()}
    index = indexed(git_repo, files)
    [task] = workloads.code_qa(index, 1, seed=0, context_tokens=400, shares=(0.0, 0.0))
    assert task.answer == "\n\treturn helper(doubled)" and not task.query.endswith(("\r", "\n"))


def test_go_s_own_functions_are_no_call_question(git_repo):
    index = indexed(git_repo, {"util.go": ("package app\n\nfunc size(items []int) int {\n"
                                           "\treturn len(items)\n}\n\n"
                                           "func total(items []int) int {\n"
                                           "\treturn size(items) * 2\n}\n")})
    tasks = workloads.code_qa(index, 6, seed=0, context_tokens=400, shares=(0.0, 1.0))
    calls = {t.source: t.answer for t in tasks if t.kind == "calls"}
    assert "util.go::size" not in calls  # its first call is len, Go's own
    assert calls.get("util.go::total", " size") == " size"


def test_language_selects_the_code_tasks_are_drawn_from(git_repo):
    files = {**HAND, **HAND_BY_LANGUAGE["go"]}
    index = indexed(git_repo, files)
    both = workloads.code_qa(index, 12, seed=0, context_tokens=400)
    assert {t.meta["language"] for t in both} == {"python", "go"}
    for languages in (("go",), ("python",)):
        tasks = workloads.code_qa(index, 12, seed=0, context_tokens=400, languages=languages)
        assert tasks and {t.meta["language"] for t in tasks} == set(languages)
        for task in tasks:  # the context is the task's language too
            assert {c.language for c in task.context} == set(languages)
    assert workloads.code_qa(index, 4, seed=0, context_tokens=400, languages=("rust",)) == []


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


def test_rag_is_deterministic_and_quotes_one_passage_of_the_context(stdlib_index):
    first = workloads.rag(stdlib_index, 5, seed=1, context_tokens=1024)
    assert len(first) == 5
    assert [t.as_json() for t in first] == [
        t.as_json() for t in workloads.rag(stdlib_index, 5, 1, 1024)]
    assert [t.as_json() for t in first] != [
        t.as_json() for t in workloads.rag(stdlib_index, 5, 2, 1024)]
    for task in first:
        start = task.query.split('\n"', 1)[1]  # the quoted start of the sentence
        holding = [p for p in task.context if start + task.answer in p.text]
        assert [p.name for p in holding] == [task.source]
        assert sum(start in p.text for p in task.context) == 1
        assert all(isinstance(p, Passage) and p.kind == "passage" for p in task.context)
        assert task.source.split("#")[0] in STDLIB_FILES


def test_rag_passages_are_the_docstrings_of_the_repository_s_python_code(git_repo):
    index = indexed(git_repo, {
        "shapes.py": '''"""Shapes and their areas.

Every shape here is measured in
whole units.
"""


class Square:
    """A square.

    Its sides are equal::

        Square(2).area() == 4
    """

    def area(self):
        """The side times itself."""
        return self.side ** 2
''',
        "broken.py": '"""Never read."""\ndef (:\n',
        "notes.md": "# Notes\n\nProse that is not a docstring.\n",
    })
    passages = workloads.doc_passages(index, passage_tokens=1000)
    assert [p.name for p in passages] == ["shapes.py#0"]
    assert passages[0].text == (
        "shapes.py\n\nmodule:\n\nShapes and their areas.\n\n"
        "Every shape here is measured in whole units.\n\nSquare:\n\nA square.\n\n"
        "Its sides are equal::\n\n    Square(2).area() == 4\n\n"
        "Square.area:\n\nThe side times itself.")
    small = workloads.doc_passages(index, passage_tokens=8)
    assert [p.name for p in small][:2] == ["shapes.py#0", "shapes.py#1"]
    assert "".join(p.text.split("\n\n", 1)[1] for p in small).count("Square.area:") == 1


@pytest.mark.parametrize("make", ["rag", "tool-docs"])
def test_no_query_is_longer_than_max_query_tokens(stdlib_index, make):
    """The preflight sizes a request by ``--max-query-tokens``: a quote or a question longer
    than that makes no task."""
    def draw(limit):
        if make == "rag":
            return workloads.rag(stdlib_index, 8, 0, 1024, max_query_tokens=limit)
        return workloads.tool_doc_tasks(stdlib_index, 8, 0, 1024, max_query_tokens=limit)

    longest = max(workloads.approx_tokens(t.query) for t in draw(256))
    bounded = draw(longest - 1)
    assert bounded and all(workloads.approx_tokens(t.query) < longest for t in bounded)


def test_tool_docs_are_deterministic_and_ask_for_a_tool_of_the_context(stdlib_index):
    first = workloads.tool_doc_tasks(stdlib_index, 6, seed=0, context_tokens=1024)
    assert len(first) == 6
    assert [t.as_json() for t in first] == [
        t.as_json() for t in workloads.tool_doc_tasks(stdlib_index, 6, 0, 1024)]
    for task in first:
        words = task.query.split('"')[1]
        [passage] = [p for p in task.context if p.name == task.source]
        tool = json.loads(passage.text)["function"]
        assert task.source == f"{task.source.split('::')[0]}::{tool['name']}"
        assert task.answer == tool["name"] and tool["description"].startswith(words)
        assert task.query.endswith('\nCall: {"name": "')
        assert all(p.kind == "tool-doc" for p in task.context)
        others = [json.loads(p.text)["function"] for p in task.context if p is not passage]
        assert all(words not in o["description"] and o["name"] != tool["name"] for o in others)


# A declaration file TypeScript's grammar cannot parse (its root an ERROR node, as fp-ts's
# .d.ts files): recovery makes a function node with no name out of a type.
UNPARSED_DTS = """export declare const apply: <A>(
  a: A
) => <E, B>(fab: import('./k').Kind<'Pair', E, (a: A) => B>) => import('./k').Kind<'Pair', E, B>
/**
 * @since 1.0.0
 */
export declare const Functor: Functor2<URI>
/**
 * @since 1.0.0
 */
export declare const Bifunctor: Bifunctor2<URI>
/**
 * @since 1.0.0
 */
export declare const FromValue: FromValue2<URI>
/**
 * @since 1.0.0
 */
export declare const fromMaybe: <E>(onNone: Lazy<E>) => <A>(fa: Maybe<A>) => Pair<E, A>
/**
 * @since 1.0.0
 */
export declare const fromMaybeK: <E>(
  onNone: Lazy<E>
) => <A extends ReadonlyArray<unknown>, B>(f: (...a: A) => Maybe<B>) => (...a: A) => Pair<E, B>
/**
 * @since 1.0.0
 */
export declare const fromCheck: {
  <A, B extends A, E>(refinement: Refinement<A, B>, onFalse: (a: A) => E): (a: A) => Pair<E, B>
"""


def test_a_function_without_a_name_gets_no_question_that_names_it(git_repo):
    """Recall and completion place a function by its file and line; a definition question
    names it, so a nameless one (an unparsed file's) gets none."""
    index = indexed(git_repo, {"types.d.ts": UNPARSED_DTS, **HAND_BY_LANGUAGE["typescript"]})
    source = workloads.CodeSource(index, workloads.approx_tokens)
    assert any(c.kind == "function" and c.qualname is None and c.anchors for c in source.chunks)
    for shares in ((1.0, 0.0), (0.0, 1.0), (0.0, 0.0)):
        tasks = workloads.code_qa(index, 12, seed=0, context_tokens=600, shares=shares)
        assert {t.meta["language"] for t in tasks} == {"typescript"}
        assert all("::" in t.source for t in tasks if t.kind in ("returns", "calls"))
