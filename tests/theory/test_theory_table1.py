"""Table 1 rows: data, numerical checks, and the two-KL counterexample, done independently."""

import math

import numpy as np
import pytest

from grpo_companion import theory
from grpo_companion.theory.analyses import table1
from tests._converged import EPS, ULPS, brent_root


def test_variants_are_the_six_rows():
    rows = table1.variants(eps=1e-4, alpha_two_kl=0.3)
    assert [v.key for v in rows] == ["grpo", "dr_grpo", "mirror", "mirror_dr", "two_kl",
                                     "two_kl_mean"]
    assert [v.alpha for v in rows] == [1.0, 1.0, 0.0, 0.0, 0.3, 0.3]
    assert [v.calibration.normalization for v in rows] == ["mean_std", "mean_only"] * 3
    assert rows[0].calibration.eps == 1e-4
    with pytest.raises(ValueError):
        table1.variants(alpha_two_kl=1.0)


@pytest.fixture(scope="module")
def checks():
    return table1.check_table1(n_grid=16, n_steps=20)


def test_statuses(checks):
    assert [c.status for c in checks] == ["pass", "pass", "pass", "pass", "corrected", "pass"]
    for c in checks:
        assert c.reason


def test_policy_closed_form_matches_scalar_recurrence(checks):
    for c in checks:
        assert c.recurrence_error < 1e-10, c.variant.key
        assert c.trajectory_error < 1e-8, c.variant.key
        assert c.evidence["trajectory_cells"] > 0
    for c in checks[4:]:
        assert c.renyi_max < 1e-10  # Delta_R = 0 along pi_0 = pi_ref
        assert c.evidence["renyi_step_size"] > 1e-3  # ... but not from another pi_0
        assert c.evidence["renyi_step_error"] < 1e-9


def _two_kl_logit(L, lr, alpha, beta, eps):
    e = math.exp(-abs(L))
    return alpha * lr + (1 - alpha) * L + 1 / (beta * math.sqrt(e / (1 + e) ** 2 + eps))


def test_two_kl_counterexample_by_hand():
    """alpha = 0.5, beta = 1, eps = 1e-5, p_ref = 1e-3: three fixed points, one with slope ~2.8."""
    a, b, eps = 0.5, 1.0, 1e-5
    lr = math.log(1e-3 / (1 - 1e-3))
    grid = np.linspace(lr, lr + 2 / (a * b * math.sqrt(eps)) + 1, 400_001)
    g = np.array([_two_kl_logit(x, lr, a, b, eps) - x for x in grid[::50]])
    xs = grid[::50]
    found = [brent_root(lambda x: _two_kl_logit(x, lr, a, b, eps) - x, xs[i], xs[i + 1],
                        xtol=1e-13)
             for i in np.flatnonzero(np.sign(g[1:]) != np.sign(g[:-1]))]
    roots, widths = np.array([r for r, _ in found]), np.array([w for _, w in found])
    assert len(roots) == 3
    h = 1e-6
    slopes = np.array([(_two_kl_logit(r + h, lr, a, b, eps) - _two_kl_logit(r - h, lr, a, b, eps))
                       / (2 * h) for r in roots])
    assert max(slopes) == pytest.approx(2.80, abs=0.01)
    lib = theory.fixed_points_logit(lr, b, alpha=a, eps=eps)
    # tolerance: brentq's bracket (widths) and the library's (4 ulps of max(1, |L|)), plus
    # the rounding of the map's three terms moving each sign change by rounding / |g' - 1|
    omega_term = np.array([_two_kl_logit(r, 0.0, 1.0, b, eps) for r in roots])  # Omega / b
    rounding = ULPS * EPS * (a * abs(lr) + (1 - a) * np.abs(roots) + omega_term + np.abs(roots))
    tol = widths + 4 * EPS * np.maximum(1.0, np.abs(roots)) + 2 * rounding / np.abs(slopes - 1)
    assert np.all(np.abs(lib - roots) <= tol), (lib - roots, tol)


def test_max_lemma1_bound_matches_brute_force():
    for eps in (1e-5, 1e-3, 1e-1):
        p = np.linspace(1e-7, 1 - 1e-7, 2_000_001)
        brute = np.max(p * (1 - p) * np.abs(2 * p - 1) / (2 * (p * (1 - p) + eps) ** 1.5))
        cal = theory.Calibration("mean_std", eps)
        assert table1.max_lemma1_bound(cal) == pytest.approx(brute, rel=1e-4)
    assert table1.max_lemma1_bound(theory.Calibration("mean_only")) == 0


def test_two_kl_contraction_threshold(checks):
    ev = checks[4].evidence
    assert ev["sup_slope_above"] < 1 < ev["sup_slope_below"]
    assert ev["beta_contraction"] == pytest.approx(ev["max_B"] / 0.5)
    assert ev["cells_unstable_fp"] > 0 and ev["max_fp_slope"] > 1


def test_mirror_rows(checks):
    for c in checks[2:4]:
        assert c.evidence["interior_fixed_points"] == 0
        bound = c.evidence["bound_omega_inf_over_beta_max"]
        assert c.evidence["min_logit_increment"] >= bound * (1 - 1e-9)
        assert c.evidence["share_saturating"] == 1
    assert checks[3].evidence["arithmetic_error"] < 1e-12


def test_mean_only_two_kl_rate(checks):
    assert checks[5].evidence["geometric_rate_error"] < 1e-9
    assert checks[5].evidence["max_fixed_points"] == 1
