"""End to end on the real default model: composition against full prefill on real code."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from codekv.cli import main
from codekv.compose import COMPOSED, Composer
from codekv.index import Index
from codekv.stdlib_repo import stdlib_dir

pytestmark = pytest.mark.model

FILES = ("shlex.py", "fnmatch.py")
QUERY = "# Question: which function above splits a string like a shell?\n# Answer:"


@pytest.fixture
def stdlib_repo(git_repo):
    git_repo.commit({name: (stdlib_dir() / name).read_bytes() for name in FILES})
    return git_repo


@pytest.fixture
def composer(stdlib_repo, default_backend):
    index = Index(stdlib_repo.root)
    index.update()
    return Composer(default_backend, index, experimental=True)


CHUNKS = ["fnmatch.py::filter", "shlex.py::split", "shlex.py::quote"]


def test_all_equals_full_prefill_on_real_code(composer):
    full = composer.full_prefill(CHUNKS, QUERY)
    composed = composer.compose(CHUNKS, QUERY, strategy="all")
    assert composed.status == COMPOSED
    assert composed.report.recompute_ratio == 1.0
    assert composed.token_ids == full.token_ids
    diff = (composed.next_token_logits() - full.next_token_logits()).abs().max().item()
    assert diff <= 1e-4
    assert composed.generate(4) == full.generate(4)


def test_reused_chunks_are_read_back_and_recomputed(composer):
    naive = composer.compose(CHUNKS, QUERY, strategy="none")
    boundary = composer.compose(CHUNKS, QUERY, strategy="boundary", ratio=0.15)
    assert naive.report.chunk_misses == len(CHUNKS)
    assert boundary.report.chunk_hits == len(CHUNKS)
    assert 0 < boundary.report.recomputed_tokens <= 0.15 * boundary.report.context_tokens + 1
    # Quality against full prefill is the evaluation's business (one sample proves nothing);
    # here: the recompute really changed the state the reused KV alone gave.
    difference = (boundary.next_token_logits() - naive.next_token_logits()).abs().max()
    assert difference > 1e-3


def test_chunk_token_counts_come_from_the_real_tokenizer(stdlib_repo, default_backend):
    index = Index(stdlib_repo.root, budget=256)
    index.update()
    chunks = index.chunks()
    for chunk in chunks:
        alone = len(default_backend.tokenize(index.text(chunk).decode()))
        # Counted inside the file's tokenization: a token may straddle the chunk's edge.
        assert abs(chunk.n_tokens - alone) <= 2
    assert sum(c.n_tokens > 256 for c in chunks) <= len(chunks) // 10


def test_cli_compose_json_check(stdlib_repo, default_backend):
    result = CliRunner().invoke(
        main,
        [
            "compose", str(stdlib_repo.root), "--chunk", "shlex.py::split",
            "--chunk", "fnmatch.py::filter", "--query", QUERY, "--strategy", "all",
            "--max-new-tokens", "4", "--check", "--experimental", "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    output = json.loads(result.output.strip().splitlines()[-1])
    assert output["status"] == "composed"
    assert {"total_tokens", "recomputed_tokens", "ttft_s", "fallback_reason"} <= set(
        output["report"]
    )
    assert output["check"]["max_logit_diff"] <= 1e-4
    assert output["check"]["top1_agree"] is True
    assert isinstance(output["answer"], str)


def test_cli_compose_without_evidence_falls_back(stdlib_repo, default_backend, tmp_path,
                                                 monkeypatch):
    monkeypatch.setenv("CODEKV_SUPPORT", str(tmp_path / "support.json"))
    (tmp_path / "support.json").write_text(json.dumps({"entries": []}))
    result = CliRunner().invoke(
        main,
        ["compose", str(stdlib_repo.root), "--chunk", "shlex.py::split", "--query", QUERY,
         "--max-new-tokens", "2", "--json"],
    )
    assert result.exit_code == 0, result.output
    output = json.loads(result.output.strip().splitlines()[-1])
    assert output["status"] == "full-prefill"
    assert output["report"]["fallback_reason"].startswith("unsupported")


def test_the_shipped_support_file_decides_what_composes(stdlib_repo, default_backend, tmp_path):
    """With the support file codekv ships (from the documented evidence runs) and no options,
    each workload composes with the rule its entry passed for this request (its model,
    languages and length), or falls back to full prefill: Python code QA and passages at 2K
    compose, tool docs do not."""
    from codekv.compose import FULL_PREFILL, Passage
    from codekv.gate import GateRequest, SupportGate
    from codekv.stores.local import LocalKVStore

    gate = SupportGate.load()
    assert gate.source == "codekv/data/support.json"
    index = Index(stdlib_repo.root)
    index.update()
    composer = Composer(default_backend, index, store=LocalKVStore(tmp_path / "kv"), gate=gate)
    text = (stdlib_dir() / "shlex.py").read_text()[:400]
    requests = {"code-qa": CHUNKS[:2], "rag": [Passage(text, "shlex")],
                "tool-docs": [Passage(text, "shlex", kind="tool-doc")]}
    fingerprint = default_backend.info.fingerprint
    composed = set()
    for workload, chunks in requests.items():
        result = composer.compose(chunks, QUERY)
        languages = frozenset({"python"} if workload == "code-qa" else ())
        verdict = gate.verdict("llama", workload, request=GateRequest(
            fingerprint, languages, result.report.context_tokens))
        if verdict.allowed:
            composed.add(workload)
            assert result.status == COMPOSED, (workload, result.report.fallback_reason)
            report = result.report
            assert (report.strategy, report.ratio) == (verdict.strategy, verdict.ratio)
        else:
            assert result.status == FULL_PREFILL
            assert result.report.fallback_reason.startswith("unsupported"), workload
    assert composed == {"code-qa", "rag"}
