"""Confidence intervals for the evaluation: a paired bootstrap over tasks.

Every measure of a method is paired with full prefill of the same task (ΔNLL is already a
per-task difference), and two rules are compared on the same tasks. Resampling whole tasks
keeps that pairing, and a percentile interval assumes nothing about the shape of the
distribution - |ΔNLL| and KL are heavy-tailed, and a few hard tasks dominate their means.
The generator is seeded, so the same measures always give the same interval. A share of
tasks (how many of those full prefill solves a rule still solves) gets a Wilson score interval,
which stays inside [0, 1] and is not degenerate at 100%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

SAMPLES = 4000
LEVEL = 0.95


def bootstrap_ci(values: Sequence[float], samples: int = SAMPLES, level: float = LEVEL,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile interval of the mean of ``values``; None for fewer than two values."""
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or len(data) < 2:
        return None
    if not np.isfinite(data).all():
        raise ValueError("bootstrap_ci: values must be finite")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(samples, len(data)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def paired_difference(a: Sequence[float], b: Sequence[float], samples: int = SAMPLES,
                      level: float = LEVEL, seed: int = 0
                      ) -> tuple[float, tuple[float, float] | None]:
    """Mean of ``a[i] - b[i]`` over tasks and its interval: ``a`` and ``b`` measure two methods
    on the same tasks, in the same order. An interval that excludes zero is a result."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference: {len(a)} and {len(b)} tasks are not paired")
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if not len(diff):
        raise ValueError("paired_difference: no tasks")
    return float(diff.mean()), bootstrap_ci(diff, samples, level, seed)


def excludes_zero(interval: tuple[float, float] | None) -> bool:
    return interval is not None and (interval[0] > 0.0 or interval[1] < 0.0)


Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_ci(successes: int, trials: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial share; None without trials."""
    if trials <= 0:
        return None
    p = successes / trials
    centre = p + z * z / (2 * trials)
    spread = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    scale = 1 + z * z / trials
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)
