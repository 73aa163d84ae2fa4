"""Recorded coding-agent prompts as OpenAI chat requests, for ``bench_serve.py`` to replay.

Each loader turns one recorded format into trajectories: a trajectory is one agent session, a
list of calls, each the ``messages`` of the chat request the agent sent and the reply it got.

- ``aider``: an aider ``--llm-history-file`` log (``.aider.llm.history``): every request aider
  sent, verbatim, and each reply. A log is appended to across runs: calls more than
  ``SESSION_GAP_S`` apart start a new session.
- ``swe-agent``: a SWE-agent 0.x ``.traj`` (``history``: every message of the run). The
  prompt of each model call is rebuilt as the agent built it: the history so far with
  ``Last5Observations`` applied (observations older than the last five, except the first, the
  issue, collapsed to "Old output omitted (N lines)"); ``swe-agent-full`` keeps every
  observation (no trimming: an append-only trace).
- ``mini-swe-agent``: a mini-swe-agent 2.x ``.traj.json`` (``messages``: the whole
  conversation; each call sent all messages so far, append-only).
- ``aider-generated``: no download: ``generated_aider_session`` builds requests in aider's shape
  (system prompt, repo map, history summarised beyond a budget, the chat's files re-sent whole
  in every call after the history, then the new turn) from a real package's source files, each
  turn's reply an edit that the next call's files carry.

Where a trajectory came from is kept with it (``origin``): repository, commit and path for
recorded ones, the source directory and settings for generated ones.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

AIDER, SWE_AGENT, SWE_AGENT_FULL, MINI_SWE_AGENT, AIDER_GENERATED = (
    "aider", "swe-agent", "swe-agent-full", "mini-swe-agent", "aider-generated")
SOURCES = (AIDER, SWE_AGENT, SWE_AGENT_FULL, MINI_SWE_AGENT, AIDER_GENERATED)
SESSION_GAP_S = 1800


@dataclass
class Call:
    messages: list[dict]  # the chat request's messages, as the agent sent them
    reply: str  # the reply the agent recorded ('' when none was)


@dataclass
class Trajectory:
    agent: str
    name: str
    origin: dict
    calls: list[Call] = field(default_factory=list)


class SourceError(ValueError):
    """A file that is not the format its loader reads."""


# -- aider -------------------------------------------------------------------------------------
_AIDER_HEADER = re.compile(r"^(TO LLM|LLM RESPONSE) (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)$", re.M)
_AIDER_ROLES = {"SYSTEM": "system", "USER": "user", "ASSISTANT": "assistant"}


def _aider_lines(block: str) -> tuple[str, str]:
    """(role, content) of one message as aider's ``format_messages`` wrote it: every line of
    the content prefixed with the upper-case role and a space."""
    role, lines = None, []
    for line in block.split("\n"):
        name, _, text = line.partition(" ")
        if name not in _AIDER_ROLES or (role is not None and _AIDER_ROLES[name] != role):
            raise SourceError(f"not an aider message line: {line[:80]!r}")
        role = _AIDER_ROLES[name]
        lines.append(text)
    if role is None:
        raise SourceError("an empty aider message")
    return role, "\n".join(lines)


def load_aider(path: Path, origin: dict, gap_s: int = SESSION_GAP_S) -> list[Trajectory]:
    """The sessions of an aider ``--llm-history-file`` log."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    heads = list(_AIDER_HEADER.finditer(text))
    if not heads:
        raise SourceError(f"{path}: no 'TO LLM <time>' entries: not an aider LLM history")
    sessions: list[Trajectory] = []
    last = None
    for index, head in enumerate(heads):
        end = heads[index + 1].start() if index + 1 < len(heads) else len(text)
        body = text[head.end() + 1:end].rstrip("\n")
        when = datetime.fromisoformat(head.group(2))
        if head.group(1) == "LLM RESPONSE":
            if sessions and sessions[-1].calls and not sessions[-1].calls[-1].reply:
                role, content = _aider_lines(body) if body else ("assistant", "")
                sessions[-1].calls[-1].reply = content
            continue
        blocks = [b for b in body.split("-------\n") if b.strip("\n")]
        messages = [dict(zip(("role", "content"), _aider_lines(b.rstrip("\n"))))
                    for b in blocks]
        if last is None or (when - last).total_seconds() > gap_s:
            sessions.append(Trajectory(AIDER, f"{Path(path).name}#{len(sessions) + 1}",
                                       {**origin, "session_started": head.group(2)}))
        sessions[-1].calls.append(Call(messages, ""))
        last = when
    return sessions


# -- SWE-agent 0.x -----------------------------------------------------------------------------
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
        if seen == 1 or seen > observations - 5:
            out.append(message)
        else:
            lines = len(message["content"].splitlines())
            out.append({**message, "content": f"Old output omitted ({lines} lines)"})
    return out


