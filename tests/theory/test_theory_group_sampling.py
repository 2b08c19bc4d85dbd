"""Simulated GRPO groups: practice-style advantages and Monte Carlo finite-group weights."""

import itertools
import math
import statistics

import numpy as np
import pytest
import torch

from grpo_companion import theory
from grpo_companion.theory import group_sampling

TRL = {"eps": 1e-4, "eps_placement": "std", "ddof": 1}
PAPER = {"eps": 1e-5, "eps_placement": "sqrt", "ddof": 0}


def _trl_advantages(rewards: np.ndarray) -> np.ndarray:
    """TRL GRPOTrainer's computation, written with torch: (r - mean) / (std + 1e-4)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True)  # Bessel-corrected, as torch.std defaults
    return ((r - mean) / (std + 1e-4)).numpy()


def _advantage_by_hand(rewards, *, eps, eps_placement, ddof, normalization="mean_std"):
    """One group with the statistics module (independent of numpy vectorisation)."""
    mean = statistics.fmean(rewards)
    if len(set(rewards)) == 1:
        return [0.0] * len(rewards)
    if normalization == "mean_only":
        return [r - mean for r in rewards]
    sd = statistics.stdev(rewards) if ddof == 1 else statistics.pstdev(rewards)
    scale = math.sqrt(sd**2 + eps) if eps_placement == "sqrt" else sd + eps
    return [(r - mean) / scale for r in rewards]


def test_advantages_match_trl_torch_code():
    rng = np.random.default_rng(1)
    rewards = (rng.random((500, 8)) < 0.3).astype(float)
    ours = group_sampling.group_advantages(rewards, **TRL)
    np.testing.assert_allclose(ours, _trl_advantages(rewards), rtol=1e-13, atol=1e-13)
    # all-equal groups get 0 (TRL: 0 / (0 + 1e-4)); every group's advantages sum to 0
    const = rewards.min(axis=1) == rewards.max(axis=1)
    assert const.any() and np.all(ours[const] == 0)
    np.testing.assert_allclose(ours.sum(axis=1), 0.0, atol=1e-12)


@pytest.mark.parametrize("cfg", [TRL, PAPER, {"eps": 0.0, "eps_placement": "sqrt", "ddof": 1}])
@pytest.mark.parametrize("normalization", ["mean_std", "mean_only"])
def test_advantages_match_hand_computation_on_every_group(cfg, normalization):
    g = 5
    groups = np.array(list(itertools.product((0.0, 1.0), repeat=g)))
    ours = group_sampling.group_advantages(groups, normalization=normalization, **cfg)
    expected = [_advantage_by_hand(list(row), normalization=normalization, **cfg)
                for row in groups]
    np.testing.assert_allclose(ours, expected, rtol=1e-13, atol=1e-15)
    assert np.isfinite(ours).all()  # eps = 0 and constant groups: still finite


@pytest.mark.parametrize("g", [2, 3, 4, 6])
@pytest.mark.parametrize("cfg", [TRL, PAPER])
def test_exact_enumeration_of_all_groups_matches_finite_group_weights(g, cfg):
    # E[A_1 | r_1] summed over all 2^G reward vectors, advantages by hand
    p = 0.37
    num_plus = num_minus = 0.0
    for rewards in itertools.product((0.0, 1.0), repeat=g):
        k = sum(rewards)
        prob = p**k * (1 - p) ** (g - k)
        a1 = _advantage_by_hand(list(rewards), **cfg)[0]
        if rewards[0]:
            num_plus += prob * a1
        else:
            num_minus += prob * a1
    w_plus, w_minus = theory.weights(p, group_size=g, **cfg)
    np.testing.assert_allclose([num_plus / p, -num_minus / (1 - p)], [w_plus, w_minus],
                               rtol=1e-12)


@pytest.mark.parametrize(
    "g, cfg, normalization",
    [(2, TRL, "mean_std"), (4, PAPER, "mean_std"), (8, TRL, "mean_std"),
     (16, PAPER, "mean_std"), (6, TRL, "mean_only")],
)
def test_monte_carlo_agrees_with_exact_weights_within_4_se(g, cfg, normalization):
    p = np.array([0.03, 0.3, 0.5, 0.9])
    cal = theory.Calibration(normalization=normalization, group_size=g, **cfg)
    est = group_sampling.estimate_group_weights(p, 40_000, seed=g, calibration=cal)
    w_plus, w_minus = cal.weights(p)
    assert np.all(np.abs(est.w_plus - w_plus) <= 4 * est.se_plus)
    assert np.all(np.abs(est.w_minus - w_minus) <= 4 * est.se_minus)
    assert np.all(np.abs(est.omega - (w_plus + w_minus)) <= 4 * est.se_omega)
    assert np.all(est.se_plus > 0) and np.all(est.se_omega > 0)
    assert np.all(est.n_success + est.n_failure == 40_000 * g)


def test_standard_errors_are_calibrated():
    # 300 independent small runs: the z-scores must have spread close to 1
    p = np.full(300, 0.2)
    est = group_sampling.estimate_group_weights(p, 400, seed=7, group_size=4, **TRL)
    w_plus, w_minus = theory.weights(0.2, group_size=4, **TRL)
    for z in [(est.w_plus - w_plus) / est.se_plus, (est.w_minus - w_minus) / est.se_minus]:
        assert 0.85 < np.std(z) < 1.15
        assert abs(np.mean(z)) < 0.25
    # a naive per-sample standard error would ignore the within-group correlation; ours
    # also agrees with the spread of the 300 estimates
    assert 0.85 < np.std(est.w_plus) / np.mean(est.se_plus) < 1.15


def test_sampling_is_deterministic_and_shaped():
    a = group_sampling.sample_groups([0.2, 0.7], 3, 10, seed=5)
    b = group_sampling.sample_groups([0.2, 0.7], 3, 10, seed=5)
    assert a.shape == (2, 10, 3) and np.array_equal(a, b)
    assert set(np.unique(a)) <= {0.0, 1.0}
    e1 = group_sampling.estimate_group_weights(0.4, 1000, seed=3, group_size=4)
    e2 = group_sampling.estimate_group_weights(0.4, 1000, seed=3, group_size=4,
                                               max_chunk_values=64)
    assert e1.w_plus.shape == ()
    # chunking changes the stream order but not the estimator's validity
    assert abs(float(e1.w_plus) - float(e2.w_plus)) < 6 * float(e1.se_plus)


@pytest.mark.parametrize(
    "call, name",
    [(lambda: group_sampling.group_advantages([1.0]), "rewards"),
     (lambda: group_sampling.group_advantages([[0.0, 1.0]], eps=-1.0), "eps"),
     (lambda: group_sampling.group_advantages([[0.0, 1.0]], ddof=2), "ddof"),
     (lambda: group_sampling.group_advantages([[0.0, 1.0]], eps_placement="in"), "eps_placement"),
     (lambda: group_sampling.sample_groups(1.5, 4, 10), "p"),
     (lambda: group_sampling.sample_groups(0.5, 1, 10), "group_size"),
     (lambda: group_sampling.estimate_group_weights(0.5, 100), "group_size"),
     (lambda: group_sampling.estimate_group_weights(0.0, 100, group_size=4), "p"),
     (lambda: group_sampling.estimate_group_weights(0.5, 1, group_size=4), "n_groups"),
     (lambda: group_sampling.estimate_group_weights(1e-9, 10, group_size=2), "n_groups")],
)
def test_bad_input_raises_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
