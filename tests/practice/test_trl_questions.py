"""``practice.trl_questions`` (the theory's answers for a GRPOConfig) against TRL's own code.

TRL's side is a real ``GRPOTrainer`` on the tiny offline model (``_tiny.py``), driven on
the two-outcome bandit by :class:`~grpo_companion.practice.trl_bandit.TRLBandit`: its
advantages come from ``_generate_and_score_completions`` and its exact expected loss
from ``_compute_loss`` summed over the success counts of a group. Nothing of the theory
is used to make TRL's numbers.
"""

from __future__ import annotations

import functools
import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grpo_companion import theory
from grpo_companion.practice import trl_questions as tq
from grpo_companion.practice.trl_bandit import TRLBandit
from grpo_companion.practice.trl_bridge import theory_reading

from . import _tiny

TIGHT = 1e-12
G = 4
P_REF = 0.3


@pytest.fixture(scope="module")
def bandit(tmp_path_factory):
    """``bandit(**settings)``: a TRLBandit with those GRPOConfig settings, groups of 4."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = _tiny.save_model(folder)
    tokenizer = _tiny.tokenizer()
    ids = tokenizer("say A")["input_ids"]
    out = tmp_path_factory.mktemp("bandit-out")

    @functools.cache
    def build(items):
        return TRLBandit(model, tokenizer, ids, out, **{"num_generations": G, **dict(items)})

    return lambda **settings: build(tuple(sorted(settings.items())))


CONFIGS = {"k3_ratio": dict(beta=1.0), "k3": dict(beta=1.0, use_bias_correction_kl=False),
           "none": dict(beta=1.0, scale_rewards="none"), "beta0": dict(beta=0.0)}


@pytest.mark.parametrize("scale", ["group", "none"])
def test_advantage_table_is_trls(bandit, scale):
    b = bandit(beta=0.5, scale_rewards=scale)
    plus, minus = tq.advantage_table(b.trainer.args)
    theirs = b.table()
    assert plus.shape == (G + 1,)
    np.testing.assert_allclose(theirs[0].numpy(), plus, rtol=0, atol=TIGHT)
    np.testing.assert_allclose(theirs[1].numpy(), minus, rtol=0, atol=TIGHT)
    assert plus[1] > 0 and minus[G - 1] > 0  # not two zeros
    with pytest.raises(ValueError, match="batch"):
        tq.advantage_table(bandit(beta=0.5, scale_rewards="batch",
                                  per_device_train_batch_size=2 * G).trainer.args)


def test_batch_scaled_advantages_are_trls(bandit):
    b = bandit(beta=1.0, scale_rewards="batch", per_device_train_batch_size=3 * G)
    rng = np.random.default_rng(1)
    for _ in range(4):
        rewards = (rng.random((3, G)) < rng.random((3, 1))).astype(int)
        theirs = b.advantages(rewards.ravel()).numpy().reshape(3, G)
        np.testing.assert_allclose(tq.batch_scaled_advantages(rewards), theirs, rtol=0,
                                   atol=TIGHT)
    with pytest.raises(ValueError, match="rewards"):
        tq.batch_scaled_advantages([1, 0, 1])


def test_batch_weights_are_trls_expectation(bandit):
    """Expected advantage of a success / failure of the first group over every batch of
    two groups of 4, each scored by TRL's own advantage code."""
    b = bandit(beta=1.0, scale_rewards="batch", per_device_train_batch_size=2 * G)
    p, q = 0.35, 0.6
    n_total = 2 * G
    succ_sum = fail_sum = succ_prob = fail_prob = 0.0
    for bits in itertools.product((0, 1), repeat=n_total):
        own, rest = bits[:G], bits[G:]
        prob = (p ** sum(own) * (1 - p) ** (G - sum(own))
                * q ** sum(rest) * (1 - q) ** (G - sum(rest)))
        adv = float(b.advantages(list(bits))[0])
        if own[0]:
            succ_sum, succ_prob = succ_sum + prob * adv, succ_prob + prob
        else:
            fail_sum, fail_prob = fail_sum - prob * adv, fail_prob + prob
    w_plus, w_minus = tq.batch_weights(p, q, b.trainer.args)
    assert math.isclose(float(w_plus), succ_sum / succ_prob, rel_tol=1e-12)
    assert math.isclose(float(w_minus), fail_sum / fail_prob, rel_tol=1e-12)
    # broadcasting: a grid of q against the scalar computation
    wp, wm = tq.batch_weights(p, [0.0, q, 1.0], b.trainer.args)
    assert wp.shape == (3,) and wp[1] == w_plus and wm[1] == w_minus


