"""practice.log_answers and trl_logs against TRL's own loss and advantages (TRL 1.16)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from grpo_companion import theory
from grpo_companion.practice import log_answers, trl_logs
from grpo_companion.practice.diagnose import read_config
from grpo_companion.practice.trl_bandit import TRLBandit
from grpo_companion.practice.trl_bridge import predict_limits, theory_reading
from grpo_companion.theory.finite_group import group_table

from . import _tiny

TIGHT = 1e-12


@pytest.fixture(scope="module")
def bandit(tmp_path_factory):
    """``bandit(**settings)``: a TRLBandit on the tiny model (cached)."""
    folder = tmp_path_factory.mktemp("tiny")
    path = _tiny.save_model(folder)
    tok = _tiny.tokenizer()
    prompt = torch.tensor([tok("say A")["input_ids"]])
    cache = {}

    def make(**settings):
        key = tuple(sorted(settings.items()))
        if key not in cache:
            cache[key] = TRLBandit(path, tok, prompt, folder / f"out{len(cache)}", **settings)
        return cache[key]

    return make


def _cal(name, g):
    return dataclasses.replace(theory.CALIBRATIONS[name], group_size=g)


@pytest.mark.parametrize("scale, name", [("group", "trl"), ("none", "mean_only")])
def test_trls_advantages_are_the_group_tables(bandit, scale, name):
    plus, minus = bandit(scale_rewards=scale, num_generations=6).table()
    mine = group_table(_cal(name, 6), 6)
    np.testing.assert_allclose(plus.numpy(), mine[0], rtol=0, atol=TIGHT)
    np.testing.assert_allclose(minus.numpy(), mine[1], rtol=0, atol=TIGHT)


@pytest.mark.parametrize("scale, name", [("group", "trl"), ("none", "mean_only")])
def test_the_beta_zero_drift_is_trls_expected_gradient(bandit, scale, name):
    b = bandit(scale_rewards=scale)
    cal = _cal(name, b.group_size)
    for p in (0.02, 0.3, 0.8, 0.999):
        assert b.drift(p, 0.5) == pytest.approx(float(log_answers.beta0_drift(p, cal)),
                                                rel=1e-11)
    assert log_answers.beta0_drift([0.0, 1.0], cal).tolist() == [0.0, 0.0]
    q = 1e-7
    assert float(log_answers.beta0_drift(1 - q, cal)) / q == pytest.approx(
        log_answers.beta0_tail(cal), rel=1e-5)


def test_the_fixed_points_with_and_without_kl_on_uniform_groups_are_trls(bandit):
    b = bandit(beta=1.0)
    cal = _cal("trl", b.group_size)
    table = b.table()
    p_ref = np.array([0.15, 0.43, 0.81])
    masked = log_answers.kl_on_mixed_groups_fixed_point(p_ref, 1.0, cal)
    paper, _ = predict_limits(p_ref, theory_reading(read_config({"beta": 1.0})))
    for i, p in enumerate(p_ref):
        assert b.fixed_point(p, table) == pytest.approx(paper[i], abs=1e-9)
        assert b.fixed_point(p, table, uniform_kl=False) == pytest.approx(masked[i], abs=1e-9)
    assert np.all(masked > paper)  # a weaker anchor: higher fixed points
    with pytest.raises(ValueError, match="beta"):
        log_answers.kl_on_mixed_groups_fixed_point(p_ref, 0.0, cal)


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_the_softmax_expected_gradient_is_trls_by_enumeration(bandit, beta):
    g = 4
    b = bandit(beta=beta, num_generations=g)
    correct = np.array([True, True, False])
    theta_ref = np.log([0.3, 0.2, 0.5])
    theta = theta_ref + np.array([0.4, -0.3, 0.2])
    mine = log_answers.softmax_expected_gradient(theta, theta_ref, correct, _cal("trl", g), beta)
    np.testing.assert_allclose(b.softmax_gradient(theta, theta_ref, correct), mine,
                               rtol=0, atol=1e-13)


def test_the_loss_at_ratio_one_is_trls(bandit):
    b = bandit(beta=0.3)
    gen = torch.Generator().manual_seed(0)
    g, width = b.group_size, 5
    lengths = torch.randint(1, width + 1, (g,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    logp = -2 * torch.rand(g, width, generator=gen, dtype=torch.float64)
    ref = logp + 0.5 * torch.randn(g, width, generator=gen, dtype=torch.float64)
    rewards = torch.tensor([1, 0, 1, 1, 0, 0, 0, 1][:g], dtype=torch.float64)
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    value = b.loss(logp, b.inputs(adv, logp, ref, mask)).item()
    k3 = torch.exp(ref - logp) - (ref - logp) - 1  # TRL's per-token KL, independently
    kl = float((k3 * mask).sum() / mask.sum())
    assert value == pytest.approx(trl_logs.loss_at_ratio_one(adv, lengths, 0.3, kl),
                                  rel=0, abs=TIGHT)
    with pytest.raises(ValueError, match="one shape"):
        trl_logs.loss_at_ratio_one([1.0, -1.0], [1.0], 0.0, 0.0)


def test_the_zero_variance_check_has_power():
    rng = np.random.default_rng(1)
    pos = np.tile([0.9, 0.5, 0.2, 0.05], (400, 1))
    k = rng.binomial(8, pos)
    observed = ((k == 0) | (k == 8)).mean(1)
    right = trl_logs.zero_variance_check(observed, pos, 8)
    wrong = trl_logs.zero_variance_check(observed, np.full_like(pos, 0.4), 8)
    assert abs(right["pooled_z"]) < 4 and right["share_within_3se"] > 0.95
    assert abs(wrong["pooled_z"]) > 4  # the prompts' mean PoS for every prompt fails
    with pytest.raises(ValueError, match="one share per row"):
        trl_logs.zero_variance_check(observed[:3], pos, 8)


def test_entropy_among_verified_outputs():
    assert log_answers.correct_share_entropy(np.log([0.25, 0.25, 0.5]),
                                             [True, True, False]) == pytest.approx(math.log(2))


@pytest.mark.slow
def test_runs_in_spawned_processes_equal_runs_in_this_one(tmp_path):
    """logged_runs(workers=2) gives the numbers of the same runs made one after another."""
    from grpo_companion.practice import addition_toy

    toy = addition_toy.build(tmp_path / "ref", sft_steps=20)
    settings = {"a": {}, "b": {"beta": 0.5}}
    alone = trl_logs.logged_runs(toy, tmp_path / "one", settings, max_steps=4)
    spread = trl_logs.logged_runs(toy, tmp_path / "two", settings, max_steps=4, workers=2)
    for name in settings:
        np.testing.assert_array_equal(alone[name].pos, spread[name].pos)
        assert [r["loss"] for r in alone[name].history] == [r["loss"] for r in
                                                            spread[name].history]
        assert len(alone[name].inputs) == 4
    with pytest.raises(ValueError, match="workers"):
        trl_logs.logged_runs(toy, tmp_path, settings, workers=0, max_steps=1)
