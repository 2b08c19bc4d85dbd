"""Calibration weights: closed forms, finite groups (Monte Carlo, large-G limit), extremes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_companion import theory

P = np.array([1e-3, 0.05, 0.3, 0.5, 0.77, 0.999])


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.1])
def test_population_weights_match_eq4_and_practice(eps):
    # eq. (4): (1-p)/sqrt(p(1-p)+eps), p/sqrt(p(1-p)+eps); practice: sqrt(p(1-p)) + eps
    w_plus, w_minus = theory.weights(P, eps=eps)
    np.testing.assert_allclose(w_plus, (1 - P) / np.sqrt(P * (1 - P) + eps), rtol=1e-12)
    np.testing.assert_allclose(w_minus, P / np.sqrt(P * (1 - P) + eps), rtol=1e-12)
    w_plus, w_minus = theory.weights(P, eps=eps, eps_placement="std")
    np.testing.assert_allclose(w_plus, (1 - P) / (np.sqrt(P * (1 - P)) + eps), rtol=1e-12)
    np.testing.assert_allclose(w_minus, P / (np.sqrt(P * (1 - P)) + eps), rtol=1e-12)


def test_mean_only_weights_eq13():
    w_plus, w_minus = theory.weights(P, normalization="mean_only")
    np.testing.assert_allclose(w_plus, 1 - P, rtol=1e-12)
    np.testing.assert_allclose(w_minus, P, rtol=1e-12)
    np.testing.assert_allclose(theory.omega(P, normalization="mean_only"), 1.0)


def test_eps_zero_at_extreme_probabilities():
    # p = 1e-300: w+ = sqrt((1-p)/p) = 1e150, w- = sqrt(p/(1-p)) = 1e-150
    w_plus, w_minus = theory.weights(1e-300, eps=0.0)
    np.testing.assert_allclose([w_plus, w_minus], [1e150, 1e-150], rtol=1e-12)
    # given as a logit: Omega = 2 cosh(L/2) exactly when eps = 0
    L = np.array([-1300.0, -40.0, 0.0, 3.0, 700.0])
    np.testing.assert_allclose(theory.omega_of_logit(L, eps=0.0), 2 * np.cosh(L / 2), rtol=1e-12)
    assert np.isfinite(theory.omega_of_logit([-np.inf, np.inf], eps=1e-5)).all()


def test_omega_prime_matches_finite_differences():
    L = np.linspace(-15, 15, 61)
    h = 1e-5
    for cal in [theory.Calibration(eps=1e-3), theory.Calibration(eps=0.01, eps_placement="std"),
                theory.Calibration(group_size=6, ddof=1), theory.Calibration(eps=0.0)]:
        fd = (cal.omega_of_logit(L + h) - cal.omega_of_logit(L - h)) / (2 * h)
        np.testing.assert_allclose(cal.omega_prime_of_logit(L), fd, rtol=1e-6, atol=1e-8)


def _practice_advantages(rewards, *, eps, eps_placement, ddof, normalization):
    """Advantages computed the way GRPO code does it, group by group (rows)."""
    mean = rewards.mean(axis=1, keepdims=True)
    centred = rewards - mean
    if normalization == "mean_only":
        return centred
    std = rewards.std(axis=1, ddof=ddof, keepdims=True)
    scale = np.sqrt(std**2 + eps) if eps_placement == "sqrt" else std + eps
    with np.errstate(invalid="ignore", divide="ignore"):
        adv = centred / scale
    return np.where(centred == 0, 0.0, adv)  # all-equal groups get zero advantage


@pytest.mark.parametrize(
    "group_size, eps, placement, ddof, normalization",
    [(8, 1e-4, "std", 1, "mean_std"), (5, 0.0, "sqrt", 0, "mean_std"),
     (16, 1e-5, "sqrt", 0, "mean_std"), (4, 0.0, "std", 1, "mean_only")],
)
@pytest.mark.parametrize("p", [0.03, 0.4, 0.9])
def test_finite_group_weights_match_monte_carlo(group_size, eps, placement, ddof,
                                                normalization, p):
    rng = np.random.default_rng(1234)
    rewards = (rng.random((100_000, group_size)) < p).astype(float)
    adv = _practice_advantages(rewards, eps=eps, eps_placement=placement, ddof=ddof,
                               normalization=normalization)
    first, own = adv[:, 0], rewards[:, 0]  # one sample per group: independent draws
    w_plus, w_minus = theory.weights(p, eps=eps, eps_placement=placement, ddof=ddof,
                                     group_size=group_size, normalization=normalization)
    for value, sel in ((w_plus, own == 1), (-w_minus, own == 0)):
        est = first[sel].mean()
        se = first[sel].std(ddof=1) / np.sqrt(sel.sum())
        assert abs(est - value) <= 4 * se + 1e-12, (est, value, se)


@pytest.mark.parametrize("placement, ddof", [("sqrt", 0), ("std", 1)])
def test_finite_group_tends_to_population(placement, ddof):
    p = np.linspace(0.05, 0.95, 19)
    pop = np.stack(theory.weights(p, eps=1e-3, eps_placement=placement))
    errors = []
    for g in (4, 32, 256, 2048):
        fin = np.stack(theory.weights(p, eps=1e-3, eps_placement=placement, ddof=ddof,
                                      group_size=g))
        errors.append(np.max(np.abs(fin - pop) / pop))
    assert all(b < a for a, b in zip(errors, errors[1:], strict=False))
    assert errors[-1] < 5e-3


def test_finite_group_mean_only_closed_form():
    # E[A | r=1] = (1 - 1/G) - (G-1) p / G: hand derivation from E[S] = (G-1) p
    g, p = 7, np.array([0.0, 0.2, 1.0])
    w_plus, w_minus = theory.weights(p, normalization="mean_only", group_size=g)
    np.testing.assert_allclose(w_plus, (g - 1) / g * (1 - p), atol=1e-15)
    np.testing.assert_allclose(w_minus, (g - 1) / g * p, atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(st.floats(-30, 30), st.integers(2, 40), st.sampled_from(["sqrt", "std"]))
def test_finite_group_omega_is_symmetric(L, g, placement):
    cal = theory.Calibration(eps=1e-4, eps_placement=placement, group_size=g, ddof=1)
    np.testing.assert_allclose(cal.omega_of_logit(L), cal.omega_of_logit(-L), rtol=1e-10)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"eps": -1.0}, "eps must be"), ({"normalization": "whiten"}, "normalization"),
     ({"eps_placement": "inside"}, "eps_placement"), ({"group_size": 1}, "group_size"),
     ({"group_size": 2.5}, "group_size"), ({"ddof": 2}, "ddof"),
     ({"eps": float("nan")}, "eps"), ({"eps": 1e-310}, "eps")],
)
def test_bad_calibration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        theory.weights(0.5, **kwargs)


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_bad_probability(p):
    with pytest.raises(ValueError, match="p must"):
        theory.weights(p)


def test_eps_zero_undefined_at_boundary():
    with pytest.raises(ValueError, match="eps=0"):
        theory.weights([0.2, 1.0], eps=0.0)
    # finite groups and mean-only stay defined
    assert np.isfinite(theory.weights(0.0, eps=0.0, group_size=4)).all()
    assert np.isfinite(theory.weights(1.0, eps=0.0, normalization="mean_only")).all()
