"""The exact-prefix cache of a server: recent requests' prompt KV, reused up to the longest
common token prefix with a new prompt.

Its own namespace and counters (never the chunk store's): what it serves is the same tokens at
the same positions after the same tokens, so it is exact. Entries are kept per scope (one API
key's prompts never answer another's) within a byte budget, least recently used out first.

Each scope's prompts form a radix tree (edges labelled with token runs), so finding the longest
common prefix walks one path instead of comparing every recent prompt. A kept prompt is never a
prefix of another of its scope, so every kept prompt ends at a leaf; when several share the
longest common prefix, the least recently used of them answers (and is refreshed).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DEFAULT_BUDGET_BYTES = 2 << 30


@dataclass(eq=False)
class _Node:
    label: np.ndarray  # the tokens on the edge from the parent
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)  # by the edge's first token
    key: tuple[str, bytes] | None = None  # the kept prompt ending here


@dataclass
class Entry:
    token_ids: np.ndarray
    kv: Any  # the backend's chunk KV of those tokens, from position 0
    nbytes: int
    node: _Node
    used: int  # when last used: the order of ``entries``


def common_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class ExactPrefixLRU:
    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES):
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[tuple[str, bytes], Entry] = OrderedDict()  # LRU first
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._roots: dict[str, _Node] = {}
        self._clock = itertools.count()

    def longest(self, scope: str, token_ids: list[int], min_tokens: int = 1
                ) -> tuple[int, Any]:
        """(n, kv): the longest common prefix of ``token_ids`` with a recent prompt of
        ``scope`` and that prompt's KV (n may be less than its length); (0, None) if none or
        shorter than ``min_tokens`` (a BOS every prompt starts with is no shared prefix: it
        neither counts as a hit nor keeps a prompt in use)."""
        ids = np.asarray(token_ids, dtype=np.int64)
        n, node, _ = self._walk(scope, ids)
        if n < max(min_tokens, 1):
            self.misses += 1
            return 0, None
        self.hits += 1
        entry = self._least_recent_under(node)
        self._use(entry)
        return n, entry.kv

    def holding(self, scope: str, token_ids: list[int]) -> Any:
        """The KV of a recent prompt of ``scope`` that starts with all of ``token_ids``, or
        None: for work besides a request's own prefix (storing segments computed after these
        tokens), so neither counted nor refreshed."""
        ids = np.asarray(token_ids, dtype=np.int64)
        n, node, _ = self._walk(scope, ids)
        if not len(ids) or n < len(ids):
            return None
        return self._least_recent_under(node).kv

    def put(self, scope: str, token_ids: list[int], kv: Any, nbytes: int) -> bool:
        """Keep ``kv`` (of ``token_ids``); a prompt that is a prefix of one kept adds nothing.
        Whether it was kept."""
        if nbytes > self.budget_bytes:
            return False
        ids = np.asarray(token_ids, dtype=np.int64)
        n, node, path = self._walk(scope, ids)
        if node is not None and n == len(ids) and (node.key is not None or node.children):
            self._use(self._least_recent_under(node))  # a kept prompt starts with this one
            return False
        # Kept prompts that this one extends (on its path) are now redundant.
        for redundant in [p.key for p in path if p.key is not None]:
            self._drop(redundant)
        key = (scope, ids.tobytes())
        leaf = self._insert(scope, ids)
        leaf.key = key
        self.entries[key] = Entry(ids, kv, nbytes, leaf, next(self._clock))
        self.bytes += nbytes
        while self.bytes > self.budget_bytes:
            self._drop(next(iter(self.entries)))
        return True

    # -- the tree ------------------------------------------------------------------------

    def _walk(self, scope: str, ids: np.ndarray) -> tuple[int, _Node | None, list[_Node]]:
        """(n, node, path): how many leading tokens of ``ids`` the tree of ``scope`` holds,
        the deepest node they reach into (its edge may go on past them), and the nodes they
        pass whole, root first."""
        node = self._roots.get(scope)
        if node is None:
            return 0, None, []
        n, path = 0, [node]
        while n < len(ids):
            child = node.children.get(int(ids[n]))
            if child is None:
                break
            matched = common_length(child.label, ids[n:])
            n += matched
            node = child
            if matched < len(child.label):
                return n, node, path
            path.append(node)
        return n, node, path

    def _least_recent_under(self, node: _Node) -> Entry:
        """The least recently used kept prompt ending at or below ``node`` (one always does)."""
        best, stack = None, [node]
        while stack:
            below = stack.pop()
            if below.key is not None:
                entry = self.entries[below.key]
                if best is None or entry.used < best.used:
                    best = entry
            stack.extend(below.children.values())
        return best

    def _use(self, entry: Entry) -> None:
        entry.used = next(self._clock)
        self.entries.move_to_end(entry.node.key)

    def _insert(self, scope: str, ids: np.ndarray) -> _Node:
        """The node where ``ids`` ends, split or added as needed."""
        node = self._roots.setdefault(scope, _Node(ids[:0], None))
        n = 0
        while n < len(ids):
            child = node.children.get(int(ids[n]))
            if child is None:
                leaf = _Node(ids[n:], node)
                node.children[int(ids[n])] = leaf
                return leaf
            matched = common_length(child.label, ids[n:])
            if matched < len(child.label):  # split the edge where the tokens part
                middle = _Node(child.label[:matched], node)
                node.children[int(ids[n])] = middle
                child.label, child.parent = child.label[matched:], middle
                middle.children[int(child.label[0])] = child
                child = middle
            n += matched
            node = child
        return node

    def _drop(self, key: tuple[str, bytes]) -> None:
        """Forget a kept prompt and the tree nodes only it needed."""
        entry = self.entries.pop(key)
        self.bytes -= entry.nbytes
        node = entry.node
        node.key = None
        while node.parent is not None and node.key is None and len(node.children) <= 1:
            parent = node.parent
            if node.children:  # one child: merge it into this edge
                (child,) = node.children.values()
                child.label = np.concatenate([node.label, child.label])
                child.parent = parent
                parent.children[int(node.label[0])] = child
                break
            del parent.children[int(node.label[0])]
            node = parent
        if node.parent is None and node.key is None and not node.children:
            del self._roots[key[0]]
