"""The scope's last prompt, kept whole for its segments: where a coding agent re-sends a file,
it most often sent it in its last call too, among the same neighbours, around a new turn.

A segment stored in the chunk store was computed alone (after the system message at most), so
its KV lacks everything the prompt had before it. The same segment in the scope's last prompt
was computed there in place (or recomputed, or reused from the call before), against the files
and turns around it; when the new prompt moves it (aider writes the new turn before the files it
re-sends), only what changed before it is missing from its KV. So a segment found in the last
prompt is taken from there, re-positioned, and the rule recomputes its share as for any reused
segment: composed, never exact. One prompt per scope (as one llama-server slot per client),
least recently used out first beyond the byte budget. Segments are found by their tokens:
the last prompt's segments as that request cut them.

With ``--experimental`` (every class reused), the new prompt's common token prefix with the
last prompt beyond the exact prefix is reused the same way, in place: after a composed
request, the exact-prefix cache keeps only its tokens before the first reused segment, so a next
call that repeats the whole last prompt would otherwise compute all the rest again.

A segment that changed since (a header with a request id and the time before the system
prompt's text, a summary that grew) is not found whole, but its unchanged head and tail may be
(``parts``): the tokens it shares with the start and with the end of one of the last prompt's
segments. They are taken from there the same way; the span between them is computed in place.
The gate licenses them apart (``schema.PARTS``: a message's text's apart from a piece of code's):
their KV was computed against the span that changed.

The text between segments (the chat template's framing, messages shorter than a segment: a
history's requests and short replies) is no segment, but a stretch of it shares its head and
tail with the last prompt's stretches the same way (``runs``): after a new header, the history
the last prompt held, up to the turn added since. A class of its own (``schema.LAST_PROMPT_RUN``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from codekv.serve.prefix import common_length


@dataclass
class LastPrompt:
    ids: np.ndarray
    kv: Any  # the backend's chunk KV of the whole prompt, from position 0
    starts: dict[bytes, int]  # a segment's tokens -> where it starts in the prompt
    spans: list[tuple[int, int]]  # its segments, as that request cut them
    gaps: list[tuple[int, int]]  # the text between them
    nbytes: int


@dataclass(frozen=True)
class Part:
    """Tokens ``[offset, offset + length)`` of a segment, found at ``start`` of the last
    prompt."""

    offset: int
    start: int
    length: int


class RecentPrompts:
    """The scope's last prompts, on a backend whose prompt cache ``supports_last_prompt``
    (``codekv.serve.prompt_cache``)."""

    def __init__(self, backend, budget_bytes: int):
        self.backend = backend
        self.budget_bytes = budget_bytes
        self.prompts: OrderedDict[str, LastPrompt] = OrderedDict()

    def find(self, scope: str, token_ids: list[int]) -> Any:
        """The KV of ``token_ids`` where the scope's last prompt had them as a segment (at the
        positions they had there), or None."""
        last = self.prompts.get(scope)
        if last is None:
            return None
        start = last.starts.get(_key(token_ids))
        return None if start is None else self.backend.span(last.kv, start,
                                                            start + len(token_ids))

    def common(self, scope: str, token_ids: list[int]) -> int:
        """How many leading tokens ``token_ids`` share with the scope's last prompt."""
        last = self.prompts.get(scope)
        return 0 if last is None else common_length(np.asarray(token_ids, dtype=np.int64),
                                                    last.ids)

    def parts(self, scope: str, token_ids: list[int], min_tokens: int) -> list[Part]:
        """The longest head and the longest tail ``token_ids`` share with one of the last
        prompt's segments, each of at least ``min_tokens`` (and not overlapping): where a
        segment changed inside, what is left of it in the last prompt."""
        last = self.prompts.get(scope)
        return [] if last is None else _head_and_tail(token_ids, last.ids, last.spans,
                                                      min_tokens)

    def runs(self, scope: str, token_ids: list[int], min_tokens: int) -> list[Part]:
        """The same for a stretch of the text between segments, against the last prompt's."""
        last = self.prompts.get(scope)
        return [] if last is None else _head_and_tail(token_ids, last.ids, last.gaps,
                                                      min_tokens)

    def span(self, scope: str, start: int, end: int) -> Any:
        """The scope's last prompt's KV of positions ``[start, end)``."""
        return self.backend.span(self.prompts[scope].kv, start, end)

    def remember(self, scope: str, ids: list[int], spans: list[tuple[int, int]],
                 kv: Any) -> None:
        """``kv`` (of all of ``ids``) as the scope's last prompt, its segments at ``spans``."""
        self.prompts.pop(scope, None)
        nbytes = kv.nbytes()
        if nbytes > self.budget_bytes:
            return
        starts = {_key(ids[start:end]): start for start, end in spans}
        self.prompts[scope] = LastPrompt(np.asarray(ids, dtype=np.int64), kv, starts,
                                         list(spans), gaps(spans, 0, len(ids)), nbytes)
        while sum(p.nbytes for p in self.prompts.values()) > self.budget_bytes:
            self.prompts.popitem(last=False)


def gaps(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The stretches of ``[start, end)`` that no span (in order) covers."""
    out, cursor = [], start
    for first, last in spans:
        if first > cursor:
            out.append((cursor, min(first, end)))
        cursor = max(cursor, last)
        if cursor >= end:
            break
    if cursor < end:
        out.append((cursor, end))
    return [(first, last) for first, last in out if last > first]


def _head_and_tail(token_ids: list[int], last_ids: np.ndarray, spans: list[tuple[int, int]],
                   min_tokens: int) -> list[Part]:
    """The longest head and tail ``token_ids`` share with one of ``spans`` of ``last_ids``,
    each of at least ``min_tokens``, the tail cut where it would run into the head."""
    ids = np.asarray(token_ids, dtype=np.int64)
    head = tail = (0, 0)  # (length, where it starts in the last prompt)
    for start, end in spans:
        theirs = last_ids[start:end]
        n = common_length(ids, theirs)
        if n > head[0]:
            head = (n, start)
        n = common_length(ids[::-1], theirs[::-1])
        if n > tail[0]:
            tail = (n, end - n)
    if head[0] < min_tokens:
        head = (0, 0)
    length = min(tail[0], len(ids) - head[0])  # a tail running into the head: what it leaves
    found = [Part(0, head[1], head[0])] if head[0] else []
    if length >= min_tokens:
        found.append(Part(len(ids) - length, tail[1] + tail[0] - length, length))
    return found


def _key(token_ids: list[int]) -> bytes:
    return np.asarray(token_ids, dtype=np.int64).tobytes()
