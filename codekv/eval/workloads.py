"""Evaluation workloads, generated reproducibly from a seed out of material no one here wrote.

- ``code-qa``: from a git repository (default: the standard library), in every language the
  index parses (``languages`` narrows it). Mostly recall: a line of a function that is in
  the context, asked for by the lines before it (a lookup the model can do). Then cross-chunk
  completion: a function using a name defined in another chunk (from the def-use graph); the
  context holds the defining chunk, related chunks and distractors of the function's language
  in random order; the query is the function up to the line using the name (the name not yet
  seen in it); the answer is that line, from its newline on (where a tokenizer cuts). And
  definition questions answered by exact strings of the code: what a function returns, which
  call comes first in it. Each task is written in its language's line comments
  and names (``LanguageSpec.tasks``: ``// Question: ... Counter::get()``) and records its
  ``language``.
- ``rag``: the documentation written in a repository's Python code (its docstrings) cut into
  passages; the question quotes the start of a sentence of one passage, the answer is how it
  goes on.
- ``tool-docs``: function tools (as a chat request's ``tools``) made from a repository's
  documented functions; the question describes one in the words of its description, the
  answer is its name in the call the query opens.

A task's context length is drawn between half the requested length and all of it, so the
results cover a range of lengths. Every choice goes through one ``random.Random`` seeded with
the workload and the seed, over inputs in a sorted order, so a seed always gives the same tasks
(for the same token counter).
"""

from __future__ import annotations

import ast
import collections
import functools
import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from codekv import gitrepo
from codekv.chunks import Chunk
from codekv.eval.tooldocs import Tool, tools
from codekv.grammars import LANGUAGES, TaskSyntax
from codekv.request import Passage
from codekv.schema import WORKLOADS, ChunkKind

FUNCTION_KINDS = ("function", "method")
Counter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """A model-free token estimate (about 4 characters a token) for generating without a model."""
    return max(1, len(text) // 4)


@dataclass
class Task:
    workload: str
    id: str
    kind: str  # completion, returns, calls, quote, option
    context: list  # Chunk or Passage objects, in request order
    query: str
    answer: str
    source: str  # where the answer is written: a context item, or the query's function
    meta: dict = field(default_factory=dict)
    # agent-session: the session's calls up to this one (``sessions.SessionPrompt``), served
    # in order; the context is the last one's messages, the query the reply it begins
    calls: list | None = field(default=None, repr=False)

    def context_names(self) -> list[str]:
        return [item_name(item) for item in self.context]

    def as_json(self) -> dict:
        return {"workload": self.workload, "id": self.id, "kind": self.kind,
                "context": self.context_names(), "query": self.query, "answer": self.answer,
                "source": self.source, **self.meta}

    def digest(self) -> str:
        """What the task is, content included (a chunk's id is its blob and range): a
        checkpoint reuses a finished task for this one only when the digests agree."""
        content = {"task": self.as_json(), "context": [_content(item) for item in self.context],
                   "calls": [[call.messages, call.partial] for call in self.calls or ()]}
        return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()
                              ).hexdigest()


def _content(item) -> str | list[str]:
    return item.id if isinstance(item, Chunk) else [item.name, item.kind, item.text]


def item_name(item) -> str:
    if isinstance(item, Passage):
        return item.name
    name = f"{item.path}::{item.qualname}" if item.qualname else f"{item.path}@{item.start_line}"
    return f"{name}#{item.part}" if item.part else name


