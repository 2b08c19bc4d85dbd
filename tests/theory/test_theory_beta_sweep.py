"""Chapter 5's beta sweep against the reference map written out and iterated here.

The map is g(L) = L_ref + Omega(L) / beta with Omega = (p(1-p) + eps)^(-1/2) (paper, eq. 4
and Theorem 2), in log-odds. Fixed points come from sign changes of g(L) - L and brentq,
slopes from central differences of g, orbits and Lyapunov exponents from direct iteration
with the chain rule h'(p) = h (1 - h) Omega'(p) / beta.
"""

import numpy as np
import pytest
from scipy import special

from grpo_companion.theory.analyses import beta_sweep
from tests._converged import EPS as ULP
from tests._converged import ULPS, brent_root

EPS = 1e-5


def _g(L, l_ref, beta):
    v = special.expit(L) * special.expit(-L)
    return l_ref + 1.0 / np.sqrt(v + EPS) / beta


def _roots(l_ref, beta):
    """Every root of g(L) = L; all lie in (L_ref, L_ref + max Omega / beta].

    Returns the roots and the half-widths of brentq's final brackets around them.
    """
    top = l_ref + 1.0 / (np.sqrt(EPS) * beta) + 1.0
    grid = np.concatenate([np.linspace(l_ref, 60.0, 120001), np.linspace(60.0, top, 20001)[1:]])
    f = _g(grid, l_ref, beta) - grid
    idx = np.flatnonzero(np.sign(f[:-1]) != np.sign(f[1:]))
    found = [brent_root(lambda x: _g(x, l_ref, beta) - x, grid[i], grid[i + 1], xtol=1e-12)
             for i in idx]
    return np.array([r for r, _ in found]), np.array([w for _, w in found])


def _root_tolerance(roots, widths, l_ref, beta):
    """How far two solvers' roots of g(L) - L may lie apart, from their stopping rules.

    Each solver stops within its bracket (brentq: ``widths``; the library: 4 ulps of
    max(1, |L|)) of a sign change of g - L as evaluated; rounding moves that sign change
    by at most (rounding of g - L) / |g' - 1|, with g - L a sum of three terms.
    """
    rounding = ULPS * ULP * (np.abs(l_ref) + np.abs(_g(roots, l_ref, beta) - l_ref)
                             + np.abs(roots))
    return (widths + 4 * ULP * np.maximum(1.0, np.abs(roots))
            + 2 * rounding / np.abs(_slope(roots, l_ref, beta) - 1))


def _slope(L, l_ref, beta, h=1e-6):
    return (_g(L + h, l_ref, beta) - _g(L - h, l_ref, beta)) / (2 * h)


def _lyapunov(p_ref, betas, n_transient=500, n_measure=300):
    l_ref = special.logit(p_ref)
    L, acc = np.full(betas.shape, l_ref), np.zeros(betas.shape)
    for n in range(n_transient + n_measure):
        nxt = _g(L, l_ref, betas)
        if n >= n_transient:
            p, v = special.expit(L), special.expit(L) * special.expit(-L)
            log_h1h = -np.logaddexp(0, nxt) - np.logaddexp(0, -nxt)  # log h (1 - h)
            acc += (log_h1h + np.log(np.abs(1 - 2 * p)) - np.log(2) - 1.5 * np.log(v + EPS)
                    - np.log(betas))
        L = nxt
    return acc / n_measure


BETAS = np.logspace(-1, 2, 60)


@pytest.mark.parametrize("p_ref", [1e-4, 0.2])
def test_fixed_points_count_and_stability_against_bracketing(p_ref):
    s = beta_sweep.sweep_beta(p_ref, BETAS, eps=EPS)
    l_ref = special.logit(p_ref)
    three = []
    for i, b in enumerate(BETAS):
        roots, widths = _roots(l_ref, b)
        assert s.n_fixed_points[i] == roots.size
        got = s.logit_fixed_points[i, : roots.size]
        # tolerance: both solvers' brackets plus rounding over |g' - 1| (_root_tolerance)
        tol = _root_tolerance(roots, widths, l_ref, b)
        assert np.all(np.abs(got - roots) <= tol), (b, got - roots, tol)
        slopes = _slope(roots, l_ref, b)
        clear = np.abs(np.abs(slopes) - 1) > 1e-4
        assert np.array_equal(s.stable[i, : roots.size][clear], (np.abs(slopes) < 1)[clear])
        if roots.size == 3:
            three.append(b)
    expected = (min(three), max(three)) if three else (np.nan, np.nan)
    np.testing.assert_array_equal(s.three_fixed_points, expected)


