"""The objective of ``p`` each calibration ascends; Davis and Recht's arcsin(sqrt(p)) transform."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import sympy as sp
from scipy.integrate import quad

from grpo_companion.symbolic import transforms as tr
from grpo_companion.symbolic.symbols import eps, on_unit_interval, p, sigmoid
from grpo_companion.theory import CALIBRATIONS

PAPER_EPS0 = replace(CALIBRATIONS["paper"], eps=0.0)
#: every registered preset, the unsmoothed eq. (3), and two finite groups
CASES = {
    **CALIBRATIONS,
    "paper_eps0": PAPER_EPS0,
    "paper_G4": replace(CALIBRATIONS["paper"], group_size=4),
    "rloo_G4": replace(CALIBRATIONS["rloo"], group_size=4),
}
P_VALUES = (0.05, 0.3, 0.5, 0.77, 0.99)


def zero_on_unit_interval(expr: sp.Expr) -> bool:
    return sp.simplify(on_unit_interval(expr, p)) == 0


def test_two_outcome_factor_is_omega():
    expectation, factor = tr.two_outcome_gradient()
    w_plus, w_minus = sp.symbols("w_+ w_-", real=True)
    assert sp.simplify(factor - (w_plus + w_minus)) == 0
    assert sp.simplify(expectation - p * (1 - p) * (w_plus + w_minus)) == 0


@pytest.mark.parametrize("name", ["paper", "trl", "mean_only", "rloo", "max_abs"])
def test_factor_is_registry_omega_symbolically(name):
    from grpo_companion.symbolic.calibration import calibration_weights

    g = tr.expected_gradient_factor(name)
    assert sp.simplify(g - calibration_weights(CALIBRATIONS[name]).omega) == 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_factor_by_summing_over_two_outcomes(name):
    """Independent of SymPy: E[A d log pi / dL] from the registry's numpy advantages."""
    cal = CASES[name]
    g = sp.lambdify((p, eps), tr.expected_gradient_factor(cal), modules="numpy")
    h = 1e-30  # complex-step derivative: exact to rounding

    def d_dl(f, logit):
        return f(complex(logit, h)).imag / h

    for x in P_VALUES:
        logit = np.log(x / (1 - x))
        w_plus, w_minus = (float(w) for w in cal.weights(x))
        score_success = d_dl(lambda z: -np.log(1 + np.exp(-z)), logit)
        score_failure = d_dl(lambda z: -np.log(1 + np.exp(z)), logit)
        expected = x * w_plus * score_success + (1 - x) * (-w_minus) * score_failure
        dp_dl = d_dl(lambda z: 1 / (1 + np.exp(-z)), logit)
        assert expected == pytest.approx(float(g(x, cal.eps)) * dp_dl, rel=1e-12)


def test_paper_eps0_is_davis_recht():
    f = tr.ascended_objective(PAPER_EPS0)
    target = tr.davis_recht_objective()
    # equal derivatives on (0, 1) and equal values at 0, both continuous on [0, 1]
    assert zero_on_unit_interval(sp.diff(f - target, p))
    assert sp.simplify((f - target).subs(p, 0)) == 0
    assert sp.simplify(sp.diff(f, p) - tr.expected_gradient_factor(PAPER_EPS0)) == 0


def test_mean_only_and_rloo_ascend_p():
    assert tr.ascended_objective("mean_only") == p
    assert tr.ascended_objective("rloo") == p
    assert sp.simplify(tr.ascended_objective(CASES["rloo_G4"]) - p) == 0  # unbiased baseline


def test_paper_with_eps_closed_form_and_limit():
    f = tr.ascended_objective("paper")
    # by hand: p (1 - p) + eps = (1 + 4 eps)/4 - (p - 1/2)^2
    root = sp.sqrt(1 + 4 * eps)
    closed = sp.asin((2 * p - 1) / root) + sp.asin(1 / root)
    assert sp.simplify(f - closed) == 0
    assert sp.simplify(sp.diff(f, p) - 1 / sp.sqrt(p * (1 - p) + eps)) == 0
    assert f.subs(p, 0) == 0
    limit = sp.limit(f, eps, 0, "+")
    assert zero_on_unit_interval(sp.diff(limit - tr.davis_recht_objective(), p))
    assert sp.simplify((limit - tr.davis_recht_objective()).subs(p, 0)) == 0


