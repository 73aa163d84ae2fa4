"""The support gate keys evidence by engine and family (one engine never licenses another) and
licenses only evidence confirmed on held-out tasks."""

from __future__ import annotations

import pytest

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


# -- the support file's schema: an invalid entry licenses nothing and says why ---------------

LICENSED = {"family": "llama", "workload": "code-qa", "passed": True, "strategy": "query",
            "ratio": 0.15, "conditioning": "prefix", "method": "query@0.15",
            "measured": {"delta_nll": 0.01, "delta_nll_ci": [-0.02, 0.04]},
            "held_out": {"passed": True, "measured": {"delta_nll": 0.0}}}


def _with(**changes) -> dict:
    held_out = changes.pop("held_out_passed", None)
    entry = {**LICENSED, **changes}
    if held_out is not None:
        entry["held_out"] = {**LICENSED["held_out"], "passed": held_out}
    return entry


@pytest.mark.parametrize(("entry", "why"), [
    (_with(ratio=5), "ratio 5 is not a share from 0 to 1"),
    (_with(ratio=-1), "ratio -1 is not a share from 0 to 1"),
    (_with(ratio=0), "ratio 0 recomputes nothing: 'query' needs a share above 0"),
    (_with(ratio="0.15"), 'ratio "0.15" is not a share from 0 to 1'),
    (_with(ratio=True), "ratio true is not a share from 0 to 1"),
    (_with(ratio=float("nan")), "ratio NaN is not a share from 0 to 1"),
    (_with(ratio=None), "it licenses composition but names no ratio for 'query'"),
    (_with(strategy=None), "it licenses composition but names no strategy"),
    (_with(passed="false"), 'passed "false" is not true or false'),
    (_with(held_out_passed="no"), 'held_out.passed "no" is not true or false'),
    (_with(held_out=[True]), "held_out [true] is not an object"),
    (_with(conditioning="neighbours"), 'conditioning "neighbours" is not one of none, prefix, '
                                       "graph"),
    (_with(strategy="bogus"), 'strategy "bogus" is not a rule requests compose with'),
    (_with(strategy="all"), 'strategy "all" is not a rule requests compose with'),
    (_with(strategy="none-norope"), 'strategy "none-norope" is not a rule requests compose with'),
    (_with(strategy="deviation"), "method 'query@0.15' is not its rule 'deviation@0.15'"),
    (_with(backend="llama.cpp", strategy="deviation", method="deviation@0.15"),
     "strategy 'deviation' needs per-token KV deviation, which llama.cpp cannot give"),
    (_with(backend="llama.cpp"),
     "strategy 'query' needs the query's attention over reused KV, which llama.cpp cannot give"),
    (_with(measured={"kl": float("nan")}), "measured.kl NaN is not a finite number"),
    (_with(measured={"delta_nll_ci": [0.1]}), "measured.delta_nll_ci [0.1] is not a finite "
                                              "number or an interval of two"),
    (_with(reason=["x"]), 'reason ["x"] is not a text'),
])
def test_an_invalid_entry_licenses_nothing_and_says_why(entry, why):
    assert SupportGate([LICENSED], "t").verdict("llama", "code-qa").allowed
    engine = entry.get("backend", "transformers")
    verdict = SupportGate([entry], "t").verdict("llama", "code-qa", engine)
    assert not verdict.allowed and verdict.strategy is None
    pair = "llama/code-qa" + (" on llama.cpp" if engine == "llama.cpp" else "")
    assert verdict.reason.startswith(f"unsupported: the entry for {pair} in t is invalid: ")
    assert why in verdict.reason
    [shown] = SupportGate([entry], "t").pairs()
    assert shown["supported"] is False and any(why in problem for problem in shown["problems"])
    assert shown["method"] is None and shown["reason"] == verdict.reason


