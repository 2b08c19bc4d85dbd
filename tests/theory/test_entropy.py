"""Policy entropy under GRPO steps (grpo_companion.theory.analyses.entropy), issue 24 item 5.

Cui et al., arXiv 2505.22617. The expectations were committed before this module
existed (benchmarks/results/beyond_expectations.md, section 5). Checks:

- the entropy against SciPy and 50-digit mpmath; the exact entropy change against
  mpmath (down to steps of 1e-9, where the plain difference has lost every digit);
- the covariance identity: first-order error ~ |dz|^2, fitted log-log slope over
  five decades of step size (committed criterion [1.9, 2.1]) and the limit
  ``error / s^2 -> |H''| / 2`` from the second derivative derived below;
- one GRPO step: the plain step against a finite-difference gradient of the
  objective, the natural step against the Fisher map and against the paper's
  Theorem 1 (``lr = 1 / beta``), the covariance form against a Richardson-
  extrapolated finite difference of ``H`` along the step;
- the two least-squares fits against numpy.polyfit / numpy.linalg.lstsq;
- the outcome: exponential vs linear law on exact-gradient bandit runs. The
  committed expectation (neither better by more than one SE) is false: see
  ``test_committed_neither_law_wins_on_the_bandit`` (xfail strict) and
  ``test_exponential_law_fits_bandit_runs_better``.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from scipy import special, stats

from grpo_companion import theory
from grpo_companion.theory.analyses import entropy as ent
from tests._converged import EPS, ULPS


# ------------------------------------------------------------------ helpers
def _mp_h(zs) -> mpmath.mpf:
    log_z = mpmath.log(mpmath.fsum(mpmath.exp(x) for x in zs))
    return -mpmath.fsum(mpmath.exp(x - log_z) * (x - log_z) for x in zs)


def _mp_entropy(z) -> float:
    # 400 digits: log Z = log(1 + e^{-700}) must keep its digits near a vertex
    with mpmath.workdps(400):
        return float(_mp_h([mpmath.mpf(float(x)) for x in z]))


def _mp_change(z, dz) -> float:
    # z + dz formed in 60 digits from the float inputs (not rounded to float64 first)
    with mpmath.workdps(60):
        zs = [mpmath.mpf(float(x)) for x in z]
        shifted = [x + mpmath.mpf(float(d)) for x, d in zip(zs, dz, strict=True)]
        return float(_mp_h(shifted) - _mp_h(zs))


def _case(seed: int):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(3, 9))
    z = rng.normal(0.0, 2.0, k)
    u = rng.normal(size=k)
    return z, u / np.linalg.norm(u)


def _second_derivative(z, u) -> float:
    """``d^2/dt^2 H(z + t u)`` at 0. With ``d log pi / dt = u_c = u - E u`` and
    ``d E_pi[f] / dt = Cov(f, u)``: ``dH/dt = -E[log pi u_c]``, so
    ``H'' = -E[log pi u_c^2] - Var(u) + E[log pi] Var(u) = -E[(log pi + H) u_c^2] - Var(u)``."""
    log_pi = special.log_softmax(z)
    pi = np.exp(log_pi)
    h = -np.sum(pi * log_pi)
    uc = u - pi @ u
    return float(-np.sum(pi * (log_pi + h) * uc**2) - pi @ uc**2)


def _bandit(seed: int, k: int = 6):
    rng = np.random.default_rng(seed)
    mask = np.zeros(k, bool)
    mask[rng.choice(k, size=int(rng.integers(1, k)), replace=False)] = True
    ref = rng.dirichlet(np.ones(k))
    z = np.log(rng.dirichlet(np.ones(k))) + 0.3
    beta = float(rng.uniform(0.1, 2.0))
    return z, ref, mask, beta


# ------------------------------------------------------------------ entropy
def test_entropy_matches_scipy_and_mpmath():
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 3.0, (20, 7))
    got = ent.entropy(z)
    want = stats.entropy(special.softmax(z, axis=-1), axis=-1)
    np.testing.assert_allclose(got, want, rtol=ULPS * EPS, atol=0)
    # near a vertex H is tiny; each term is computed in log space (relative accuracy)
    for spread in (30.0, 200.0, 700.0):
        zz = np.array([0.0, -spread, -spread - 1.0, -spread - 3.0])
        assert abs(ent.entropy(zz) / _mp_entropy(zz) - 1) <= ULPS * EPS
    # outputs without mass, shifts, batches
    assert abs(ent.entropy([0.0, 0.0, -np.inf]) - np.log(2)) <= ULPS * EPS
    assert ent.entropy([3.0, -np.inf]) == 0.0
    np.testing.assert_allclose(ent.entropy(z + 17.0), got, rtol=ULPS * EPS)
    assert ent.entropy(np.zeros((0, 3))).shape == (0,)


@pytest.mark.parametrize("seed", range(6))
def test_exact_change_matches_mpmath(seed):
    z, u = _case(seed)
    log_pi = special.log_softmax(z)
    for s in np.logspace(0.5, -9, 12):
        got = ent.entropy_change(z, s * u)
        want = _mp_change(z, s * u)
        # the first-order term carries the rounding of log pi: a few ulps of |u| (1 + max|log pi|)
        tol = ULPS * EPS * min(s, 1.0) * (1.0 + np.abs(log_pi).max()) + ULPS * EPS * abs(want)
        if s > 0.5:  # the plain difference: a few ulps of H
            tol += ULPS * EPS * (1.0 + _mp_entropy(z))
        assert abs(got - want) <= tol, (s, got, want)


# ------------------------------------------------------- covariance identity
@pytest.mark.parametrize("seed", range(8))
def test_first_order_error_scales_like_dz_squared(seed):
    """Committed criterion: log-log slope of |exact - first order| in [1.9, 2.1] over five
    decades of step size; and the error over ``s^2`` tends to ``|H''| / 2``."""
    z, u = _case(100 + seed)
    s = np.logspace(-1, -6, 21)
    dz = s[:, None] * u
    err = np.abs(ent.entropy_change(z, dz) - ent.entropy_change_first_order(z, dz))
    slope = np.polyfit(np.log(s), np.log(err), 1)[0]
    assert 1.9 <= slope <= 2.1, slope
    curvature = abs(_second_derivative(z, u)) / 2
    # error / s^2 = |H''| / 2 + O(s); at s = 1e-6 the O(s) term is ~1e-6 relative
    assert abs(err[-1] / s[-1] ** 2 / curvature - 1) <= 1e-4
    # the slope over the five decades, and beyond them (the exact change keeps its digits)
    s_far = np.logspace(-5, -9, 9)
    err_far = np.abs(ent.entropy_change(z, s_far[:, None] * u)
                     - ent.entropy_change_first_order(z, s_far[:, None] * u))
    assert abs(np.polyfit(np.log(s_far), np.log(err_far), 1)[0] - 2) <= 1e-3


@pytest.mark.parametrize("seed", range(6))
def test_first_order_is_the_directional_derivative(seed):
    """``-Cov(log pi, dz)`` against a Richardson-extrapolated central difference of the
    exact change (each accurate to a few ulps relative); ``dz`` not centred, with
    masses of 0."""
    z, u = _case(200 + seed)
    z = z.copy()
    z[0] = -np.inf
    dz = 3.0 + u
    want = ent.entropy_change_first_order(z, dz)

    def central(h):
        return (ent.entropy_change(z, h * dz) - ent.entropy_change(z, -h * dz)) / (2 * h)

    d1, d2 = central(1e-3), central(5e-4)
    extrapolated = (4 * d2 - d1) / 3
    # each exact change is accurate to a few ulps of |h dz| (1 + max|log pi|), divided by h
    live = np.isfinite(z)
    rounding = ULPS * EPS * np.abs(dz).max() * (1 + np.abs(special.log_softmax(z)[live]).max())
    assert abs(extrapolated - want) <= 1e-3 * abs(d1 - d2) + rounding
    # invariance under dz -> dz + const and equality with the value at the centred dz
    assert abs(ent.entropy_change_first_order(z, dz - 3.0) - want) <= ULPS * EPS * 10


# ------------------------------------------------------------- a GRPO step
@pytest.mark.parametrize("seed", range(6))
def test_plain_step_is_lr_times_the_objective_gradient(seed):
    z, ref, mask, beta = _bandit(seed)
    pi0 = special.softmax(z)
    w_plus, w_minus = theory.weights(pi0[mask].sum())  # held fixed (stop-gradient)
    adv = np.where(mask, w_plus, -w_minus)

    def objective(zz):
        pi = special.softmax(zz)
        return pi @ adv - beta * np.sum(pi * np.log(pi / ref))

    lr = 0.7
    step = ent.grpo_logit_step(z, ref, mask, beta, lr)
    eye, h = np.eye(z.size), 1e-4
    fd = np.array([(objective(z + h * e) - objective(z - h * e)) / (2 * h) for e in eye])
    fd2 = np.array([(objective(z + h / 2 * e) - objective(z - h / 2 * e)) / h for e in eye])
    extrapolated = (4 * fd2 - fd) / 3  # truncation O(h^4); rounding ~ ulps of J over h
    scale = 1.0 + np.abs(adv).max() + beta * np.abs(np.log(pi0 / ref)).max()
    np.testing.assert_allclose(step / lr, extrapolated,
                               atol=1e-3 * np.abs(fd - fd2).max() + ULPS * EPS * scale / h)


@pytest.mark.parametrize("seed", range(6))
def test_natural_step_is_the_fisher_preimage_of_the_plain_one(seed):
    z, ref, mask, beta = _bandit(10 + seed)
    pi = special.softmax(z)
    plain = ent.grpo_logit_step(z, ref, mask, beta, 0.3, gradient="plain")
    natural = ent.grpo_logit_step(z, ref, mask, beta, 0.3, gradient="natural")
    fisher = np.diag(pi) - np.outer(pi, pi)
    scale = np.abs(natural).max()
    np.testing.assert_allclose(fisher @ natural, plain, atol=ULPS * EPS * scale)
    assert abs(pi @ natural) <= ULPS * EPS * scale


@pytest.mark.parametrize("seed", range(6))
def test_natural_step_with_lr_one_over_beta_is_theorem_1(seed):
    """``z + (c - E c) / beta = log pi_ref + A / beta + const``: the paper's iteration."""
    z, ref, mask, beta = _bandit(20 + seed)
    dz = ent.grpo_logit_step(z, ref, mask, beta, 1.0 / beta, gradient="natural")
    got = special.softmax(z + dz)
    want = theory.optimal_policy(ref, special.softmax(z), mask, beta)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("gradient", ent.GRADIENTS)
