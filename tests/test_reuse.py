"""The prefix-vs-composition reuse simulation counts tokens the way each cache reuses them."""

from __future__ import annotations

import pytest

from codekv.eval import reuse, workloads


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """Every test here indexes with byte counting (the ``byte_counter`` fixture)."""


def test_exact_prefix_reuse_is_the_longest_common_token_prefix():
    trie = reuse._PrefixTrie()
    system, a, b, c = ("s", [1, 2, 3]), ("a", [4, 5]), ("b", [6, 7, 8]), ("c", [6, 7, 9, 9])
    assert trie.longest([system, a, b]) == 0
    trie.add([system, a, b])
    assert trie.longest([system, a, c]) == 3 + 2 + 2  # b and c share their first two tokens
    assert trie.longest([system, b, a]) == 3  # same chunks, other order: only the prompt
    trie.add([system, b, a])
    assert trie.longest([system, b, a]) == 3 + 3 + 2


def test_reuse_simulation_counts_every_prefill_token_once(stdlib_index):
    source = workloads.CodeSource(stdlib_index, workloads.approx_tokens)
    result = reuse.simulate(source, str.split, sessions=2, tasks=6, seed=0, working_set=8)
    assert result["sessions"] == 2 and result["prefill_tokens"] > 0
    assert 0 < result["exact_prefix_tokens"] < result["composition_tokens"]
    assert result["composition_tokens"] < result["prefill_tokens"]  # first requests are new
    assert result["composition_share"] == pytest.approx(
        result["composition_tokens"] / result["prefill_tokens"])
