"""Rank bias and positive/negative samples (grpo_companion.theory.analyses.sample_weighting),
issue 24.

Items 3 and 4; the expectations were committed before this module existed
(benchmarks/results/beyond_expectations.md, sections 3 and 4). Checks:

- the exact softmax gradient against central finite differences;
- each variant's round optimum against direct optimisation (BFGS on softmax logits,
  polished by Newton on the simplex KKT system), and full GRPO against the library;
- the closed-form rounds keep within-class ratios (1e-12), and the tabular PoS follows
  the scalar map;
- pass@k against a Monte Carlo at a fixed seed (4 standard errors) and its limits;
- the committed expectations of sections 3 and 4 (one is false: xfail strict).

- sampled training against a loop implementation (1e-12), its mu = 1 expected update
  against the finite-group expected gradient (4 standard errors), and the committed
  expectations of section 3 for it.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import optimize, special

from grpo_companion import theory
from grpo_companion.theory.analyses import sample_weighting as sw
from tests._converged import EPS, ULPS, newton_polish_simplex

REF = np.array([0.15, 0.05, 0.3, 0.3, 0.2])  # correct outputs 0 (likelier) and 1
MASK = np.array([1, 1, 0, 0, 0], bool)
VARIANTS = tuple(sw.VARIANT_SCALES)
GRID = [(p, b) for p in (0.05, 0.2, 0.5) for b in (0.5, 1.0, 2.0)]


def _random_problem(seed: int):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(3, 7))
    mask = np.zeros(k, bool)
    mask[rng.choice(k, size=int(rng.integers(1, k)), replace=False)] = True
    return rng.dirichlet(np.ones(k)), rng.dirichlet(np.ones(k)), mask, float(
        rng.uniform(0.3, 2.0))


# ------------------------------------------------------------- the gradient
@pytest.mark.parametrize("beta", [0.0, 0.7])
@pytest.mark.parametrize("seed", range(3))
def test_softmax_gradient_matches_finite_differences(seed, beta):
    rng = np.random.default_rng(seed)
    ref = rng.dirichlet(np.ones(6))
    z = rng.normal(size=6)
    adv = rng.normal(size=6)
    h = 1e-5
    eye = np.eye(6)
    fd = np.array([(sw.softmax_objective(z + h * e, ref, adv, beta)
                    - sw.softmax_objective(z - h * e, ref, adv, beta)) / (2 * h) for e in eye])
    grad = sw.softmax_gradient(z, ref, adv, beta)
    # central differences: truncation h^2 |J'''| / 6 (|J'''| <= a few (|A| + beta |log r|))
    # plus rounding EPS |J| / h
    scale = np.max(np.abs(adv)) + beta * (np.max(np.abs(np.log(ref))) + np.max(np.abs(z))) + 1
    tol = 10 * h**2 * scale + ULPS * EPS * scale / h
    np.testing.assert_allclose(grad, fd, rtol=0, atol=tol)
    assert abs(grad.sum()) <= ULPS * EPS * scale  # a constant shift of z changes nothing


def test_softmax_gradient_of_calibrated_advantage_with_bonus():
    pi = special.softmax(np.log(REF) + np.array([0.3, -0.2, 0.1, 0.0, -0.4]))
    adv = sw.calibrated_advantage(pi, MASK, unlikeliness=0.5)
    w_plus, w_minus = theory.weights(pi[MASK].sum())
    share = pi[MASK] / pi[MASK].sum()
    np.testing.assert_allclose(adv[MASK], w_plus * (1 + 0.5 * (1 - share)), rtol=4 * EPS)
    np.testing.assert_allclose(adv[~MASK], -w_minus, rtol=4 * EPS)
    assert adv[1] > adv[0]  # the less likely correct output gets the larger bonus


# -------------------------------------------------------- exact round optima
def _objective(pi, ref, mask, beta, c, w):
    a = np.where(mask, c[0] * w[0], -c[1] * w[1])
    return pi @ a - beta * np.sum(pi * (np.log(pi) - np.log(ref)))


def _objective_grad(pi, ref, mask, beta, c, w):
    a = np.where(mask, c[0] * w[0], -c[1] * w[1])
    return a - beta * (np.log(pi) - np.log(ref) + 1)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", range(4))
def test_round_optimum_matches_direct_optimisation(seed, variant):
    ref, prev, mask, beta = _random_problem(seed)
    c = sw.VARIANT_SCALES[variant]
    w = tuple(float(x) for x in theory.weights(prev[mask].sum()))
    args = (ref, mask, beta, c, w)
    closed = sw.weighted_round_policy(ref, prev, mask, beta, variant)

    def neg(z):
        return -_objective(special.softmax(z), *args)

    def neg_grad(z):
        pi = special.softmax(z)
        g = _objective_grad(pi, *args)
        return -pi * (g - pi @ g)

    res = optimize.minimize(neg, np.zeros(ref.size), jac=neg_grad, method="BFGS",
                            options={"gtol": 1e-10})
    numeric, spread = newton_polish_simplex(special.softmax(res.x),
                                            lambda pi: _objective_grad(pi, *args),
                                            lambda pi: -beta / pi)
    # numeric is the exact optimum with advantages shifted by at most `spread`, so
    # |log numeric - log closed| <= spread / beta (as in test_theory_policies)
    bound = np.expm1(spread / beta)
    assert bound < 1e-9, f"reference not converged: KKT spread {spread:.2e}"
    scale = np.max(np.abs(np.log(ref))) + np.max(np.abs(_objective_grad(closed, *args))) / beta + 1
    np.testing.assert_allclose(closed, numeric, rtol=bound + ULPS * EPS * scale, atol=0)


@pytest.mark.parametrize("seed", range(3))
def test_grpo_pair_is_the_library_optimal_policy(seed):
    ref, prev, mask, beta = _random_problem(seed)
    lib = theory.optimal_policy(ref, prev, mask, beta)
    np.testing.assert_allclose(sw.weighted_round_policy(ref, prev, mask, beta, (1.0, 1.0)), lib,
                               rtol=ULPS * EPS * 10, atol=0)
    np.testing.assert_array_equal(sw.weighted_round_policy(ref, prev, mask, beta, "grpo"), lib)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("p_ref", "beta"), GRID)
def test_tabular_pos_follows_scalar_map(variant, p_ref, beta):
    ref = np.concatenate([p_ref * np.array([0.75, 0.25]), (1 - p_ref) * np.array([.4, .35, .25])])
    path = sw.weighted_policy_iterate(ref, MASK, beta, 12, variant)
    log_pi = np.log(path)
    tab = special.logsumexp(log_pi[:, :2], axis=1) - special.logsumexp(log_pi[:, 2:], axis=1)
    scal = sw.weighted_iterate_logit(theory.logit(p_ref), theory.logit(p_ref), beta, 12, variant)
    # each round adds Omega_c / beta <= 2 sup Omega / beta to logits of that size; rounding
    # grows by a few ulps of the largest logit per round
    tol = 12 * ULPS * EPS * (np.max(np.abs(scal)) + np.max(np.abs(np.log(ref))) + 1)
    np.testing.assert_allclose(tab, scal, rtol=0, atol=tol)


# --------------------------------------------------------------------- pass@k
def test_pass_at_k_matches_monte_carlo():
    rng = np.random.default_rng(20240624)
    n = 200_000
    for p in (0.003, 0.1, 0.5, 0.9):
        for k in (1, 4, 32, 256):
            hits = rng.binomial(k, p, size=n) > 0
            se = np.sqrt(max(hits.mean() * (1 - hits.mean()), 1.0 / n) / n)
            assert abs(hits.mean() - sw.pass_at_k(p, k)) <= 4 * se, (p, k)


def test_pass_at_k_limits_and_logit_form():
    k = np.arange(1, 257)
    np.testing.assert_allclose(sw.pass_at_k(1e-300, k), k * 1e-300, rtol=4 * EPS)
    assert np.all(sw.pass_at_k(0.0, k) == 0) and np.all(sw.pass_at_k(1.0, k) == 1)
    # p = 1 - 1e-20 (not representable as p): from the logit, 1 - pass@k = 1e-20^k
    lf = sw.log_fail_at_k(np.log(1e20), k)
    np.testing.assert_allclose(lf, k * np.log(1e-20), rtol=8 * EPS)
    p = np.linspace(0.01, 0.99, 7)[:, None]
    np.testing.assert_allclose(sw.pass_at_k_of_logit(theory.logit(p), k),
                               1 - (1 - p) ** k, rtol=1e-13, atol=1e-15)


# ----------------------------------------------------- section 3: rank bias
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_committed_exact_rounds_keep_within_class_ratios(variant, beta):
    path = sw.weighted_policy_iterate(REF, MASK, beta, 40, variant)
    assert np.max(np.abs(sw.log_ratio_drift(path, REF, 0, 1))) <= 1e-12
    # failures: where their mass has not underflowed to 0 (small beta drives it below 1e-308)
    alive = np.min(path[:, [2, 4]], axis=1) > 0
    assert alive[:2].all()
    assert np.max(np.abs(sw.log_ratio_drift(path[alive], REF, 2, 4))) <= 1e-12


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_committed_expected_gradient_drift_peaks_then_returns(beta):
    run = sw.expected_gradient_training(REF, MASK, beta, 0.25, 1500)
    assert run.pair == (0, 1)
    assert run.drift[1] > 0  # the likelier correct output gains first
    assert 0 < run.peak_round < 1500 and run.peak > 0.3
    assert np.all(np.diff(run.drift[: run.peak_round + 1]) > 0)  # grows up to the peak
    assert abs(run.final) <= 1e-3


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_stationary_point_is_the_closed_form_fixed_point(beta):
    run = sw.expected_gradient_training(REF, MASK, beta, 0.25, 1500)
    lr = theory.logit(REF[MASK].sum())
    l_star = sw.weighted_fixed_points_logit(lr, beta, "grpo")[0]  # the stable, lowest one
    pi_star = theory.anchored_policy(REF, MASK, theory.sigmoid(l_star), beta)
    pi_end = special.softmax(run.logits[-1])
    # geometric convergence: the last step's size bounds the distance (contraction < 1/2)
    last = np.max(np.abs(np.diff(run.logits[-2:], axis=0)))
    np.testing.assert_allclose(pi_end, pi_star, rtol=1e-9 + 100 * last, atol=0)


def test_committed_beta_zero_drift_grows_without_returning():
    run = sw.expected_gradient_training(REF, MASK, 0.0, 0.25, 2000)
    assert np.all(np.diff(run.drift) > 0)
    assert run.final == run.peak
    assert run.drift[-1] > run.drift[1000] + 0.5  # still growing (like log t)


# -------------------------------------------------- section 3: sampled training
def _loop_training(ref, mask, beta, lr, n_rounds, g, n_seeds, mu, gamma, kappa, seed, eps=1e-5):
    """Independent implementation of sampled_gradient_training: one run at a time, Python
    loops, the same uniforms (drawn the same way), eq. (4) whitening by hand."""
    rng = np.random.default_rng(seed)
    k = ref.size
    z = np.tile(np.log(ref), (n_seeds, 1))
    out = [z.copy()]
    for _ in range(n_rounds):
        u_all = rng.random((n_seeds, g))
        for s_ in range(n_seeds):
            old = special.softmax(z[s_])
            cdf = np.cumsum(old)
            o = [min(int(np.sum(u >= cdf)), k - 1) for u in u_all[s_]]
            good = [bool(mask[j]) for j in o]
            r = []
            for i in range(g):
                if not good[i]:
                    r.append(0.0)
                    continue
                rank = sum(1 for j in range(g) if good[j] and old[o[j]] > old[o[i]])
                r.append(1.0 - gamma * (g - rank) / g)
            r = np.array(r)
            sd = np.sqrt(r.var() + eps)
            a = np.zeros(g) if np.all(r == r[0]) else (r - r.mean()) / sd
            zz = z[s_].copy()
            for _ in range(mu):
                pi = special.softmax(zz)
                grad = np.zeros(k)
                for i in range(g):
                    x = pi[o[i]] / old[o[i]]
                    if kappa is not None and ((a[i] > 0 and x > 1 + kappa)
                                              or (a[i] < 0 and x < 1 - kappa)):
                        continue
                    e = np.zeros(k)
                    e[o[i]] = 1.0
                    grad += a[i] * x * (e - pi) / g
                kl_grad = pi * (np.log(pi / ref) - np.sum(pi * np.log(pi / ref)))
                zz = zz + lr * (grad - beta * kl_grad)
            z[s_] = zz
        out.append(z.copy())
    return np.stack(out)


@pytest.mark.parametrize(("mu", "gamma", "kappa"), [(1, 0.0, None), (3, 0.5, 0.2),
                                                    (2, 1.0, None)])
def test_sampled_training_matches_a_loop_implementation(mu, gamma, kappa):
    run = sw.sampled_gradient_training(REF, MASK, 0.5, 0.7, 4, group_size=5, n_seeds=6, mu=mu,
                                       unlikeliness=gamma, clip_eps=kappa, seed=11)
    ref = _loop_training(REF, MASK, 0.5, 0.7, 4, 5, 6, mu, gamma, kappa, seed=11)
    np.testing.assert_allclose(run.logits, ref, rtol=0, atol=1e-12)
    assert run.pair == (0, 1) and run.drift.shape == run.pos.shape == (5, 6)
    np.testing.assert_allclose(run.drift, sw.log_ratio_drift(special.softmax(ref, axis=-1),
                                                             REF, 0, 1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(), dict(eps=1e-3, eps_placement="std", ddof=1),
                                dict(normalization="mean_only"), dict(normalization="rloo"),
                                dict(normalization="max_abs")])
def test_real_reward_advantages_agree_with_the_library_on_binary_rewards(kw):
    rng = np.random.default_rng(5)
    r = (rng.random((300, 6)) < 0.4).astype(float)
    cal = theory.Calibration(**kw)
    np.testing.assert_allclose(sw._real_advantages(r, cal), theory.group_advantages(r, cal),
                               rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize(("beta", "g"), [(0.7, 6), (0.0, 3)])
def test_sampled_mu_one_update_is_the_finite_group_expected_gradient(beta, g):
    # E[A_i | o_i = o] = +w+_G(p) on a correct o, -w-_G(p) otherwise, and a group's
    # advantages sum to 0: E[dz] = lr softmax_gradient(z, pi_ref, A_G, beta)
    z0 = np.log(REF) + np.array([0.3, -0.2, 0.1, 0.0, -0.4])
    n = 40_000
    run = sw.sampled_gradient_training(REF, MASK, beta, 0.5, 1, group_size=g, n_seeds=n, z0=z0,
                                       seed=3)
    dz = run.logits[1] - run.logits[0]
    mean, se = dz.mean(0), dz.std(0, ddof=1) / np.sqrt(n)
    pi = special.softmax(z0)
    a_g = sw.calibrated_advantage(pi, MASK, calibration=theory.Calibration(group_size=g))
    exact = 0.5 * sw.softmax_gradient(z0, REF, a_g, beta)
    assert np.all(np.abs(mean - exact) <= 4 * se), (mean - exact) / se
    # the test resolves the finite group: the population weights are far outside
    population = 0.5 * sw.softmax_gradient(z0, REF, sw.calibrated_advantage(pi, MASK), beta)
    assert np.max(np.abs(mean - population) / se) > 10


def test_sampled_training_is_deterministic_and_seeds_are_independent():
    a = sw.sampled_gradient_training(REF, MASK, 1.0, 0.25, 5, n_seeds=8, seed=2)
    b = sw.sampled_gradient_training(REF, MASK, 1.0, 0.25, 5, n_seeds=8, seed=2)
    np.testing.assert_array_equal(a.logits, b.logits)
    assert len({tuple(a.logits[-1, s]) for s in range(8)}) == 8
    np.testing.assert_allclose(a.logits[0], np.tile(np.log(REF), (8, 1)), rtol=0, atol=0)
    one = sw.sampled_gradient_training(REF, MASK, 1.0, 0.25, 0, n_seeds=1)
    assert one.peak_increment == 0.0 and one.final == 0.0 and np.isinf(one.final_se)


# Committed expectations (beyond_expectations.md section 3, third and fourth bullets). The
# settings: REF, MASK, beta = 1, lr = 0.25, G = 8, 1000 seeds per run (independent seeds
# between compared runs); the numbers are in the module docstring of sample_weighting.
SAMPLED = dict(beta=1.0, lr=0.25, group_size=8, n_seeds=1000)


def _sampled(n_rounds=400, seed=0, **kw):
    return sw.sampled_gradient_training(REF, MASK, n_rounds=n_rounds, seed=seed, **(SAMPLED | kw))


def test_committed_sampled_drift_peaks_then_returns():
    run = _sampled()
    assert run.mean_drift[1] > 3 * run.drift_se[1]
    assert 10 < run.peak_round < 100 and run.peak > 0.3
    assert abs(run.final) <= 3 * run.final_se + 1e-3


def _excess(lr, n_rounds, seed):
    run = _sampled(n_rounds=n_rounds, seed=seed, lr=lr)
    exact = sw.expected_gradient_training(REF, MASK, 1.0, lr, n_rounds,
                                          calibration=theory.Calibration(group_size=8))
    logged = np.linspace(0, n_rounds, 17).astype(int)[1:]
    z = (run.mean_drift - exact.drift)[logged] / run.drift_se[logged]
    return run, exact, z


@pytest.mark.xfail(strict=True, reason=(
    "committed expectation (beyond_expectations.md section 3) that the sampled drift is "
    "within 3 SE of the expected-gradient drift at each logged step is false at lr = 0.25: "
    "the sampled drift sits above it (z = 5.6 at round 100 of 400, 1000 seeds; mean excess "
    "0.008 over the run), an O(lr) sampling effect (see "
    "test_sampled_drift_excess_is_positive_and_shrinks_with_lr)"))
def test_committed_sampled_drift_within_three_standard_errors():
    _, _, z = _excess(0.25, 400, 0)
    assert np.all(np.abs(z) <= 3), z


def test_sampled_drift_excess_is_positive_and_shrinks_with_lr():
    run, exact, _ = _excess(0.25, 400, 0)
    per_seed = (run.drift[1:] - exact.drift[1:, None]).mean(axis=0)  # time-averaged excess
    mean, se = per_seed.mean(), per_seed.std(ddof=1) / np.sqrt(per_seed.size)
    assert mean > 3 * se and 0.004 < mean < 0.015
    # at half the step (twice the rounds) every logged step is within 3 SE
    _, _, z = _excess(0.125, 800, 5)
    assert np.all(np.abs(z) <= 3), z


def test_committed_unlikeliness_reward_reduces_sampled_peak_drift():
    plain, bonus = _sampled(seed=1), _sampled(seed=2, unlikeliness=0.5)
    se = np.hypot(plain.peak_se, bonus.peak_se)
    assert bonus.peak < plain.peak - 3 * se


@pytest.mark.parametrize("mu", [2, 4])
def test_committed_more_steps_increase_sampled_peak_drift_per_round(mu):
    base, more = _sampled(seed=3), _sampled(n_rounds=400 // mu, seed=4, mu=mu)
    se = np.hypot(base.peak_increment_se, more.peak_increment_se)
    assert more.peak_increment > base.peak_increment + 3 * se


def test_committed_unlikeliness_reward_reduces_peak_drift():
    plain = sw.expected_gradient_training(REF, MASK, 1.0, 0.25, 400)
    bonus = sw.expected_gradient_training(REF, MASK, 1.0, 0.25, 400, unlikeliness=1.0)
    assert bonus.peak < plain.peak - 0.1
    # what the bonus also does: the stationary point is no longer Theorem 1's tilt, and the
    # unlikely output ends above its reference ratio (negative drift)
    assert bonus.final < -0.1


@pytest.mark.parametrize("mu", [2, 4, 8])
def test_committed_more_steps_per_round_increase_peak_drift(mu):
    base = sw.expected_gradient_training(REF, MASK, 1.0, 0.25, 800)
    more = sw.expected_gradient_training(REF, MASK, 1.0, 0.25, 800 // mu, mu=mu)
    assert more.peak_increment > base.peak_increment * (mu - 0.5)  # per round: ~mu times
    assert more.peak > base.peak  # and the peak over the run, slightly
    assert abs(more.final) <= 1e-3


# ---------------------------------------------- section 4: positive / negative
def _limits(p_ref, beta, variant, n=400):
    lr = theory.logit(p_ref)
    path = sw.weighted_iterate_logit(lr, lr, beta, n, variant)
    return path


@pytest.mark.parametrize(("p_ref", "beta"), GRID)
def test_committed_pass_at_k_ordering_is_the_same_for_every_k(p_ref, beta):
    k = np.arange(1, 257)
    logits = np.stack([_limits(p_ref, beta, v, 20) for v in VARIANTS])  # (4, rounds)
    for n in range(logits.shape[1]):
        by_p = np.argsort(logits[:, n], kind="stable")
        lf = sw.log_fail_at_k(logits[:, n, None], k)  # (4, 256)
        order = np.argsort(-lf, axis=0, kind="stable")
        assert np.all(order == by_p[:, None])
        # pass@k itself (rounded to 1.0 at large k) never reverses the order
        pk = sw.pass_at_k_of_logit(logits[by_p, n, None], k)
        assert np.all(np.diff(pk, axis=0) >= 0)


def _rounds_to_90(p_ref, beta, variant):
    path = _limits(p_ref, beta, variant)
    assert abs(path[-1] - path[-2]) <= 1e-12 * (1 + abs(path[-1])), "not converged"
    p = theory.sigmoid(path)
    return int(np.argmax(p - p_ref >= 0.9 * (p[-1] - p_ref))), p[-1]


@pytest.mark.xfail(strict=True, reason=(
    "committed expectation (beyond_expectations.md section 4) that GRPO needs strictly fewer "
    "rounds than negative-only to reach 90 % of its fixed point is false on this grid: both "
    "need 1 round at (p_ref, beta) = (0.05, 2) and 2 at (0.5, 2) (see "
    "test_grpo_never_needs_more_rounds_than_negative_only)"))
def test_committed_negative_only_needs_more_rounds():
    for p_ref, beta in GRID:
        assert _rounds_to_90(p_ref, beta, "grpo")[0] < _rounds_to_90(p_ref, beta, "negative")[0]


@pytest.mark.parametrize(("p_ref", "beta"), GRID)
def test_grpo_never_needs_more_rounds_than_negative_only(p_ref, beta):
    n_grpo, _ = _rounds_to_90(p_ref, beta, "grpo")
    n_neg, p_neg = _rounds_to_90(p_ref, beta, "negative")
    assert n_grpo <= n_neg
    assert p_neg >= p_ref  # committed: the negative-only fixed point is not below p_ref
    # and round by round negative-only is never ahead (w- <= Omega, both maps from L_ref)
    lg, ln = _limits(p_ref, beta, "grpo", 60), _limits(p_ref, beta, "negative", 60)
    assert np.all(ln <= lg)


def test_fixed_points_found_are_fixed():
    for p_ref, beta in GRID:
        lr = theory.logit(p_ref)
        for v in VARIANTS:
            roots = sw.weighted_fixed_points_logit(lr, beta, v)
            assert roots.size >= 1 and np.all(roots >= lr)
            step = sw.weighted_pos_map_logit(roots, lr, beta, v) - roots
            # Brent's bracket (1e-14 (1 + |L|)) times the map's slope (<= ~ sup Omega' / beta)
            assert np.all(np.abs(step) <= 1e-9 * (1 + np.abs(roots)))


# ---------------------------- section 4: the variants as registered normalisations
REGISTERED = {"positive_only": "positive", "negative_only": "negative",
              "w_reinforce": "w_reinforce"}


@pytest.fixture
def sample_variants():
    before = set(theory.NORMALIZATIONS)
    names = sw.register_sample_variants()
    yield names
    for name in names:
        if name not in before:
            theory.unregister_normalization(name)


def test_register_sample_variants_is_idempotent(sample_variants):
    assert sample_variants == tuple(REGISTERED)
    entries = [theory.NORMALIZATIONS[n] for n in sample_variants]
    assert sw.register_sample_variants() == sample_variants
    assert [theory.NORMALIZATIONS[n] for n in sample_variants] == entries


def test_register_sample_variants_refuses_a_taken_name():
    assert "negative_only" not in theory.NORMALIZATIONS  # nothing registered at import
    theory.register_normalization("negative_only", lambda s, f, n, cal, ops: (f, s),
                                  summary="test only")
    try:
        with pytest.raises(ValueError, match="negative_only"):
            sw.register_sample_variants()
    finally:
        for name in REGISTERED:
            if name in theory.NORMALIZATIONS:
                theory.unregister_normalization(name)


@pytest.mark.parametrize("name", tuple(REGISTERED))
def test_registered_variant_weights_are_scaled_whitening(sample_variants, name):
    c_plus, c_minus = sw.VARIANT_SCALES[REGISTERED[name]]
    logits = np.linspace(-12.0, 12.0, 97)
    for kw in (dict(), dict(eps=1e-3, eps_placement="std"), dict(group_size=6, ddof=1)):
        cal = theory.Calibration(normalization=name, **kw)
        ref = theory.Calibration(**kw)
        w_plus, w_minus = cal.weights_of_logit(logits)
        r_plus, r_minus = ref.weights_of_logit(logits)
        np.testing.assert_allclose(w_plus, c_plus * r_plus, rtol=1e-13, atol=0)
        np.testing.assert_allclose(w_minus, c_minus * r_minus, rtol=1e-13, atol=0)
    # group advantages: the scaled whitened ones
    r = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    a = theory.group_advantages(r, normalization=name)
    whitened = theory.group_advantages(r)
    np.testing.assert_allclose(a, np.where(r == 1, c_plus, c_minus) * whitened, rtol=1e-14,
                               atol=0)
    # module-level gains: a calibration bound to them pickles (spawned workers unpickle it)
    cal = theory.Calibration(normalization=name)
    assert pickle.loads(pickle.dumps(cal)) == cal


@pytest.mark.parametrize("name", tuple(REGISTERED))
@pytest.mark.parametrize(("p_ref", "beta"), GRID)
def test_registered_variant_pos_map_is_the_weighted_map(sample_variants, name, p_ref, beta):
    cal = theory.Calibration(normalization=name)
    lr = theory.logit(p_ref)
    logits = np.linspace(-8.0, 8.0, 65)
    lib = theory.pos_map_logit(logits, lr, beta, calibration=cal)
    ours = sw.weighted_pos_map_logit(logits, lr, beta, REGISTERED[name])
    np.testing.assert_allclose(lib, ours, rtol=1e-12, atol=1e-12)
    path = theory.iterate_logit(lr, lr, beta, 20, calibration=cal)
    np.testing.assert_allclose(path, sw.weighted_iterate_logit(lr, lr, beta, 20,
                                                               REGISTERED[name]),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [
    dict(beta=-1.0), dict(lr=0.0), dict(mu=0), dict(n_rounds=1.5), dict(unlikeliness=-0.1),
    dict(pair=(0, 2))])
def test_training_rejects_bad_input(bad):
    kwargs = dict(beta=1.0, lr=0.1, n_rounds=3) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        sw.expected_gradient_training(REF, MASK, **kwargs)


def test_variant_rejects_bad_input():
    with pytest.raises(ValueError, match="variant"):
        sw.weighted_round_policy(REF, REF, MASK, 1.0, "nsr")
    with pytest.raises(ValueError, match="c_minus"):
        sw.weighted_round_policy(REF, REF, MASK, 1.0, (1.0, -1.0))
    with pytest.raises(ValueError, match="k"):
        sw.pass_at_k(0.5, -1)


@pytest.mark.parametrize("bad", [
    dict(n_seeds=0), dict(n_seeds=10**15), dict(group_size=1), dict(group_size=10**15),
    dict(n_rounds=10**15), dict(unlikeliness=1.5), dict(clip_eps=-0.1), dict(seed=None),
    dict(z0=[0.0, np.nan, 0.0, 0.0, 0.0]), dict(z0=[0.0, 0.0]), dict(mu=0), dict(lr=0.0),
    dict(pair=(0, 2))])
def test_sampled_training_rejects_bad_input(bad):
    kwargs = dict(beta=1.0, lr=0.1, n_rounds=2, n_seeds=4) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        sw.sampled_gradient_training(REF, MASK, **kwargs)


def test_sampled_training_refuses_unlikeliness_with_a_registered_binary_normalisation(
        sample_variants):
    with pytest.raises(ValueError, match="normalization"):
        sw.sampled_gradient_training(REF, MASK, 1.0, 0.1, 2, unlikeliness=0.5,
                                     normalization="negative_only")
    with pytest.raises(ValueError, match="group_size"):
        sw.sampled_gradient_training(REF, MASK, 1.0, 0.1, 2, group_size=4,
                                     calibration=theory.Calibration(group_size=6))
