"""Closed-form policies against direct optimisation; policy PoS against the scalar recurrence."""

import numpy as np
import pytest
from scipy import optimize, special

from grpo_companion import theory
from tests._converged import EPS, ULPS, newton_polish_simplex


def _random_problem(seed, n=7):
    rng = np.random.default_rng(seed)
    pi_ref = rng.dirichlet(np.ones(n))
    pi_prev = rng.dirichlet(np.ones(n))
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(n, size=rng.integers(1, n), replace=False)] = True
    return pi_ref, pi_prev, mask


def _objective(pi, pi_ref, pi_prev, mask, beta, alpha, cal):
    """Eq. (17) written out directly: E_pi[A] - beta (alpha KL_ref + (1 - alpha) KL_prev)."""
    p_prev = pi_prev[mask].sum()
    w_plus, w_minus = cal.weights(p_prev)
    adv = np.where(mask, w_plus, -w_minus)
    kl_ref = np.sum(pi * np.log(pi / pi_ref))
    kl_prev = np.sum(pi * np.log(pi / pi_prev))
    return pi @ adv - beta * (alpha * kl_ref + (1 - alpha) * kl_prev)


def _objective_grad(pi, pi_ref, pi_prev, mask, beta, alpha, cal):
    """dJ/dpi of eq. (17) as written in :func:`_objective`; its Hessian is -beta / pi."""
    w_plus, w_minus = cal.weights(pi_prev[mask].sum())
    adv = np.where(mask, w_plus, -w_minus)
    return adv - beta * (1 + np.log(pi) - alpha * np.log(pi_ref) - (1 - alpha) * np.log(pi_prev))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.35])
@pytest.mark.parametrize(
    "cal", [theory.Calibration(eps=1e-3), theory.Calibration(normalization="mean_only"),
            theory.Calibration(eps=1e-4, eps_placement="std", group_size=8, ddof=1)]
)
def test_closed_form_maximises_objective(seed, alpha, cal):
    pi_ref, pi_prev, mask = _random_problem(seed)
    beta = 0.5 + seed
    closed = theory.optimal_policy(pi_ref, pi_prev, mask, beta, alpha=alpha, calibration=cal)
    args = (pi_ref, pi_prev, mask, beta, alpha, cal)

    def neg(z):
        return -_objective(special.softmax(z), *args)

    def neg_grad(z):  # chain rule through the softmax: pi * (g - pi @ g)
        pi = special.softmax(z)
        g = _objective_grad(pi, *args)
        return -pi * (g - pi @ g)

    res = optimize.minimize(neg, np.zeros(pi_ref.size), jac=neg_grad, method="BFGS",
                            options={"gtol": 1e-10})
    # BFGS's gtol is on logit gradients pi_i (g_i - pi @ g), which a small pi_i hides;
    # polish with Newton on the KKT system in pi with the objective's own Hessian.
    numeric, spread = newton_polish_simplex(special.softmax(res.x),
                                            lambda pi: _objective_grad(pi, *args),
                                            lambda pi: -beta / pi)
    # Convergence: numeric is the exact optimum of the same problem with the advantages
    # shifted by r = g - const, so |log numeric_i - log closed_i| <= (max r - min r) / beta
    # = spread / beta (the log-partition shift is a pi-average of r / beta).
    bound = np.expm1(spread / beta)
    assert bound < 1e-9, f"reference not converged: KKT spread {spread:.2e}, beta={beta}"
    # plus rounding: softmax of log-arguments of size `scale`, and of g itself (in spread)
    scale = np.max(np.abs(np.log(pi_ref))) + np.max(np.abs(np.log(pi_prev))) + \
        np.max(np.abs(_objective_grad(closed, *args))) / beta + 1
    np.testing.assert_allclose(closed, numeric, rtol=bound + ULPS * EPS * scale, atol=0)
    # closed is the maximiser: J(closed) >= J(numeric) up to rounding of J's terms
    terms = np.abs(closed @ np.abs(_objective_grad(closed, *args))) + beta * scale
    assert _objective(closed, *args) >= _objective(numeric, *args) - ULPS * EPS * terms


