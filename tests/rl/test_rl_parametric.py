"""Parametric (shared-parameter) GRPO iterations against the non-parametric theory."""

import itertools

import numpy as np
import pytest
from scipy import special

from grpo_companion import theory
from grpo_companion.rl import parametric as P
from grpo_companion.rl.tasks import make_bandit_task

EPS = 1e-5


def _bandit(n_prompts=6, n_outputs=5, p_ref=(0.05, 0.15, 0.3, 0.45, 0.6, 0.8), seed=0):
    task = make_bandit_task(n_prompts, n_outputs, n_success=2, p_ref=list(p_ref), seed=seed)
    ref = task.ref_logits.numpy()
    ref = ref - special.logsumexp(ref, axis=1, keepdims=True)
    return ref, task.success.numpy(), task.p_ref


@pytest.mark.parametrize("family", ["tabular", "correctness", "random_full"])
@pytest.mark.parametrize("beta", [1.5, 4.0])
def test_rich_families_reproduce_the_exact_iterates(family, beta):
    ref, success, p_ref = _bandit()
    n, k = success.shape
    phi = {"tabular": P.tabular_features(n, k),
           "correctness": P.correctness_features(success, n),
           "random_full": P.random_features(n, k, n * k, seed=3)}[family]
    run = P.parametric_grpo(P.LogLinearPolicy(ref, phi), success, beta, 12, eps=EPS)
    expected = theory.iterate(p_ref, p_ref, beta, 12, eps=EPS)
    np.testing.assert_allclose(run.success_prob, expected, rtol=0, atol=1e-11)
    exact = P.exact_iterates(np.exp(ref), success, beta, 12, eps=EPS)
    np.testing.assert_allclose(run.probs, exact, rtol=0, atol=1e-11)
    gap = P.parametric_gap(run.probs, exact, success)
    assert gap.tv.max() < 1e-11 and gap.delta_star_mean[-1] < 1e-10
    assert np.all(run.grad_norm <= 1e-10)
    assert np.abs(expected[-1] - p_ref).max() > 0.1  # the iterates actually moved


def test_small_capacity_leaves_a_gap_and_the_binary_event_bound_holds():
    ref, success, _ = _bandit()
    n, k = success.shape
    exact = P.exact_iterates(np.exp(ref), success, 2.0, 15, eps=EPS)
    for dim in (1, 3, 8):
        run = P.parametric_grpo(P.LogLinearPolicy(ref, P.random_features(n, k, dim, seed=1)),
                                success, 2.0, 15, eps=EPS)
        gap = P.parametric_gap(run.probs, exact, success)
        assert gap.tv_mean[-1] > 1e-3
        # |P(S) - Q(S)| <= TV per prompt and for the prompt average (factor 1, not 2)
        assert np.all(gap.pos_gap <= gap.tv + 1e-14)
        assert np.all(gap.pos_gap_mean <= gap.tv_mean + 1e-14)
        # Assumption 1 with the smallest increments: TV_n <= sum_{i<=n} delta_i
        assert np.all(gap.tv <= gap.delta_star + 1e-14)
        assert np.all(gap.tv_mean <= gap.delta_star_mean + 1e-14)


def test_shared_correctness_logit_error_is_all_in_the_success_probability():
    """Both policies tilt pi_ref by a function of the reward: TV = |p~ - p| exactly."""
    ref, success, _ = _bandit()
    exact = P.exact_iterates(np.exp(ref), success, 2.0, 10, eps=EPS)
    run = P.parametric_grpo(P.LogLinearPolicy(ref, P.correctness_features(success, 1)),
                            success, 2.0, 10, eps=EPS)
    gap = P.parametric_gap(run.probs, exact, success)
    assert gap.tv.max() > 1e-2
    np.testing.assert_allclose(gap.pos_gap, gap.tv, rtol=0, atol=1e-12)
    # one shared theta: every prompt's log-odds moves by the same amount
    shift = theory.logit(run.success_prob[-1]) - theory.logit(run.success_prob[0])
    np.testing.assert_allclose(shift, shift[0], atol=1e-9)


def test_total_variation_is_the_largest_event_difference():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(6), size=2)
    events = itertools.product([False, True], repeat=6)
    direct = max(abs(p[list(a)].sum() - q[list(a)].sum()) for a in map(np.array, events))
    assert P.total_variation(p, q) == pytest.approx(direct, abs=1e-15)
    assert P.total_variation(p, p) == 0


