"""How much prefill an exact prefix cache could reuse, against chunk composition.

A simulated agent session over one repository: a fixed system prompt, then per task a few
chunks drawn from a working set (one file's definitions and what they use), more popular ones
more often, read in a different order each time. For each request:

- exact prefix reuse: the longest common token prefix with any earlier request (what an
  exact prefix cache can serve at best);
- composition reuse: the tokens of segments (system prompt, chunks) seen in an earlier request
  in any position (what chunk composition can serve, before recomputing its selected share).

The query of each task is new and counted in neither.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from codekv.serve.shift import common_prefix

SYSTEM_PROMPT = (
    "You are a coding agent working in a git repository. Read the code below, then answer the "
    "question or complete the code. Use only what the repository defines.\n\n"
)


class _PrefixTrie:
    """Requests as sequences of segments; finds the longest token prefix shared with any."""

    def __init__(self):
        self.root: dict = {}

    def longest(self, segments: list[tuple[str, list]]) -> int:
        node, matched = self.root, 0
        for name, tokens in segments:
            if name in node:
                matched += len(tokens)
                node = node[name][1]
                continue
            # Diverging here: the best partial match against any request continuing otherwise.
            matched += max((common_prefix(tokens, other) for other, _ in node.values()), default=0)
            break
        return matched

    def add(self, segments: list[tuple[str, list]]) -> None:
        node = self.root
        for name, tokens in segments:
            node = node.setdefault(name, (tokens, {}))[1]


def working_sets(source, rng: random.Random, size: int, max_tokens: int) -> list:
    """A file's definitions plus the chunks they use, up to ``size`` chunks."""
    by_path: dict[str, list] = {}
    for chunk in source.chunks:
        if source.tokens(chunk) <= max_tokens:
            by_path.setdefault(chunk.path, []).append(chunk)
    paths = sorted(p for p, chunks in by_path.items() if len(chunks) >= size // 2)
    rng.shuffle(paths)
    for path in paths:
        chunks = list(by_path[path])
        ids = {c.id for c in chunks}
        for chunk in list(chunks):
            for use in source.uses(chunk):
                target = source.by_id[use.target]
                if target.id not in ids and source.tokens(target) <= max_tokens:
                    chunks.append(target)
                    ids.add(target.id)
        yield chunks[:size]


def agent_sessions(source, rng: random.Random, sessions: int = 3, tasks: int = 20,
             per_task: tuple[int, int] = (3, 8), working_set: int = 24,
             max_chunk_tokens: int = 512):
    """Agent sessions: each a list of ``tasks`` requests, each the chunks it reads, in order."""
    done = 0
    for chunks in working_sets(source, rng, working_set, max_chunk_tokens):
        if done >= sessions:
            return
        done += 1
        weights = [1.0 / (rank + 1) for rank in range(len(chunks))]  # Zipf-like popularity
        session = []
        for _ in range(tasks):
            k = min(len(chunks), rng.randint(*per_task))
            picked: list = []
            while len(picked) < k:
                chunk = rng.choices(chunks, weights)[0]
                if chunk not in picked:
                    picked.append(chunk)
            session.append(picked)
        yield session


def simulate(source, tokenize: Callable[[str], list], sessions: int = 3, tasks: int = 20,
             seed: int = 0, per_task: tuple[int, int] = (3, 8), working_set: int = 24,
             max_chunk_tokens: int = 512, recompute_ratio: float = 0.15) -> dict:
    """Prefill tokens reusable by an exact prefix cache vs by composition, over ``sessions``."""
    rng = random.Random(f"reuse:{seed}")
    system = ("system", tokenize(SYSTEM_PROMPT))
    total = prefix_reuse = composed_reuse = 0
    done = 0
    tokens: dict = {}
    for session in agent_sessions(source, rng, sessions, tasks, per_task, working_set,
                                  max_chunk_tokens):
        done += 1
        trie, seen = _PrefixTrie(), set()
        for picked in session:
            for c in picked:
                if c.id not in tokens:
                    tokens[c.id] = tokenize(f"# {c.path}\n{source.text(c)}\n\n")
            segments = [system] + [(c.id, tokens[c.id]) for c in picked]
            total += sum(len(t) for _, t in segments)
            prefix_reuse += trie.longest(segments)
            composed_reuse += sum(len(t) for name, t in segments if name in seen)
            trie.add(segments)
            seen.update(name for name, _ in segments)
    share = (lambda n: n / total) if total else (lambda n: 0.0)
    return {
        "sessions": done,
        "tasks_per_session": tasks,
        "prefill_tokens": total,
        "exact_prefix_tokens": prefix_reuse,
        "composition_tokens": composed_reuse,
        "exact_prefix_share": share(prefix_reuse),
        "composition_share": share(composed_reuse),
        "composition_share_after_recompute": share(composed_reuse) * (1 - recompute_ratio),
        "recompute_ratio": recompute_ratio,
    }
