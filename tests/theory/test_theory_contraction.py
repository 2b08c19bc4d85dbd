"""Theorem 7 (local contraction), Theorem 6 (the reference map) and Remark 2 (uniformity)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_companion import theory
from grpo_companion.theory.analyses.contraction import (
    local_contraction,
    reference_map_contraction,
    uniform_contraction,
)

DOTTIE = 0.7390851332151607  # the fixed point of cos, cos(x) = x


def _logistic(lam):
    lam = np.asarray(lam, dtype=float)[:, None]
    return (lambda x: lam * x * (1 - x)), (lambda x: lam * (1 - 2 * x)), 1 - 1 / lam[:, 0]


def test_cosine_contracts_around_its_fixed_point() -> None:
    res = local_contraction(np.cos, lambda x: -np.sin(x), [DOTTIE])
    assert res.holds.all() and res.maps_into.all() and res.unique.all()
    assert res.slope[0] == pytest.approx(np.sin(DOTTIE), rel=1e-12)
    assert res.slope[0] < res.rate[0] < 1 and res.radius[0] > 0.1
    assert res.worst_ratio[0] <= 1 and res.final_error[0] < 1e-12


@settings(max_examples=40, deadline=None)
@given(st.floats(1.05, 2.95))
def test_logistic_fixed_point_contracts_exactly_when_the_slope_is_below_one(lam) -> None:
    # f(x) = lam x (1 - x) has x* = 1 - 1/lam with f'(x*) = 2 - lam, |f'(x*)| < 1 on (1, 3)
    f, fp, x_star = _logistic([lam])
    res = local_contraction(f, fp, x_star, n_steps=400)
    assert res.holds.all()
    assert res.rate[0] <= 0.5 * (1 + abs(2 - lam)) + 1e-15


def test_the_check_fails_where_the_lemma_does_not_apply() -> None:
    # unstable (|f'| = 1.2), neutral (|f'| = 1) and a point that is not a fixed point
    f, fp, x_star = _logistic([3.2, 3.0])
    res = local_contraction(f, fp, x_star)
    assert not res.holds.any() and np.all(res.radius == 0) and np.all(np.isnan(res.rate))
    wrong = local_contraction(np.cos, lambda x: -np.sin(x), [0.7])
    assert not wrong.holds.any() and wrong.fixed_residual[0] > 0.06


def test_a_false_rate_is_caught_by_the_orbits() -> None:
    # a derivative that understates |f'| makes the lemma's construction choose a rate
    # the orbits of f cannot meet: the envelope check must fail
    f, _, x_star = _logistic([2.9])
    res = local_contraction(f, lambda x: 0.1 * np.ones_like(x), x_star, radius0=0.01)
    assert not res.holds.any() and res.worst_ratio[0] > 1


def test_reference_map_fixed_points_contract_iff_lemma1_says_stable() -> None:
    p_ref = np.array([1e-4, 1e-3, 0.05, 0.2, 0.5])[:, None]
    beta = np.array([0.3, 1.0, 5.0, 30.0])[None, :]
    roots = theory.fixed_points_logit(theory.logit(p_ref), beta, eps=1e-5)
    ok = ~np.isnan(roots)
    L_ref = np.broadcast_to(theory.logit(p_ref)[..., None], roots.shape)[ok]
    b = np.broadcast_to(beta[..., None], roots.shape)[ok]
    res = reference_map_contraction(roots[ok], L_ref, b, eps=1e-5)
    stable = theory.stability_bound(theory.sigmoid(roots[ok]), eps=1e-5) < b
    clear = np.abs(res.slope - 1) > 1e-3
    assert np.array_equal(res.holds[clear], stable[clear])
    assert res.holds.sum() > 5 and (~res.holds).sum() > 3


def test_uniform_contraction_is_the_worst_case() -> None:
    res = local_contraction(np.cos, lambda x: -np.sin(x), [DOTTIE, DOTTIE])
    assert uniform_contraction(res) == (res.radius.min(), res.rate.max())
    f, fp, x_star = _logistic([2.5, 3.2])
    r, k = uniform_contraction(local_contraction(f, fp, x_star))
    assert r == 0 and np.isnan(k)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="x_star"):
        local_contraction(np.cos, np.sin, [[0.1, 0.2]])
    with pytest.raises(ValueError, match="n_steps"):
        local_contraction(np.cos, np.sin, [DOTTIE], n_steps=0)
    with pytest.raises(ValueError, match="radius0"):
        local_contraction(np.cos, np.sin, [DOTTIE], radius0=-1.0)
    with pytest.raises(ValueError, match="beta"):
        reference_map_contraction(0.0, 0.0, -1.0, eps=1e-5)
