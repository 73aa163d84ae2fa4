"""Coding-agent sessions in aider's and SWE-agent's shapes, and the ``agent-session`` workload
drawn from aider's.

A session (``aider_session``) is the requests aider sends over a few turns: its system prompt,
a repo map (each file's classes and functions, within a token budget as aider's
``--map-tokens``), the history (summarised beyond a budget, as aider does), the chat's files
re-sent whole in every call after the history, then the new turn. Each turn asks for a change
to one function, and its reply (a SEARCH/REPLACE block) is applied to the files the next call
re-sends: between calls the history grows, one function is edited and the files move. Every
other session of the workload also opens its system prompt with a header that changes on each
call (a request id and the time, as agents and their proxies write), so that nothing after it
is an exact prefix of the call before.

A task of ``agent-session`` is one call after a session's first, answered the way aider answers:
the reply is begun (the path, the fence and the SEARCH marker, then the lines of the function
the turn asks about before the one asked for, quoted from the file), and the answer is that
next line as the file has it, a lookup the model can do from its context. The composed side of a
task is the server's own pipeline serving the session's calls in order
(``codekv.eval.serving``), so the evidence measures what ``codekv serve`` reuses from the
scope's last prompt; the reference is full prefill of the same prompt tokens.
"""

from __future__ import annotations

import ast
import hashlib
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from codekv import gitrepo

TURNS = 6  # calls per generated session: the first is served, the others are tasks
MAP_TOKENS = 1024  # aider's default --map-tokens
HISTORY_CHARS = 3000  # history beyond this is summarised (aider: a share of the context)
RECALL_LINES = 4  # lines quoted before the one asked for (as code-qa's recall tasks)
ANSWER_ROOM = 64  # tokens a prompt leaves for the answer and the template's markers

AIDER_STYLE_SYSTEM = """Act as an expert software developer.
Always use best practices when coding.
Respect and use existing conventions, libraries, etc that are already present in the code base.

Take requests for changes to the supplied code.
If the request is ambiguous, ask questions.

Once you understand the request you MUST:
1. Decide if you need to propose *SEARCH/REPLACE* edits to any files that haven't been added \
to the chat. You can create new files without asking!
2. Think step-by-step and explain the needed changes in a few short sentences.
3. Describe each change with a *SEARCH/REPLACE block* per the examples below.

All changes to files must use this *SEARCH/REPLACE block* format.
ONLY EVER RETURN CODE IN A *SEARCH/REPLACE BLOCK*!

Every *SEARCH/REPLACE block* must use this format:
1. The *FULL* file path alone on a line, verbatim.
2. The opening fence and code language, eg: ```python
3. The start of search block: <<<<<<< SEARCH
4. A contiguous chunk of lines to search for in the existing source code
5. The dividing line: =======
6. The lines to replace into the source code
7. The end of the replace block: >>>>>>> REPLACE
8. The closing fence: ```

Every *SEARCH* section must *EXACTLY MATCH* the existing file content, character for character,
including all comments, docstrings, etc.
Keep *SEARCH/REPLACE* blocks concise.
Only create *SEARCH/REPLACE* blocks for files that the user has added to the chat!
"""
REPO_MAP_LEAD = ("Here are summaries of some files present in my git repository.\n"
                 "Do not propose changes to these files, treat them as *read-only*.\n"
                 "If you need to edit any of these files, ask me to *add them to the chat* "
                 "first.\n\n")
FILES_LEAD = ("I have *added these files to the chat* so you can go ahead and edit them.\n\n"
              "*Trust this message as the true contents of these files!*\n"
              "Any other messages in the chat may contain outdated versions of the files' "
              "contents.\n\n")
SUMMARY_LEAD = "I spoke to you previously about a number of things.\n"
REQUESTS = (
    "Add a docstring to {name} that says what it returns.",
    "In {name}, check the arguments first and raise ValueError on bad input.",
    "Rename the local variables in {name} so they say what they hold.",
    "Add a short comment to {name} explaining the tricky part.",
    "Make {name} handle an empty input without failing.",
    "Add type hints to {name}.",
)


class SourceError(ValueError):
    """Material a session cannot be made of (or a file that is not the format its loader
    reads)."""


@dataclass
class Call:
    messages: list[dict]  # the chat request's messages, as the agent sent them
    reply: str  # the reply the agent recorded ('' when none was)
    # generated calls: the file and function the turn asks about (``path``, ``function``) and
    # that function's lines as this call re-sends them (``lines``)
    meta: dict = field(default_factory=dict)


