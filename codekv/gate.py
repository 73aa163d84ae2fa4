"""The support gate: composition runs only where measured evidence says it keeps quality.

The support file (written by ``codekv eval --write-gate``) holds, per (engine, model family,
workload), the thresholds, the measured values, the best strategy and ratio, and a verdict. An
entry licenses composition only when it passed on its evidence tasks *and* was confirmed on
held-out tasks no rule was tuned on (``codekv eval --confirm-gate``). A pair with no entry, a
failed one or an unconfirmed one is unsupported: the composer falls back to full prefill.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from codekv.models import TRANSFORMERS  # the engine of entries that name none

SUPPORT_ENV = "CODEKV_SUPPORT"
# The workloads the gate rules on, by what a request's chunks are.
WORKLOADS = {"code": "code-qa", "passage": "rag", "tool-doc": "tool-docs"}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str
    strategy: str | None = None
    ratio: float | None = None
    conditioning: str | None = None  # what the passing rule's chunk KV was computed after


class SupportGate:
    def __init__(self, entries: list[dict] | None = None, source: str = "none"):
        self.entries = entries or []
        self.source = source

    @classmethod
    def load(cls, path: str | Path | None = None) -> SupportGate:
        """The support file at ``path``, ``$CODEKV_SUPPORT``, else the one shipped with codekv."""
        path = path or os.environ.get(SUPPORT_ENV)
        if path:
            text, source = Path(path).read_text(), str(path)
        else:
            shipped = resources.files("codekv").joinpath("data", "support.json")
            if not shipped.is_file():
                return cls([], "no support file")
            text, source = shipped.read_text(), "codekv/data/support.json"
        data = json.loads(text)
        return cls(data.get("entries", []), source)

    def pairs(self) -> list[dict]:
        """Each evaluated (engine, family, workload) pair with its verdict and where its
        evidence and held-out confirmation came from: what ``codekv support`` shows."""
        out = []
        for entry in self.entries:
            engine = entry.get("backend", TRANSFORMERS)
            verdict = self.verdict(entry.get("family"), entry.get("workload"), engine)
            held_out = entry.get("held_out") or {}
            out.append({
                "engine": engine, "family": entry.get("family"),
                "workload": entry.get("workload"), "supported": verdict.allowed,
                "reason": (entry.get("reason") or verdict.reason) if verdict.allowed
                else verdict.reason,
                "method": entry.get("method"),  # what composes, or what passed its evidence
                "closest": entry.get("closest"),  # of a failed evaluation
                "evidence": {"command": entry.get("generated_by"),
                             "created": entry.get("created"),
                             "measured": entry.get("measured") or {}},
                "held_out": {"command": held_out.get("generated_by"),
                             "created": held_out.get("created"),
                             "measured": held_out.get("measured") or {}} if held_out else None,
            })
        return out

    def verdict(self, family: str, workload: str, engine: str = TRANSFORMERS) -> Verdict:
        """The evidence for ``family`` on ``engine``: one engine's results never license another
        (entries without a ``backend`` field were measured on transformers)."""
        pair = f"{family}/{workload}" + ("" if engine == TRANSFORMERS else f" on {engine}")
        for entry in self.entries:
            if (entry.get("family") == family and entry.get("workload") == workload
                    and entry.get("backend", TRANSFORMERS) == engine):
                if not entry.get("passed"):
                    return Verdict(False, f"unsupported: {pair} failed its evaluation")
                held_out = entry.get("held_out") or {}
                if "passed" not in held_out:
                    return Verdict(False, f"unsupported: {pair} passed its evaluation but was "
                                          "not confirmed on held-out tasks")
                if not held_out["passed"]:
                    return Verdict(False, f"unsupported: {pair} failed on held-out tasks")
                return Verdict(True, "supported", entry.get("strategy"), entry.get("ratio"),
                               entry.get("conditioning"))
        return Verdict(False, f"unsupported: no evidence for {pair} ({self.source})")
