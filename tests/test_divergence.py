"""The one KL divergence that ``compose --check`` and the evaluation report."""

from __future__ import annotations

import math

import pytest
import torch

from codekv.divergence import kl_divergence, logits_kl


def test_kl_of_two_known_distributions():
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1])
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert float(kl_divergence(p.log(), q.log())) == pytest.approx(expected)
    # Logits are any shift of the log-probabilities.
    assert logits_kl(p.log() + 3.0, q.log() - 1.0) == pytest.approx(expected)


def test_kl_is_per_row_and_never_negative():
    rows = torch.log_softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(0)), -1)
    per_row = kl_divergence(rows, rows.flip(0))
    assert per_row.shape == (4,) and (per_row > 0).all()
    assert (kl_divergence(rows, rows + 1e-9) == 0).all()  # rounding below zero reads as 0
    assert logits_kl(rows[0], rows[0]) == 0.0