def test_batch_fixed_point_solves_the_batch_map(bandit):
    b = bandit(beta=1.0, scale_rewards="batch", per_device_train_batch_size=2 * G)
    args = b.trainer.args
    for q in (0.0, 0.5, 1.0):
        star = tq.batch_fixed_point(P_REF, q, args)
        w_plus, w_minus = tq.batch_weights(star, q, args)
        assert abs(theory.logit(star) - theory.logit(P_REF) - (w_plus + w_minus)) < 1e-9
        assert star > P_REF
    with pytest.raises(ValueError, match="beta"):
        tq.batch_fixed_point(P_REF, 0.5, bandit(beta=0.0, scale_rewards="batch",
                                                 per_device_train_batch_size=2 * G).trainer.args)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_drift_and_fixed_point_are_trls(bandit, name):
    b = bandit(**CONFIGS[name])
    grid = np.array([0.1, 0.45, 0.8])
    result = tq.compare_drift(b, P_REF, grid)
    assert result.table_gap <= TIGHT
    assert result.drift_gap <= 1e-10, result.drift_gap
    assert np.abs(result.measured).max() > 1e-2
    np.testing.assert_array_equal(result.predicted, tq.expected_drift(grid, P_REF, b.trainer.args))
    if name == "beta0":
        assert result.trl_fp is None and result.theory_fp is None
        assert np.all(result.predicted > 0)
    else:
        assert abs(result.trl_fp - result.theory_fp) <= 1e-9
        assert result.theory_fp == tq.fixed_point(P_REF, b.trainer.args)
    # the two estimators head for different fixed points
    if name == "k3":
        assert abs(tq.fixed_point(P_REF, bandit(**CONFIGS["k3_ratio"]).trainer.args)
                   - result.theory_fp) > 1e-3


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "bnpo", "dapo"])
def test_length_fixed_point_against_trl(bandit, loss_type):
    b = bandit(beta=1.0, loss_type=loss_type, max_completion_length=3)
    args = b.trainer.args
    table = b.table()
    equal = tq.length_fixed_point(P_REF, args, (1, 1))
    assert abs(b.fixed_point(P_REF, table, (1, 1)) - equal) <= 1e-9
    unequal = tq.length_fixed_point(P_REF, args, (3, 2))
    trl_unequal = b.fixed_point(P_REF, table, (3, 2))
    if loss_type in ("grpo", "dr_grpo"):
        assert abs(trl_unequal - unequal) <= 1e-9
    else:
        assert unequal is None
    if loss_type == "grpo":
        assert abs(unequal - equal) > 1e-3  # the lengths matter: the test has power
    with pytest.raises(ValueError, match="lengths"):
        tq.length_fixed_point(P_REF, args, (0, 2))


CLIPS = {"default": {}, "higher": {"epsilon_high": 0.28},
         "off": {"epsilon": 1.0, "epsilon_high": 1e12}}


@pytest.mark.parametrize("clip", list(CLIPS))
def test_round_step_is_trls_solved_round(bandit, clip):
    b = bandit(beta=1.0, **CLIPS[clip])
    table = b.table()
    solved = b.round_pos(P_REF, P_REF, None, table)
    predicted = tq.round_step(P_REF, P_REF, b.trainer.args)
    assert abs(solved - predicted) <= 1e-8, (solved, predicted)
    cal = theory_reading(b.trainer.args).calibration
    unclipped = float(theory.pos_map(P_REF, P_REF, 1.0, calibration=cal))
    if clip == "off":
        assert predicted == unclipped
    else:
        assert predicted < unclipped - 1e-3  # the clip binds: the test tells them apart
    # one step of a round is on policy, so the clip does not act yet
    assert b.round_pos(P_REF, P_REF, 1, table) == bandit(beta=1.0, **CLIPS["off"]).round_pos(
        P_REF, P_REF, 1)


def test_solved_rounds_are_theorem_2(bandit):
    b = bandit(beta=1.0, **CLIPS["off"])
    path = b.rounds(P_REF, 4)
    cal = theory_reading(b.trainer.args).calibration
    np.testing.assert_allclose(path, theory.iterate(P_REF, P_REF, 1.0, 4, calibration=cal),
                               rtol=0, atol=1e-9)
    stepped = b.rounds(P_REF, 3, mu=2)
    assert stepped.shape == (4,) and np.all(np.diff(stepped) > 0)
    with pytest.raises(ValueError, match="mu"):
        b.round_pos(P_REF, P_REF, 0)
    with pytest.raises(ValueError, match="n_rounds"):
        b.rounds(P_REF, -1)


