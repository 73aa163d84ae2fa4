"""How far one next-token distribution is from another: the KL divergence that both
``compose --check`` and the evaluation report against full prefill."""

from __future__ import annotations

import torch


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(reference || other) over the last dimension, from log-probabilities. Rounding can
    make two equal distributions a hair negative: clamped at 0."""
    return (reference.exp() * (reference - other)).sum(-1).clamp_min(0.0)


def logits_kl(reference_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """KL between the distributions of one position's logits, in double precision."""
    return float(kl_divergence(torch.log_softmax(reference_logits.double(), -1),
                               torch.log_softmax(logits.double(), -1)))
