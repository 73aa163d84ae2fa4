"""Shift-only reuse, as llama-server's ``--cache-reuse N`` does it: the baseline that
``codekv serve --reuse shift-only`` serves, for the replay benchmark to measure against.

Each scope has one slot (llama-server's) holding its previous prompt's tokens and KV. A new
prompt keeps the common prefix with it, then walks both from there: a run of at least
``min_run`` tokens that the slot holds at its cursor and the prompt holds at its own is shifted
into place (its keys rotated to the new positions, nothing recomputed); otherwise the slot's
cursor moves on by one token. The prompt's cursor moves only over matched runs, so tokens the
slot held and the prompt dropped are skipped, while tokens the prompt inserted end the reuse:
everything after is prefilled. Shifted KV was computed after other tokens, so it is not exact:
such a request is ``composed`` (strategy ``shift``), and the slot remembers where its KV stops
being exact, so a later request's common prefix with it is counted exact only up to there.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from codekv.request import COMPOSED, EXACT_PREFIX, FULL_PREFILL

SHIFT = "shift"


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def shift_runs(cached: list[int], ids: list[int], start: int, min_run: int
               ) -> list[tuple[int, int, int]]:
    """The runs llama-server's cache reuse shifts: (slot position, prompt position, length),
    both cursors starting at ``start`` (the common prefix), in order."""
    runs = []
    head_c = head_p = start
    while head_c < len(cached) and head_p < len(ids):
        n = 0
        while (head_c + n < len(cached) and head_p + n < len(ids)
               and cached[head_c + n] == ids[head_p + n]):
            n += 1
        if n >= min_run:
            runs.append((head_c, head_p, n))
            head_c += n
            head_p += n
        else:
            head_c += 1
    return runs


@dataclass
class Slot:
    token_ids: list[int]
    kv: Any  # the backend's chunk KV of token_ids, from position 0
    exact: int  # its first ``exact`` tokens' KV is what full prefill computes
    nbytes: int


class ShiftSlots:
    """One slot per scope, least recently used out first beyond ``budget_bytes``, on a
    backend whose prompt cache ``supports_shift`` (``codekv.serve.prompt_cache``)."""

    def __init__(self, backend, min_run: int, budget_bytes: int):
        self.backend = backend
        self.min_run = min_run
        self.budget_bytes = budget_bytes
        self.slots: OrderedDict[str, Slot] = OrderedDict()

    def prefill(self, scope: str, ids: list[int], outcome) -> Any:
        """The request state of ``ids`` built from the scope's slot, ``outcome`` filled in;
        the slot then holds ``ids``."""
        backend = self.backend
        slot = self.slots.pop(scope, None)
        cached = slot.token_ids if slot else []
        n = min(common_prefix(cached, ids), len(ids) - 1)  # the last token is computed
        runs = shift_runs(cached, ids, n, self.min_run)
        if runs:  # the last token's logits are computed, never shifted
            c, p, length = runs[-1]
            if p + length == len(ids):
                runs[-1] = (c, p, length - 1)
            runs = [r for r in runs if r[2] > 0]
        end = runs[-1][1] + runs[-1][2] if runs else n
        exact = min(n, slot.exact) if slot else 0
        if end == 0:
            state = backend.full_prefill(ids)
        else:
            parts = [backend.head(slot.kv, n)] if n else []
            for c, p, length in runs:
                parts.append(backend.reposition(backend.span(slot.kv, c, c + length), p))
            state = backend.recompute(ids[:end], backend.concat(parts), [], ids[end:])
        shifted = sum(length for _, _, length in runs)
        outcome.exact_prefix_tokens = exact
        outcome.reused_tokens = (n - exact) + shifted
        outcome.recomputed_tokens = 0
        outcome.prefilled_tokens = len(ids) - end
        if outcome.reused_tokens:
            outcome.status, outcome.strategy, outcome.ratio = COMPOSED, SHIFT, 0.0
        else:
            outcome.status = EXACT_PREFIX if exact else FULL_PREFILL
        kv = backend.state_kv(state, len(ids))
        self.slots[scope] = Slot(list(ids), kv, exact if outcome.reused_tokens else len(ids),
                                 kv.nbytes())
        while len(self.slots) > 1 and sum(s.nbytes for s in self.slots.values()) > \
                self.budget_bytes:
            self.slots.popitem(last=False)
        return state