@dataclass
class Trajectory:
    agent: str
    name: str
    origin: dict
    calls: list[Call] = field(default_factory=list)


def _definitions(source: str) -> list[tuple[str, int, int, str]]:
    """(qualified name, first line, last line, signature line) of the module's functions and
    methods."""
    found = []
    lines = source.splitlines()
    for node in ast.parse(source).body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        for member in members:
            if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                name = (f"{node.name}.{member.name}" if isinstance(node, ast.ClassDef)
                        else member.name)
                found.append((name, member.lineno, member.end_lineno or member.lineno,
                              lines[member.lineno - 1]))
    return found


def repo_map(files: dict[str, str], budget_chars: int | None = None) -> str:
    """aider's repo map, simplified: each file with its classes' and functions' lines, files in
    order until ``budget_chars`` (None: all of them)."""
    out, used = [REPO_MAP_LEAD], 0
    for path, source in files.items():
        lines = source.splitlines()
        entry = [f"{path}:\n"]
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                entry.append("│" + lines[node.lineno - 1] + "\n")
                if isinstance(node, ast.ClassDef):
                    for member in node.body:
                        if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                            entry.append("│" + lines[member.lineno - 1] + "\n")
        entry.append("⋮\n")
        text = "".join(entry)
        if budget_chars is not None and used + len(text) > budget_chars:
            break
        out.append(text)
        used += len(text)
    return "".join(out)


def fenced_files(files: dict[str, str]) -> str:
    return FILES_LEAD + "".join(f"{path}\n````\n{text}````\n\n" for path, text in files.items())


def reply_start(path: str, name: str) -> str:
    """How aider's reply to a change of ``name`` begins, up to the SEARCH block's first line."""
    return f"To do this, I'll change `{name}` in `{path}`.\n\n{path}\n```python\n<<<<<<< SEARCH\n"


def aider_session(name: str, sources: dict[str, str], in_chat: list[str], turns: int = TURNS,
                  history_chars: int = HISTORY_CHARS, map_chars: int | None = None,
                  origin: dict | None = None, agent: str = "aider-generated",
                  volatile: bool = False) -> Trajectory:
    """An aider-style session: ``in_chat`` of ``sources`` (path: text) in the chat, ``sources``
    in the repo map (within ``map_chars``); each turn asks for a change to one function of a
    chat file, and its reply is applied to the files the next call re-sends. Once the history
    passes ``history_chars``, all but the last exchange is summarised, as aider does. With
    ``volatile``, the system prompt opens with a header of its own in each call."""
    sources = dict(sources)
    trajectory = Trajectory(agent, name, origin or {})
    done: list[dict] = []
    for turn in range(turns):
        path = in_chat[turn % len(in_chat)]
        definitions = _definitions(sources[path])
        function, line_no, last_no, line = definitions[(turn * 7) % len(definitions)]
        request = REQUESTS[turn % len(REQUESTS)].format(name=function)
        header = volatile_header(name, turn) if volatile else ""
        messages = [{"role": "system", "content": header + AIDER_STYLE_SYSTEM},
                    {"role": "user", "content": repo_map(sources, map_chars)},
                    {"role": "assistant", "content": "Ok, I won't try and edit those files "
                                                     "without asking first."},
                    *done,
                    {"role": "user", "content": fenced_files({p: sources[p] for p in in_chat})},
                    {"role": "assistant", "content": "Ok, any changes I propose will be to "
                                                     "those files."},
                    {"role": "user", "content": request}]
        indent = line[:len(line) - len(line.lstrip())] + "    "
        added = f"{indent}# {request.rstrip('.')} (turn {turn + 1})"
        reply = (reply_start(path, function) + f"{line}\n=======\n{line}\n{added}\n"
                 ">>>>>>> REPLACE\n```\n")
        lines = sources[path].splitlines(keepends=True)
        trajectory.calls.append(Call(messages, reply, {
            "path": path, "function": function,
            "lines": [text.rstrip("\r\n") for text in lines[line_no - 1:last_no]]}))
        lines.insert(line_no, added + "\n")  # the edit applied: the next call re-sends it
        sources[path] = "".join(lines)
        done += [{"role": "user", "content": request}, {"role": "assistant", "content": reply}]
        if sum(len(m["content"]) for m in done) > history_chars and len(done) > 2:
            asked = "\n".join(f"- {m['content']}" for m in done[:-2] if m["role"] == "user")
            done = [{"role": "user", "content": f"{SUMMARY_LEAD}You asked me to:\n{asked}\n"
                                                "I proposed SEARCH/REPLACE edits for each, "
                                                "and you applied them."},
                    {"role": "assistant", "content": "Ok."}, *done[-2:]]
    return trajectory


