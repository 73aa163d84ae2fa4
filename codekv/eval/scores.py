"""Task scores the way code-completion benchmarks score a generated answer.

CrossCodeEval and RepoBench score the greedy line itself, not its likelihood: exact match after
whitespace normalisation, edit similarity (0-100, rapidfuzz's normalised Indel similarity, the
``fuzz.ratio`` they use) and, for code, identifier F1. Edit similarity and identifier F1 stay
informative where a small model rarely reproduces a line exactly.
"""

from __future__ import annotations

import keyword
import re
from collections import Counter
from dataclasses import dataclass

from rapidfuzz import fuzz

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist)


@dataclass(frozen=True)
class Score:
    exact_match: bool
    edit_similarity: float  # 0..100
    identifier_f1: float  # 0..1


def normalise(text: str) -> str:
    """Whitespace runs become one space; leading and trailing whitespace goes."""
    return " ".join(text.split())


def first_line(text: str) -> str:
    """The first non-blank line: a completion is scored as one line, as the benchmarks do."""
    for line in text.splitlines():
        if line.strip():
            return line
    return ""


def identifiers(text: str) -> Counter:
    """The identifiers of ``text`` with their counts, keywords left out."""
    return Counter(name for name in IDENTIFIER.findall(text) if name not in KEYWORDS)


def identifier_f1(prediction: str, reference: str) -> float:
    """F1 of the identifier multisets; two answers without identifiers agree fully."""
    predicted, expected = identifiers(prediction), identifiers(reference)
    if not predicted and not expected:
        return 1.0
    common = sum((predicted & expected).values())
    if not common:
        return 0.0
    precision = common / sum(predicted.values())
    recall = common / sum(expected.values())
    return 2 * precision * recall / (precision + recall)


def score(prediction: str, reference: str, one_line: bool = False) -> Score:
    """Score ``prediction`` against ``reference``; ``one_line`` first cuts both to their first
    non-blank line (completion tasks, whose answer is one line)."""
    if one_line:
        prediction, reference = first_line(prediction), first_line(reference)
    p, r = normalise(prediction), normalise(reference)
    return Score(p == r, float(fuzz.ratio(p, r)), identifier_f1(p, r))
