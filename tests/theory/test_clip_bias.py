"""Clipping bias under random rewards, exactly (grpo_companion.theory.analyses.clip_bias),
issue 24 item 6.

The claim is Shao et al.'s (arXiv 2506.10947): with rewards independent of the
output, GRPO's clip biases the update. The expectations were committed before this
module existed (benchmarks/results/beyond_expectations.md, section 6) for a
3-output bandit, ``pi_old = (0.9, 0.07, 0.03)``, ``G = 4``, Bernoulli(1/2) rewards,
``kappa = 0.2``. Checks against independent computations:

- the enumeration: probabilities sum to 1, the marginals are ``pi_old`` and ``q``;
- the per-group gradient against central finite differences of the surrogate;
- the exact expectation against a seeded Monte Carlo of sampled groups, run with
  an independent implementation of the steps (gradient by the chain rule through
  ``pi``, advantages whitened by hand), within 3 standard errors (the committed
  criterion);
- :func:`clip_bias.sampled_drift`, the library's Monte Carlo counterpart, against the
  enumeration within 4 standard errors (``mu`` in {1, 4}, with and without clipping);
- the committed expectations. Three are false and kept as ``xfail(strict=True)``
  beside a passing test of what is true:

  * ``mu = 1``: the expected *logit* update is zero (1e-12), clipped or not, but the
    expected *probability* drift is not: the softmax is curved, so
    ``E[softmax(z + lr g)] - softmax(z)`` is of order ``lr^2`` even with ``E[g] = 0``
    (``-2.0e-3`` for the high-prior output at ``lr = 1``);
  * with clipping and ``mu`` in {2, 4, 10} the high-prior output's probability
    drift is *negative* at every learning rate tried, not positive; clipping does
    push it up *relative to no clipping*;
  * without clipping the drift is of second order in ``lr`` (true), but *larger*
    in magnitude than the clipped drift, not smaller: the clip caps how far a group
    moves the policy, and the curvature loss grows with that distance.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

from grpo_companion import theory
from grpo_companion.theory.analyses import clip_bias
from tests._converged import EPS

OLD = np.array([0.9, 0.07, 0.03])
G = 4
Q = 0.5
KAPPA = 0.2
MUS = (2, 4, 10)
#: learning rates on the logits where the ratios reach the clip within mu steps:
#: the expected fraction of samples clipped at some step is 5-14 % (test below)
LRS = (0.5, 1.0, 2.0, 5.0)


def _drift(mu, lr, kappa=KAPPA, **kw):
    return clip_bias.expected_drift(OLD, n_steps=mu, lr=lr, clip_eps=kappa, group_size=G, p=Q,
                                    **kw)


# ------------------------------------------------------------------ enumeration
def test_enumeration_probabilities_and_marginals():
    e = clip_bias.enumerate_groups(OLD, G, Q)
    n = OLD.size ** G * 2 ** G
    assert e.outputs.shape == e.rewards.shape == e.advantages.shape == (n, G)
    assert e.probability.shape == (n,)
    assert abs(e.probability.sum() - 1.0) <= n * EPS
    # each position's output is distributed as pi_old, each reward as Bernoulli(q)
    for i in range(G):
        marginal = np.bincount(e.outputs[:, i], weights=e.probability, minlength=OLD.size)
        np.testing.assert_allclose(marginal, OLD, rtol=0, atol=n * EPS)
    np.testing.assert_allclose(e.probability @ e.rewards, Q, rtol=0, atol=n * EPS)
    # every (outputs, rewards) pair exactly once
    keys = {(tuple(o), tuple(r)) for o, r in zip(e.outputs, e.rewards, strict=True)}
    assert len(keys) == n
    np.testing.assert_array_equal(e.advantages, theory.group_advantages(e.rewards))


def test_enumeration_non_uniform_q():
    q = 0.3
    e = clip_bias.enumerate_groups(OLD, 3, q)
    assert abs(e.probability.sum() - 1.0) <= e.probability.size * EPS
    np.testing.assert_allclose(e.probability @ e.rewards, q, rtol=0, atol=1e-14)


# ------------------------------------------------------------------- gradient
@pytest.mark.parametrize("kappa", [None, 0.1, 0.2])
def test_gradient_against_finite_differences(kappa):
    rng = np.random.default_rng(1)
    n = 200
    outs = rng.integers(0, OLD.size, size=(n, G))
    adv = theory.group_advantages((rng.random((n, G)) < Q).astype(float))
    z = np.log(OLD) + rng.normal(0.0, 0.3, size=(n, OLD.size))
    grad = clip_bias.group_surrogate_gradient(z, OLD, outs, adv, kappa)
    h = 1e-6
    fd = np.empty_like(grad)
    same_side = np.ones(n, bool)
    for k in range(OLD.size):
        dz = np.zeros(OLD.size)
        dz[k] = h
        fd[:, k] = (clip_bias.group_surrogate(z + dz, OLD, outs, adv, kappa)
                    - clip_bias.group_surrogate(z - dz, OLD, outs, adv, kappa)) / (2 * h)
        if kappa is not None:  # drop groups with a kink between z - h and z + h
            for s in (-1, 1):
                x = special.softmax(z + s * dz, axis=-1)[np.arange(n)[:, None], outs] / OLD[outs]
                clipped = np.where(adv > 0, x > 1 + kappa, x < 1 - kappa)
                x0 = special.softmax(z, axis=-1)[np.arange(n)[:, None], outs] / OLD[outs]
                clipped0 = np.where(adv > 0, x0 > 1 + kappa, x0 < 1 - kappa)
                same_side &= np.all(clipped == clipped0, axis=-1)
    assert same_side.sum() > n // 2
    if kappa is not None:
        assert np.any(np.all(grad == 0, axis=-1) & np.any(adv != 0, axis=-1))  # some clipped
    # central differences: truncation h^2 |S'''| / 6 ~ 1e-12 (|S'''| <= a few units,
    # the ratios here being < 3); rounding ~ EPS |S| / h ~ 1e-10
    np.testing.assert_allclose(grad[same_side], fd[same_side], rtol=0, atol=1e-8)
    np.testing.assert_allclose(grad.sum(-1), 0.0, atol=1e-15)


def test_surrogate_broadcasts_one_policy_over_groups():
    outs = np.array([[0, 1, 2, 2], [1, 1, 0, 2]])
    adv = np.array([[1.0, -1.0, 0.5, -0.5], [0.3, -0.3, 0.0, 0.0]])
    z = np.log(OLD) + np.array([0.4, -0.2, 0.1])
    s = clip_bias.group_surrogate(z, OLD, outs, adv, KAPPA)
    g = clip_bias.group_surrogate_gradient(z, OLD, outs, adv, KAPPA)
    assert s.shape == (2,) and g.shape == (2, 3)
    for i in range(2):
        assert s[i] == clip_bias.group_surrogate(z, OLD, outs[i], adv[i], KAPPA)
    empty = clip_bias.group_round_logits(OLD, np.zeros((0, G), int), np.zeros((0, G)),
                                         n_steps=2, lr=1.0)
    assert empty.shape == (0, 3)


def test_round_zero_steps_and_one_step():
    e = clip_bias.enumerate_groups(OLD, G, Q)
    z0 = clip_bias.group_round_logits(OLD, e.outputs, e.advantages, n_steps=0, lr=1.0)
    np.testing.assert_array_equal(z0, np.broadcast_to(np.log(OLD), z0.shape))
    z1 = clip_bias.group_round_logits(OLD, e.outputs, e.advantages, n_steps=1, lr=0.7,
                                      clip_eps=KAPPA)
    g = clip_bias.group_surrogate_gradient(np.log(OLD), OLD, e.outputs, e.advantages, KAPPA)
    np.testing.assert_allclose(z1, np.log(OLD) + 0.7 * g, rtol=0, atol=4 * EPS)


# ---------------------------------------------------------------- Monte Carlo
def _sampled_rounds(mu, lr, kappa, n, seed):
    """Independent implementation: groups and rewards sampled, advantages whitened by
    hand (eq. 4, eps = 1e-5), gradient by the chain rule dS/dz = J(pi)^T dS/dpi."""
    rng = np.random.default_rng(seed)
    outs = rng.choice(OLD.size, size=(n, G), p=OLD)
    r = (rng.random((n, G)) < Q).astype(float)
    adv = (r - r.mean(-1, keepdims=True)) / np.sqrt(r.var(-1, keepdims=True) + 1e-5)
    onehot = np.eye(OLD.size)[outs]                              # (n, G, K)
    z = np.tile(np.log(OLD), (n, 1))
    for _ in range(mu):
        pi = special.softmax(z, axis=-1)
        x = np.einsum("ngk,nk->ng", onehot, pi) / OLD[outs]
        live = np.ones_like(x, bool) if kappa is None else ~(
            ((adv > 0) & (x > 1 + kappa)) | ((adv < 0) & (x < 1 - kappa)))
        d_pi = np.einsum("ng,ngk->nk", np.where(live, adv, 0.0), onehot) / OLD / G
        jac = pi[:, :, None] * (np.eye(OLD.size) - pi[:, None, :])  # d pi_j / d z_k
        z = z + lr * np.einsum("njk,nj->nk", jac, d_pi)
    return special.softmax(z, axis=-1)


@pytest.mark.parametrize("mu, lr, kappa", [(1, 2.0, KAPPA), (2, 1.0, KAPPA), (4, 2.0, None),
                                           (10, 1.0, KAPPA), (10, 5.0, KAPPA)])
def test_exact_drift_against_monte_carlo(mu, lr, kappa):
    n = 40_000
    pi = _sampled_rounds(mu, lr, kappa, n, seed=2026)
    mean = pi.mean(0)
    se = pi.std(0, ddof=1) / np.sqrt(n)
    exact = _drift(mu, lr, kappa).expected_policy
    # committed criterion: within 3 standard errors (the largest |z| seen is reported)
    assert np.all(np.abs(mean - exact) <= 3 * se), (mean - exact) / se
    # and the sample resolves the drift: the high-prior output's is > 5 SE from zero
    assert abs(mean[0] - OLD[0]) > 5 * se[0]


@pytest.mark.parametrize("kappa", [KAPPA, None])
@pytest.mark.parametrize("mu", [1, 4])
def test_sampled_drift_agrees_with_enumeration(mu, kappa):
    n = 20_000
    mc = clip_bias.sampled_drift(OLD, n_steps=mu, lr=2.0, clip_eps=kappa, group_size=G, p=Q,
                                 n_samples=n, seed=7)
    exact = _drift(mu, 2.0, kappa)
    assert mc.n_samples == n and mc.policy_drift.shape == (OLD.size,)
    assert np.all(np.abs(mc.policy_drift - exact.policy_drift) <= 4 * mc.policy_drift_se)
    assert np.all(np.abs(mc.logit_drift - exact.logit_drift) <= 4 * mc.logit_drift_se)
    np.testing.assert_allclose(mc.logit_drift.sum(), 0.0, atol=1e-12)
    # the sample resolves the policy drift of the high-prior output (> 4 SE from zero)
    assert abs(mc.policy_drift[0]) > 4 * mc.policy_drift_se[0]
    if kappa is None:
        assert mc.clipped_fraction == 0.0
    elif mu > 1:
        assert abs(mc.clipped_fraction - exact.clipped_fraction) < 0.02
    # deterministic given the seed
    again = clip_bias.sampled_drift(OLD, n_steps=mu, lr=2.0, clip_eps=kappa, group_size=G,
                                    p=Q, n_samples=n, seed=7)
    np.testing.assert_array_equal(again.policy_drift, mc.policy_drift)


@pytest.mark.parametrize("kwargs, name", [
    ({"n_samples": 1}, "n_samples"), ({"n_samples": 10**15}, "n_samples"),
    ({"n_samples": 2.5}, "n_samples"), ({"seed": -1}, "seed"), ({"seed": None}, "seed"),
    ({"lr": -1.0}, "lr"), ({"p": 1.5}, "p"), ({"group_size": 1}, "group_size"),
    ({"group_size": 10**15}, "group_size"), ({"clip_eps": -0.1}, "clip_eps")])
def test_sampled_drift_bad_input(kwargs, name):
    args = {"n_steps": 2, "lr": 1.0, "n_samples": 10} | kwargs
    with pytest.raises(ValueError, match=name):
        clip_bias.sampled_drift(OLD, **args)


# ----------------------------------------------------- committed expectations
def test_clip_reaches_the_ratios_at_the_chosen_learning_rates():
    for mu in MUS:
        for lr in LRS:
            assert 0.04 < _drift(mu, lr).clipped_fraction < 0.2
        assert _drift(mu, lr, None).clipped_fraction == 0.0


@pytest.mark.parametrize("kappa", [KAPPA, None])
def test_mu_one_expected_logit_update_is_zero(kappa):
    # first order, exactly: given the outputs each advantage has mean zero
    for lr in (0.1, 1.0, 5.0):
        d = _drift(1, lr, kappa)
        np.testing.assert_allclose(d.logit_drift, 0.0, rtol=0, atol=1e-12)


@pytest.mark.xfail(strict=True, reason=(
    "committed expectation (beyond_expectations.md section 6) that the mu = 1 probability "
    "drift is zero to 1e-12 is false: the logit update has mean zero, but softmax is "
    "curved, so E[pi_new] - pi_old = O(lr^2) (-2.0e-3 for pi_old = 0.9 at lr = 1); see "
    "test_mu_one_probability_drift_is_second_order_and_clip_free"))
@pytest.mark.parametrize("kappa", [KAPPA, None])
def test_committed_mu_one_probability_drift_is_zero(kappa):
    np.testing.assert_allclose(_drift(1, 1.0, kappa).policy_drift, 0.0, rtol=0, atol=1e-12)


def test_mu_one_probability_drift_is_second_order_and_clip_free():
    lrs = np.geomspace(1e-3, 1e-1, 5)
    clip = np.array([_drift(1, lr).policy_drift for lr in lrs])
    free = np.array([_drift(1, lr, None).policy_drift for lr in lrs])
    np.testing.assert_array_equal(clip, free)  # at the one step every ratio is 1
    slope = np.polyfit(np.log(lrs), np.log(np.abs(clip[:, 0])), 1)[0]
    assert abs(slope - 2.0) < 0.01
    assert np.all(clip[:, 0] < 0)  # the leader loses mass to the curvature


@pytest.mark.xfail(strict=True, reason=(
    "committed expectation (beyond_expectations.md section 6) that the high-prior output's "
    "probability drift is positive with clipping is false: it is negative at every lr in "
    "0.5-5 (and 0.01-50, kappa 0.1-0.3), e.g. -9.9e-3 at mu = 10, lr = 1; clipping only "
    "raises it relative to no clipping (see test_clipping_raises_the_high_prior_output)"))
@pytest.mark.parametrize("mu", MUS)
def test_committed_clipped_drift_of_high_prior_output_is_positive(mu):
    assert all(_drift(mu, lr).policy_drift[0] > 0 for lr in LRS)


@pytest.mark.parametrize("mu", MUS)
def test_clipping_raises_the_high_prior_output(mu):
    for lr in LRS:
        clip, free = _drift(mu, lr), _drift(mu, lr, None)
        assert clip.policy_drift[0] < 0                      # still a loss ...
        assert clip.policy_drift[0] > free.policy_drift[0]   # ... smaller than unclipped
        assert clip.logit_drift[0] > free.logit_drift[0]


@pytest.mark.parametrize("mu", MUS)
def test_unclipped_drift_is_second_order_in_lr(mu):
    # lr in [1e-3, 1e-2]: no ratio reaches the clip, so clipped = unclipped there
    lrs = np.geomspace(1e-3, 1e-2, 6)
    free = np.array([_drift(mu, lr, None).policy_drift[0] for lr in lrs])
    clip = np.array([_drift(mu, lr).policy_drift[0] for lr in lrs])
    np.testing.assert_array_equal(clip, free)
    slope = np.polyfit(np.log(lrs), np.log(np.abs(free)), 1)[0]
    # the O(lr^3) term bends the log-log line by O(lr mu) ~ 1e-3 (seen: 2.00001-2.0008)
    assert abs(slope - 2.0) < 0.01


@pytest.mark.xfail(strict=True, reason=(
    "committed expectation (beyond_expectations.md section 6) that the unclipped drift is "
    "smaller in magnitude than the clipped one is false: it is larger wherever the clip "
    "acts (e.g. -0.123 against -9.9e-3 at mu = 10, lr = 1), and equal where it does not; "
    "see test_clipping_raises_the_high_prior_output"))
@pytest.mark.parametrize("mu", MUS)
def test_committed_unclipped_drift_smaller_than_clipped(mu):
    assert all(abs(_drift(mu, lr, None).policy_drift[0]) < abs(_drift(mu, lr).policy_drift[0])
               for lr in LRS)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs, name", [
    ({"prev_policy": [0.5, 0.6, -0.1]}, "prev_policy"),
    ({"prev_policy": [1.0, 0.0]}, "prev_policy"),
    ({"prev_policy": [1.0]}, "prev_policy"),
    ({"prev_policy": [[0.5, 0.5]]}, "prev_policy"),
    ({"n_steps": -1}, "n_steps"),
    ({"n_steps": 1.5}, "n_steps"),
    ({"n_steps": 10**15}, "n_steps"),
    ({"lr": -0.1}, "lr"),
    ({"lr": np.inf}, "lr"),
    ({"clip_eps": -0.1}, "clip_eps"),
    ({"clip_eps": [0.1, 0.2]}, "clip_eps"),
    ({"group_size": 1}, "group_size"),
    ({"group_size": 10**15}, "group_size"),
    ({"p": 1.2}, "p"),
    ({"p": [0.2, 0.3]}, "p"),
    ({"eps": -1.0}, "eps"),
])
def test_bad_input_names_the_parameter(kwargs, name):
    args = {"prev_policy": OLD, "n_steps": 2, "lr": 1.0, "clip_eps": KAPPA, "group_size": 2,
            "p": Q} | kwargs
    old = args.pop("prev_policy")
    with pytest.raises(ValueError, match=name):
        clip_bias.expected_drift(old, **args)


def test_bad_group_inputs():
    with pytest.raises(ValueError, match="outputs"):
        clip_bias.group_surrogate(np.log(OLD), OLD, [[0, 3]], [[1.0, -1.0]])
    with pytest.raises(ValueError, match="outputs"):
        clip_bias.group_surrogate(np.log(OLD), OLD, [[0.0, 1.0]], [[1.0, -1.0]])
    with pytest.raises(ValueError, match="logits"):
        clip_bias.group_surrogate(np.zeros(2), OLD, [[0, 1]], [[1.0, -1.0]])
    with pytest.raises(ValueError, match="advantages"):
        clip_bias.group_surrogate(np.log(OLD), OLD, [[0, 1]], [[np.nan, 1.0]])
    with pytest.raises(ValueError, match="n_steps"):
        clip_bias.group_round_logits(OLD, [[0, 1]], [[1.0, -1.0]], n_steps=2.0, lr=1.0)


def test_no_clipping_spellings_agree():
    np.testing.assert_array_equal(_drift(4, 1.0, None).expected_policy,
                                  _drift(4, 1.0, np.inf).expected_policy)
