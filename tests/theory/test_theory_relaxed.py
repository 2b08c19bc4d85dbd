"""Relaxed GRPO steps against the interpolation written out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_companion import theory
from grpo_companion.theory.analyses import relaxed

CAL = {"eps": 1e-5, "group_size": 16, "ddof": 1}


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("fraction", [0.05, 0.3, 1.0])
def test_relaxed_step_interpolates_towards_the_exact_step(alpha, fraction):
    p_ref = np.array([0.02, 0.3, 0.7])
    beta = 0.4
    by_hand = theory.logit(p_ref)
    for _ in range(6):
        exact = theory.pos_map_logit(by_hand, theory.logit(p_ref), beta, alpha=alpha, **CAL)
        by_hand = (1 - fraction) * by_hand + fraction * exact
    path = relaxed.relaxed_iterate(p_ref, p_ref, beta, 6, fraction, alpha=alpha, **CAL)
    # compared as probabilities: the mirror runs reach p = 1 to double precision
    np.testing.assert_allclose(path[-1], theory.sigmoid(by_hand), rtol=1e-12, atol=0)


def test_fraction_one_is_the_paper_recurrence():
    p = relaxed.relaxed_iterate(0.2, 0.2, 1.0, 10, 1.0, eps=1e-5)
    np.testing.assert_array_equal(p, theory.iterate(0.2, 0.2, 1.0, 10, eps=1e-5))


def test_fit_recovers_the_fraction_of_synthetic_trajectories():
    p_ref = np.linspace(0.05, 0.9, 12)
    observed = relaxed.relaxed_iterate(p_ref, p_ref, 0.1, 15, 0.02, **CAL)
    fitted = relaxed.fit_step_fraction(observed, 0.1, **CAL)
    assert fitted == pytest.approx(0.02, rel=2e-3)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_bad_fraction_is_rejected(bad):
    with pytest.raises(ValueError, match="step_fraction must be in"):
        relaxed.relaxed_iterate(0.2, 0.2, 1.0, 3, bad)


def test_bad_trajectories_are_rejected():
    with pytest.raises(ValueError, match="success_prob must have shape"):
        relaxed.fit_step_fraction(np.array([0.1, 0.2]), 1.0)
