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
- ``swe-agent-generated``: no download: ``generated_swe_agent_session`` builds requests in
  SWE-agent 0.x's shape (its system prompt, the issue, then actions opening files and their
  windows as observations, all but the last five collapsed) from a real package's files.
- ``aider-generated``: no download: ``codekv.eval.sessions.generated_aider_session`` builds
  requests in aider's shape (system prompt, repo map, history summarised beyond a budget, the
  chat's files re-sent whole in every call after the history, then the new turn) from a real
  package's source files, each turn's reply an edit that the next call's files carry; the
  agent-session workload draws its sessions the same way.

Where a trajectory came from is kept with it (``origin``): repository, commit and path for
recorded ones, the source directory and settings for generated ones.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from codekv.eval.sessions import (  # noqa: F401 - the generated source's, and the formats'
    SUMMARY_LEAD,
    Call,
    SourceError,
    Trajectory,
    generated_aider_session,
    generated_swe_agent_session,
    last_5_observations,
)

AIDER, SWE_AGENT, SWE_AGENT_FULL, MINI_SWE_AGENT = (
    "aider", "swe-agent", "swe-agent-full", "mini-swe-agent")
RECORDED = (AIDER, SWE_AGENT, SWE_AGENT_FULL, MINI_SWE_AGENT)  # what ``load`` reads from a file
SESSION_GAP_S = 1800


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


# -- the command line's sources ----------------------------------------------------------------
def load(agent: str, path: Path, origin: dict, demos: bool = True) -> list[Trajectory]:
    """The trajectories of one recorded file of ``agent``'s format (``demos``: SWE-agent's)."""
    if agent == AIDER:
        return load_aider(path, origin)
    if agent in (SWE_AGENT, SWE_AGENT_FULL):
        return [load_swe_agent(path, origin, trim=agent == SWE_AGENT, demos=demos)]
    if agent == MINI_SWE_AGENT:
        return [load_mini_swe_agent(path, origin)]
    raise SourceError(f"unknown agent {agent!r}: expected one of {', '.join(RECORDED)}")
