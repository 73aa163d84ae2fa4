"""Keys and the entry format: token hashes, digests, and what a reader checks of a writer."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace

import pytest
from fixtures.stores import make_key

from codekv.stores import entry
from codekv.stores.entry import KVKey, token_hash


def test_token_hash_is_sha256_of_little_endian_int64():
    ids = [1, 2, 49151, 2**40]
    want = hashlib.sha256(
        b"codekv.tokens.v1\0" + struct.pack("<Q", 4) + struct.pack("<4q", *ids)
    ).hexdigest()
    assert token_hash(ids) == want
    assert token_hash([2, 1]) != token_hash([1, 2])
    assert token_hash([]) != token_hash([0])


def test_digest_covers_every_field_and_the_format_version(monkeypatch):
    key = make_key()
    digests = {key.digest()}
    for name in ("scope", "model", "tokenizer", "chunk", "token_hash"):
        digests.add(replace(key, **{name: getattr(key, name) + "x"}).digest())
    assert len(digests) == 6
    monkeypatch.setattr(entry, "FORMAT_VERSION", entry.FORMAT_VERSION + ".next")
    assert key.digest() not in digests
    with pytest.raises(TypeError):
        KVKey("s", "m", "t", "c", 5)  # type: ignore[arg-type]


def test_all_finite_sees_every_non_finite_value_and_no_others():
    """The one-sum check: +inf and -inf together (a NaN sum) are caught, and 16-bit values whose
    16-bit sum would overflow are still finite (the sum is taken in float32)."""
    import torch

    from codekv.stores.entry import all_finite

    both = torch.zeros(4, 8)
    both[0, 0], both[3, 7] = float("inf"), float("-inf")
    assert not all_finite(both)
    assert all_finite(torch.full((64, 64), 60000.0, dtype=torch.float16))
    assert not all_finite(torch.tensor([1.0, float("nan")], dtype=torch.bfloat16))
