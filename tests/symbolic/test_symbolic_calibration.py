"""Calibration weights (eqs. 3, 4, 13) derived with SymPy, checked against ``theory``."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from grpo_companion import theory
from grpo_companion.symbolic import calibration as cal
from grpo_companion.symbolic.symbols import eps, on_unit_interval, p

RTOL = 1e-10
CALIBRATIONS = [("mean_std", "sqrt"), ("mean_std", "std"), ("mean_only", "sqrt")]


def random_points(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.01, 0.99, n), 10 ** rng.uniform(-6, -1, n)


def test_bernoulli_moments_from_pmf():
    mean, variance = cal.bernoulli_moments()
    assert mean == p
    assert sp.expand(variance - (p - p**2)) == 0


@pytest.mark.parametrize(("normalization", "placement"), CALIBRATIONS)
def test_weights_have_paper_form(normalization, placement):
    w = cal.calibration_weights(normalization, placement)
    if normalization == "mean_only":
        expected = (1 - p, p, sp.Integer(1))
    elif placement == "sqrt":
        s = sp.sqrt(p * (1 - p) + eps)
        expected = ((1 - p) / s, p / s, 1 / s)
    else:
        s = sp.sqrt(p * (1 - p)) + eps
        expected = ((1 - p) / s, p / s, 1 / s)
    for derived, paper in zip((w.w_plus, w.w_minus, w.omega), expected, strict=True):
        assert sp.simplify(derived - paper) == 0


@pytest.mark.parametrize(("normalization", "placement"), CALIBRATIONS)
def test_weights_match_theory(normalization, placement):
    weights = theory.weights
    w = cal.calibration_weights(normalization, placement)
    f = sp.lambdify((p, eps), (w.w_plus, w.w_minus, w.omega), "numpy")
    probs, smoothing = random_points()
    w_plus, w_minus, omega = f(probs, smoothing)
    for i in range(probs.size):
        t_plus, t_minus = weights(
            probs[i], eps=smoothing[i], normalization=normalization, eps_placement=placement
        )
        np.testing.assert_allclose([t_plus, t_minus], [w_plus[i], w_minus[i]], rtol=RTOL)
        np.testing.assert_allclose(t_plus + t_minus, np.broadcast_to(omega, probs.shape)[i],
                                   rtol=RTOL)


def test_unsmoothed_whitening_eq3():
    success, failure = cal.unsmoothed_whitening()
    f = sp.lambdify(p, (success.lhs - success.rhs, failure.lhs - failure.rhs))
    probs, _ = random_points()
    np.testing.assert_allclose(f(probs), 0, atol=1e-12)
    # eq. (3) is eq. (4) at eps = 0
    w4 = cal.calibration_weights("mean_std", "sqrt")
    w3 = cal.calibration_weights(theory.Calibration(eps=0.0))
    assert sp.simplify(w4.w_plus.subs(eps, 0) - w3.w_plus) == 0


@pytest.mark.parametrize("calibration", [*(theory.Calibration(n, eps_placement=e)
                                            for n, e in CALIBRATIONS),
                                          theory.Calibration(eps=0.0)])
def test_successes_and_failures_carry_equal_weight(calibration):
    assert cal.mean_advantage(calibration) == 0
    eq = cal.equal_total_weight(calibration)
    assert sp.simplify(eq.lhs - eq.rhs) == 0


def test_weights_positive_on_open_interval():
    for normalization, placement in CALIBRATIONS:
        w = cal.calibration_weights(normalization, placement)
        for expr in (w.w_plus, w.w_minus, w.omega):
            assert sp.simplify(on_unit_interval(expr, p)).is_positive


def test_advantage_piecewise_evaluates_to_weights():
    w = cal.calibration_weights()
    assert sp.simplify(w.advantage.subs(cal.reward, 1) - w.w_plus) == 0
    assert sp.simplify(w.advantage.subs(cal.reward, 0) + w.w_minus) == 0


@pytest.mark.parametrize("group_size", [2, 3, 5])
@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize(("normalization", "placement"), CALIBRATIONS)
def test_group_weights_match_theory(group_size, ddof, normalization, placement):
    weights = theory.weights
    g = cal.group_weights(group_size, normalization, placement, ddof)
    assert g.mean_advantage == 0
    f = sp.lambdify((p, eps), (g.w_plus, g.w_minus), "numpy")
    probs, smoothing = random_points(40, seed=group_size)
    for i in range(probs.size):
        t_plus, t_minus = weights(
            probs[i], eps=smoothing[i], normalization=normalization,
            eps_placement=placement, group_size=group_size, ddof=ddof,
        )
        s_plus, s_minus = f(probs[i], smoothing[i])
        np.testing.assert_allclose([t_plus, t_minus], [s_plus, s_minus], rtol=RTOL)


def test_large_group_approaches_population_weights():
    g = cal.group_weights(8, "mean_only", "sqrt", 0)
    # mean-only with the group mean: E[A | r=1] = (1 - p)(G - 1)/G exactly
    assert sp.simplify(g.w_plus - (1 - p) * sp.Rational(7, 8)) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"calibration": "median"}, "normalization"),
        ({"eps_placement": "inside"}, "eps_placement"),
    ],
)
def test_bad_calibration_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cal.calibration_weights(**kwargs)


def test_bad_group_raises():
    with pytest.raises(ValueError, match="group_size"):
        cal.group_weights(1)
    with pytest.raises(ValueError, match="ddof"):
        cal.group_weights(3, ddof=2)