@pytest.mark.parametrize("seed", range(5))
def test_step_covariance_is_the_entropy_derivative_along_the_step(gradient, seed):
    z, ref, mask, beta = _bandit(30 + seed)
    dz = ent.grpo_logit_step(z, ref, mask, beta, 1.0, gradient=gradient)
    cov = ent.step_entropy_covariance(z, ref, mask, beta, 1.0, gradient=gradient)
    # a direct finite difference of the public entropy along the step
    h = 1e-3 / np.abs(dz).max()

    def central(hh):
        return (ent.entropy(z + hh * dz) - ent.entropy(z - hh * dz)) / (2 * hh)

    d1, d2 = central(h), central(h / 2)
    extrapolated = (4 * d2 - d1) / 3
    rounding = ULPS * EPS * (1 + ent.entropy(z)) / h
    assert abs(extrapolated - cov) <= 1e-2 * abs(d1 - d2) + rounding
    # the covariance written from the advantage equals the identity applied to dz
    assert abs(ent.entropy_change_first_order(z, dz) - cov) <= ULPS * EPS * (1 + abs(cov)) * 10
    # and it is linear in the step size
    half = ent.step_entropy_covariance(z, ref, mask, beta, 0.5, gradient=gradient)
    assert abs(2 * half - cov) <= ULPS * EPS * abs(cov)


