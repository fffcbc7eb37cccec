import numpy as np
import pytest
from scipy import stats

from audit_callbacks.federated import CohortSampler


def test_uniform_cohorts_are_distinct_and_fair():
    s = CohortSampler(50, 10, "uniform", seed=0)
    counts = np.zeros(50)
    rounds = 2000
    for _ in range(rounds):
        ids = s.sample()
        assert ids.size == 10 and np.unique(ids).size == 10
        counts[ids] += 1
    # each client is included with probability m/N = 0.2
    assert stats.chisquare(counts).pvalue > 1e-3
    assert counts.sum() == rounds * 10


def test_shuffle_every_client_once_per_pass():
    s = CohortSampler(40, 8, "shuffle", seed=1)
    for _ in range(3):
        seen = np.concatenate([s.sample() for _ in range(5)])
        assert np.array_equal(np.sort(seen), np.arange(40))


def test_shuffle_with_remainder_never_repeats_within_a_cohort():
    s = CohortSampler(23, 7, "shuffle", seed=2)
    counts = np.zeros(23, int)
    for _ in range(23 * 7):  # 49 passes exactly
        ids = s.sample()
        assert np.unique(ids).size == 7
        counts[ids] += 1
    assert counts.max() - counts.min() <= 2
    assert counts.sum() == 23 * 7 * 7


def test_poisson_inclusion_rate():
    s = CohortSampler(100, 5, "poisson", seed=3)
    sizes = np.array([s.sample().size for _ in range(4000)])
    # sizes ~ Binomial(100, 0.05): mean 5, var 4.75
    assert abs(sizes.mean() - 5) < 4 * np.sqrt(4.75 / 4000)


def test_state_roundtrip_and_errors():
    a = CohortSampler(30, 4, "shuffle", seed=4)
    for _ in range(3):
        a.sample()
    b = CohortSampler(30, 4, "shuffle", seed=99)
    b.load_state_dict(a.state_dict())
    for _ in range(20):
        assert np.array_equal(a.sample(), b.sample())
    with pytest.raises(ValueError, match="smaller than the cohort"):
        CohortSampler(3, 4)
    with pytest.raises(ValueError):
        CohortSampler(30, 4, "round-robin")
    with pytest.raises(ValueError):
        CohortSampler(31, 4, "shuffle").load_state_dict(a.state_dict())