def test_lowest_fixed_point_loses_stability_in_a_period_doubling():
    s = beta_sweep.sweep_beta(1e-4, BETAS, eps=EPS)
    j = int(np.flatnonzero(BETAS == s.lowest_stable_from)[0])
    assert 0 < j < BETAS.size
    l_ref = special.logit(1e-4)
    # from j on the lowest fixed point attracts orbits started next to it ...
    for b in BETAS[j:]:
        roots, widths = _roots(l_ref, b)
        low = roots[0]
        s = abs(_slope(low, l_ref, b))
        L = low + 1e-3
        for _ in range(4000):
            L = _g(L, l_ref, b)
        # convergence: near a fixed point of slope s, |L - L*| <= |g(L) - L| / (1 - s)
        err = abs(_g(L, l_ref, b) - L) / (1 - s)
        assert err < 1e-9, f"beta={b}: orbit not converged after 4000 steps ({err:.1e})"
        # ... to the lowest root: iteration error, plus that root's bracket and rounding
        tol = err + _root_tolerance(roots[:1], widths[:1], l_ref, b)[0]
        assert abs(L - low) <= tol, (b, L - low, tol)
    # ... and just below it the orbit from next to it settles on a 2-cycle around it
    b = BETAS[j - 1]
    low = _roots(l_ref, b)[0][0]
    assert _slope(low, l_ref, b) < -1
    L = low + 1e-3
    for _ in range(4000):
        L = _g(L, l_ref, b)
    L1 = _g(L, l_ref, b)
    L2 = _g(L1, l_ref, b)
    # convergence to a cycle of the two-step map, slope s2 = g'(L) g'(L1) (|s2| < 1):
    # |L - cycle point| <= |L2 - L| / (1 - |s2|)
    s2 = abs(_slope(L, l_ref, b) * _slope(L1, l_ref, b))
    err = abs(L2 - L) / (1 - s2)
    assert s2 < 1 and err < 1e-9, f"beta={b}: no converged 2-cycle (|s2|={s2}, {err:.1e})"
    assert abs(L1 - L) > 1e-3  # a genuine cycle: the two points are far apart
    assert min(L, L1) < low < max(L, L1)


def test_lyapunov_and_chaos_range_against_direct_iteration():
    betas = np.logspace(-1, 2, 200)
    s = beta_sweep.sweep_beta(1e-4, betas, eps=EPS)
    own = _lyapunov(1e-4, betas)
    chaotic = own > 0
    assert chaotic.sum() >= 2
    assert np.array_equal(s.lyapunov > 0, chaotic)
    assert s.chaos == (betas[chaotic].min(), betas[chaotic].max())
    # off the chaotic cells the orbits are periodic and both exponents agree closely
    finite = np.isfinite(s.lyapunov) & ~chaotic
    np.testing.assert_allclose(s.lyapunov[finite], own[finite], rtol=0, atol=1e-6)


def test_no_chaos_and_no_fold_for_an_easy_prompt():
    s = beta_sweep.sweep_beta(0.6, np.array([0.05, 0.2, 50.0]), eps=EPS)
    assert np.all(np.isnan(s.chaos)) and np.all(np.isnan(s.three_fixed_points))
    assert s.fixed_points.shape == (3, 3) and np.all(s.n_fixed_points == 1)
    assert s.lowest_stable_from == 0.05


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"p_ref": 0.0}, "p_ref"), ({"p_ref": [0.1, 0.2]}, "p_ref"), ({"p_ref": np.nan}, "p_ref"),
    ({"betas": []}, "betas"), ({"betas": [1.0, 0.5]}, "betas"), ({"betas": [0.0, 1.0]}, "betas"),
    ({"betas": "1"}, "betas"), ({"alpha": 1.5}, "alpha"), ({"n_measure": 0}, "n_measure"),
    ({"n_transient": -1}, "n_transient"), ({"epsilon": 1e-5}, "epsilon"),
])
def test_bad_input_names_the_parameter(kwargs, name):
    call = {"p_ref": 0.2, "betas": [1.0, 2.0], **kwargs}
    with pytest.raises(ValueError, match=name):
        beta_sweep.sweep_beta(**call)


def _stable_from_by_scan(betas, stable):
    """The smallest grid beta at and above which every entry is stable, by brute force."""
    for i in range(len(betas)):
        if all(stable[i:]):
            return float(betas[i])
    return np.nan


@pytest.mark.parametrize("seed", range(8))
def test_stable_from_against_the_definition(seed):
    rng = np.random.default_rng(seed)
    betas = np.sort(rng.uniform(0.05, 50.0, 12))
    stable = rng.random(12) < 0.7
    if seed % 3 == 0:
        stable[-4:] = True  # a threshold inside the grid
    got = beta_sweep.stable_from(betas, stable)
    want = _stable_from_by_scan(betas, stable)
    assert (np.isnan(got) and np.isnan(want)) or got == want
    assert beta_sweep.stable_from(betas, np.ones(12, dtype=bool)) == betas[0]


def test_stable_from_is_the_sweeps_lowest_stable_from():
    betas = np.geomspace(0.1, 100.0, 40)
    sweep = beta_sweep.sweep_beta(1e-4, betas, eps=1e-5)
    assert beta_sweep.stable_from(betas, sweep.stable[:, 0]) == sweep.lowest_stable_from


@pytest.mark.parametrize("betas, stable, name", [
    ([1.0, 2.0], [True], "stable"), ([1.0, 2.0], [1, 0], "stable"),
    ([1.0, 2.0], "TT", "stable"), ([2.0, 1.0], [True, True], "betas"),
    ([], [], "betas")])
def test_stable_from_refuses_bad_input(betas, stable, name):
    with pytest.raises(ValueError, match=name):
        beta_sweep.stable_from(betas, stable)
