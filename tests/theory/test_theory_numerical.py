"""Direct numerical maximisation of the regularised step against the closed forms."""

import numpy as np
import pytest

from grpo_companion import theory
from grpo_companion.theory.analyses import numerical


def _problem(seed, n=7):
    rng = np.random.default_rng(100 + seed)
    pi_ref = rng.dirichlet(np.ones(n))
    pi_prev = rng.dirichlet(np.ones(n))
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(n, size=rng.integers(1, n), replace=False)] = True
    return pi_ref, pi_prev, mask


CALS = [theory.Calibration(eps=1e-5), theory.Calibration(normalization="mean_only"),
        theory.Calibration(eps=1e-4, eps_placement="std")]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.35, 0.8])
@pytest.mark.parametrize("cal", CALS)
def test_maximiser_matches_closed_form(seed, alpha, cal):
    pi_ref, pi_prev, mask = _problem(seed)
    beta = [0.3, 1.0, 2.5, 7.0][seed]
    res = numerical.maximise_regularised_objective(pi_ref, pi_prev, mask, beta, alpha=alpha,
                                                   calibration=cal)
    closed = theory.optimal_policy(pi_ref, pi_prev, mask, beta, alpha=alpha, calibration=cal)
    assert res.converged
    np.testing.assert_allclose(res.policy, closed, atol=1e-8)
    at_closed = numerical.regularised_objective(closed, pi_ref, pi_prev, mask, beta,
                                                alpha=alpha, calibration=cal)
    assert at_closed >= res.objective - 1e-12


@pytest.mark.parametrize("seed", range(3))
def test_general_anchor_theorem8(seed):
    anchor, nu, _ = _problem(seed)
    mask = np.arange(anchor.size) < 3
    p_nu = nu[mask].sum()
    beta = 0.6
    res = numerical.maximise_regularised_objective(anchor, anchor, mask, beta, p_nu=p_nu)
    closed = theory.anchored_policy(anchor, mask, p_nu, beta)
    np.testing.assert_allclose(res.policy, closed, atol=1e-8)
    # the printed Theorem 8 (no 1/beta) is not the maximiser when beta != 1
    w_plus, w_minus = theory.weights(p_nu)
    printed = anchor * np.exp(np.where(mask, w_plus, -w_minus))
    printed /= printed.sum()
    assert np.max(np.abs(printed - res.policy)) > 1e-3


def test_objective_matches_hand_computation():
    pi_ref, pi_prev, mask = _problem(0)
    pi = np.full(pi_ref.size, 1 / pi_ref.size)
    alpha, beta = 0.3, 1.7
    p = pi_prev[mask].sum()
    w_plus, w_minus = theory.weights(p)
    expected = pi @ np.where(mask, w_plus, -w_minus) - beta * (
        alpha * theory.kl_divergence(pi, pi_ref) + (1 - alpha) * theory.kl_divergence(pi, pi_prev)
    )
    got = numerical.regularised_objective(pi, pi_ref, pi_prev, mask, beta, alpha=alpha)
    assert got == pytest.approx(expected, rel=1e-13)


def test_starting_point_does_not_matter():
    pi_ref, pi_prev, mask = _problem(2)
    a = numerical.maximise_regularised_objective(pi_ref, pi_prev, mask, 0.9, alpha=0.5)
    b = numerical.maximise_regularised_objective(pi_ref, pi_prev, mask, 0.9, alpha=0.5,
                                                 x0=np.linspace(-3, 3, pi_ref.size))
    np.testing.assert_allclose(a.policy, b.policy, atol=1e-9)


def test_zero_entries_allowed_only_where_the_kl_term_is_off():
    pi_ref, _, mask = _problem(1)
    prev = np.zeros_like(pi_ref)
    prev[np.flatnonzero(mask)[0]] = prev[np.flatnonzero(~mask)[0]] = 0.5
    res = numerical.maximise_regularised_objective(pi_ref, prev, mask, 1.0, alpha=1.0)
    np.testing.assert_allclose(res.policy, theory.optimal_policy(pi_ref, prev, mask, 1.0),
                               atol=1e-8)
    with pytest.raises(ValueError, match="pi_prev must be > 0"):
        numerical.maximise_regularised_objective(pi_ref, prev, mask, 1.0, alpha=0.5)


def test_input_validation():
    pi_ref, pi_prev, mask = _problem(0)
    with pytest.raises(ValueError, match="beta"):
        numerical.maximise_regularised_objective(pi_ref, pi_prev, mask, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        numerical.maximise_regularised_objective(pi_ref, pi_prev, mask, 1.0, alpha=1.5)
    with pytest.raises(ValueError, match="p_nu"):
        numerical.maximise_regularised_objective(pi_ref, pi_prev, mask, 1.0, p_nu=1.2)
    with pytest.raises(ValueError, match="gtol"):
        numerical.maximise_regularised_objective(pi_ref, pi_prev, mask, 1.0, gtol=0)
    with pytest.raises(ValueError, match="x0"):
        numerical.maximise_regularised_objective(pi_ref, pi_prev, mask, 1.0, x0=[0.0])
    with pytest.raises(ValueError, match="same shape"):
        numerical.maximise_regularised_objective(pi_ref, pi_prev[:-1] / pi_prev[:-1].sum(),
                                                 mask, 1.0)
    with pytest.raises(ValueError, match="1-D"):
        numerical.maximise_regularised_objective(np.stack([pi_ref] * 2), pi_prev, mask, 1.0)


def test_max_scaled_error_against_a_loop():
    rng = np.random.default_rng(4)
    value, reference = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    for scale in (np.abs(reference), np.maximum(1.0, np.abs(reference)), 0.05):
        s = np.broadcast_to(scale, value.shape)
        want = max(abs(v - r) / u for v, r, u in zip(value.flat, reference.flat, s.flat,
                                                     strict=True))
        assert numerical.max_scaled_error(value, reference, scale) == want
    assert numerical.max_scaled_error([1.0, 2.0], 2.0, [1.0, 4.0]) == 1.0  # broadcast


@pytest.mark.parametrize("args, name", [(([1.0], [1.0], [0.0]), "scale"),
                                        (([1.0], [np.nan], [1.0]), "reference"),
                                        (("x", [1.0], [1.0]), "value"),
                                        (([], [], 1.0), "value"),
                                        (([1.0, 2.0], [1.0, 2.0, 3.0], 1.0), "value")])
def test_max_scaled_error_refuses_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        numerical.max_scaled_error(*args)


def test_success_log_odds_against_logit_of_the_success_mass():
    rng = np.random.default_rng(8)
    pi = rng.dirichlet(np.ones(6), size=(4, 3))
    mask = np.array([True, False, True, False, False, True])
    want = theory.logit(pi[..., mask].sum(-1))
    got = numerical.success_log_odds(pi, mask)
    assert got.shape == (4, 3)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_success_log_odds_keeps_a_failure_mass_below_the_float_resolution():
    pi = np.array([1.0 - 1e-20, 1e-20, 0.0])  # 1 - p rounds to 0, the masses do not
    assert numerical.success_log_odds(pi, [1, 0, 0]) == pytest.approx(np.log(1e20), rel=1e-15)


@pytest.mark.parametrize("mask, name", [([1, 1, 1], "success_mask"), ([0, 0, 0], "success_mask"),
                                        ([1, 0], "success_mask")])
def test_success_log_odds_refuses_bad_masks(mask, name):
    with pytest.raises(ValueError, match=name):
        numerical.success_log_odds([0.2, 0.3, 0.5], mask)
