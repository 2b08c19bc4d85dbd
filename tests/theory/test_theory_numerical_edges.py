"""Numerical edges: subnormal p, |logit p| > 1400 and eps = 0 give the true values, never NaN.

Reference values come from closed forms evaluated independently (powers of two,
logs), not from the library.
"""

import math

import numpy as np
import pytest

from grpo_companion import theory
from grpo_companion.theory import Calibration
from grpo_companion.theory import kl_estimators as kl

TINY = 5e-324  # the smallest subnormal, 2**-1074


@pytest.mark.parametrize("logit_p", [1500.0, 1e4, 1e300])
def test_eps0_weights_far_out_are_their_limits(logit_p):
    # eps = 0: w+ = sqrt((1 - p) / p) = exp(-L / 2) and w- = exp(L / 2) (times 1 + O(e^-L))
    cal = Calibration(eps=0.0)
    w_plus, w_minus = cal.weights_of_logit(logit_p)
    assert w_plus == 0.0 and w_minus == math.inf  # exp(-750) rounds to 0, exp(750) > 1.8e308
    w_plus, w_minus = cal.weights_of_logit(-logit_p)
    assert w_plus == math.inf and w_minus == 0.0
    log_plus, log_minus = cal.log_weights_of_logit(logit_p)
    assert log_plus == pytest.approx(-logit_p / 2, rel=1e-15)
    assert log_minus == pytest.approx(logit_p / 2, rel=1e-15)
    assert cal.omega_of_logit(logit_p) == math.inf


def test_eps0_weights_just_inside_float_range_are_accurate():
    cal = Calibration(eps=0.0)
    for logit_p in (720.0, 1400.0):
        w_plus, w_minus = cal.weights_of_logit(logit_p)
        assert math.log(w_minus) == pytest.approx(logit_p / 2, rel=1e-15)
        if logit_p / 2 < 744:  # exp(-L/2) is still a (subnormal) float
            assert w_plus == pytest.approx(math.exp(-logit_p / 2), rel=1e-12)


def test_weights_of_subnormal_p():
    # p = 2**-1074: with eps = 0, w+ = sqrt((1 - p) / p) = 2**537 and w- = 2**-537
    # (to the rounding of log p ~ -744 in the logit, about 1e-13 relative)
    w_plus, w_minus = theory.weights(TINY, eps=0.0)
    assert w_plus == pytest.approx(2.0**537, rel=1e-12)
    assert w_minus == pytest.approx(2.0**-537, rel=1e-12)
    # eps > 0: w- = p Omega(p) ~ p / sqrt(eps), a subnormal that must not round to 0
    eps = 1e-5
    w_plus, w_minus = theory.weights(TINY, eps=eps)
    assert w_plus == pytest.approx(1 / math.sqrt(eps), rel=1e-12)
    assert w_minus > 0
    assert w_minus == pytest.approx(TINY / math.sqrt(eps), rel=0.01)  # subnormal: ~2 digits


def test_eps_positive_weights_beyond_logit_700_keep_their_digits():
    # log w+ = log Omega + log sigmoid(-L); Omega -> 1 / sqrt(eps) as p -> 1
    eps, logit_p = 1e-5, 745.0
    w_plus, _ = Calibration(eps=eps).weights_of_logit(logit_p)
    expected = -logit_p - 0.5 * math.log(eps)  # log(e^-L / sqrt(eps)), e^-L << eps
    assert w_plus > 0 and math.log(w_plus) == pytest.approx(expected, rel=1e-3)


def test_map_slope_at_subnormal_p_is_finite_and_exact():
    # Dr. GRPO with alpha = 1 is a constant map: h' = 0 exactly, also where
    # h (1 - h) / (p (1 - p)) overflows (p = 2**-1074)
    slope = theory.pos_map_derivative(TINY, 0.3, 0.1, normalization="mean_only")
    assert slope == 0.0
    grpo = theory.pos_map_derivative(np.array([TINY, 1e-310, 1e-300]), 0.3, 0.1)
    assert np.all(np.isfinite(grpo) | np.isinf(grpo)) and not np.isnan(grpo).any()


def test_eps0_iteration_saturates_without_nan():
    # eps = 0 from p = 0.3, beta = 0.1: L_1 ~ 21, L_2 ~ 4e5, L_3 = inf (p = 1 exactly)
    path = theory.iterate(0.3, 0.3, 0.1, 5, eps=0.0)
    assert not np.isnan(path).any()
    assert path[-1] == 1.0
    logits = theory.iterate_logit(theory.logit(0.3), theory.logit(0.3), 0.1, 5, eps=0.0)
    assert not np.isnan(logits).any() and logits[-1] == math.inf


def test_logit_drift_at_the_boundary_with_eps0():
    # p (1 - p) Omega(p) = sqrt(p (1 - p)) -> 0 at p in {0, 1}: the drift is the KL pull alone
    drift = kl.logit_drift(np.array([0.0, 1.0]), 0.3, 0.5, "k3", eps=0.0)
    np.testing.assert_allclose(drift, [-0.5 * (0.0 - 0.3), -0.5 * (1.0 - 0.3)], rtol=1e-15)
    inside = kl.logit_drift(TINY, 0.3, 0.5, "k3", eps=0.0)
    assert inside == pytest.approx(math.sqrt(TINY) + 0.5 * 0.3, rel=1e-12)
