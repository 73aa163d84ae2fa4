"""The scope's last prompt, kept whole: what a coding agent sends next is mostly what it sent
last, a few spans changed (a new turn, an edited function, a timestamp or request id in the
system prompt) and blocks moved (aider writes the history before the files it re-sends).

A block stored in the chunk store was computed alone (after the system message at most), so its
KV lacks everything the prompt had before it. The same tokens in the scope's last prompt were
computed there in place (or recomputed, or reused from the call before), against nearly the
same neighbours; only what changed before them is missing from their KV. So every run of the
new prompt's tokens that the last prompt holds too (``RecentPrompts.runs``: after a changed
span, the rest of the prompt; around an edited block, the rest of the file) is taken from
there, re-positioned, and the rule recomputes its share as for any reused segment: composed,
never exact (the exact prefix ends where the prompts first differ). One prompt per scope (as
one llama-server slot per client), least recently used out first beyond the byte budget.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

_BASE = np.uint64(0x9E3779B97F4A7C15)  # an odd multiplier: windows hash apart mod 2**64


class Run(NamedTuple):
    """Tokens ``[start, end)`` of the new prompt, which the last prompt holds from ``source``."""

    start: int
    end: int
    source: int


@dataclass
class LastPrompt:
    ids: np.ndarray
    kv: Any  # the backend's chunk KV of the whole prompt, from position 0
    nbytes: int
    places: dict[int, list[int]] | None = None  # a window's hash -> where it starts, built once

    def where(self, width: int) -> dict[int, list[int]]:
        if self.places is None:
            self.places = {}
            for at, value in enumerate(_window_hashes(self.ids, width).tolist()):
                self.places.setdefault(value, []).append(at)
        return self.places


class RecentPrompts:
    """The scope's last prompts, on a backend whose prompt cache ``supports_last_prompt``
    (``codekv.serve.prompt_cache``)."""

    def __init__(self, backend, budget_bytes: int, min_tokens: int):
        self.backend = backend
        self.budget_bytes = budget_bytes
        self.min_tokens = min_tokens
        self.prompts: OrderedDict[str, LastPrompt] = OrderedDict()

    def runs(self, scope: str, token_ids: list[int], start: int) -> list[Run]:
        """The runs of ``token_ids`` from ``start`` on that the scope's last prompt holds too,
        each at least ``min_tokens`` long, in the new prompt's order. Each is found by its first
        ``min_tokens`` tokens and extended as far as both prompts agree; where the last prompt
        holds them more than once, the place that continues the run before is taken, else the
        first after it (the prompts' order), else the first."""
        last = self.prompts.get(scope)
        width = self.min_tokens
        if last is None or len(token_ids) - start < width or len(last.ids) < width:
            return []
        places = last.where(width)
        new = np.asarray(token_ids, dtype=np.int64)
        hashes = _window_hashes(new[start:], width).tolist()
        found: list[Run] = []
        at, after = start, 0  # after: where the last run ended in the last prompt
        while at + width <= len(new):
            source = _pick(places.get(hashes[at - start], ()), after, last.ids, new, at, width)
            if source is None:
                at += 1
                continue
            n = min(len(last.ids) - source, len(new) - at)
            differ = np.flatnonzero(last.ids[source:source + n] != new[at:at + n])
            length = int(differ[0]) if len(differ) else n
            found.append(Run(at, at + length, source))
            at, after = at + length, source + length
        return found

    def span(self, scope: str, start: int, end: int) -> Any:
        """The scope's last prompt's KV of positions ``[start, end)``."""
        return self.backend.span(self.prompts[scope].kv, start, end)

    def remember(self, scope: str, ids: list[int], kv: Any) -> None:
        """``kv`` (of all of ``ids``) as the scope's last prompt."""
        self.prompts.pop(scope, None)
        nbytes = kv.nbytes()
        if nbytes > self.budget_bytes:
            return
        self.prompts[scope] = LastPrompt(np.asarray(ids, dtype=np.int64), kv, nbytes)
        while sum(p.nbytes for p in self.prompts.values()) > self.budget_bytes:
            self.prompts.popitem(last=False)


def _window_hashes(ids: np.ndarray, width: int) -> np.ndarray:
    """A hash of each ``width`` tokens of ``ids`` (one per start; none when fewer)."""
    count = len(ids) - width + 1
    hashes = np.zeros(max(count, 0), dtype=np.uint64)
    if count <= 0:
        return hashes
    values = ids.astype(np.uint64)
    with np.errstate(over="ignore"):
        for offset in range(width):
            hashes = hashes * _BASE + values[offset:offset + count]
    return hashes


def _pick(places, after: int, old: np.ndarray, new: np.ndarray, at: int, width: int
          ) -> int | None:
    """Of the last prompt's ``places`` whose window may equal the new prompt's at ``at``, the
    one to continue from (``RecentPrompts.runs``), checked token by token."""
    later = [p for p in places if p >= after]
    for place in ([after] if after in places else []) + later + list(places):
        if np.array_equal(old[place:place + width], new[at:at + width]):
            return place
    return None
