"""Contrastive form of the GRPO objective (Section 2.2-2.3)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from grpo_companion.symbolic import contrastive as con


def test_pointwise_identity_by_sign():
    cases = con.clipped_surrogate_by_sign()
    assert set(cases) == {"positive", "negative"}
    for case in cases.values():
        assert set(case.regions) == {"below", "inside", "above"}
        assert all(v == 0 for v in case.regions.values())


def test_pointwise_identity_numerically():
    """Independent numpy check, including ratios exactly on the clip edges."""
    rng = np.random.default_rng(0)
    c = rng.uniform(0.01, 0.9, 2000)
    x = np.concatenate([rng.uniform(0.0, 3.0, 1000), 1 - c[:500], 1 + c[500:1000]])
    a = rng.uniform(0.01, 5.0, 2000)
    f_pos = np.minimum(x * a, np.clip(x, 1 - c, 1 + c) * a)
    f_neg = np.minimum(-x * a, -np.clip(x, 1 - c, 1 + c) * a)
    np.testing.assert_allclose(f_pos, a * np.minimum(x, 1 + c), rtol=1e-14)
    np.testing.assert_allclose(f_neg, -a * np.maximum(x, 1 - c), rtol=1e-14)


def test_sympy_surrogate_matches_numpy():
    f = sp.lambdify((con.ratio, sp.Symbol("y"), con.clip_eps),
                    con.clipped_surrogate(con.ratio, sp.Symbol("y")), "numpy")
    rng = np.random.default_rng(1)
    x, y, c = rng.uniform(0, 3, 200), rng.normal(size=200), rng.uniform(0.05, 0.5, 200)
    expected = np.minimum(x * y, np.clip(x, 1 - c, 1 + c) * y)
    np.testing.assert_allclose(f(x, y, c), expected, rtol=1e-14)


@pytest.mark.parametrize(("n_success", "n_failure"), [(1, 1), (1, 2)])
def test_finite_space_clipped_identity(n_success, n_failure):
    ident = con.contrastive_identity(n_success, n_failure, clipped=True)
    args = (*ident.prev_probs, *ident.ratios, con.w_plus_sym, con.w_minus_sym, con.clip_eps)
    lhs = sp.lambdify(args, ident.per_sample, "numpy")
    rhs = sp.lambdify(args, ident.contrastive, "numpy")
    rng = np.random.default_rng(2)
    for _ in range(50):
        vals = rng.uniform(0.0, 2.5, len(args))
        vals[-1] = rng.uniform(0.05, 0.5)
        assert lhs(*vals) == pytest.approx(rhs(*vals), rel=1e-12, abs=1e-14)


def test_unclipped_identity_is_importance_sampling():
    ident = con.contrastive_identity(2, 2, clipped=False)
    assert sp.expand(ident.per_sample - ident.contrastive) == 0
    # with a Bernoulli old policy, E_old[A] = w+ p - w- (1 - p) vanishes for GRPO weights,
    # so the unclipped objective at x = 1 (pi = pi_old) is 0
    from grpo_companion.symbolic.calibration import calibration_weights
    from grpo_companion.symbolic.symbols import p

    w = calibration_weights()
    q1, q2, q3, q4 = ident.prev_probs
    at_old = ident.contrastive.subs({x: 1 for x in ident.ratios})
    at_old = at_old.subs({q2: p - q1, q4: 1 - p - q3})
    at_old = at_old.subs({con.w_plus_sym: w.w_plus, con.w_minus_sym: w.w_minus})
    assert sp.simplify(at_old) == 0


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="n_success"):
        con.contrastive_identity(0, 1)
    with pytest.raises(ValueError, match="n_failure"):
        con.contrastive_identity(1, 4)
