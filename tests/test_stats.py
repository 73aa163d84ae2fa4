import random

import pytest

from codekv.eval.stats import bootstrap_ci, excludes_zero, paired_difference


def test_interval_covers_the_mean_and_narrows_with_more_tasks():
    rng = random.Random(1)
    few = [rng.gauss(0.3, 1.0) for _ in range(20)]
    many = [rng.gauss(0.3, 1.0) for _ in range(2000)]
    low, high = bootstrap_ci(few)
    assert low < sum(few) / len(few) < high
    low_many, high_many = bootstrap_ci(many)
    assert high_many - low_many < (high - low) / 5
    # The standard error of 2000 N(0.3, 1) draws is 0.022: the interval is about +-0.044.
    assert low_many < 0.3 + 0.1 and high_many > 0.3 - 0.1
    assert 0.06 < high_many - low_many < 0.11


def test_interval_is_reproducible_and_needs_two_values():
    values = [0.1, 0.5, -0.2, 0.9, 0.0]
    assert bootstrap_ci(values) == bootstrap_ci(values)
    assert bootstrap_ci([1.0]) is None
    assert bootstrap_ci([]) is None
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, float("nan")])


def test_paired_difference_sees_what_unpaired_intervals_hide():
    # Task difficulty varies a lot; b is always a little worse than a on the same task.
    rng = random.Random(7)
    difficulty = [rng.uniform(0, 2) for _ in range(60)]
    a = [d for d in difficulty]
    b = [d + 0.05 + rng.uniform(-0.01, 0.01) for d in difficulty]
    low_a, high_a = bootstrap_ci(a)
    low_b, high_b = bootstrap_ci(b)
    assert low_b < high_a  # the marginal intervals overlap ...
    mean, interval = paired_difference(a, b)
    assert mean == pytest.approx(-0.05, abs=0.005)
    assert excludes_zero(interval) and interval[1] < 0  # ... the paired one does not


def test_paired_difference_refuses_unpaired_lists():
    with pytest.raises(ValueError, match="not paired"):
        paired_difference([1.0, 2.0], [1.0])
    mean, interval = paired_difference([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert mean == 0.0 and not excludes_zero(interval)
    assert not excludes_zero(None)
