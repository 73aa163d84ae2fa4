"""The replay benchmark's loaders: each recorded format becomes the chat requests the agent
sent, and the generated sessions have aider's and SWE-agent's shapes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import replay_sources as rs  # noqa: E402

AIDER_LOG = """TO LLM 2025-01-31T11:21:36
-------
SYSTEM Act as an expert.
SYSTEM 
SYSTEM Be brief.
-------
USER fix this
LLM RESPONSE 2025-01-31T11:21:41
ASSISTANT Done.
ASSISTANT 
ASSISTANT Really.
TO LLM 2025-01-31T11:23:00
-------
SYSTEM Act as an expert.
-------
USER fix this
-------
ASSISTANT Done.
-------
USER and that
LLM RESPONSE 2025-01-31T11:23:07
ASSISTANT Ok.
TO LLM 2025-01-31T15:00:00
-------
USER a new day
"""


def test_aider_log_is_split_into_sessions_of_requests_and_replies(tmp_path):
    log = tmp_path / ".aider.llm.history"
    log.write_text(AIDER_LOG)
    first, second = rs.load_aider(log, {"repository": "r"})
    assert [c.messages for c in first.calls] == [
        [{"role": "system", "content": "Act as an expert.\n\nBe brief."},
         {"role": "user", "content": "fix this"}],
        [{"role": "system", "content": "Act as an expert."},
         {"role": "user", "content": "fix this"},
         {"role": "assistant", "content": "Done."},
         {"role": "user", "content": "and that"}]]
    assert [c.reply for c in first.calls] == ["Done.\n\nReally.", "Ok."]
    # More than half an hour later: another session, its reply never recorded.
    assert second.calls[0].messages == [{"role": "user", "content": "a new day"}]
    assert second.calls[0].reply == "" and second.origin["session_started"].startswith("2025")


def test_a_file_of_another_format_is_refused(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    with pytest.raises(rs.SourceError, match="not an aider LLM history"):
        rs.load_aider(other, {})
    with pytest.raises(rs.SourceError, match="not a SWE-agent"):
        other.write_text("[]")
        rs.load_swe_agent(other, {})


def swe_history(observations: int) -> list[dict]:
    history = [{"role": "system", "content": "sys", "agent": "primary"},
               {"role": "user", "content": "demo", "is_demo": True, "agent": "primary"}]
    for i in range(observations):
        history.append({"role": "user", "content": f"obs {i}\nline", "agent": "primary"})
        history.append({"role": "assistant", "content": f"act {i}", "agent": "primary"})
    return history


def test_last_5_observations_keeps_the_issue_and_the_last_five():
    kept = rs.last_5_observations(swe_history(8))
    observations = [m["content"] for m in kept if m["role"] == "user" and not m.get("is_demo")]
    assert observations == ["obs 0\nline", "Old output omitted (2 lines)",
                            "Old output omitted (2 lines)", "obs 3\nline", "obs 4\nline",
                            "obs 5\nline", "obs 6\nline", "obs 7\nline"]


def test_swe_agent_calls_are_the_trimmed_history_before_each_action(tmp_path):
    path = tmp_path / "x.traj"
    path.write_text(json.dumps({"history": swe_history(8)}))
    trimmed = rs.load_swe_agent(path, {})
    assert len(trimmed.calls) == 8 and trimmed.calls[7].reply == "act 7"
    assert "Old output omitted (2 lines)" in [m["content"] for m in trimmed.calls[7].messages]
    full = rs.load_swe_agent(path, {}, trim=False, demos=False)
    assert full.agent == rs.SWE_AGENT_FULL
    last = full.calls[7].messages
    assert "demo" not in [m["content"] for m in last] and len(last) == 1 + 8 + 7
    # Without trimming, each call's messages extend the previous call's: append-only.
    for before, after in zip(full.calls, full.calls[1:]):
        assert after.messages[:len(before.messages)] == before.messages


def test_mini_swe_agent_calls_keep_tool_calls_and_replies_carry_the_commands(tmp_path):
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "<pr_description>fix</pr_description>"},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [call],
                 "function_call": None, "extra": {"actions": []}},
                {"role": "tool", "content": "<returncode>0</returncode>",
                 "tool_call_id": "call_1"},
                {"role": "assistant", "content": "Done.", "tool_calls": None}]
    path = tmp_path / "a__b-1.traj.json"
    path.write_text(json.dumps({"info": {"mini_version": "2.2.7"}, "messages": messages}))
    trajectory = rs.load_mini_swe_agent(path, {})
    assert trajectory.name == "a__b-1" and len(trajectory.calls) == 2
    assert trajectory.calls[0].reply == "Let me look.\n{\"command\": \"ls\"}"
    sent = trajectory.calls[1].messages
    assert sent[2] == {"role": "assistant", "content": "Let me look.", "tool_calls": [call]}
    assert sent[3] == {"role": "tool", "content": "<returncode>0</returncode>",
                       "tool_call_id": "call_1"}


def test_generated_session_has_aiders_shape(tmp_path):
    for name, count in (("a.py", 2), ("b.py", 3), ("c.py", 4), ("big.py", 400)):
        (tmp_path / name).write_text("".join(f"def f{i}(x):\n    return x + {i}\n\n"
                                             for i in range(count)))
    session = rs.generated_aider_session(tmp_path, turns=5, chat_files=2, max_file_chars=200,
                                         history_chars=400)
    assert session.origin["chat_files"] == ["b.py", "c.py"]  # the largest that fit
    roles = [[m["role"] for m in call.messages] for call in session.calls]
    assert all(r[:3] == ["system", "user", "assistant"] and r[-3:] == ["user", "assistant",
                                                                        "user"] for r in roles)
    for turn, call in enumerate(session.calls):
        repo_map, files = call.messages[1]["content"], call.messages[-3]["content"]
        assert "a.py:" in repo_map and "big.py" not in repo_map  # within aider's map budget
        assert "b.py\n````\n" in files and "c.py\n````\n" in files and "big.py" not in files
        # Each reply's edit is in the files the next call re-sends, not before.
        added = call.reply.split("=======\n")[1].split("\n")[1]
        assert added not in files
        if turn + 1 < len(session.calls):
            assert added in session.calls[turn + 1].messages[-3]["content"]
    # The history grows before the files, then is summarised past its budget.
    assert len(session.calls[1].messages) == len(session.calls[0].messages) + 2
    assert any(m["content"].startswith(rs.SUMMARY_LEAD) for m in session.calls[-1].messages)
    whole = rs.generated_aider_session(tmp_path, turns=1, chat_files=2, max_file_chars=200,
                                       map_chars=None)
    assert "def f399(x):" in whole.calls[0].messages[1]["content"]  # every file in the map


def test_generated_swe_agent_session_collapses_a_middle_observation_from_the_seventh_call(
        tmp_path):
    for name, count in (("a.py", 20), ("b.py", 30), ("c.py", 40), ("small.py", 2)):
        (tmp_path / name).write_text("".join(f"def f{i}(x):\n    return x + {i}\n\n"
                                             for i in range(count)))
    session = rs.generated_swe_agent_session(tmp_path, turns=9, files=3, window=12)
    assert session.origin["files"] == ["a.py", "b.py", "c.py"]  # "small.py" is under a window
    calls = session.calls
    for turn, call in enumerate(calls):
        roles = [m["role"] for m in call.messages]
        assert roles == ["system", "user"] + ["assistant", "user"] * turn
        observations = [m["content"] for m in call.messages[3::2]]
        collapsed = [o.startswith("Old output omitted") for o in observations]
        assert collapsed == [n < turn - 5 for n in range(turn)]  # all but the last five
        assert all(o.startswith("[File: /") and len(o.splitlines()) >= 12 + 3
                   for o, gone in zip(observations, collapsed) if not gone)
        # The reply quotes the observation before the last, which the call holds whole.
        if turn >= 2:
            quoted = call.reply.split("```\n")[1].splitlines()
            assert len(quoted) == 4 and all(line in observations[-2].splitlines()
                                            for line in quoted)
        # What it opens is the next call's last observation.
        if turn + 1 < len(calls):
            assert f"open {call.meta['path']} " in call.reply
            assert calls[turn + 1].messages[-1]["content"].startswith(
                f"[File: /{tmp_path.name}/{call.meta['path']} (")
    # Up to the sixth call each prompt extends the last; then a message in the middle shrinks
    # and everything after it is the last prompt's, moved.
    for before, after in zip(calls[:6], calls[1:6]):
        assert after.messages[:len(before.messages)] == before.messages
    before, after = calls[6].messages, calls[7].messages  # the second observation collapses
    assert after[5]["content"].startswith("Old output omitted")
    assert not before[5]["content"].startswith("Old output omitted")
    assert after[:5] == before[:5] and after[6:len(before)] == before[6:]


def row(mode, call, status, parts, nll, ttft=1.0):
    report = dict(zip(("exact_prefix_tokens", "reused_tokens", "recomputed_tokens",
                       "prefilled_tokens"), parts), status=status, prompt_tokens=sum(parts),
                  stored_tokens=0, continuation_nll=nll)
    return {"mode": mode, "agent": "aider", "trajectory": "t", "call": call, "ttft_s": ttft,
            "e2e_s": ttft + 1, "codekv": report}


def test_summary_shares_through_model_and_paired_delta_nll():
    import bench_serve

    rows = [row("exact-only", 0, "full-prefill", (0, 0, 0, 100), [1.0, 1.0], ttft=4.0),
            row("exact-only", 1, "exact-prefix", (50, 0, 0, 50), [2.0, 2.0], ttft=2.0),
            row("exact-only", 2, "exact-prefix", (50, 0, 0, 50), [1.0, 3.0], ttft=2.0),
            {"mode": "exact-only", "agent": "aider", "trajectory": "t", "call": 3,
             "error": "context_length_exceeded"},
            row("compose", 0, "full-prefill", (0, 0, 0, 100), [1.0, 1.0], ttft=4.0),
            row("compose", 1, "composed", (50, 40, 5, 5), [2.5, 2.5], ttft=1.0),
            row("compose", 2, "composed", (50, 40, 5, 5), [1.0, 2.0], ttft=1.0)]
    exact, compose = bench_serve.summarize(rows, nll_tokens=2)
    assert (exact["calls"], exact["skipped_too_long"]) == (3, 1)
    assert exact["through_model_tokens"] == 200 and compose["through_model_tokens"] == 120
    assert compose["share_reused"] == pytest.approx(80 / 300)
    assert compose["share_exact_prefix"] == pytest.approx(100 / 300)
    # ΔNLL over the composed calls only, each against the same call in exact-only:
    # call 1: 2.5 - 2.0, call 2: 1.5 - 2.0.
    assert compose["delta_nll_calls"] == 2 and compose["delta_nll"] == pytest.approx(0.0)
    assert compose["ttft_median_s"] == 1.0 and exact["ttft_median_s"] == 2.0
    table = bench_serve.table([exact, compose])
    assert "| aider | compose | 3 (1) |" in table and "(0.60x)" in table


def test_the_peer_counts_its_cache_and_greedy_replies_are_compared_call_by_call():
    import bench_serve

    plain = bench_serve.peer_report({"cache_n": 30, "prompt_n": 70}, "llama-server")
    shifted = bench_serve.peer_report({"cache_n": 30, "prompt_n": 70}, "llama-server-reuse")
    assert plain["prompt_tokens"] == shifted["prompt_tokens"] == 100
    assert (plain["exact_prefix_tokens"], plain["reused_tokens"]) == (30, 0)
    assert (shifted["exact_prefix_tokens"], shifted["reused_tokens"]) == (0, 30)
    rows = []
    for mode, report, replies in (
            ("exact-only", {"status": "full-prefill", "prompt_tokens": 100,
                            "exact_prefix_tokens": 0, "reused_tokens": 0,
                            "recomputed_tokens": 0, "prefilled_tokens": 100},
             ["a b", "c d", "e f"]),
            ("llama-server", plain, ["a b", "c x", "e f"])):
        for call, reply in enumerate(replies):
            rows.append({"mode": mode, "agent": "aider", "trajectory": "t", "call": call,
                         "ttft_s": 1.0, "e2e_s": 2.0, "codekv": report, "reply": reply})
    exact, peer = bench_serve.summarize(rows, nll_tokens=2)
    assert (exact["same_reply"], exact["replies_compared"]) == (3, 3)
    assert (peer["same_reply"], peer["replies_compared"]) == (2, 3)
    assert peer["through_model_tokens"] == 210 and peer["share_exact_prefix"] == 0.3
    assert "| 2 of 3 |" in bench_serve.table([exact, peer])
