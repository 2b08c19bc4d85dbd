"""Parametric (shared-parameter) GRPO iterations against the non-parametric theory."""

import itertools
import subprocess
import sys

import numpy as np
import pytest
from scipy import special

from grpo_companion import theory
from grpo_companion.theory.analyses import parametric as P
from tests._converged import EPS as ULP
from tests._converged import ULPS, brent_root

EPS = 1e-5


def _bandit(n_prompts=6, n_outputs=5, p_ref=(0.05, 0.15, 0.3, 0.45, 0.6, 0.8), seed=0):
    """Random reference log-probabilities with two successes per prompt and PoS exactly p_ref."""
    rng = np.random.default_rng(seed)
    success = np.zeros((n_prompts, n_outputs), dtype=bool)
    for q in range(n_prompts):
        success[q, rng.choice(n_outputs, size=2, replace=False)] = True
    logits = rng.normal(size=(n_prompts, n_outputs))
    p_ref = np.asarray(p_ref, dtype=float)
    within = np.where(success, logits, -np.inf)
    log_s = within - special.logsumexp(within, axis=1, keepdims=True)
    within = np.where(success, -np.inf, logits)
    log_f = within - special.logsumexp(within, axis=1, keepdims=True)
    ref = np.where(success, log_s + np.log(p_ref)[:, None], log_f + np.log1p(-p_ref)[:, None])
    return ref, success, p_ref