def test_settled_pos_is_the_late_mean():
    rows = [{"step": s, "measured_pos": v} for s, vals in
            [(0, (0.1, 0.2)), (10, (0.5, 0.6)), (20, (0.7, 0.8)), (30, (0.9, 0.6))]
            for v in vals]
    mean, se = tq.settled_pos(SimpleNamespace(rows=rows), 15)
    np.testing.assert_allclose(mean, [0.8, 0.7])
    np.testing.assert_allclose(se, [0.1, 0.1])
    with pytest.raises(ValueError, match="from_step"):
        tq.settled_pos(SimpleNamespace(rows=rows), 25)


def test_bad_inputs_name_the_parameter(bandit):
    args = bandit(**CONFIGS["k3_ratio"]).trainer.args
    for call, name in [(lambda: tq.expected_drift(1.5, P_REF, args), "p"),
                       (lambda: tq.expected_drift(0.5, 0.0, args), "p_ref"),
                       (lambda: tq.fixed_point(math.nan, args), "p_ref"),
                       (lambda: tq.fixed_point(P_REF, None), "args"),
                       (lambda: tq.batch_weights(0.5, -0.1, args), "q"),
                       (lambda: tq.round_step(1.0, P_REF, args), "p_prev"),
                       (lambda: tq.round_step(P_REF, P_REF, bandit(**CONFIGS["k3"]).trainer.args),
                        "use_bias_correction_kl"),
                       (lambda: tq.settled_pos(SimpleNamespace(rows=[]), math.inf), "from_step")]:
        with pytest.raises(ValueError, match=name):
            call()


def test_trl_advantages_refuse_other_dtypes(bandit):
    from grpo_companion.practice.trl_bandit import trl_advantages

    with pytest.raises(ValueError, match="dtype"):
        trl_advantages(bandit(beta=1.0).trainer, [{"prompt": "say A", "target": 1}],
                       torch.float16)


def test_compare_round_holds_trl_against_round_step(bandit):
    b = bandit(beta=1.0, **CLIPS["higher"])
    result = tq.compare_round(b, P_REF, (1, 3))
    assert (result.clip_low, result.clip_high) == (0.2, 0.28)
    assert result.stepped.shape == (2,) and result.mu == (1, 3)
    assert result.stepped[0] == b.round_pos(P_REF, P_REF, 1)
    assert result.solved == b.round_pos(P_REF, P_REF)
    assert result.predicted == tq.round_step(P_REF, P_REF, b.trainer.args)
    assert abs(result.solved - result.predicted) <= 1e-8
    with pytest.raises(ValueError, match="mu_values"):
        tq.compare_round(b, P_REF, ())


def test_compare_batch_against_trl(bandit):
    b = bandit(beta=1.0, scale_rewards="batch", per_device_train_batch_size=2 * G)
    result = tq.compare_batch(b, P_REF, [0.0, 0.5], seed=3, n_batches=2)
    assert result.formula_gap <= TIGHT
    wp, wm = tq.batch_weights(P_REF, [0.0, 0.5], b.trainer.args)
    np.testing.assert_array_equal(result.omega_batch, wp + wm)
    assert result.fp_batch[1] == tq.batch_fixed_point(P_REF, 0.5, b.trainer.args)
    group = bandit(beta=1.0)
    assert result.fp_group == tq.fixed_point(P_REF, group.trainer.args)
    plus, minus = tq.advantage_table(group.trainer.args)
    pmf = [math.comb(G - 1, j) * P_REF ** j * (1 - P_REF) ** (G - 1 - j) for j in range(G)]
    # Omega_G(p) is E[plus | a success] + E[minus | a failure] over the other G - 1 samples
    omega = sum(q * (plus[j + 1] + minus[j]) for j, q in enumerate(pmf))
    assert result.omega_group == pytest.approx(omega, rel=1e-12)
    with pytest.raises(ValueError, match="scale_rewards"):
        tq.compare_batch(group, P_REF, [0.5])


def test_compare_lengths_against_trl(bandit):
    b = bandit(beta=1.0, loss_type="grpo", max_completion_length=3)
    result = tq.compare_lengths(b, P_REF, (3, 2))
    assert result.loss_type == "grpo" and result.lengths == (3, 2)
    assert abs(result.trl_unequal - result.theory_unequal) <= 1e-9
    assert abs(result.trl_equal - result.theory_equal) <= 1e-9
    with pytest.raises(ValueError, match="max_completion_length"):
        tq.compare_lengths(bandit(beta=1.0, loss_type="grpo", max_completion_length=2), P_REF,
                           (3, 2))