def length(context_tokens: int, rng: random.Random) -> int:
    """A task's context length: from half of ``context_tokens`` to all of it, so results (and
    the TTFT plot) cover a range of lengths rather than one."""
    return rng.randint(context_tokens // 2, context_tokens)


def generate(workload: str, n: int, seed: int, context_tokens: int, count: Counter = approx_tokens,
             index=None, max_query_tokens: int = 256,
             languages: tuple[str, ...] | None = None) -> list[Task]:
    """``n`` tasks of a registered workload (``codekv.schema``); ``languages``: which
    languages' code a workload drawn by language takes (default: all the index has)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    return WORKLOADS[workload].generate(n, seed, context_tokens, count, index, max_query_tokens,
                                        languages)


# -- the registered generators: (n, seed, context_tokens, count, index, max_query_tokens) ----
def code_qa_tasks(n, seed, context_tokens, count, index, max_query_tokens,
                  languages=None) -> list[Task]:
    return code_qa(index, n, seed, context_tokens, count, max_query_tokens, languages=languages)


def rag_tasks(n, seed, context_tokens, count, index, max_query_tokens) -> list[Task]:
    return rag(index, n, seed, context_tokens, count, max_query_tokens=max_query_tokens)


def tool_docs_tasks(n, seed, context_tokens, count, index, max_query_tokens) -> list[Task]:
    return tool_doc_tasks(index, n, seed, context_tokens, count, max_query_tokens)


# -- code-qa ---------------------------------------------------------------------------------
class CodeSource:
    """The repository's code chunks of ``languages`` (default: every language it has) in a
    stable order, their text and their def-use links."""

    def __init__(self, index, count: Counter, languages: tuple[str, ...] | None = None):
        self.index = index
        self.count = count
        chunks = [c for c in index.chunks() if c.kind != "text" and c.language in LANGUAGES
                  and (languages is None or c.language in languages)]
        self.chunks = sorted(chunks, key=lambda c: (c.path, c.start_byte, c.end_byte))
        self.by_id = {c.id: c for c in self.chunks}
        self.by_language: dict[str, list[Chunk]] = {}
        for chunk in self.chunks:
            self.by_language.setdefault(chunk.language, []).append(chunk)
        self._files = {f.path: f for f in index.files()}
        self._reader = gitrepo.BlobReader(index.repo.path)
        self._tokens: dict[str, int] = {}

    def languages(self) -> list[str]:
        return sorted(self.by_language)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one source per evaluation
    def data(self, path: str) -> bytes:
        return self._reader.read(self._files[path])

    def text(self, chunk: Chunk) -> str:
        return chunk.text(self.data(chunk.path)).decode("utf-8", "replace")

    def tokens(self, chunk: Chunk) -> int:
        """Tokens of the chunk as the composer presents it (path header, code, blank line)."""
        if chunk.id not in self._tokens:
            self._tokens[chunk.id] = self.count(f"# {chunk.path}\n{self.text(chunk)}\n\n")
        return self._tokens[chunk.id]

    def uses(self, chunk: Chunk) -> list:
        """Uses resolved to another chunk of this source, in source order."""
        return sorted((u for u in self.index.uses(chunk)
                       if u.target != chunk.id and u.target in self.by_id),
                      key=lambda u: (u.start_byte, u.end_byte))

    def fill(self, required: list[Chunk], query_chunk: Chunk | None, context_tokens: int,
             rng: random.Random, language: str) -> list[Chunk]:
        """``required`` plus random distractors of ``language`` (the task's) up to
        ``context_tokens``, in random order."""
        pool = self.by_language[language]
        items = list(required)
        total = sum(self.tokens(c) for c in items)
        chosen = {c.id for c in items}
        for _ in range(400):
            if total >= 0.9 * context_tokens:
                break
            candidate = pool[rng.randrange(len(pool))]
            if candidate.id in chosen or _overlaps(candidate, query_chunk):
                continue
            size = self.tokens(candidate)
            if total + size > context_tokens:
                continue
            items.append(candidate)
            chosen.add(candidate.id)
            total += size
        rng.shuffle(items)
        return items


def _overlaps(a: Chunk, b: Chunk | None) -> bool:
    if b is None or a.path != b.path:
        return False
    return a.start_byte < b.end_byte and b.start_byte < a.end_byte


def code_qa(index, n: int, seed: int, context_tokens: int, count: Counter = approx_tokens,
            max_query_tokens: int = 256, shares: tuple[float, float] = (0.7, 0.15),
            languages: tuple[str, ...] | None = None) -> list[Task]:
    """``n`` tasks from the functions of ``languages`` (default: every language the index
    has); each task is written in its function's language and records it (``language``).
    ``shares``: of recall and definition tasks (the rest are cross-chunk completions)."""
    rng = random.Random(f"code-qa:{seed}")
    source = CodeSource(index, count, languages)
    functions = [c for c in source.chunks if c.kind in FUNCTION_KINDS and c.part == 0]
    kinds = {_recall_task: list(functions),
             _definition_task: [c for c in functions if c.qualname  # its question names it
                                and any(a.kind in ("return", "call") for a in c.anchors)],
             _completion_task: [c for c in functions if source.uses(c)]}
    for pool in kinds.values():
        rng.shuffle(pool)
    tasks: list[Task] = []
    used: set[str] = set()
    while len(tasks) < n and any(kinds.values()):
        draw = rng.random()
        want = (_recall_task if draw < shares[0] else _definition_task
                if draw < shares[0] + shares[1] else _completion_task)
        build = want if kinds[want] else next(b for b, pool in kinds.items() if pool)
        chunk = kinds[build].pop()
        if chunk.id in used:
            continue
        task = build(source, chunk, context_tokens, max_query_tokens, rng)
        if task is not None:
            used.add(chunk.id)
            task.id = f"code-qa-{seed}-{len(tasks)}"
            task.meta["language"] = chunk.language
            tasks.append(task)
    return tasks


def syntax(chunk: Chunk) -> TaskSyntax:
    """How a task about ``chunk`` is written: its language's comments and names."""
    return LANGUAGES[chunk.language].tasks


def _line_bounds(data: bytes, start: int, end: int) -> tuple[int, int]:
    first = data.rfind(b"\n", 0, start) + 1
    last = data.find(b"\n", end)
    return first, len(data) if last < 0 else last


def _related(source: CodeSource, chunk: Chunk, exclude: set[str], limit: int,
             context_tokens: int, rng: random.Random) -> list[Chunk]:
    """Up to ``limit`` other chunks ``chunk`` uses: the neighbours an agent would also read."""
    ids = sorted({u.target for u in source.uses(chunk)} - exclude)
    fitting = [source.by_id[i] for i in ids]
    fitting = [c for c in fitting
               if source.tokens(c) <= context_tokens // 4 and not _overlaps(c, chunk)]
    return rng.sample(fitting, min(limit, len(fitting)))


def _completion_task(source: CodeSource, chunk: Chunk, context_tokens: int,
                     max_query_tokens: int, rng: random.Random) -> Task | None:
    data = source.data(chunk.path)
    written = syntax(chunk)
    first_line = data.rfind(b"\n", 0, chunk.start_byte) + 1
    for use in source.uses(chunk):
        target = source.by_id[use.target]
        start, end = _line_bounds(data, use.start_byte, use.end_byte)
        if start <= first_line or end > chunk.end_byte or _overlaps(target, chunk):
            continue
        # The line without its end: a CRLF file's "\r" is no part of the answer.
        line = data[start:end].decode("utf-8", "replace").removesuffix("\r")
        stripped = line.strip()
        if not 8 <= len(stripped) <= 100 or stripped.startswith(written.skipped_lines):
            continue
        prefix = data[first_line:start].decode("utf-8", "replace")
        if use.name in prefix:
            continue  # seen before in the function: the query would give the answer away
        # The query stops before the line's newline and the answer starts with it: a
        # tokenizer reads a newline and the indentation after it as one token, so a query
        # ending in a bare newline is a boundary the model never saw (it starts a new file).
        query = f"{written.line_comment(chunk.path)}\n{prefix}".removesuffix("\n")
        query = query.removesuffix("\r")
        if source.count(query) > max_query_tokens:
            return None  # later uses only make the query longer
        if source.tokens(target) > context_tokens // 2:
            continue
        related = _related(source, chunk, {target.id, chunk.id}, 2, context_tokens, rng)
        context = source.fill([target, *related], chunk, length(context_tokens, rng), rng,
                              chunk.language)
        return Task("code-qa", "", "completion", context, query, "\n" + line, item_name(chunk),
                    {"definition": item_name(target), "name": use.name})
    return None


def _recall_task(source: CodeSource, chunk: Chunk, context_tokens: int,
                 max_query_tokens: int, rng: random.Random) -> Task | None:
    """A line of a function that is in the context, asked for by the lines before it: a
    RepoQA-style lookup whose answer the context holds verbatim, so a model that reads its
    context (full prefill's, or a composed one) gets it right."""
    if source.tokens(chunk) > context_tokens // 2:
        return None
    data = source.data(chunk.path)
    written = syntax(chunk)
    start = data.rfind(b"\n", 0, chunk.start_byte) + 1
    lines = [line.removesuffix("\r") for line in
             data[start:chunk.end_byte].decode("utf-8", "replace").split("\n")]
    picks = [j for j in range(2, len(lines))
             if 8 <= len(lines[j].strip()) <= 100 and lines.count(lines[j]) == 1
             and not lines[j].strip().startswith(written.skipped_lines)]
    if not picks:
        return None
    j = picks[rng.randrange(len(picks))]
    # As in a completion, the query stops before the line's newline and the answer starts
    # with it.
    query = written.line_comment(chunk.path) + "\n" + "\n".join(lines[max(0, j - RECALL_LINES):j])
    if source.count(query) > max_query_tokens:
        return None
    related = _related(source, chunk, {chunk.id}, 2, context_tokens, rng)
    context = source.fill([chunk, *related], None, length(context_tokens, rng), rng,
                          chunk.language)
    return Task("code-qa", "", "recall", context, query, "\n" + lines[j], item_name(chunk),
                {"definition": item_name(chunk)})


RECALL_LINES = 4  # lines of the function before the one asked for: a cue, not the whole body
_CALLEE = re.compile(r"^[A-Za-z_]\w*(?:(?:\.|::)[A-Za-z_]\w*)*$")


def _returned(text: str) -> str:
    """The expression of a one-line ``return EXPR`` (its statement's ``;`` left out), or ""."""
    if not text.startswith("return ") or "\n" in text:
        return ""
    return text[len("return "):].strip().removesuffix(";").rstrip()


def _definition_task(source: CodeSource, chunk: Chunk, context_tokens: int,
                     max_query_tokens: int, rng: random.Random) -> Task | None:
    if source.tokens(chunk) > context_tokens // 2:
        return None
    data = source.data(chunk.path)
    written = syntax(chunk)
    name = written.qualified(chunk.qualname)
    defs = [a for a in chunk.anchors if a.kind == "def"]
    body = defs[0].end_byte if defs else chunk.start_byte
    questions = []
    returns = [a for a in chunk.anchors if a.kind == "return"]
    if len(returns) == 1:
        expr = _returned(data[returns[0].start_byte:returns[0].end_byte].decode("utf-8",
                                                                                  "replace"))
        if 2 <= len(expr) <= 60:
            questions.append(("returns", f"what does {name}() return?", f"{name}() returns",
                              expr))
    calls = sorted((a for a in chunk.anchors if a.kind == "call" and a.start_byte > body),
                   key=lambda a: a.start_byte)
    if calls:
        text = data[calls[0].start_byte:calls[0].end_byte].decode("utf-8", "replace")
        callee = text.split("(", 1)[0].strip()
        if _CALLEE.match(callee) and 3 <= len(callee) <= 40 and callee not in written.builtins:
            questions.append(("calls", f"which function does {name}() call first?",
                              f"{name}() first calls", callee))
    if not questions:
        return None
    kind, question, lead, answer = questions[rng.randrange(len(questions))]
    query = (written.line_comment(f"Question: in {chunk.path}, {question}") + "\n"
             + written.line_comment(f"Answer: {lead}"))
    related = _related(source, chunk, {chunk.id}, 2, context_tokens, rng)
    context = source.fill([chunk, *related], None, length(context_tokens, rng), rng,
                          chunk.language)
    return Task("code-qa", "", kind, context, query, " " + answer, item_name(chunk),
                {"definition": item_name(chunk)})


# -- rag -------------------------------------------------------------------------------------
_UNDERLINE = re.compile(r"^[*=\-~^]{3,}$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")


def python_trees(index) -> list[tuple[str, ast.Module]]:
    """The repository's Python files parsed, by path (a file that does not parse is left
    out): where its documentation is written."""
    reader = gitrepo.BlobReader(index.repo.path)
    trees = []
    for file in sorted(index.files(), key=lambda f: f.path):
        if file.language != "python":
            continue
        try:
            trees.append((file.path, ast.parse(reader.read(file))))
        except (SyntaxError, ValueError):
            continue
    return trees


def docstrings(index) -> list[tuple[str, list[tuple[str, str]]]]:
    """The documentation written in the repository's Python code: each file's docstrings
    (module, classes, functions, by qualified name) in source order, by path."""
    documents = []
    for path, tree in python_trees(index):
        found = list(_docstrings(tree, ""))
        if found:
            documents.append((path, found))
    return documents


def _docstrings(node, qualname: str):
    text = ast.get_docstring(node)
    if text:
        yield qualname or "module", text
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _docstrings(child, f"{qualname}.{child.name}" if qualname else child.name)


def doc_passages(index, passage_tokens: int = 256, count: Counter = approx_tokens
                 ) -> tuple[Passage, ...]:
    """The repository's docstrings cut into passages of about ``passage_tokens``, a file's
    together (the file is the passage's topic and title, each docstring headed by its name).

    Wrapped prose paragraphs are joined into one line each (code blocks and indented lists
    stay as they are), so a sentence is a plain substring of its passage.
    """
    passages = []
    for path, found in docstrings(index):
        paragraphs = []
        for qualname, text in found:
            paragraphs.append(f"{qualname}:")
            for block in re.split(r"\n\s*\n", text):
                rows = [r for r in block.splitlines() if not _UNDERLINE.match(r.strip())]
                if not any(r.strip() for r in rows):
                    continue
                if rows[0].startswith(" "):
                    paragraphs.append("\n".join(rows))  # a code block or an indented list
                else:
                    paragraphs.append(" ".join(" ".join(rows).split()))
        group: list[str] = []
        size = 0
        for paragraph in paragraphs:
            tokens = count(paragraph)
            if group and size + tokens > passage_tokens:
                passages.append(_passage(path, len(passages), group))
                group, size = [], 0
            group.append(paragraph)
            size += tokens
        if group:
            passages.append(_passage(path, len(passages), group))
    return tuple(passages)


def _passage(path: str, number: int, paragraphs: list[str]) -> Passage:
    return Passage(f"{path}\n\n" + "\n\n".join(paragraphs), f"{path}#{number}", ChunkKind.PASSAGE)


def _fill_passages(required: list[Passage], pool, context_tokens: int, count: Counter,
                   rng: random.Random, avoid: tuple[str, ...] = ()) -> list[Passage]:
    """``required`` plus random others of ``pool`` (none of another's topic, none holding a
    string of ``avoid``) up to ``context_tokens``, in random order."""
    items = list(required)
    total = sum(count(p.text) for p in items)
    chosen = {p.name for p in items}
    topics = {p.name.split("#")[0] for p in items}
    for _ in range(400):
        if total >= 0.9 * context_tokens:
            break
        candidate = pool[rng.randrange(len(pool))]
        if candidate.name in chosen or candidate.name.split("#")[0] in topics:
            continue
        if any(text in candidate.text for text in avoid):
            continue
        size = count(candidate.text)
        if total + size > context_tokens:
            continue
        items.append(candidate)
        chosen.add(candidate.name)
        total += size
    rng.shuffle(items)
    return items


def rag(index, n: int, seed: int, context_tokens: int, count: Counter = approx_tokens,
        passage_tokens: int | None = None, max_query_tokens: int = 256) -> list[Task]:
    rng = random.Random(f"rag:{seed}")
    passage_tokens = passage_tokens or max(96, min(384, context_tokens // 6))
    passages = list(doc_passages(index, passage_tokens, count))
    fitting = [p for p in passages if count(p.text) <= context_tokens // 2]
    order = list(range(len(fitting)))
    rng.shuffle(order)
    corpus = "\n".join(p.text for p in passages)
    tasks = []
    for position in order:
        if len(tasks) >= n:
            break
        passage = fitting[position]
        quote = _quote(passage, corpus, rng)
        if quote is None:
            continue
        start, rest = quote
        title = passage.text.split("\n", 1)[0]
        query = f"Quote from the documentation above ({title}):\n\"{start}"
        if count(query) > max_query_tokens:
            continue
        context = _fill_passages([passage], fitting, length(context_tokens, rng), count, rng,
                                 avoid=(start,))
        tasks.append(Task("rag", f"rag-{seed}-{len(tasks)}", "quote", context, query,
                          " " + rest, passage.name))
    return tasks


def _quote(passage: Passage, corpus: str, rng: random.Random) -> tuple[str, str] | None:
    """A sentence start found once in the whole documentation, and up to 8 words after it."""
    sentences = []
    for paragraph in passage.text.split("\n\n")[1:]:
        if paragraph.startswith(" ") or "\n" in paragraph:
            continue
        for sentence in _SENTENCE_END.split(paragraph):
            words = sentence.split(" ")
            if 10 <= len(words) <= 40 and ">>>" not in sentence and "::" not in sentence:
                sentences.append(words)
    rng.shuffle(sentences)
    for words in sentences:
        cut = rng.randrange(5, len(words) - 3)
        start, rest = " ".join(words[:cut]), " ".join(words[cut:cut + 8])
        if corpus.count(start) == 1:
            return start, rest
    return None


# -- tool-docs -------------------------------------------------------------------------------
def tool_passage(tool: Tool) -> Passage:
    return Passage(tool.text, f"{tool.path}::{tool.name}", ChunkKind.TOOL_DOC)


def _describe(description: str) -> str:
    """A tool's description up to its first sentence end or parenthesis: the question's words."""
    text = re.split(r"(?<=[a-z])\.\s|\s\(", description, maxsplit=1)[0].rstrip(".")
    return text[:120]


def tool_doc_tasks(index, n: int, seed: int, context_tokens: int, count: Counter = approx_tokens,
                   max_query_tokens: int = 256) -> list[Task]:
    """Which tool of a request's tools does what the question says in the words of its
    description; the tools are the repository's (``codekv.eval.tooldocs``). The answer is the
    name, inside the call the query opens (``Call: {"name": "``), as a model calling a tool
    writes it. The other tools of the context neither share the name nor hold the words."""
    rng = random.Random(f"tool-docs:{seed}")
    found = [tool for path, tree in python_trees(index) for tool in tools(path, tree)]
    fitting = [(tool, passage) for tool in found
               if count((passage := tool_passage(tool)).text) <= context_tokens // 2]
    pool = [passage for _, passage in fitting]
    times = collections.Counter(_describe(tool.description) for tool in found)
    candidates = [(tool, passage, words) for tool, passage in fitting
                  if len(words := _describe(tool.description)) >= 20 and times[words] == 1
                  and tool.name.lower() not in words.lower()]
    rng.shuffle(candidates)
    tasks = []
    for tool, passage, words in candidates:
        if len(tasks) >= n:
            break
        query = f"Question: which tool does this: \"{words}\"?\nCall: {{\"name\": \""
        if count(query) > max_query_tokens:
            continue
        # ``"name": "NAME"`` as the tool's compact JSON writes it: no other tool of that name
        context = _fill_passages([passage], pool, length(context_tokens, rng), count, rng,
                                 avoid=(words, json.dumps({"name": tool.name})[1:-1]))
        tasks.append(Task("tool-docs", f"tool-docs-{seed}-{len(tasks)}", "tool", context, query,
                          tool.name, passage.name))
    return tasks