@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.6])
@pytest.mark.parametrize("normalization", ["mean_std", "mean_only"])
def test_policy_pos_follows_scalar_recurrence_from_pi_ref(alpha, normalization):
    pi_ref, _, mask = _random_problem(11, n=9)
    beta, n_steps = 2.0, 12
    pis = theory.policy_iterate(pi_ref, mask, beta, n_steps, alpha=alpha, eps=1e-2,
                                normalization=normalization)
    pos = theory.pos(pis, mask)
    scalar = theory.iterate(pos[0], pos[0], beta, n_steps, alpha=alpha, eps=1e-2,
                            normalization=normalization)
    np.testing.assert_allclose(pos, scalar, rtol=1e-10)
    # the Renyi correction vanishes along iterates started at pi_ref
    corr = theory.renyi_correction(pi_ref, pis[:-1], mask, alpha)
    np.testing.assert_allclose(corr, 0.0, atol=1e-13)


def test_two_kl_renyi_correction_from_non_tilted_start():
    pi_ref, pi_0, mask = _random_problem(5, n=8)
    alpha, beta, cal = 0.4, 1.5, theory.Calibration(eps=1e-3)
    pis = theory.policy_iterate(pi_ref, mask, beta, 6, alpha=alpha, pi_0=pi_0, calibration=cal)
    pos = theory.pos(pis, mask)
    # logit of the PoS from the two class masses, exact also when the PoS rounds to 1
    logits = np.log(pis[:, mask].sum(-1)) - np.log(pis[:, ~mask].sum(-1))
    corr = theory.renyi_correction(pi_ref, pis[:-1], mask, alpha)
    assert np.all(np.abs(corr) > 1e-6)
    # Theorem 9: logit p_n = alpha L_ref + (1-alpha) L_{n-1} + Delta_R + Omega(p_{n-1}) / beta
    l_ref = theory.logit(theory.pos(pi_ref, mask))
    expected = (alpha * l_ref + (1 - alpha) * logits[:-1] + corr
                + cal.omega_of_logit(logits[:-1]) / beta)
    np.testing.assert_allclose(logits[1:], expected, rtol=1e-10, atol=1e-12)
    # the scalar map without the correction does not describe this run
    assert not np.allclose(theory.pos_map(pos[:-1], theory.pos(pi_ref, mask), beta,
                                          alpha=alpha, calibration=cal), pos[1:])


def test_renyi_correction_matches_renyi_divergences():
    pi_ref, pi_prev, mask = _random_problem(3, n=6)
    alpha = 0.3
    cond = {}
    for name, pi in (("ref", pi_ref), ("prev", pi_prev)):
        cond[name, "S"] = np.where(mask, pi, 0) / pi[mask].sum()
        cond[name, "F"] = np.where(~mask, pi, 0) / pi[~mask].sum()
    d = {k: theory.renyi_divergence(cond["ref", k], cond["prev", k], alpha) for k in "SF"}
    expected = (1 - alpha) * (d["F"] - d["S"])
    np.testing.assert_allclose(theory.renyi_correction(pi_ref, pi_prev, mask, alpha), expected,
                               rtol=1e-12)
    # and it is the logit gap of the geometric anchor (Lemma 3)
    anchor = theory.geometric_anchor(pi_ref, pi_prev, alpha)
    gap = (theory.logit(theory.pos(anchor, mask))
           - alpha * theory.logit(pi_ref[mask].sum())
           - (1 - alpha) * theory.logit(pi_prev[mask].sum()))
    np.testing.assert_allclose(gap, expected, rtol=1e-10)


def test_mirror_keeps_zero_success_support():
    pi_ref = np.array([0.0, 0.5, 0.5])
    mask = np.array([1, 0, 0])
    pis = theory.policy_iterate(pi_ref, mask, 1.0, 5, alpha=0.0)
    assert np.all(theory.pos(pis, mask) == 0)


def test_kl_divergence_zero_and_positive():
    p = np.array([0.2, 0.8])
    assert theory.kl_divergence(p, p) == 0
    assert theory.kl_divergence(p, [0.5, 0.5]) > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [({"success_mask": [1, 2, 0]}, "binary"), ({"pi_ref": [0.5, 0.6, -0.1]}, "pi_ref"),
     ({"pi_ref": [0.3, 0.3, 0.3]}, "sum to 1"), ({"beta": 0.0}, "beta"),
     ({"alpha": 1.5}, "alpha")],
)
def test_bad_policy_inputs(kwargs, match):
    args = {"pi_ref": [0.2, 0.3, 0.5], "pi_prev": [0.3, 0.3, 0.4], "success_mask": [1, 0, 0],
            "beta": 1.0, "alpha": 0.5}
    args.update(kwargs)
    alpha = args.pop("alpha")
    with pytest.raises(ValueError, match=match):
        theory.optimal_policy(**args, alpha=alpha)
