"""Exact-mode training against the theory module's PoS recurrence."""

import numpy as np
import pytest

from grpo_companion import theory
from grpo_companion.rl.trainer import TrainConfig, train

BASE = {"exact": True, "n_prompts": 48, "n_outputs": 12, "n_success": 3, "iterations": 6,
        "progress": False, "p_ref_zero_fraction": 0.15, "seed": 2}


@pytest.mark.parametrize("overrides", [
    {"alpha": 1.0, "beta": 1.0},                                    # GRPO, Theorem 2
    {"alpha": 0.0, "beta": 2.0},                                    # Mirror GRPO, Theorem 4
    {"alpha": 0.4, "beta": 1.5},                                    # two-KL, Theorem 9
    {"alpha": 1.0, "beta": 0.5, "normalization": "mean_only"},      # Dr. GRPO, Section 5
    {"alpha": 0.0, "beta": 1.0, "normalization": "mean_only"},      # Mirror Dr. GRPO
    {"alpha": 1.0, "beta": 1.0, "eps": 1e-4, "eps_placement": "std"},
    {"alpha": 0.5, "beta": 1.0, "exact_group_size": 8, "ddof": 1},  # finite-group weights
])
def test_exact_training_reproduces_theory(overrides):
    config = TrainConfig.flat(**{**BASE, **overrides})
    result = train(config)
    calibration = theory.Calibration(
        normalization=config.grpo.normalization, eps=config.grpo.eps,
        eps_placement=config.grpo.eps_placement, group_size=config.grpo.exact_group_size,
        ddof=config.grpo.ddof)
    expected = theory.iterate(result.p_ref, result.p_ref, config.grpo.beta, config.run.iterations,
                              alpha=config.grpo.alpha, calibration=calibration)
    assert result.success_prob.shape == expected.shape
    np.testing.assert_allclose(result.success_prob, expected, rtol=0, atol=1e-6)
    # p_ref = 0 is absorbing (Theorem 5 (c)); and the trajectory is not trivial.
    zero = result.p_ref == 0
    assert zero.any() and np.all(result.success_prob[:, zero] == 0)
    assert np.abs(result.success_prob[-1] - result.p_ref).max() > 0.1


def test_exact_training_with_reference_resets_chains_the_recurrence():
    config = TrainConfig.flat(**{**BASE, "alpha": 1.0, "beta": 2.0, "ref_reset_every": 3})
    result = train(config)
    first = theory.iterate(result.p_ref, result.p_ref, 2.0, 3, eps=config.grpo.eps)
    second = theory.iterate(first[-1], first[-1], 2.0, 3, eps=config.grpo.eps)
    np.testing.assert_allclose(result.success_prob, np.vstack([first, second[1:]]), atol=1e-6)


def test_exact_metrics_are_exact_kl_and_entropy():
    config = TrainConfig.flat(**{**BASE, "alpha": 0.0, "beta": 1.0, "iterations": 2})
    result = train(config)
    assert np.all(result.metrics["kl_ref"][0] == 0) and np.all(result.metrics["kl_prev"][0] == 0)
    # Mirror step from pi_ref: KL to the previous policy equals KL to the reference at n = 1.
    np.testing.assert_allclose(result.metrics["kl_prev"][1], result.metrics["kl_ref"][1])
    moved = result.p_ref > 0  # p_ref = 0: w- = 0, nothing to push, the policy stays put
    assert np.all(result.metrics["kl_ref"][2, moved] > 0)
    np.testing.assert_allclose(result.metrics["kl_ref"][2, ~moved], 0.0, atol=1e-12)
    assert np.all(np.isnan(result.metrics["clip_fraction"]))
    assert np.all(result.metrics["entropy"] >= 0)