def test_importing_the_module_does_not_import_torch():
    code = ("import sys, grpo_companion.theory.analyses.parametric; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


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
    p_s = theory.pos(pi, success)
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


# --------------------------------------------------------------------------- chapter 9 helpers


def _h(p, p_ref, beta, eps=EPS):
    """The reference PoS map of Theorem 2, written out: sigmoid(L_ref + Omega(p) / beta)."""
    omega = 1.0 / np.sqrt(p * (1 - p) + eps)
    return special.expit(special.logit(p_ref) + omega / beta)


def _g_logit(L, p_ref, beta):
    """g(L) = L_ref + Omega(L) / beta - L: zero at the fixed points, in log-odds."""
    var = special.expit(L) * special.expit(-L)
    return special.logit(p_ref) + 1.0 / np.sqrt(var + EPS) / beta - L


def _roots_by_bracketing(p_ref, beta):
    """Every root of h(p) = p, as sign changes of g(L) = L_ref + Omega / beta - L and brentq.

    In log-odds, since a root can sit far closer to 1 than float64 probabilities resolve.
    Returns the roots as probabilities and the tolerance to which two solvers of g agree
    there, in probability: brentq's final bracket and the library's (4 ulps of
    max(1, |L|)), plus the rounding of g's three terms over |g'| (sign changes of g as
    evaluated lie that far from the true root), mapped by dp = p (1 - p) dL, plus the
    rounding of expit itself.
    """
    def g(L):
        return _g_logit(L, p_ref, beta)

    grid = np.linspace(-40, 1000, 200001)
    f = g(grid)
    idx = np.flatnonzero(np.sign(f[:-1]) != np.sign(f[1:]))
    found = [brent_root(g, grid[i], grid[i + 1], xtol=1e-13) for i in idx]
    L, widths = np.array([r for r, _ in found]), np.array([w for _, w in found])
    h = 1e-6
    slope = (g(L + h) - g(L - h)) / (2 * h)
    rounding = ULPS * ULP * (abs(special.logit(p_ref)) + np.abs(g(L) + L
                                                            - special.logit(p_ref)) + np.abs(L))
    tol_logit = widths + 4 * ULP * np.maximum(1.0, np.abs(L)) + 2 * rounding / np.abs(slope)
    p = special.expit(L)
    return p, p * (1 - p) * tol_logit + ULPS * ULP * p


@pytest.mark.parametrize(("p_ref", "beta"), [(0.2, 1.0), (0.2, 0.5), (1e-3, 5.0), (0.6, 3.0)])
def test_nearest_fixed_point_against_bracketed_roots(p_ref, beta):
    roots, tols = _roots_by_bracketing(p_ref, beta)
    assert roots.size in (1, 3)
    starts = np.linspace(0.01, 0.99, 41)
    nearest = np.argmin(np.abs(roots[None, :] - starts[:, None]), axis=1)
    got = P.nearest_fixed_point(starts, p_ref, beta, eps=EPS)
    # tolerance: both root finders' brackets plus rounding (see _roots_by_bracketing)
    assert np.all(np.abs(got - roots[nearest]) <= tols[nearest]), (got - roots[nearest])


def test_nearest_fixed_point_is_where_direct_iteration_ends():
    # beta = 3, p_ref = 0.6: one stable fixed point; iterate the written-out map to it
    p = np.array([0.6, 0.3, 0.95])
    for _ in range(500):
        p = _h(p, 0.6, 3.0)
    roots, tols = _roots_by_bracketing(0.6, 3.0)
    near = np.argmin(np.abs(roots[None, :] - p[:, None]), axis=1)
    root, root_tol = roots[near], tols[near]
    # convergence: near a fixed point of slope s < 1, |p - p*| <= |h(p) - p| / (1 - s)
    d = 1e-7
    s = np.abs(_h(root + d, 0.6, 3.0) - _h(root - d, 0.6, 3.0)) / (2 * d)
    err = np.abs(_h(p, 0.6, 3.0) - p) / (1 - s)
    assert np.all(s < 1) and np.all(err < 1e-12), f"orbit not converged after 500 steps: {err}"
    # the iterate's rounding floor: one evaluation of h (ULPS ulps), amplified by 1 / (1 - s)
    floor = ULPS * ULP * p / (1 - s)
    got = P.nearest_fixed_point(p, 0.6, 3.0, eps=EPS)
    assert np.all(np.abs(got - p) <= err + floor + root_tol), (got - p, err, floor, root_tol)


def test_nearest_fixed_point_broadcasts_and_gives_nan_without_a_root():
    got = P.nearest_fixed_point(np.full((2, 3), 0.5), np.array([0.2, 0.4, 0.6]), [[1.0], [2.0]],
                                eps=EPS)
    assert got.shape == (2, 3) and np.all(np.isfinite(got))
    assert np.isnan(P.nearest_fixed_point(0.5, 0.3, 1.0, alpha=0.0, eps=EPS))  # mirror map
    assert P.nearest_fixed_point(np.array([]), 0.2, 1.0).shape == (0,)
    with pytest.raises(ValueError, match="p_ref"):
        P.nearest_fixed_point(0.5, 1.5, 1.0)
    with pytest.raises(ValueError, match="beta"):
        P.nearest_fixed_point(0.5, 0.2, 0.0)
    with pytest.raises(ValueError, match="p, p_ref"):
        P.nearest_fixed_point(np.full(2, 0.5), np.full(3, 0.2), 1.0)


def test_measure_gap_against_the_scalar_recurrence_and_direct_sums():
    ref, success, p_ref = _bandit()
    n, k = success.shape
    policy = P.LogLinearPolicy(ref, P.random_features(n, k, 3, seed=4))
    m = P.measure_gap(policy, success, 3.0, 25, eps=EPS)
    # exact PoS: the scalar recurrence of Theorem 2, iterated by hand
    p = p_ref.copy()
    path = [p]
    for _ in range(25):
        p = _h(p, p_ref, 3.0)
        path.append(p)
    np.testing.assert_allclose(m.p_exact, np.array(path), rtol=0, atol=1e-12)
    # p* is a root of the written-out map, the one the exact orbit has reached
    np.testing.assert_allclose(_h(m.p_star, p_ref, 3.0), m.p_star, rtol=0, atol=1e-12)
    assert np.max(np.abs(m.p_exact[-1] - m.p_star)) < 1e-5  # still converging, slowly
    # TV by direct sums over outputs, and the parametric run is the one parametric_grpo gives
    direct = 0.5 * np.abs(m.run.probs - m.exact).sum(axis=-1)
    np.testing.assert_allclose(m.gap.tv, direct, rtol=0, atol=1e-15)
    again = P.parametric_grpo(policy, success, 3.0, 25, eps=EPS)
    np.testing.assert_array_equal(m.run.probs, again.probs)
    assert m.gap.tv_mean[-1] > 1e-3  # three features cannot follow eight prompts


def test_input_checks_name_the_parameter():
    ref, success, _ = _bandit()
    n, k = success.shape
    policy = P.LogLinearPolicy(ref, P.tabular_features(n, k))
    with pytest.raises(ValueError, match="success"):
        P.measure_gap(policy, success[:, :3], 1.0, 2)
    with pytest.raises(ValueError, match="policy"):
        P.measure_gap("policy", success, 1.0, 2)
    with pytest.raises(ValueError, match="n_steps"):
        P.measure_gap(policy, success, 1.0, 2.5)
    with pytest.raises(ValueError, match="p_prev"):
        P.projection_error(policy, np.zeros(n * k), success, np.full(n, 1.5), 1.0)
    with pytest.raises(ValueError, match="p_prev"):
        P.grpo_objective(policy, np.zeros(n * k), success, np.full(n + 1, 0.5), 1.0)
    with pytest.raises(ValueError, match="theta"):
        P.grpo_objective(policy, np.full(n * k, np.nan), success, np.full(n, 0.5), 1.0)
    with pytest.raises(ValueError, match="tv"):
        P.minimal_increments([0.1, np.nan])
    with pytest.raises(ValueError, match="gtol"):
        P.parametric_grpo(policy, success, 1.0, 1, gtol=0.0)
    with pytest.raises(ValueError, match="seed"):
        P.random_features(2, 2, 2, seed=-1)
    with pytest.raises(ValueError, match="p"):
        P.total_variation([0.5, 0.6], [0.5, 0.5])