def test_step_broadcasts_over_a_batch():
    cases = [_bandit(40 + s, k=5) for s in range(3)]
    z = np.stack([c[0] for c in cases])
    ref = np.stack([c[1] for c in cases])
    mask = np.stack([c[2] for c in cases])
    beta = np.array([c[3] for c in cases])
    lr = np.array([0.1, 0.5, 2.0])
    for gradient in ent.GRADIENTS:
        batch = ent.grpo_logit_step(z, ref, mask, beta, lr, gradient=gradient)
        cov = ent.step_entropy_covariance(z, ref, mask, beta, lr, gradient=gradient)
        for i in range(3):
            one = ent.grpo_logit_step(z[i], ref[i], mask[i], beta[i], lr[i], gradient=gradient)
            np.testing.assert_allclose(batch[i], one, rtol=ULPS * EPS, atol=0)
            c1 = ent.step_entropy_covariance(z[i], ref[i], mask[i], beta[i], lr[i],
                                             gradient=gradient)
            assert abs(cov[i] - c1) <= ULPS * EPS * abs(c1)


# ------------------------------------------------------------------- runs
def test_natural_run_keeps_entropy_a_function_of_the_pos():
    """The natural step is constant on each class when ``pi / pi_ref`` is, so along a
    natural run ``H = h(p) + p H_S + (1 - p) H_F`` (``H_S``, ``H_F``: the reference's
    within-class entropies); the plain run leaves that curve."""
    rng = np.random.default_rng(5)
    k = 7
    mask = np.array([1, 1, 1, 0, 0, 0, 0], bool)
    ref = rng.dirichlet(np.ones(k))
    h_s = stats.entropy(ref[mask] / ref[mask].sum())
    h_f = stats.entropy(ref[~mask] / ref[~mask].sum())
    for gradient, lr in (("natural", 0.2), ("plain", 1.0)):
        run = ent.exact_gradient_run(ref, mask, 0.3, lr, 40, gradient=gradient)
        p = run.reward
        assert abs(p[0] - ref[mask].sum()) <= ULPS * EPS
        curve = stats.entropy(np.stack([p, 1 - p])) + p * h_s + (1 - p) * h_f
        gap = np.abs(run.entropy - curve).max()
        if gradient == "natural":
            assert gap <= 1e-12
        else:
            assert gap >= 1e-3
        # the run is the iterated step
        z1 = run.logits[0] + ent.grpo_logit_step(run.logits[0], ref, mask, 0.3, lr,
                                                 gradient=gradient)
        np.testing.assert_array_equal(run.logits[1], z1)
        np.testing.assert_allclose(run.entropy, ent.entropy(run.logits), rtol=0, atol=0)


