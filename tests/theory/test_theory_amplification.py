"""Theorem 3 closed form, the upper fixed point near 1, and the sign-change scan."""

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_companion import theory
from grpo_companion.theory.analyses.amplification import (
    scan_fixed_points,
    success_gain,
    upper_fixed_point_logit,
)


def _gain_mp(l_ref, d):
    """sigma(L_ref + d) - sigma(L_ref) with enough digits to resolve the difference."""
    digits = 40 + (int(-np.log10(abs(d))) if 0 < abs(d) < 1 else 0)
    digits += int(max(l_ref, l_ref + d, 0) / 2.3)  # sigma near 1 loses these to cancellation
    with mpmath.workdps(digits):
        sig = lambda x: 1 / (1 + mpmath.exp(-x))  # noqa: E731
        return float(sig(mpmath.mpf(l_ref) + mpmath.mpf(d)) - sig(mpmath.mpf(l_ref)))


@settings(max_examples=200, deadline=None)
@given(st.floats(-700, 700), st.floats(-700, 700))
def test_success_gain_matches_high_precision(l_ref, d):
    got = float(success_gain(l_ref, d))
    want = _gain_mp(l_ref, d)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-300)


@settings(max_examples=100, deadline=None)
@given(st.floats(1e-4, 1 - 1e-4), st.floats(1e-3, 30.0))
def test_success_gain_is_the_papers_factored_form(p_ref, d):
    # p_ref (1 - p_ref) (e^d - 1) / (1 + p_ref (e^d - 1)), typed in directly
    u = np.expm1(d)
    factored = p_ref * (1 - p_ref) * u / (1 + p_ref * u)
    got = float(success_gain(np.log(p_ref / (1 - p_ref)), d))
    assert got == pytest.approx(factored, rel=1e-10)
    assert got > 0


def test_success_gain_is_pos_map_minus_p_ref():
    p = np.linspace(0.01, 0.99, 99)[:, None]
    p_ref, beta, eps = np.array([1e-4, 0.2, 0.8]), 3.0, 1e-3
    d = theory.omega(p, eps=eps) / beta
    h = theory.pos_map(p, p_ref, beta, eps=eps)
    np.testing.assert_allclose(success_gain(theory.logit(p_ref), d), h - p_ref,
                               rtol=1e-9, atol=1e-15)


def test_success_gain_edges_and_errors():
    assert success_gain(-np.inf, 3.0) == 0.0
    assert success_gain(np.inf, -3.0) == 0.0
    assert success_gain(0.0, np.inf) == pytest.approx(0.5)
    assert success_gain(0.0, 0.0) == 0.0
    assert np.shape(success_gain(np.zeros(3), 1.0)) == (3,)
    with pytest.raises(ValueError, match="opposite signs"):
        success_gain(-np.inf, np.inf)
    with pytest.raises(ValueError, match="logit_gain"):
        success_gain(0.0, np.nan)


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
@pytest.mark.parametrize("placement", ["sqrt", "std"])
def test_upper_fixed_point_approximation(eps, placement):
    # where the largest fixed point has p (1 - p) << eps, it sits at L_ref + Omega(1)/beta
    p_ref = np.array([1e-3, 0.2, 0.8])[:, None]
    beta = np.array([0.05, 0.2, 1.0])[None, :]
    kw = {"eps": eps, "eps_placement": placement}
    roots = theory.fixed_points_logit(theory.logit(p_ref), beta, **kw)
    top = np.nanmax(roots, axis=-1)
    approx = upper_fixed_point_logit(theory.logit(p_ref), beta, **kw)
    assert np.all(top <= approx + 1e-9)  # Omega increases towards p = 1: an upper bound
    # independent error bound: Omega(1) - Omega(L) <= Omega'(bound) ... checked by hand:
    # (eps + v)^(-1/2) >= eps^(-1/2) (1 - v / (2 eps)) and sqrt(v) + eps >= eps, v <= e^(-L)
    v = np.exp(-top)
    slack = (v / (2 * eps**1.5) if placement == "sqrt" else np.sqrt(v) / eps**2) / beta
    far = v < 1e-3 * (eps if placement == "sqrt" else eps**2)
    assert far.sum() >= 4
    np.testing.assert_array_less((approx - top)[far], slack[far] * 1.0001 + 1e-12)


def test_upper_fixed_point_needs_bounded_omega():
    with pytest.raises(ValueError, match="infinite"):
        upper_fixed_point_logit(0.0, 1.0, eps=0.0)
    assert upper_fixed_point_logit(0.0, 2.0, normalization="mean_only") == pytest.approx(0.5)


@pytest.mark.parametrize("kw", [{"eps": 1e-5}, {"eps": 1e-2}, {"eps": 0.0},
                                {"eps": 1e-4, "eps_placement": "std"}])
def test_scan_agrees_with_root_finder(kw):
    p_ref = np.array([1e-5, 1e-3, 0.05, 0.3, 0.7, 0.99])[:, None]
    beta = np.array([0.5, 1.0, 3.0, 10.0, 60.0])[None, :]
    # every fixed point lies below L_ref + Omega(1)/beta <= 9.3 + 1e4/0.5 < 3e4
    below, above = scan_fixed_points(p_ref, beta, n_points=20_001,
                                     logit_range=(-700.0, 3e4), **kw)
    roots = theory.fixed_points_logit(theory.logit(p_ref), beta, **kw)
    counts = np.sum(~np.isnan(roots), axis=-1)
    assert np.all(below == 0)
    np.testing.assert_array_equal(above, counts)
    assert set(np.unique(counts)) >= ({0, 2} if kw["eps"] == 0 else {1, 3})


def test_scan_input_errors():
    with pytest.raises(ValueError, match="n_points"):
        scan_fixed_points(0.2, 1.0, n_points=1)
    with pytest.raises(ValueError, match="logit_range"):
        scan_fixed_points(0.2, 1.0, logit_range=(5.0, -5.0))
    with pytest.raises(ValueError, match="p_ref"):
        scan_fixed_points(1.0, 1.0)
    with pytest.raises(ValueError, match="beta"):
        scan_fixed_points(0.2, -1.0)