def volatile_header(session: str, turn: int) -> str:
    """A line that differs in every call: the session, a request id and the time sent."""
    request = hashlib.sha256(f"{session}:{turn}".encode()).hexdigest()[:8 + turn % 5]
    sent = datetime(2026, 12, 3, 9, 0, tzinfo=UTC) + timedelta(seconds=97 * turn + turn ** 3)
    return f"Session {session}, request {request}, sent {sent.isoformat()}.\n\n"


def generated_aider_session(root: Path, turns: int = TURNS, chat_files: int = 3,
                            max_file_chars: int = 7000, history_chars: int = HISTORY_CHARS,
                            volatile: bool = False,
                            map_chars: int | None = 4 * MAP_TOKENS) -> Trajectory:
    """An aider-style session over the Python files of ``root``: the largest ``chat_files``
    of those of at most ``max_file_chars`` are in the chat, the files in the repo map within
    ``map_chars`` (aider's default budget; None: every file); with ``volatile``, each call's
    system prompt opens with a header of its own."""
    root = Path(root)
    sources = {str(p.relative_to(root)): p.read_text(encoding="utf-8")
               for p in sorted(root.rglob("*.py")) if "test" not in p.name}
    sources = {p: t for p, t in sources.items() if t.strip()}
    candidates = sorted((p for p, t in sources.items() if len(t) <= max_file_chars
                         and _definitions(t)), key=lambda p: (len(sources[p]), p))
    if len(candidates) < chat_files:
        raise SourceError(f"{root}: fewer than {chat_files} Python files of at most "
                          f"{max_file_chars} characters with functions")
    in_chat = sorted(candidates[-chat_files:])  # the largest that fit: most to re-send
    origin = {"generated": "aider-style", "source": str(root), "turns": turns,
              "chat_files": in_chat, "volatile": volatile, "map_chars": map_chars}
    return aider_session(root.name, sources, in_chat, turns, history_chars, map_chars,
                         origin=origin, volatile=volatile)


# -- SWE-agent's shape ------------------------------------------------------------------------
SWE_STYLE_SYSTEM = """SETTING: You are an autonomous programmer, working in the command line \
with a special interface.

The interface has a file editor that shows you {window} lines of a file at a time. Besides the \
usual bash commands, you can use these commands to navigate and edit files:

open <path> [<line_number>]: opens the file at path in the editor; with line_number, the \
window moves to include that line
goto <line_number>: moves the window to show line_number
scroll_down: moves the window down {window} lines
scroll_up: moves the window up {window} lines
search_file <search_term> [<file>]: searches for search_term in file (default: the open file)
edit <start_line>:<end_line>
<replacement_text>
end_of_edit: replaces lines start_line through end_line (inclusive) of the open file with the \
replacement text, indented as the code needs
submit: submits your changes and ends the session

RESPONSE FORMAT:
Your shell prompt is formatted as follows:
(Open file: <path>) <cwd> $

Your output has two fields, a discussion and a command, EXACTLY as in this example:
DISCUSSION
First I'll use ls to see what files are in the current directory.
```
ls -a
```

Include a *SINGLE* command in the command field, then wait for the shell's response before \
you go on.
"""
SWE_ISSUE = """We're currently solving the following issue within our repository. Here's the \
issue text:
ISSUE:
{issue}

INSTRUCTIONS:
Now, you're going to solve this issue on your own. Edit the files you need to and run any \
checks you want. You can only enter one command at a time. When you're satisfied with your \
changes, submit them by running the submit command.

(Open file: n/a)
(Current directory: /{repo})
bash-$"""
SWE_KEPT = 5  # observations kept whole besides the issue (SWE-agent 0.x's Last5Observations)


def last_5_observations(history: list[dict]) -> list[dict]:
    """SWE-agent 0.x's ``Last5Observations`` history processor: the first observation (the
    issue) and the last five kept, every other one collapsed; demonstrations untouched."""
    observations = sum(1 for m in history if m["role"] == "user" and not m.get("is_demo"))
    out, seen = [], 0
    for message in history:
        if message["role"] != "user" or message.get("is_demo"):
            out.append(message)
            continue
        seen += 1
        if seen == 1 or seen > observations - SWE_KEPT:
            out.append(message)
        else:
            lines = len(message["content"].splitlines())
            out.append({**message, "content": f"Old output omitted ({lines} lines)"})
    return out