# -------------------------------------------------------------------- fits
def test_fits_match_polyfit_and_lstsq():
    rng = np.random.default_rng(3)
    h = np.sort(rng.uniform(0.05, 2.0, (4, 30)), axis=-1)
    r = 0.9 - 0.2 * np.exp(h) + 0.3 * h**2 + rng.normal(0, 0.02, h.shape)
    fit = ent.fit_entropy_laws(h, r)
    for i in range(4):
        lin = np.polyfit(h[i], r[i], 1)
        np.testing.assert_allclose([fit.lin_a[i], fit.lin_b[i]], lin, rtol=1e-10)
        design = np.stack([-np.exp(h[i]), np.ones_like(h[i])], axis=-1)
        coef, *_ = np.linalg.lstsq(design, r[i], rcond=None)
        np.testing.assert_allclose([fit.exp_a[i], fit.exp_b[i]], coef, rtol=1e-10)
        res_lin = r[i] - np.polyval(lin, h[i])
        res_exp = r[i] - design @ coef
        np.testing.assert_allclose(fit.lin_rms[i], np.mean(res_lin**2), rtol=1e-9)
        np.testing.assert_allclose(fit.exp_rms[i], np.mean(res_exp**2), rtol=1e-9)
    # an exact law is recovered exactly (to rounding)
    exact = ent.fit_entropy_laws(h[0], 1.5 - 0.25 * np.exp(h[0]))
    assert abs(exact.exp_a - 0.25) <= 1e-12 and abs(exact.exp_b - 1.5) <= 1e-12
    assert exact.exp_rms <= 1e-28 < exact.lin_rms
    line = ent.fit_entropy_laws(h[0], 0.4 - 0.3 * h[0])
    assert abs(line.lin_a + 0.3) <= 1e-12 and line.lin_rms <= 1e-28 < line.exp_rms


