"""KL estimators: expected gradients, the reverse-KL optimum and its PoS fixed points.

Every closed form of :mod:`grpo_companion.theory.kl_estimators` is checked
against an independent computation: torch autograd through the trainer's own
per-sample estimators (:func:`grpo_companion.rl.losses.kl_penalty`), direct
numerical optimisation with scipy, and closed-form roots of the fixed-point
equation where they exist.
"""

import numpy as np
import pytest
import torch
from scipy import optimize, special

from grpo_companion import theory
from grpo_companion.rl import losses
from grpo_companion.theory import kl_estimators as kle
from tests._converged import EPS, ULPS, newton_polish_simplex


def _random_policies(seed, n=6):
    rng = np.random.default_rng(seed)
    return tuple(rng.dirichlet(np.ones(n)) for _ in range(3))


def _autograd_expected_gradient(pi, ref, old, estimator):
    """grad_theta sum_o old(o) k(o) through the trainer's per-sample estimators."""
    theta = torch.tensor(np.log(pi), dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(theta, dim=-1)
    ref_logp = torch.tensor(np.log(ref), dtype=torch.float64)
    prev_logp = torch.tensor(np.log(old), dtype=torch.float64)
    if estimator == "exact":
        value = losses.tabular_kl(logp, ref_logp)
    else:
        per_sample = losses.kl_penalty(logp, ref_logp, estimator, prev_logp=prev_logp)
        value = (prev_logp.exp() * per_sample).sum()
    (grad,) = torch.autograd.grad(value, theta)
    return grad.numpy()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("estimator", list(kle.ESTIMATOR_TARGETS))
@pytest.mark.parametrize("on_policy", [True, False])
def test_expected_gradient_matches_autograd(seed, estimator, on_policy):
    pi, ref, old = _random_policies(seed)
    if on_policy:
        old = pi
    expected = kle.expected_kl_gradient(pi, ref, estimator, prev_policy=old)
    auto = _autograd_expected_gradient(pi, ref, old, estimator)
    np.testing.assert_allclose(expected, auto, rtol=1e-10, atol=1e-13)
    assert abs(expected.sum()) < 1e-12


@pytest.mark.parametrize("seed", range(3))
def test_on_policy_gradients_follow_the_named_divergence(seed):
    pi, ref, _ = _random_policies(seed)
    forward = pi * (np.log(pi / ref) - np.sum(pi * np.log(pi / ref)))  # grad KL(pi||ref)
    reverse = pi - ref  # grad of KL(ref||pi) = -sum ref log pi + const
    grads = {e: kle.expected_kl_gradient(pi, ref, e) for e in kle.ESTIMATOR_TARGETS}
    for estimator, target in kle.ESTIMATOR_TARGETS.items():
        want = {"forward": forward, "reverse": reverse, "none": np.zeros_like(pi)}[target]
        np.testing.assert_allclose(grads[estimator], want, atol=1e-14)
    # Off policy, k1 pulls pi towards pi_old: E_old[grad log pi] = pi_old - pi.
    _, _, old = _random_policies(seed + 10)
    np.testing.assert_allclose(kle.expected_kl_gradient(pi, ref, "k1", prev_policy=old),
                               old - pi, atol=1e-14)


@pytest.mark.parametrize("seed", range(4))
def test_reverse_kl_policy_maximises_objective(seed):
    rng = np.random.default_rng(seed)
    ref = rng.dirichlet(np.ones(5))
    adv = rng.normal(size=5)
    beta = 0.3 + seed

    def objective(pi):
        return pi @ adv - beta * np.sum(ref * np.log(ref / pi))

    def grad(pi):  # dJ/dpi; the Hessian is diagonal, -beta ref / pi^2
        return adv + beta * ref / pi

    def neg(z):
        return -objective(special.softmax(z))

    def neg_grad(z):  # chain rule through the softmax: pi * (g - pi @ g)
        pi = special.softmax(z)
        return -pi * (grad(pi) - pi @ grad(pi))

    res = optimize.minimize(neg, np.zeros(5), jac=neg_grad, method="BFGS",
                            options={"gtol": 1e-11})
    # BFGS's gtol is on logit gradients, which a small pi_i hides: polish with Newton on
    # the KKT system in pi with the objective's own Hessian.
    numeric, spread = newton_polish_simplex(special.softmax(res.x), grad,
                                            lambda pi: -beta * ref / pi**2)
    # Convergence: numeric is the exact optimum for advantages shifted by r = g - const,
    # pi_i = beta ref_i / d_i with d_i = lambda - adv_i; the shift moves every d_i by at
    # most spread = max r - min r, so |closed_i / numeric_i - 1| <= spread / (d_i - spread).
    d = beta * ref / numeric
    assert spread < 1e-9 * d.min(), f"reference not converged: KKT spread {spread:.2e}"
    bound = spread / (d - spread)
    # plus rounding of the closed form's d_i = lambda - adv_i (and of g, in spread)
    rounding = ULPS * EPS * (1 + (np.abs(adv).max() + d.max()) / d)
    closed = kle.reverse_kl_policy(ref, adv, beta)
    assert np.all(np.abs(closed - numeric) <= (bound + rounding) * numeric), (closed, numeric)
    # closed is the maximiser: J(closed) >= J(numeric) up to rounding of J's terms
    terms = np.abs(adv).max() + beta * np.sum(ref * np.abs(np.log(ref / closed)))
    assert objective(closed) >= objective(numeric) - ULPS * EPS * terms


def test_reverse_kl_policy_batches_and_respects_zero_mass():
    ref = np.array([[0.2, 0.3, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    adv = np.array([[1.0, -0.5, 0.2, 5.0], [0.0, 0.0, 0.0, 0.0]])
    pi = kle.reverse_kl_policy(ref, adv, np.array([1.0, 2.0]))
    assert pi[0, 3] == 0.0  # no reference mass, no policy mass
    np.testing.assert_allclose(pi[1], ref[1], atol=1e-15)  # zero advantage: pi = pi_ref
    np.testing.assert_allclose(pi.sum(-1), 1.0, atol=1e-15)


def test_reverse_kl_pos_is_the_class_mass_of_the_policy():
    rng = np.random.default_rng(7)
    ref = rng.dirichlet(np.ones(8))
    mask = np.zeros(8, dtype=bool)
    mask[[1, 4, 6]] = True
    w_plus, w_minus, beta = 1.3, 0.4, 0.9
    pi = kle.reverse_kl_policy(ref, np.where(mask, w_plus, -w_minus), beta)
    assert abs(kle.reverse_kl_pos(ref[mask].sum(), w_plus, w_minus, beta) - pi[mask].sum()) < 1e-13


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("p_ref", [0.01, 0.3, 0.8])
def test_reverse_fixed_point_closed_forms(beta, p_ref):
    # Population whitening, eps = 0: p(1-p) Omega = sqrt(p(1-p)) = beta (p - p_ref), a quadratic.
    b2 = beta**2
    disc = 4 * b2 * p_ref * (1 - p_ref) + 1
    whitened = ((2 * b2 * p_ref + 1) + np.sqrt(disc)) / (2 * (b2 + 1))
    np.testing.assert_allclose(kle.reverse_kl_fixed_points(p_ref, beta, eps=0.0), [whitened],
                               rtol=1e-12)
    # Mean-only (Dr. GRPO): p(1-p) = beta (p - p_ref), i.e. p^2 + (beta-1) p - beta p_ref = 0.
    mean_only = (-(beta - 1) + np.sqrt((beta - 1) ** 2 + 4 * beta * p_ref)) / 2
    np.testing.assert_allclose(
        kle.reverse_kl_fixed_points(p_ref, beta, normalization="mean_only"), [mean_only],
        rtol=1e-12)


@pytest.mark.parametrize("cal", [theory.Calibration(eps=1e-5),
                                 theory.Calibration(eps=1e-5, group_size=16),
                                 theory.Calibration(eps=1e-4, eps_placement="std",
                                                    group_size=8, ddof=1)])
def test_reverse_fixed_point_is_self_consistent(cal):
    p_ref = np.array([0.02, 0.3, 0.7])
    roots = kle.reverse_kl_fixed_points(p_ref, 2.0, calibration=cal)
    assert roots.shape[0] == 3 and not np.isnan(roots[:, 0]).any()
    for pr, row in zip(p_ref, roots, strict=True):
        for p in row[~np.isnan(row)]:
            w_plus, w_minus = cal.weights(p)
            assert abs(kle.reverse_kl_pos(pr, w_plus, w_minus, 2.0) - p) < 1e-10
            assert abs(kle.logit_drift(p, pr, 2.0, "k3", calibration=cal)) < 1e-10
            assert p > pr  # amplification holds for the reverse KL too


def test_drift_matches_autograd_of_the_sampled_objective():
    """d/dL of E_{o~pi_old}[ratio A - beta k(o)] at pi = pi_old, two outcomes, via torch."""
    cal = theory.Calibration(eps=1e-5, group_size=16)
    beta, p_ref = 1.5, 0.2
    for p in (0.05, 0.4, 0.9):
        w_plus, w_minus = cal.weights(p)
        for estimator in kle.ESTIMATOR_TARGETS:
            L = torch.tensor(special.logit(p), dtype=torch.float64, requires_grad=True)
            logp = torch.stack([torch.nn.functional.logsigmoid(L),
                                torch.nn.functional.logsigmoid(-L)])
            old = logp.detach()
            ref = torch.log(torch.tensor([p_ref, 1 - p_ref], dtype=torch.float64))
            adv = torch.tensor([w_plus, -w_minus], dtype=torch.float64)
            surrogate = (old.exp() * torch.exp(logp - old) * adv).sum()
            if estimator == "exact":
                penalty = losses.tabular_kl(logp, ref)
            else:
                penalty = (old.exp() * losses.kl_penalty(logp, ref, estimator,
                                                          prev_logp=old)).sum()
            (grad,) = torch.autograd.grad(surrogate - beta * penalty, L)
            drift = kle.logit_drift(p, p_ref, beta, estimator, calibration=cal)
            assert abs(float(grad) - float(drift)) < 1e-12, (p, estimator)


def test_forward_drift_zeros_are_the_papers_fixed_points():
    p_star = theory.fixed_points(0.3, 2.0, eps=1e-5)
    drift = kle.logit_drift(p_star, 0.3, 2.0, "k2", eps=1e-5)
    np.testing.assert_allclose(drift, 0.0, atol=1e-12)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="estimator"):
        kle.logit_drift(0.5, 0.3, 1.0, "k4")
    with pytest.raises(ValueError, match="beta"):
        kle.reverse_kl_fixed_points(0.3, 0.0)
    with pytest.raises(ValueError, match="positive"):
        kle.expected_kl_gradient([1.0, 0.0], [0.5, 0.5], "k3")
    with pytest.raises(ValueError, match="advantage"):
        kle.reverse_kl_policy([0.5, 0.5], [np.inf, 0.0], 1.0)
    assert kle.reverse_kl_fixed_points(0.0, 1.0).size == 0  # p_ref = 0: absorbing, no root


# --- one registry: theory.kl_estimators.KL_ESTIMATORS is what the loss and the trainer read ----


def test_the_loss_and_the_trainer_read_the_one_registry():
    from grpo_companion.rl import trainer

    names = tuple(kle.KL_ESTIMATORS)
    assert names == ("k1", "k2", "k3", "k3_ratio")
    assert losses.KL_ESTIMATORS == names
    assert trainer.KL_CHOICES == ("exact", *names)
    assert tuple(kle.ESTIMATOR_TARGETS) == ("exact", *names)
    import typing

    from grpo_companion.rl.train_config import GRPOConfig

    # the choices `train --help` lists for --kl: the Literal in the field's type
    kl_type = typing.get_type_hints(GRPOConfig, include_extras=True)["kl"].__origin__
    assert typing.get_args(kl_type) == ("exact", *names)
    for name in names:
        trainer.TrainConfig.flat(task="bandit", kl=name, progress=False)  # a valid choice
        assert kle.KL_ESTIMATORS[name].follows in ("forward", "reverse", "none")
    from grpo_companion.theory.analyses import trained_loss
    assert set(trained_loss.ROUND_ESTIMATORS) <= set(kle.ESTIMATOR_TARGETS)


def _largest_gap(estimator):
    """max |expected_kl_gradient - autograd through kl_penalty| over a few policy triples."""
    gaps = []
    for seed in range(3):
        pi, ref, old = _random_policies(seed)
        gaps.append(np.max(np.abs(kle.expected_kl_gradient(pi, ref, estimator, prev_policy=old)
                                  - _autograd_expected_gradient(pi, ref, old, estimator))))
    return max(gaps)


def test_a_new_estimator_is_one_entry_and_a_wrong_score_is_caught(monkeypatch):
    """An entry added to the registry reaches the loss and the theory at once; the autograd
    comparison above fails when its score is not its value's derivative."""
    k4 = kle.KLEstimator("d**4 / 12", lambda d, xp: d ** 4 / 12, lambda d, xp: -(d ** 3) / 3,
                         "forward")
    monkeypatch.setitem(kle.KL_ESTIMATORS, "k4", k4)
    assert _largest_gap("k4") < 1e-12
    wrong = kle.KLEstimator(k4.formula, k4.value, lambda d, xp: (d ** 3) / 3, "forward")
    monkeypatch.setitem(kle.KL_ESTIMATORS, "k4", wrong)
    assert _largest_gap("k4") > 1e-3
    # ratio-weighted: the loss multiplies by pi / pi_old, and the score is value - value'
    weighted = kle.KLEstimator("(pi / pi_old) d**4 / 12", k4.value,
                               lambda d, xp: d ** 4 / 12 - d ** 3 / 3, "forward",
                               ratio_weighted=True)
    monkeypatch.setitem(kle.KL_ESTIMATORS, "k4", weighted)
    assert _largest_gap("k4") < 1e-12