def test_max_abs_pieces():
    f = tr.ascended_objective("max_abs")
    assert isinstance(f, sp.Piecewise)
    below = sp.Rational(1, 3)
    above = sp.Rational(4, 5)
    assert sp.simplify(f.subs(p, below) - (-sp.log(1 - below))) == 0
    assert sp.simplify(f.subs(p, above) - sp.log(4 * above)) == 0


@pytest.mark.parametrize("name", ["paper", "paper_eps0", "mean_only", "rloo", "paper_G4"])
def test_logit_flow_is_gradient_ascent_on_f(name):
    """dF/dL = F'(p) p (1 - p) = dL/dt, with p = sigmoid(L)."""
    cal = CASES[name]
    logit = sp.Symbol("L", real=True)
    f_of_l = tr.ascended_objective(cal).subs(p, sigmoid(logit))
    flow = tr.logit_flow(cal).subs(p, sigmoid(logit))
    diff = sp.diff(f_of_l, logit) - flow
    # sigmoid(L) covers (0, 1): check with exp(-L) = t > 0
    t = sp.Symbol("t", positive=True)
    assert sp.simplify(diff.subs(sp.exp(-logit), t).subs(logit, -sp.log(t))) == 0


@pytest.mark.parametrize("name", ["trl", "max_abs"])
def test_logit_flow_numerically(name):
    cal = CASES[name]
    f = tr.ascended_objective(cal).subs(eps, sp.Float(cal.eps, 30))
    flow = tr.logit_flow(cal).subs(eps, sp.Float(cal.eps, 30))
    logit = sp.Symbol("L", real=True)
    f_of_l = f.subs(p, sigmoid(logit))
    for x in (0.2, 0.45, 0.7, 0.93):
        at = sp.log(sp.Float(x, 30) / (1 - sp.Float(x, 30)))
        lhs = sp.N(sp.diff(f_of_l, logit).subs(logit, at), 30)
        rhs = sp.N(flow.subs(p, sp.Float(x, 30)), 30)
        assert abs(lhs - rhs) < 1e-20


@pytest.mark.parametrize("name", sorted(CASES))
def test_f_against_quad(name):
    """F(p) against scipy's quadrature of the registry's numpy Omega."""
    cal = CASES[name]
    f = tr.ascended_objective(cal)
    assert not f.has(sp.Integral), f"no closed form for {name}"
    for x in P_VALUES:
        points = [0.5] if name == "max_abs" and x > 0.5 else None
        value, err = quad(lambda s, cal=cal: float(cal.omega(s)), 0.0, x, points=points,
                          epsabs=1e-13, epsrel=1e-13, limit=200)
        exact = float(sp.N(f.subs({eps: sp.Float(cal.eps, 30), p: sp.Float(x, 30)}), 30))
        tol = 10 * err + 8 * np.finfo(float).eps * abs(value)
        assert abs(exact - value) <= tol, (name, x, exact, value, err)


def test_f_vanishes_at_zero():
    for name, cal in CASES.items():
        value = tr.ascended_objective(cal).subs(p, 0)
        if name == "trl":  # SymPy does not cancel the logarithms: 30 digits at three eps
            for e in ("1e-4", "0.1", "0.3"):
                assert abs(sp.N(value.subs(eps, sp.Float(e, 30)), 30)) < 1e-25
        else:
            assert sp.simplify(value) == 0, name


def test_trl_matches_hand_closed_form():
    """Partial fractions by hand: roots (-1 +- D) / (2 eps) of eps u^2 + u + eps."""
    f = tr.ascended_objective("trl")
    d = sp.sqrt(1 - 4 * eps**2)
    u = sp.sqrt(p / (1 - p))
    hand = 2 * sp.asin(sp.sqrt(p)) - 2 * eps / d * sp.log(
        (1 + d) * (1 - d + 2 * eps * u) / ((1 - d) * (1 + d + 2 * eps * u)))
    for e in ("1e-4", "0.01", "0.3"):
        for x in ("0.1", "0.5", "0.95"):
            at = {eps: sp.Float(e, 30), p: sp.Float(x, 30)}
            assert abs(sp.N((f - hand).subs(at), 30)) < 1e-25


def test_unknown_calibration_raises():
    with pytest.raises(ValueError, match="calibration must be .*'paper'.*got 'grpo'"):
        tr.expected_gradient_factor("grpo")
    with pytest.raises(ValueError, match="calibration"):
        tr.ascended_objective(3)