def file_window(repo: str, path: str, source: str, line: int, window: int) -> tuple[str, int]:
    """What SWE-agent's ``open path line`` shows: ``window`` numbered lines around ``line``,
    and the first of them."""
    lines = source.splitlines()
    first = max(1, min(line - window // 2, len(lines) - window + 1))
    last = min(len(lines), first + window - 1)
    shown = [f"[File: /{repo}/{path} ({len(lines)} lines total)]"]
    if first > 1:
        shown.append(f"({first - 1} more lines above)")
    shown += [f"{n}:{lines[n - 1]}" for n in range(first, last + 1)]
    if last < len(lines):
        shown.append(f"({len(lines) - last} more lines below)")
    shown += [f"(Open file: /{repo}/{path})", f"(Current directory: /{repo})", "bash-$"]
    return "\n".join(shown), first


def swe_agent_session(name: str, sources: dict[str, str], targets: list[tuple[str, str, int]],
                      turns: int = 10, window: int = 100, origin: dict | None = None,
                      agent: str = "swe-agent-generated") -> Trajectory:
    """A session in SWE-agent 0.x's shape: its system prompt and the issue, then each turn an
    action (``open`` a file of ``sources`` at a function of ``targets``: path, name, line)
    and its observation, a window of the file; every call sends the history with all but the
    last five observations collapsed, so that from the seventh call on a message in the middle
    shrinks and everything after it moves. Each reply first quotes four lines of the
    observation before the last (read from the context, as an agent re-reads), then acts."""
    trajectory = Trajectory(agent, name, origin or {})
    path, function, _ = targets[0]
    issue = f"`{function}` in `{path}` fails on an empty input; it should return early instead."
    history = [{"role": "system", "content": SWE_STYLE_SYSTEM.format(window=window)},
               {"role": "user", "content": SWE_ISSUE.format(issue=issue, repo=name)}]
    windows: list[tuple[str, int, list[str]]] = []  # each observation: path, first line, lines
    for turn in range(turns):
        path, function, line = targets[turn % len(targets)]
        recall = ""
        if len(windows) >= 2:
            seen, first, lines = windows[-2]
            at = len(lines) // 2
            quoted = "\n".join(f"{first + n}:{lines[n]}" for n in range(at, at + 4))
            recall = f"Lines {first + at}-{first + at + 3} of `{seen}` read:\n```\n{quoted}\n```\n"
        reply = (f"DISCUSSION\n{recall}Now let's look at `{function}` in `{path}`.\n```\n"
                 f"open {path} {line}\n```")
        trajectory.calls.append(Call(last_5_observations(history), reply,
                                     {"path": path, "function": function}))
        shown, first = file_window(name, path, sources[path], line, window)
        windows.append((path, first, sources[path].splitlines()[first - 1:first - 1 + window]))
        history += [{"role": "assistant", "content": reply}, {"role": "user", "content": shown}]
    return trajectory


def generated_swe_agent_session(root: Path, turns: int = 10, files: int = 4,
                                window: int = 100) -> Trajectory:
    """A session in SWE-agent's shape over the Python files of ``root``: the ``files``
    largest (not tests, with functions, at least ``window`` lines) opened in turn, each at one
    of its functions."""
    root = Path(root)
    sources = {str(p.relative_to(root)): p.read_text(encoding="utf-8")
               for p in sorted(root.rglob("*.py")) if "test" not in p.name}
    candidates = sorted((p for p, t in sources.items()
                         if len(t.splitlines()) >= window and _definitions(t)),
                        key=lambda p: (len(sources[p]), p))[-files:]
    if len(candidates) < files:
        raise SourceError(f"{root}: fewer than {files} Python files of {window}+ lines with "
                          "functions")
    targets = []
    for turn in range(turns):
        path = candidates[turn % files]
        definitions = _definitions(sources[path])
        function, line, _, _ = definitions[(turn * 7) % len(definitions)]
        targets.append((path, function, line))
    origin = {"generated": "swe-agent-style", "source": str(root), "turns": turns,
              "files": candidates, "window": window}
    return swe_agent_session(root.name, sources, targets, turns, window, origin)


# -- the agent-session workload -------------------------------------------------------------
@dataclass
class SessionPrompt:
    """One call as the eval serves it: the messages the agent sent, and the reply begun
    (``partial``: text after the assistant's turn opens; "" for a call that is not a task)."""

    messages: list[dict]
    partial: str = ""


def agent_session_tasks(n, seed, context_tokens, count, index, max_query_tokens,
                        languages=None, workload: str = "agent-session") -> list:
    """``n`` tasks (calls after each session's first) of sessions over the indexed
    repository's Python files, each session's prompts between half ``context_tokens`` and all
    of it."""
    from codekv.eval.workloads import Task, length

    if languages is not None and "python" not in languages:
        return []  # the sessions are generated from Python files
    rng = random.Random(f"agent-session:{seed}")
    files = _python_files(index, count, context_tokens)
    # what every call holds besides its files: the system prompt, the repo map, the history
    fixed = count(AIDER_STYLE_SYSTEM) + MAP_TOKENS + count("x" * HISTORY_CHARS) // 2 + 200
    tasks: list[Task] = []
    attempts = 0
    while len(tasks) < n and files and attempts < 4 * n:
        attempts += 1
        target = length(context_tokens, rng) - ANSWER_ROOM
        session = _session(files, target - fixed, rng, f"s{attempts}", attempts % 2 == 0)
        if session is None:
            continue
        prompts: list[SessionPrompt] = []
        for number, call in enumerate(session.calls):
            partial, answer = _recall(call, rng)
            asked = partial or ""
            if _tokens(call.messages, count) + count(asked) > context_tokens - ANSWER_ROOM:
                break  # the session outgrew the context: its later calls would too
            prompts.append(SessionPrompt(call.messages, asked if number else ""))
            if number == 0 or partial is None:
                continue
            tasks.append(Task(workload, f"{workload}-{seed}-{session.name}-{number}",
                              "recall", [], partial, answer, call.meta["path"],
                              {"language": "python", "session": session.name, "call": number,
                               "function": call.meta["function"],
                               "chat_files": session.origin["chat_files"],
                               "volatile": session.origin["volatile"]},
                              calls=list(prompts)))
            if len(tasks) == n:
                break
    return tasks


def _python_files(index, count, context_tokens: int) -> dict[str, tuple[str, int]]:
    """The repository's Python files that parse and have functions, not tests, of at most
    half ``context_tokens``: path -> (text, tokens)."""
    reader = gitrepo.BlobReader(index.repo.path)
    out = {}
    for file in sorted(index.files(), key=lambda f: f.path):
        if file.language != "python" or "test" in file.path.lower():
            continue
        text = reader.read(file).decode("utf-8", "replace")
        if not text.strip() or len(text) > 4 * context_tokens:
            continue
        try:
            if not _definitions(text):
                continue
        except (SyntaxError, ValueError):  # a file that does not parse: no session of it
            continue
        tokens = count(text)
        if tokens <= context_tokens // 2:
            out[file.path] = (text, tokens)
    return out


def _session(files: dict[str, tuple[str, int]], room: int, rng: random.Random,
             name: str, volatile: bool) -> Trajectory | None:
    """A session whose chat files come to about ``room`` tokens (what the system prompt, repo
    map and history leave of its target): drawn until they fill it; None when none fits."""
    paths = sorted(files)
    rng.shuffle(paths)
    in_chat, used = [], 0
    for path in paths:
        if used + files[path][1] <= room:
            in_chat.append(path)
            used += files[path][1]
        if len(in_chat) == 3 or room - used < 200:
            break
    if not in_chat:
        return None
    in_chat.sort()
    others = [p for p in paths if p not in in_chat][:60]
    sources = {p: files[p][0] for p in sorted(in_chat + others)}
    origin = {"generated": "aider-style", "chat_files": in_chat, "file_tokens": room,
              "volatile": volatile}
    return aider_session(name, sources, in_chat, map_chars=4 * MAP_TOKENS, origin=origin,
                         volatile=volatile)


def _recall(call: Call, rng: random.Random) -> tuple[str | None, str]:
    """The reply begun with up to ``RECALL_LINES`` lines of the turn's function, and the next
    line (from its newline on, where a tokenizer cuts); (None, "") when no line is a fair
    question (long enough, once in the function, not a comment)."""
    lines = call.meta["lines"]
    picks = [j for j in range(1, len(lines))
             if 8 <= len(lines[j].strip()) <= 100 and lines.count(lines[j]) == 1
             and not lines[j].strip().startswith("#")]
    if not picks:
        return None, ""
    j = picks[rng.randrange(len(picks))]
    quoted = "\n".join(lines[max(0, j - RECALL_LINES):j])
    return reply_start(call.meta["path"], call.meta["function"]) + quoted, "\n" + lines[j]


def _tokens(messages: list[dict], count) -> int:
    """About how many tokens a chat of ``messages`` renders to (a few per message for the
    template's markers)."""
    return sum(count(m["content"]) + 6 for m in messages)