def test_objective_gradient_hessian_and_projection_identity():
    ref, success, _ = _bandit()
    n, k = success.shape
    policy = P.LogLinearPolicy(ref, P.random_features(n, k, 7, seed=2))
    rng = np.random.default_rng(1)
    theta = rng.normal(size=7)
    p_prev = rng.uniform(0.05, 0.95, size=n)
    value, grad = P.grpo_objective(policy, theta, success, p_prev, 1.3, eps=EPS)
    # direct formula: mean_q [w+ P(S) - w- P(F) - beta KL(pi_theta || pi_ref)]
    pi = policy.probs(theta)
    w_plus, w_minus = theory.weights(p_prev, eps=EPS)
    p_s = P.success_prob(pi, success)
    direct = w_plus * p_s - w_minus * (1 - p_s) - 1.3 * theory.kl_divergence(pi, np.exp(ref))
    assert value == pytest.approx(direct.mean(), abs=1e-13)
    h = 1e-6
    numeric = np.array([(P.grpo_objective(policy, theta + h * e, success, p_prev, 1.3, eps=EPS)[0]
                         - P.grpo_objective(policy, theta - h * e, success, p_prev, 1.3,
                                            eps=EPS)[0]) / (2 * h) for e in np.eye(7)])
    np.testing.assert_allclose(grad, numeric, atol=1e-8)
    adv = np.where(success, w_plus[:, None], -w_minus[:, None])
    hess = P._objective_parts(policy, theta, adv, 1.3, hessian=True)[2]
    numeric_h = np.array([(P._objective(policy, theta + h * e, adv, 1.3)[1]
                           - P._objective(policy, theta - h * e, adv, 1.3)[1]) / (2 * h)
                          for e in np.eye(7)])
    np.testing.assert_allclose(hess, numeric_h, atol=1e-7)
    np.testing.assert_allclose(hess, hess.T, atol=1e-14)
    # J = beta mean_q [log Z* - KL(pi_theta || pi*)]: each step is a reverse-KL projection
    log_z = special.logsumexp(ref + adv / 1.3, axis=1)
    kl = P.projection_error(policy, theta, success, p_prev, 1.3, eps=EPS)
    assert value == pytest.approx(1.3 * np.mean(log_z - kl), abs=1e-12)
    assert np.all(kl >= -1e-15)


def test_minimal_increments_and_partial_sums():
    tv = np.array([0.0, 0.2, 0.1, 0.3, 0.3, 0.25])
    delta = P.minimal_increments(tv)
    np.testing.assert_allclose(delta, [0.2, 0.0, 0.2, 0.0, 0.0])
    assert np.all(tv[1:] <= tv[:-1] + delta + 1e-15)
    probs = np.zeros((6, 1, 2))
    probs[:, 0, 0] = 0.5 + tv  # TV to (0.5, 0.5) is tv
    probs[:, 0, 1] = 1 - probs[:, 0, 0]
    exact = np.full((6, 1, 2), 0.5)
    gap = P.parametric_gap(probs, exact, np.array([[True, False]]))
    np.testing.assert_allclose(gap.tv[:, 0], tv, atol=1e-15)
    np.testing.assert_allclose(gap.delta_star_mean, [0, 0.2, 0.2, 0.4, 0.4, 0.4], atol=1e-15)


def test_error_decomposition_triangle_and_pinsker():
    ref, success, _ = _bandit()
    n, k = success.shape
    exact = P.exact_iterates(np.exp(ref), success, 2.5, 10, eps=EPS)
    run = P.parametric_grpo(P.LogLinearPolicy(ref, P.random_features(n, k, 4, seed=5)),
                            success, 2.5, 10, eps=EPS)
    gap = P.parametric_gap(run.probs, exact, success)
    dec = P.error_decomposition(run, exact, np.exp(ref), success, 2.5, eps=EPS)
    assert np.all(gap.tv[1:] <= dec.projection + dec.propagation + 1e-14)
    assert np.all(dec.projection <= dec.pinsker + 1e-12)
    # propagation is the TV between two class tilts of pi_ref, computed directly
    targets = theory.optimal_policy(np.exp(ref), run.probs[:-1], success, 2.5, eps=EPS)
    np.testing.assert_allclose(dec.propagation, P.total_variation(targets, exact[1:]),
                               atol=1e-12)
    np.testing.assert_allclose(dec.projection, P.total_variation(run.probs[1:], targets),
                               atol=1e-12)


def test_features_and_validation():
    phi = P.random_features(3, 4, 12, seed=0).reshape(12, 12)
    np.testing.assert_allclose(phi.T @ phi, np.eye(12), atol=1e-12)
    np.testing.assert_array_equal(P.random_features(3, 4, 5, seed=0),
                                  P.random_features(3, 4, 12, seed=0)[:, :, :5])
    success = np.array([[True, False], [False, True], [True, False]])
    corr = P.correctness_features(success, np.array([0, 1, 0]))
    assert corr.shape == (3, 2, 2) and corr[1, 1, 1] == 1 and corr[1, 0].sum() == 0
    with pytest.raises(ValueError, match="dim"):
        P.random_features(2, 2, 5)
    with pytest.raises(ValueError, match="groups"):
        P.correctness_features(success, 4)
    with pytest.raises(ValueError, match="success"):
        P.correctness_features(np.array([[True, True]]), 1)
    ref = np.log(np.full((3, 2), 0.5))
    with pytest.raises(ValueError, match="normalised"):
        P.LogLinearPolicy(ref + 1.0, corr)
    with pytest.raises(ValueError, match="features"):
        P.LogLinearPolicy(ref, corr[:2])
    policy = P.LogLinearPolicy(ref, corr)
    with pytest.raises(ValueError, match="theta"):
        policy.log_probs(np.zeros(3))
    with pytest.raises(ValueError, match="beta"):
        P.parametric_grpo(policy, success, 0.0, 3)
    with pytest.raises(ValueError, match="n_steps"):
        P.parametric_grpo(policy, success, 1.0, -1)
    run = P.parametric_grpo(policy, success, 1.0, 0)
    assert run.probs.shape == (1, 3, 2) and run.projection_kl.shape == (0, 3)