def test_comparison_is_the_mean_and_standard_error_over_seeds():
    rng = np.random.default_rng(4)
    h = np.sort(rng.uniform(0.1, 1.5, (6, 25)), axis=-1)
    r = 1.0 - 0.3 * np.exp(h) + rng.normal(0, 0.01, h.shape)
    cmp = ent.compare_entropy_laws(h, r)
    fit = ent.fit_entropy_laws(h, r)
    d = fit.lin_rms - fit.exp_rms
    assert abs(cmp.difference - d.mean()) <= ULPS * EPS * abs(d).max()
    se = np.std(d, ddof=1) / np.sqrt(6)
    assert abs(cmp.standard_error - se) <= 1e-12 * se
    assert abs(cmp.n_se - d.mean() / se) <= 1e-10 * abs(cmp.n_se)
    assert cmp.better == ("exponential" if cmp.n_se > 1 else
                          "linear" if cmp.n_se < -1 else "neither")
    assert bool(cmp.describes) == bool(cmp.n_se > 3)


# ------------------------------------------------------------ the outcome
P_REFS = (0.1, 0.3, 0.6)
BETAS = (0.05, 0.5)
RUNS = (("plain", 1.0, 30), ("plain", 1.0, 100), ("natural", 0.2, 30), ("natural", 0.2, 100))
N_SEEDS = 16


def _bandit_comparisons():
    """Exact-gradient runs from 16 random ``pi_ref`` (3 successes, 5 failures, success mass
    ``p_ref``) per (p_ref, beta, geometry, length); (H_t, R_t = p_t) of the whole run."""
    mask = np.array([1, 1, 1, 0, 0, 0, 0, 0], bool)
    out = {}
    for p_ref in P_REFS:
        rng = np.random.default_rng(int(p_ref * 100))
        ref = np.concatenate([p_ref * rng.dirichlet(np.ones(3), N_SEEDS),
                              (1 - p_ref) * rng.dirichlet(np.ones(5), N_SEEDS)], axis=-1)
        for beta in BETAS:
            for gradient, lr, n_steps in RUNS:
                run = ent.exact_gradient_run(ref, mask, beta, lr, n_steps, gradient=gradient)
                out[p_ref, beta, gradient, n_steps] = ent.compare_entropy_laws(
                    run.entropy.T, run.reward.T)
    return out


@pytest.fixture(scope="module")
def comparisons():
    return _bandit_comparisons()


@pytest.mark.xfail(strict=True, reason=(
    "committed expectation (beyond_expectations.md section 5) that neither R = -a e^H + b "
    "nor R = a' H + b' fits the bandit better by more than one standard error is false: "
    "the exponential law fits better by more than 1 SE in 23 of 24 configurations (by more "
    "than 3 SE in 20, up to 71 SE); see test_exponential_law_fits_bandit_runs_better"))
def test_committed_neither_law_wins_on_the_bandit(comparisons):
    assert all(abs(c.n_se) <= 1 for c in comparisons.values())


