"""Throughput over an agent session: every method serves the same requests from a cold store."""

from __future__ import annotations

import pytest

from codekv.eval import throughput, workloads
from codekv.index import Index

FILES = {
    "util.py": "def helper(x):\n    return x + 1\n\n\ndef other(y):\n    return y * 3\n",
    "app.py": "from util import helper\n\n\ndef run(value):\n    return helper(value * 2)\n",
}


def _index(git_repo) -> Index:
    git_repo.commit(FILES)
    index = Index(git_repo.root)
    index.update(workers=1)
    return index


@pytest.fixture
def index(git_repo, byte_counter):
    return _index(git_repo)


def test_each_method_serves_the_session_and_reuses_shared_chunks(index, tiny_backend):
    backend = tiny_backend("llama", max_position_embeddings=4096)
    helper, other, run = "util.py::helper", "util.py::other", "app.py::run"
    requests = [[helper, run], [run, helper, other], [other, run]]
    rows = throughput.measure(backend, index, requests, [("full", 1.0), ("anchors", 0.15)])
    full, anchors = rows
    assert [r["method"] for r in rows] == ["full", "anchors@0.15"]
    assert full["requests"] == anchors["requests"] == 3
    assert full["tokens"] == anchors["tokens"]  # the same token sequences
    assert full["composed"] == 0 and full["store_bytes"] == 0
    assert anchors["composed"] == 3
    assert anchors["exact_prefix_hits"] == 2  # the system prompt, after the first request
    assert anchors["store_bytes"] > 0  # three distinct chunks, each stored once
    assert anchors["speedup"] == pytest.approx(anchors["requests_per_s"] / full["requests_per_s"])
    assert anchors["requests_per_s"] > 0 and anchors["median_ttft_s"] > 0
    assert anchors["peak_rss_mib"] is None  # not measurable in a process that did other work


@pytest.mark.model
def test_isolated_methods_measure_their_own_peak_memory(git_repo, default_backend):
    index = _index(git_repo)  # counted with the model's tokenizer, as the child process counts
    requests = [["util.py::helper", "app.py::run"], ["app.py::run", "util.py::helper"]]
    chunks = [[index.find(*name.split("::"))[0] for name in names] for names in requests]
    rows = throughput.measure_isolated(str(index.root), None, chunks,
                                       [("full", 1.0), ("none", 0.0)])
    full, none = rows
    assert full["tokens"] == none["tokens"] and none["composed"] == 2
    for row in rows:
        assert row["peak_rss_mib"] > row["peak_over_model_mib"] > 0  # the model is most of it


def test_session_requests_come_from_the_reuse_simulation(index):
    source = workloads.CodeSource(index, workloads.approx_tokens)
    requests = throughput.session_requests(source, seed=0, tasks=4, working_set=2)
    assert len(requests) == 4
    seen = set()
    for chunks in requests:
        names = [c.qualname for c in chunks]
        assert names and len(set(names)) == len(names)
        seen.update(names)
    # One file's definitions plus what they use: util.py's two, or app.py's run and helper.
    assert seen <= {"helper", "other"} or seen <= {"run", "helper"}
    assert throughput.session_requests(source, seed=0, tasks=4, working_set=24) == []
