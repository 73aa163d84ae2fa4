"""The exact-prefix cache's radix tree against the plain comparison of every kept prompt."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest

from codekv.serve.prefix import ExactPrefixLRU


class LinearPrefixLRU:
    """The expectation: every kept prompt of the scope compared one by one, ties to the least
    recently used, LRU order in an OrderedDict."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[tuple[str, tuple], tuple[object, int]] = OrderedDict()
        self.bytes = self.hits = self.misses = 0

    def longest(self, scope, ids):
        best, best_key = 0, None
        for key in self.entries:
            if key[0] != scope:
                continue
            common = next((i for i, (a, b) in enumerate(zip(ids, key[1])) if a != b),
                          min(len(ids), len(key[1])))
            if common > best:
                best, best_key = common, key
        if best_key is None:
            self.misses += 1
            return 0, None
        self.hits += 1
        self.entries.move_to_end(best_key)
        return best, self.entries[best_key][0]

    def put(self, scope, ids, kv, nbytes):
        if nbytes > self.budget_bytes:
            return
        ids = tuple(ids)
        for key in self.entries:
            if key[0] == scope and key[1][:len(ids)] == ids:
                self.entries.move_to_end(key)
                return
        for key in [k for k in self.entries if k[0] == scope and ids[:len(k[1])] == k[1]]:
            self.bytes -= self.entries.pop(key)[1]
        self.entries[(scope, ids)] = (kv, nbytes)
        self.bytes += nbytes
        while self.bytes > self.budget_bytes:
            self.bytes -= self.entries.popitem(last=False)[1][1]


def kept(cache: ExactPrefixLRU) -> list[tuple[str, tuple]]:
    return [(scope, tuple(entry.token_ids.tolist()))
            for (scope, _), entry in cache.entries.items()]


def assert_compact(cache: ExactPrefixLRU) -> None:
    """No node outlives its prompts: below a root, each holds a prompt or parts two ways; a
    scope with no prompt has no tree."""
    assert set(cache._roots) == {scope for scope, _ in cache.entries}
    stack = [child for root in cache._roots.values() for child in root.children.values()]
    while stack:
        node = stack.pop()
        assert node.key is not None or len(node.children) >= 2
        assert node.key is None or cache.entries[node.key].node is node
        stack.extend(node.children.values())


@pytest.mark.parametrize("seed", range(20))
def test_the_tree_answers_as_comparing_every_prompt(seed):
    rng = random.Random(seed)
    budget = rng.choice([30, 60, 1000])
    tree, linear = ExactPrefixLRU(budget), LinearPrefixLRU(budget)
    prompts = {"a": [], "b": []}

    def prompt(scope: str) -> list[int]:
        """Often a variation of an earlier prompt: shared prefixes are what the tree is for."""
        if prompts[scope] and rng.random() < 0.7:
            base = rng.choice(prompts[scope])
            ids = base[:rng.randint(0, len(base))]
        else:
            ids = []
        ids = ids + [rng.randrange(4) for _ in range(rng.randint(0, 6))]
        prompts[scope].append(ids)
        return ids

    for step in range(300):
        scope = rng.choice("ab")
        ids = prompt(scope)
        if rng.random() < 0.5:
            kv = f"kv-{step}"
            nbytes = rng.randint(1, budget // 3 + 2)
            tree.put(scope, ids, kv, nbytes)
            linear.put(scope, ids, kv, nbytes)
        else:
            assert tree.longest(scope, ids) == linear.longest(scope, ids), (step, ids)
        assert kept(tree) == list(linear.entries)
        assert (tree.bytes, tree.hits, tree.misses) == (linear.bytes, linear.hits,
                                                        linear.misses)
        assert_compact(tree)


def test_a_long_shared_prefix_is_split_where_prompts_part():
    cache = ExactPrefixLRU()
    system = list(range(100, 164))
    cache.put("a", system + [1, 2, 3], "first", 10)
    cache.put("a", system + [1, 7], "second", 10)
    cache.put("a", system + [9], "third", 10)
    assert cache.longest("a", system + [1, 2, 5]) == (66, "first")
    assert cache.longest("a", system + [1, 7, 7]) == (66, "second")
    assert cache.longest("a", system + [9, 9]) == (65, "third")
    assert cache.longest("a", system[:10] + [0]) == (10, "first")  # the least recently used
    cache.put("a", system + [1, 2, 3, 4], "longer", 10)  # replaces "first"
    assert [np.asarray(e.token_ids).tolist()[64:] for e in cache.entries.values()] == [
        [1, 7], [9], [1, 2, 3, 4]]
    assert cache.bytes == 30


def test_a_bos_every_prompt_starts_with_is_no_shared_prefix():
    """Prompts that share only their BOS: a miss, and the kept prompt is not refreshed (else
    the least recently used prompt would never leave)."""
    cache = ExactPrefixLRU(budget_bytes=2)
    cache.put("s", [1, 10, 11], "first", 1)
    cache.put("s", [1, 20, 21], "second", 1)
    assert cache.longest("s", [1, 30, 31], min_tokens=2) == (0, None)
    assert (cache.hits, cache.misses) == (0, 1)
    cache.put("s", [1, 30, 31], "third", 1)  # the least recently used goes: the first
    assert cache.longest("s", [1, 10, 11], min_tokens=2) == (0, None)
    assert cache.longest("s", [1, 20, 21, 22], min_tokens=2) == (3, "second")
