"""The support gate keys evidence by engine and family: one engine never licenses another."""

from __future__ import annotations

from codekv.gate import SupportGate


def test_evidence_from_one_engine_does_not_license_the_other():
    gate = SupportGate([
        {"family": "llama", "workload": "rag", "passed": True, "strategy": "boundary",
         "ratio": 0.15},
        {"backend": "llama.cpp", "family": "llama", "workload": "code-qa", "passed": True,
         "strategy": "anchors", "ratio": 0.25},
    ], "test")
    assert gate.verdict("llama", "rag").allowed  # no backend field: transformers evidence
    assert gate.verdict("llama", "rag", "transformers").strategy == "boundary"
    refused = gate.verdict("llama", "rag", "llama.cpp")
    assert not refused.allowed
    assert refused.reason == "unsupported: no evidence for llama/rag on llama.cpp (test)"
    assert gate.verdict("llama", "code-qa", "llama.cpp").strategy == "anchors"
    assert not gate.verdict("llama", "code-qa").allowed


def test_the_shipped_support_file_is_transformers_evidence():
    gate = SupportGate.load()
    assert gate.entries
    for entry in gate.entries:
        family, workload = entry["family"], entry["workload"]
        on_transformers = gate.verdict(family, workload, "transformers")
        assert "no evidence" not in on_transformers.reason
        assert "no evidence" in gate.verdict(family, workload, "llama.cpp").reason
