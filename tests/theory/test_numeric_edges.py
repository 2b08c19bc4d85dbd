"""Numeric edge cases of the PoS dynamics and the policy iteration: never a silent NaN.

- a slowly contracting map (small ``alpha``) still approaching its fixed point
  when the run ends is classified by its limit, checked against a long iterate;
- ``h'(p)`` where ``Omega' / beta`` overflows is its limit, checked with mpmath;
- the policy iteration keeps log-policies, so ``beta`` near 0 with ``eps = 0``
  gives the limiting policies instead of an error from an internal NaN.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from scipy import special

import grpo_companion.theory as theory
from grpo_companion.theory import Regime


@pytest.mark.parametrize(("p0", "p_ref", "beta", "alpha", "cal"), [
    (0.3, 0.3, 0.1, 1e-3, {}),  # fixed point at logit ~3.2e6: PoS 1 in float64
    (0.3, 0.3, 1e3, 1e-3, {"normalization": "mean_only"}),  # interior, p* ~ 0.54
    (0.9, 0.3, 1e3, 1e-3, {"normalization": "mean_only"}),  # the same, from above
])
def test_slow_monotone_convergence_is_classified_by_its_limit(p0, p_ref, beta, alpha, cal):
    res = theory.classify_dynamics(p0, p_ref, beta, alpha=alpha, **cal)
    long = theory.iterate_logit(special.logit(p0), special.logit(p_ref), beta, 60_000,
                                alpha=alpha, keep_path=False, **cal)
    assert np.isfinite(long)
    assert int(res.regime) in (Regime.FIXED_POINT, Regime.SATURATES)
    assert int(res.regime) == Regime.FIXED_POINT  # the logit converges: not logit -> inf
    assert not np.isnan(res.limits).any()
    np.testing.assert_allclose(res.limits, [special.expit(long)] * 2, rtol=1e-9, atol=0)
    # the limit is the map's fixed point
    fixed = theory.fixed_points_logit(special.logit(p_ref), beta, alpha=alpha, **cal)
    np.testing.assert_allclose(long, fixed, rtol=1e-7)


def test_slow_convergence_on_a_grid_keeps_other_regimes():
    p_ref = np.array([0.3, 0.3, 0.3])
    beta = np.array([0.1, 1.0, 0.02])
    alpha = np.array([1e-3, 1.0, 1.0])
    res = theory.classify_dynamics(0.3, p_ref, beta, alpha=alpha)
    one = [theory.classify_dynamics(0.3, r, b, alpha=a) for r, b, a in
           zip(p_ref, beta, alpha, strict=True)]
    np.testing.assert_array_equal(res.regime, [int(o.regime) for o in one])
    np.testing.assert_array_equal(res.limits, np.array([o.limits for o in one]))
    assert res.regime[0] == Regime.FIXED_POINT and res.regime[1] == Regime.FIXED_POINT


def _h_prime_mpmath(p: float, p_ref: float, beta: float) -> float:
    """``h'(p)`` of the reference map with eps = 0 whitening, at 400 digits."""
    with mpmath.workdps(400):
        p, p_ref, beta = mpmath.mpf(p), mpmath.mpf(p_ref), mpmath.mpf(beta)
        var = p * (1 - p)
        lp = mpmath.log(p / (1 - p))
        omega = 1 / mpmath.sqrt(var)
        d_omega_dl = -omega * (1 - 2 * p) / 2  # dOmega/dp * dp/dL, dp/dL = var
        nxt = mpmath.log(p_ref / (1 - p_ref)) + omega / beta
        del lp
        h_var = mpmath.exp(-abs(nxt)) / (1 + mpmath.exp(-abs(nxt))) ** 2
        return float(h_var * (d_omega_dl / beta) / var)


@pytest.mark.parametrize(("p", "p_ref", "beta"), [
    (1e-300, 0.5, 1e-200),  # Omega' / beta overflows, h (1 - h) is exp(-1e350)
    (1e-300, 0.5, 1e-160),  # Omega / beta = 1e310 overflows as well
    (1e-300, 0.5, 1e148),  # finite, but h (1 - h) / (p (1 - p)) is 1e256
    (1e-300, 0.5, 1e151),
    (0.2, 0.4, 1e-300),
    (1 - 2**-52, 0.5, 1e-300),
])
def test_pos_map_derivative_matches_mpmath_where_terms_overflow(p, p_ref, beta):
    got = theory.pos_map_derivative(p, p_ref, beta=beta, eps=0)
    want = _h_prime_mpmath(p, p_ref, beta)
    assert np.isfinite(got)
    if want == 0:
        assert got == 0
    else:
        assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(("pi_ref", "mask"), [
    ([0.5, 0.5], [True, False]),
    ([0.25, 0.25, 0.5], [True, False, False]),
    ([1e-6, 0.5, 0.5 - 1e-6], [True, False, False]),
    ([0.2, 0.3, 0.1, 0.4], [True, True, False, False]),
])
def test_policy_iterate_with_beta_near_zero_and_eps_zero_gives_the_limit(pi_ref, mask):
    pi_ref, mask = np.array(pi_ref), np.array(mask)
    pis = theory.policy_iterate(pi_ref, mask, 1e-300, 4, eps=0)
    assert np.isfinite(pis).all()
    # beta -> 0 with eps = 0: every step puts all mass on pi_ref's successes
    limit = np.where(mask, pi_ref, 0.0) / pi_ref[mask].sum()
    np.testing.assert_allclose(pis[0], pi_ref)
    for step in pis[1:]:
        np.testing.assert_allclose(step, limit, rtol=1e-12, atol=0)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_policy_iterate_pos_follows_the_logit_iterate(alpha):
    pi_ref, mask = np.array([0.1, 0.3, 0.6]), np.array([True, False, False])
    pis = theory.policy_iterate(pi_ref, mask, 0.5, 12, alpha=alpha, eps=0)
    assert np.isfinite(pis).all()
    want = theory.iterate(0.1, 0.1, 0.5, 12, alpha=alpha, eps=0)
    np.testing.assert_allclose(theory.pos(pis, mask), want, rtol=1e-9)


def test_policy_iterate_still_refuses_a_boundary_start_with_eps_zero():
    with pytest.raises(ValueError, match="pi_0"):
        theory.policy_iterate([0.5, 0.5], [True, False], 1.0, 2, pi_0=[1.0, 0.0], eps=0)


def test_scan_roots_finds_every_root_per_cell_to_adjacent_floats():
    """roots.scan_roots (shared by theory.analyses.clipped and
    theory.analyses.sample_weighting) against known roots: cos(x / c) has roots at
    c (pi/2 + k pi); an exact grid zero is kept once."""
    import math

    from grpo_companion.theory.roots import scan_roots

    c = np.array([1.0, 2.0])

    def g(x, cells):
        return np.cos(x / c[cells])

    out = scan_roots(g, np.array([0.0, 0.0]), np.array([10.0, 10.0]), 257)
    for row, scale in zip(out, c, strict=True):
        want = [scale * (math.pi / 2 + k * math.pi) for k in range(4)
                if scale * (math.pi / 2 + k * math.pi) < 10.0]
        got = row[~np.isnan(row)]
        assert got.size == len(want)
        assert np.allclose(got, want, rtol=0, atol=4 * np.spacing(10.0))
    line = scan_roots(lambda x, cells: x - 1.0, np.array([0.0]), np.array([2.0]), 3)
    assert line.tolist() == [[1.0]]  # bisection reaches a representable root exactly
