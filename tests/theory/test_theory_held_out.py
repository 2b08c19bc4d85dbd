"""Chapter 8's held-out analysis: relaxed predictions, the fit of lambda, RMSEs, before/after.

Every expected value is computed here independently: the relaxed step written out in
log-odds with the paper's Omega, closed forms for the mean-only calibration, a brute-force
grid search for the fitted step fraction, plain loops for the errors and scipy.stats for
the standard errors.
"""

import math

import numpy as np
import pytest
from scipy import special, stats

from grpo_companion.theory import Calibration, held_out

EPS = 1e-5


def _relaxed_by_hand(p_ref, beta, n_steps, lam, alpha=1.0, eps=EPS):
    """L_n = (1 - lam) L_{n-1} + lam [alpha L_ref + (1 - alpha) L_{n-1} + Omega(p_{n-1}) / beta]."""
    l_ref = special.logit(np.asarray(p_ref, dtype=float))
    L, out = l_ref.copy(), [special.expit(l_ref)]
    for _ in range(n_steps):
        p = special.expit(L)
        omega = 1.0 / np.sqrt(p * (1 - p) + eps)  # eq. (4): mean and variance whitening
        # a zero coefficient means no term (0 * (-inf) would be NaN at p_ref = 0)
        own = 0.0 if alpha == 1 else (1 - alpha) * L
        kept = 0.0 if lam == 1 else (1 - lam) * L
        L = kept + lam * (alpha * l_ref + own + omega / beta)
        out.append(special.expit(L))
    return np.array(out)


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
def test_predict_is_the_relaxed_step_written_out(alpha):
    p_ref = np.array([0.02, 0.3, 0.7, 0.95])
    got = held_out.predict(p_ref, 2.0, 12, 0.2, alpha=alpha, eps=EPS)
    np.testing.assert_allclose(got, _relaxed_by_hand(p_ref, 2.0, 12, 0.2, alpha), rtol=0,
                               atol=1e-13)


@pytest.mark.parametrize("alpha", [1.0, 0.0])
def test_predict_mean_only_closed_form(alpha):
    """Omega = 1 - 1/G for Dr. GRPO: L_n = L_ref + (1 - (1 - lam alpha)^n) Omega / (alpha beta)."""
    p_ref, beta, lam, G = np.array([0.01, 0.4, 0.9]), 0.5, 0.1, 16
    cal = Calibration(normalization="mean_only", group_size=G)
    n = np.arange(9)[:, None]
    omega = 1 - 1 / G
    if alpha == 0:
        expected = special.logit(p_ref) + n * lam * omega / beta
    else:
        expected = special.logit(p_ref) + (1 - (1 - lam * alpha) ** n) * omega / (alpha * beta)
    got = held_out.predict(p_ref, beta, 8, lam, alpha=alpha, calibration=cal)
    np.testing.assert_allclose(special.logit(got), expected, rtol=1e-12, atol=1e-12)


def test_fit_matches_a_brute_force_grid_search_and_ignores_other_prompts():
    rng = np.random.default_rng(3)
    p_ref = rng.uniform(0.05, 0.9, size=10)
    clean = _relaxed_by_hand(p_ref, 1.0, 15, 0.07)
    observed = np.clip(clean + rng.normal(scale=0.01, size=clean.shape), 0, 1)
    observed[0] = p_ref
    fit_idx = np.array([0, 2, 3, 5, 8])
    lam = held_out.fit_step_fraction_on(observed, fit_idx, 1.0, eps=EPS)
    grid = np.geomspace(1e-3, 1.0, 4001)
    mse = [np.mean((_relaxed_by_hand(p_ref[fit_idx], 1.0, 15, g) - observed[:, fit_idx]) ** 2)
           for g in grid]
    best = grid[int(np.argmin(mse))]
    assert abs(math.log(lam) - math.log(best)) < 3e-3
    assert abs(lam - 0.07) < 0.01  # the noise moves the optimum only a little
    spoiled = observed.copy()
    spoiled[1:, [1, 4, 6, 7, 9]] = rng.uniform(size=(15, 5))  # the other prompts
    assert held_out.fit_step_fraction_on(spoiled, fit_idx, 1.0, eps=EPS) == lam


def test_rmse_against_a_plain_loop():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(size=(4, 7)), rng.uniform(size=(4, 7))
    by_loop = math.sqrt(sum((x - y) ** 2 for x, y in zip(a.ravel(), b.ravel(), strict=True))
                        / a.size)
    assert held_out.rmse(a, b) == pytest.approx(by_loop, rel=1e-14)
    assert held_out.rmse(a, a) == 0.0