def test_exponential_law_fits_bandit_runs_better(comparisons):
    n_se = {key: float(c.n_se) for key, c in comparisons.items()}
    assert len(n_se) == 24
    # the exponential law never has the larger mean residual square ...
    assert min(n_se.values()) > 0.0, n_se
    # ... within one SE only for plain gradient, beta = 0.5, p_ref = 0.1, 30 steps (0.88 SE);
    tie = [key for key, v in n_se.items() if v <= 1.0]
    assert tie == [(0.1, 0.5, "plain", 30)], tie
    # by 1 to 3 SE at p_ref = 0.1 with the natural gradient and beta = 0.05 (2.1, 2.2 SE);
    # by more than 3 SE (the committed criterion for "describes") in the other 20, every
    # configuration with p_ref >= 0.3 among them (5 to 71 SE)
    weak = [key for key, v in n_se.items() if 1.0 < v <= 3.0]
    assert weak == [(0.1, 0.05, "natural", 30), (0.1, 0.05, "natural", 100)], weak
    assert all(v > 3.0 for key, v in n_se.items() if key[0] >= 0.3)
    assert all(bool(c.describes) == (n_se[key] > 3) for key, c in comparisons.items())
    # yet neither law is exact: the exponential law's residual mean square is 0.29 to 0.99
    # of the linear law's
    for c in comparisons.values():
        ratio = np.mean(c.fits.exp_rms) / np.mean(c.fits.lin_rms)
        assert 0.2 < ratio < 1.0


# ------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(("call", "name"), [
    (lambda: ent.entropy([0.0, np.nan]), "logits"),
    (lambda: ent.entropy([0.0, np.inf]), "logits"),
    (lambda: ent.entropy([-np.inf, -np.inf]), "logits"),
    (lambda: ent.entropy(1.0), "logits"),
    (lambda: ent.entropy("ab"), "logits"),
    (lambda: ent.entropy_change([0.0, 1.0], [0.0, np.inf]), "dz"),
    (lambda: ent.entropy_change([0.0, 1.0], [0.0, 1.0, 2.0]), "logits"),
    (lambda: ent.entropy_change_first_order([0.0, 1.0], None), "dz"),
    (lambda: ent.grpo_logit_step([0.0, -np.inf], [0.5, 0.5], [1, 0], 1.0, 0.1), "logits"),
    (lambda: ent.grpo_logit_step([0.0, 0.0], [1.0, 0.0], [1, 0], 1.0, 0.1), "pi_ref"),
    (lambda: ent.grpo_logit_step([0.0, 0.0], [0.5, 0.6], [1, 0], 1.0, 0.1), "pi_ref"),
    (lambda: ent.grpo_logit_step([0.0, 0.0], [0.5, 0.5], [1, 2], 1.0, 0.1), "success_mask"),
    (lambda: ent.grpo_logit_step([0.0, 0.0], [0.5, 0.5], [1, 0], 0.0, 0.1), "beta"),
    (lambda: ent.grpo_logit_step([0.0, 0.0], [0.5, 0.5], [1, 0], 1.0, 0.0), "lr"),
    (lambda: ent.grpo_logit_step([0.0, 0.0], [0.5, 0.5], [1, 0], 1.0, 0.1, gradient="adam"),
     "gradient"),
    (lambda: ent.grpo_logit_step([0.0, 0.0], [0.5, 0.5], [1, 0], 1.0, 0.1, epsilon=1.0),
     "unknown calibration keyword"),
    (lambda: ent.step_entropy_covariance([0.0, 0.0], [0.5, 0.5], [1, 0], 1.0, -1.0), "lr"),
    (lambda: ent.exact_gradient_run([0.5, 0.5], [1, 0], 1.0, 0.1, -1), "n_steps"),
    (lambda: ent.exact_gradient_run([0.5, 0.5], [1, 0], 1.0, 0.1, 10**15), "n_steps"),
    (lambda: ent.fit_entropy_laws([0.1, 0.2], [0.3, 0.4]), "entropy"),
    (lambda: ent.fit_entropy_laws([0.1, 0.1, 0.1], [0.3, 0.4, 0.5]), "entropy"),
    (lambda: ent.fit_entropy_laws([0.1, 0.2, 0.3], [0.3, np.nan, 0.5]), "reward"),
    (lambda: ent.compare_entropy_laws([0.1, 0.2, 0.3], [0.3, 0.4, 0.5]), "entropy"),
])
def test_bad_inputs_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call()