def load_swe_agent(path: Path, origin: dict, trim: bool = True, demos: bool = True
                   ) -> Trajectory:
    """Its calls; without ``demos``, the demonstration (about 5K tokens, which with the system
    prompt already exceeds an 8K context) is left out of every prompt."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    history = data.get("history") if isinstance(data, dict) else None
    if not isinstance(history, list):
        raise SourceError(f"{path}: no 'history' list: not a SWE-agent 0.x trajectory")
    history = [m for m in history if m.get("agent", "primary") == "primary"
               and (demos or not m.get("is_demo"))]
    trajectory = Trajectory(SWE_AGENT if trim else SWE_AGENT_FULL,
                            Path(path).name.removesuffix(".traj"), origin)
    for index, message in enumerate(history):
        if message["role"] != "assistant":
            continue
        sent = last_5_observations(history[:index]) if trim else history[:index]
        trajectory.calls.append(Call([{"role": m["role"], "content": m["content"]}
                                      for m in sent], message["content"]))
    return trajectory


# -- mini-swe-agent 2.x ------------------------------------------------------------------------
def _mini_reply(message: dict) -> str:
    """An assistant message's text, then its tool calls' arguments (what the model wrote)."""
    parts = [message.get("content") or ""]
    for call in message.get("tool_calls") or []:
        parts.append(call.get("function", {}).get("arguments", ""))
    return "\n".join(p for p in parts if p)


def load_mini_swe_agent(path: Path, origin: dict) -> Trajectory:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    messages = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(messages, list):
        raise SourceError(f"{path}: no 'messages' list: not a mini-swe-agent trajectory")
    name = Path(path).name.removesuffix(".traj.json")
    trajectory = Trajectory(MINI_SWE_AGENT, name, origin)
    keep = ("role", "content", "tool_calls", "tool_call_id")
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        sent = [{k: m[k] for k in keep if m.get(k) is not None} for m in messages[:index]]
        trajectory.calls.append(Call(sent, _mini_reply(message)))
    return trajectory


# -- aider-style, generated ----------------------------------------------------------------------
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


def _definitions(source: str) -> list[tuple[str, int, str]]:
    """(qualified name, line, signature line) of the module's functions and methods."""
    found = []
    for node in ast.parse(source).body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        for member in members:
            if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                name = (f"{node.name}.{member.name}" if isinstance(node, ast.ClassDef)
                        else member.name)
                line = source.splitlines()[member.lineno - 1]
                found.append((name, member.lineno, line))
    return found


def _repo_map(files: dict[str, str]) -> str:
    """aider's repo map, simplified: each file with its classes' and functions' lines."""
    out = [REPO_MAP_LEAD]
    for path, source in files.items():
        out.append(f"{path}:\n")
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                out.append("│" + source.splitlines()[node.lineno - 1] + "\n")
                if isinstance(node, ast.ClassDef):
                    for member in node.body:
                        if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                            out.append("│" + source.splitlines()[member.lineno - 1] + "\n")
        out.append("⋮\n")
    return "".join(out)


def _fenced_files(files: dict[str, str]) -> str:
    return FILES_LEAD + "".join(f"{path}\n````\n{text}````\n\n" for path, text in files.items())


def generated_aider_session(root: Path, turns: int = 6, chat_files: int = 3,
                            max_file_chars: int = 7000, history_chars: int = 3000
                            ) -> Trajectory:
    """An aider-style session over the Python files of ``root``: the smallest
    ``chat_files`` of them (each at most ``max_file_chars``) are in the chat, every file is in
    the repo map; each turn asks for a change to one function, and its reply (a SEARCH/REPLACE
    block) is applied to the files the next call re-sends. Once the history passes
    ``history_chars``, all but the last exchange is summarised, as aider does."""
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
              "chat_files": in_chat}
    trajectory = Trajectory(AIDER_GENERATED, root.name, origin)
    done: list[dict] = []
    for turn in range(turns):
        path = in_chat[turn % len(in_chat)]
        definitions = _definitions(sources[path])
        name, line_no, line = definitions[(turn * 7) % len(definitions)]
        request = REQUESTS[turn % len(REQUESTS)].format(name=name)
        messages = [{"role": "system", "content": AIDER_STYLE_SYSTEM},
                    {"role": "user", "content": _repo_map(sources)},
                    {"role": "assistant", "content": "Ok, I won't try and edit those files "
                                                     "without asking first."},
                    *done,
                    {"role": "user", "content": _fenced_files({p: sources[p] for p in in_chat})},
                    {"role": "assistant", "content": "Ok, any changes I propose will be to "
                                                     "those files."},
                    {"role": "user", "content": request}]
        indent = line[:len(line) - len(line.lstrip())] + "    "
        added = f"{indent}# {request.rstrip('.')} (turn {turn + 1})"
        reply = (f"To do this, I'll change `{name}` in `{path}`.\n\n{path}\n```python\n"
                 f"<<<<<<< SEARCH\n{line}\n=======\n{line}\n{added}\n>>>>>>> REPLACE\n```\n")
        trajectory.calls.append(Call(messages, reply))
        lines = sources[path].splitlines(keepends=True)
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


# -- the command line's sources ----------------------------------------------------------------
def load(agent: str, path: Path, origin: dict, demos: bool = True) -> list[Trajectory]:
    """The trajectories of one recorded file of ``agent``'s format (``demos``: SWE-agent's)."""
    if agent == AIDER:
        return load_aider(path, origin)
    if agent in (SWE_AGENT, SWE_AGENT_FULL):
        return [load_swe_agent(path, origin, trim=agent == SWE_AGENT, demos=demos)]
    if agent == MINI_SWE_AGENT:
        return [load_mini_swe_agent(path, origin)]
    raise SourceError(f"unknown agent {agent!r}: expected one of {', '.join(SOURCES[:-1])}")