def test_judge_against_direct_computations():
    rng = np.random.default_rng(1)
    p_ref = rng.uniform(0.0, 1.0, size=9)
    p_ref[0] = 0.0  # an absorbing prompt
    n_steps, beta, n = 6, 0.5, 50
    observed = np.clip(_relaxed_by_hand(p_ref, beta, n_steps, 0.05)
                       + rng.normal(scale=0.05, size=(n_steps + 1, 9)), 0, 1)
    observed[0] = p_ref
    pred = _relaxed_by_hand(p_ref, beta, n_steps, 0.03)
    test_idx = np.array([0, 1, 4, 5, 7])
    got = held_out.judge(observed, pred, test_idx, beta, eval_samples=n, eps=EPS)
    obs = observed[:, test_idx]

    def loop_rmse(x, y):
        return math.sqrt(sum((u - v) ** 2 for u, v in zip(x.ravel(), y.ravel(), strict=True))
                         / x.size)

    exact = _relaxed_by_hand(obs[0], beta, n_steps, 1.0)
    assert got.none == pytest.approx(loop_rmse(np.tile(obs[0], (n_steps + 1, 1)), obs), rel=1e-13)
    assert got.exact == pytest.approx(loop_rmse(exact, obs), rel=1e-10)
    assert got.relaxed == pytest.approx(loop_rmse(pred[:, test_idx], obs), rel=1e-13)
    for j, q in enumerate(test_idx):
        f = pred[-1, q]
        band = 3 * math.sqrt(max(f * (1 - f), 1 / n) / n)
        assert got.signed[j] == pytest.approx(observed[-1, q] - f, abs=1e-15)
        assert bool(got.inside[j]) == (abs(observed[-1, q] - f) <= band)
    assert got.inside.shape == (5,) and got.inside.dtype == bool


def test_before_after_against_scipy_stats():
    rng = np.random.default_rng(2)
    x = rng.uniform(size=(5, 40))
    s = held_out.before_after(x)
    assert s.before == pytest.approx(x[0].mean()) and s.after == pytest.approx(x[-1].mean())
    assert s.before_se == pytest.approx(stats.sem(x[0]), rel=1e-12)
    assert s.after_se == pytest.approx(stats.sem(x[-1]), rel=1e-12)
    assert s.gain_se == pytest.approx(stats.sem(x[-1] - x[0]), rel=1e-12)
    assert s.gain_z == pytest.approx(stats.ttest_rel(x[-1], x[0]).statistic, rel=1e-12)


def test_split_prompts_is_a_seeded_partition():
    fit, test = held_out.split_prompts(11, seed=4)
    assert fit.size == 5 and test.size == 6
    assert np.array_equal(np.sort(np.concatenate([fit, test])), np.arange(11))
    assert np.all(np.diff(fit) > 0) and np.all(np.diff(test) > 0)
    again = held_out.split_prompts(11, seed=4)
    assert np.array_equal(again[0], fit) and np.array_equal(again[1], test)
    assert not np.array_equal(held_out.split_prompts(11, seed=5)[0], fit)


@pytest.mark.parametrize(("call", "name"), [
    (lambda: held_out.split_prompts(1), "n_prompts"),
    (lambda: held_out.fit_step_fraction_on(np.full((3, 4), 0.5), [0, 4], 1.0), "prompts"),
    (lambda: held_out.fit_step_fraction_on(np.full((3, 4), 0.5), [1, 1], 1.0), "prompts"),
    (lambda: held_out.fit_step_fraction_on(np.full((3, 4), 0.5), [0.0], 1.0), "prompts"),
    (lambda: held_out.fit_step_fraction_on(np.full((3, 4), 0.5), [True], 1.0), "prompts"),
    (lambda: held_out.fit_step_fraction_on(np.full(4, 0.5), [0], 1.0), "success_prob"),
    (lambda: held_out.fit_step_fraction_on(np.full((3, 4), 1.5), [0], 1.0), "success_prob"),
    (lambda: held_out.fit_step_fraction_on(np.full((3, 4), 0.5), [0], 0.0), "beta"),
    (lambda: held_out.predict(0.2, 1.0, 3, 0.0), "step_fraction"),
    (lambda: held_out.predict(0.2, 1.0, 3, 0.5, epsilon=1e-5), "epsilon"),
    (lambda: held_out.rmse([0.1, 0.2], [0.1]), "predicted"),
    (lambda: held_out.rmse([np.inf], [0.1]), "predicted"),
    (lambda: held_out.judge(np.full((3, 4), 0.5), np.full((3, 3), 0.5), [0], 1.0),
     "predicted"),
    (lambda: held_out.judge(np.full((3, 4), 0.5), np.full((3, 4), 0.5), [0], 1.0,
                            eval_samples=0), "eval_samples"),
    (lambda: held_out.judge(np.full((3, 4), 0.5), np.full((3, 4), 0.5), [0], 1.0, n_se=0.0),
     "n_se"),
    (lambda: held_out.before_after(np.full((3, 1), 0.5)), "success_prob"),
])
def test_bad_input_is_a_value_error_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
