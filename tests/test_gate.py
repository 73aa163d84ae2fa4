"""The support gate keys evidence by engine and family (one engine never licenses another) and
licenses only evidence confirmed on held-out tasks."""

from __future__ import annotations

from codekv.gate import SupportGate

CONFIRMED = {"passed": True}


def test_evidence_from_one_engine_does_not_license_the_other():
    gate = SupportGate([
        {"family": "llama", "workload": "rag", "passed": True, "strategy": "boundary",
         "ratio": 0.15, "held_out": CONFIRMED},
        {"backend": "llama.cpp", "family": "llama", "workload": "code-qa", "passed": True,
         "strategy": "anchors", "ratio": 0.25, "held_out": CONFIRMED},
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


def test_a_pass_licenses_composition_only_once_held_out_tasks_confirm_it():
    entry = {"family": "llama", "workload": "code-qa", "passed": True, "strategy": "query",
             "ratio": 0.15}
    unconfirmed = SupportGate([entry], "test").verdict("llama", "code-qa")
    assert not unconfirmed.allowed and unconfirmed.strategy is None
    assert unconfirmed.reason == ("unsupported: llama/code-qa passed its evaluation but was not "
                                  "confirmed on held-out tasks")
    failed = SupportGate([entry | {"held_out": {"passed": False}}], "test")
    assert failed.verdict("llama", "code-qa").reason == (
        "unsupported: llama/code-qa failed on held-out tasks")
    confirmed = SupportGate([entry | {"held_out": CONFIRMED}], "test").verdict("llama", "code-qa")
    assert confirmed.allowed and (confirmed.strategy, confirmed.ratio) == ("query", 0.15)
    # Held-out success does not rescue an entry whose evidence failed.
    assert not SupportGate([entry | {"passed": False, "held_out": CONFIRMED}],
                           "test").verdict("llama", "code-qa").allowed