@pytest.mark.parametrize("entry", [
    _with(strategy="none", ratio=0.0, method="none"),  # ratio-free: 0 is its only ratio
    _with(strategy="boundary", ratio=1, method="boundary@1"),
    _with(strategy="query", conditioning="graph", method="query+graph@0.15"),
    _with(conditioning=None, method=None),  # the composer's conditioning; no label to check
    _with(backend="llama.cpp", strategy="boundary", method="boundary@0.15"),
    # A failed or unconfirmed entry need not name a rule.
    {"family": "llama", "workload": "code-qa", "passed": False, "strategy": None, "ratio": None},
    {"family": "llama", "workload": "code-qa", "passed": True, "held_out": {}},
])
def test_a_valid_entry_means_what_it_meant(entry):
    gate = SupportGate([entry], "t")
    assert gate.problems == [[]]
    verdict = gate.verdict("llama", "code-qa", entry.get("backend", "transformers"))
    licenses = entry["passed"] and entry.get("held_out", {}).get("passed") is True
    assert verdict.allowed == licenses
    if licenses:
        assert (verdict.strategy, verdict.ratio, verdict.conditioning) == (
            entry["strategy"], entry["ratio"], entry["conditioning"])


def test_entries_that_name_no_pair_are_listed_as_invalid():
    gate = SupportGate([[1], {"family": "llama", "workload": "chat", "backend": "vllm",
                              "passed": True}, LICENSED], "t")
    first, second, third = gate.pairs()
    assert first["problems"] == ["an entry must be an object, not [1]"]
    assert first["reason"] == ("unsupported: entry 1 in t is invalid: an entry must be an "
                               "object, not [1]")
    assert second["pair"] == "llama/chat on vllm" and third["pair"] == "llama/code-qa"
    assert second["problems"] == ["backend \"vllm\" is not one of transformers, llama.cpp",
                                  "workload \"chat\" is not one of code-qa, rag, tool-docs"]
    assert third["supported"] is True  # one bad entry does not spoil the others


def test_what_an_engine_cannot_run_is_what_its_backend_refuses():
    """The gate's table of unserved needs (torch-free) agrees with the backends' refusals."""
    from codekv.backends.hf import HFBackend
    from codekv.backends.llamacpp import LlamaCppBackend
    from codekv.gate import UNSERVED_NEEDS
    from codekv.models import ENGINES

    backends = {"transformers": HFBackend, "llama.cpp": LlamaCppBackend}
    assert set(backends) == set(ENGINES)
    for engine, backend in backends.items():
        refused = {need for need, refusal in (("needs_deviation", backend.deviation_refusal),
                                              ("needs_relevance", backend.relevance_refusal))
                   if refusal}
        assert set(UNSERVED_NEEDS.get(engine, {})) == refused, engine


def test_the_shipped_support_file_is_valid():
    gate = SupportGate.load()
    assert gate.error is None and gate.problems == [[]] * len(gate.entries)


# -- a support file that cannot be read: nothing licensed, and the reason says which file ------


@pytest.mark.parametrize(("content", "why"), [
    (None, "No such file or directory"),
    ("dir", "Is a directory"),
    ("", "the file is empty"),
    ("{", "not JSON (Expecting property name"),
    ("[]", 'it holds a JSON array, not an object with an "entries" list'),
    ('"x"', 'it holds a JSON string, not an object with an "entries" list'),
    ('{"entries": {}}', 'it has no "entries" list'),
    ('{"format": 2, "entries": []}', "format 2 is not 1, the only one this codekv reads"),
    (b"\xff\xfe{}", "not UTF-8 text"),
])
def test_an_unreadable_support_file_licenses_nothing_and_says_why(tmp_path, monkeypatch,
                                                                   content, why):
    path = tmp_path / "support.json"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    named = SupportGate.load(path)
    assert named.error.startswith(f"cannot read the support file {path}: ")
    assert why in named.error and named.entries == []
    monkeypatch.setenv("CODEKV_SUPPORT", str(path))
    gate = SupportGate.load()  # never the shipped file instead
    assert gate.source == str(path)
    assert gate.error.startswith(f"cannot read the support file $CODEKV_SUPPORT={path}: ")
    verdict = gate.verdict("llama", "code-qa")
    assert not verdict.allowed and verdict.reason == f"unsupported: {gate.error}"
