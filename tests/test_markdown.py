"""The Markdown tables of docs/results.md, from a run's JSON or an unfinished run's checkpoint."""

from __future__ import annotations

import pytest
from fixtures.evidence import fake_measure

from codekv.eval import controls, markdown
from codekv.eval.results import aggregate


def test_markdown_splits_code_qa_by_repository_and_shows_conditioning_costs():
    measures = [fake_measure(method, delta, 1.0, workload="code-qa", task=task)
                for method, deltas in (("full", (0, 0, 0, 0)),
                                       ("query@0.15", (0.1, -0.1, 0.4, 0.2)),
                                       ("query+graph@0.15", (0.0, 0.1, 0.2, 0.2)))
                for task, delta in zip("abcd", deltas)]
    for m in measures:
        m.offline_prefill_s, m.offline_tokens = (2.0, 900) if "graph" in m.method else (1.0, 500)
    tasks = [{"id": task, "repo": "stdlib" if task in "ab" else "package:rich"} for task in "abcd"]
    data = {"results": [row.as_json() for row in aggregate(measures)], "tasks": tasks,
            "measures": [m.as_json() for m in measures]}
    by_repo = markdown.subset_tables(data)
    assert ("| repository: stdlib | query@0.15 | 2 | +0.000 [-0.100, +0.100] | "
            "0.100 [0.100, 0.100] | - |") in by_repo
    assert ("| repository: package:rich | query+graph@0.15 | 2 | +0.200 [+0.200, +0.200] |"
            in by_repo)
    assert "| code-qa | query+graph@0.15 | graph |" in markdown.conditioning_table(data)
    assert "| 2.00 | 900 |" in markdown.conditioning_table(data)
    one_repo = dict(data, tasks=[dict(t, repo="stdlib") for t in tasks])
    assert markdown.subset_tables(one_repo) == ""
    prefix_only = [r for r in data["results"] if r["conditioning"] == "prefix"]
    assert markdown.conditioning_table(dict(data, results=prefix_only)) == ""


def test_markdown_splits_agent_sessions_by_their_system_prompt_with_retention():
    # Full prefill solves every task; the rule keeps both with the header, one without.
    measures = [fake_measure("full", 0.0, 4.0, "agent-session", task, similarity=100.0)
                for task in "abcd"]
    measures += [fake_measure("none", delta, 1.0, "agent-session", task, similarity=similarity)
                 for task, delta, similarity in (("a", 0.01, 100.0), ("b", 0.03, 100.0),
                                                 ("c", 0.02, 100.0), ("d", 0.2, 50.0))]
    tasks = [{"id": task, "repo": "stdlib", "volatile": task in "ab"} for task in "abcd"]
    table = markdown.subset_tables({"tasks": tasks, "measures": [m.as_json() for m in measures]})
    assert ("| system prompt: a header of its own each call | none | 2 | +0.020 [+0.010, +0.030] "
            "| 0.020 [0.010, 0.030] | 1.00 [0.34, 1.00] of 2 |") in table
    assert "| system prompt: the same each call | none | 2 | +0.110 " in table
    assert "| 0.50 [0.09, 0.91] of 2 |" in table
    assert "repository:" not in table  # one repository: no split by it


def test_markdown_reads_an_unfinished_runs_checkpoint(tmp_path):
    from codekv.eval.checkpoint import Checkpoint

    checkpoint = Checkpoint(tmp_path / "run.jsonl", {"tasks": 100})
    for task, delta in (("stdlib/code-qa-0-0", 0.1), ("rich/code-qa-0-1", -0.3)):
        checkpoint.add(task, [fake_measure("full", 0.0, 4.0, "code-qa", task),
                              fake_measure("query@0.15", delta, 1.0, "code-qa", task)], "d")
    data = markdown.from_checkpoint(str(tmp_path / "run.jsonl"))
    assert data["command"].startswith("the 2 finished tasks of a checkpoint")
    [query] = [r for r in data["results"] if r["method"] == "query@0.15"]
    assert query["tasks"] == 2 and query["delta_nll"] == pytest.approx(-0.1)
    assert "| repository: rich | query@0.15 | 1 | -0.300 |" in markdown.subset_tables(data)


def test_markdown_refuses_a_damaged_checkpoint(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    path.write_text('{"config": {}}\nnot a record\n{"task": "t1", "measures": []}\n')
    with pytest.raises(SystemExit) as exit:
        markdown.main(["--checkpoint", str(path)])
    assert exit.value.code == 2
    assert "run.jsonl, line 2: not a finished task's record" in capsys.readouterr().err


@pytest.mark.parametrize("text, says", [
    (None, "No such file or directory"),
    ("{not json", "not a results file (not JSON"),
    ('{"results": []}', "not a results file (no list of measures)"),
])
@pytest.mark.parametrize("tool", [markdown, controls])
def test_the_tools_refuse_what_is_not_a_results_file(tmp_path, capsys, tool, text, says):
    path = tmp_path / "run.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit:
        tool.main([str(path)])
    assert exit.value.code == 2 and says in capsys.readouterr().err
