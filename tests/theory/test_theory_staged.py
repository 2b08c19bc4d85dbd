"""Staged GRPO (App. C.2): the reference is reset to the last iterate every K steps."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_companion import theory
from grpo_companion.theory.analyses.staged import staged_iterate

P_REFS = np.array([1e-3, 0.05, 0.2, 0.5, 0.9])


def test_one_long_stage_is_the_plain_recurrence() -> None:
    st_path = staged_iterate(P_REFS, 2.0, 15, 15, eps=1e-5)
    plain = theory.iterate(P_REFS, P_REFS, 2.0, 15, eps=1e-5)
    assert np.max(np.abs(st_path.p - plain)) < 1e-15
    assert np.all(st_path.stage == 0) and np.all(st_path.logit_p_ref == theory.logit(P_REFS))


def test_resetting_every_step_is_mirror_grpo() -> None:
    st_path = staged_iterate(P_REFS, 2.0, 10, 1, eps=1e-5)
    mirror = theory.iterate_logit(theory.logit(P_REFS), theory.logit(P_REFS), 2.0, 10,
                                  alpha=0.0, eps=1e-5)
    assert np.max(np.abs(st_path.logit_p - mirror)) < 1e-12


def test_reference_is_reset_after_each_stage() -> None:
    K = 4
    st_path = staged_iterate(P_REFS, 2.0, 12, K, eps=1e-5)
    for n in range(1, 13):
        start = K * ((n - 1) // K)
        assert np.array_equal(st_path.logit_p_ref[n], st_path.logit_p[start])
        step = theory.pos_map_logit(st_path.logit_p[n - 1], st_path.logit_p_ref[n], 2.0, eps=1e-5)
        assert np.array_equal(st_path.logit_p[n], step)
    assert st_path.stage.tolist() == [0] + [0] * 4 + [1] * 4 + [2] * 4
    # and the staged path is not the plain recurrence (the check can tell them apart)
    plain = theory.iterate(P_REFS, P_REFS, 2.0, 12, eps=1e-5)
    assert np.max(np.abs(st_path.p - plain)) > 0.1


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-6, 1 - 1e-6), st.floats(0.05, 50.0), st.integers(1, 6),
       st.floats(0.0, 1.0))
def test_every_stage_amplifies_its_own_reference(p_ref, beta, K, alpha) -> None:
    path = staged_iterate(p_ref, beta, 4 * K, K, alpha=alpha, eps=1e-5)
    if alpha == 1.0:  # Theorem 3 per stage: h(p) > p_ref for every p
        assert np.all(path.logit_p[1:] > path.logit_p_ref[1:])
    # the stage references never decrease (strictly increase while finite)
    refs = path.logit_p_ref[::K]
    assert np.all(np.diff(refs) >= 0)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="stage_length"):
        staged_iterate(0.2, 1.0, 5, 0)
    with pytest.raises(ValueError, match="n_steps"):
        staged_iterate(0.2, 1.0, -1, 2)
    with pytest.raises(ValueError, match="p_ref"):
        staged_iterate(1.5, 1.0, 5, 2)


def test_the_exact_trainer_with_ref_reset_every_follows_the_staged_recurrence() -> None:
    from grpo_companion.rl.trainer import TrainConfig, train

    p_refs = (0.05, 0.3)
    run = train(TrainConfig.flat(exact=True, n_prompts=2, n_outputs=6, n_success=2, p_ref=p_refs,
                                 iterations=6, beta=2.0, ref_reset_every=3, eps=1e-5, seed=0,
                                 progress=False))
    staged = staged_iterate(run.p_ref, 2.0, 6, 3, eps=1e-5)
    plain = theory.iterate(run.p_ref, run.p_ref, 2.0, 6, eps=1e-5)
    assert np.max(np.abs(run.success_prob - staged.p)) < 1e-9
    assert np.max(np.abs(run.success_prob - plain)) > 1e-2


# ------------------------------------------------ a moving reference (TRL's sync_ref_model)
from grpo_companion.theory.analyses.staged import (  # noqa: E402
    mixed_reference_logit,
    moving_reference_iterate,
)


@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.4])
@pytest.mark.parametrize("k", [1, 3])
def test_mixup_one_is_staged_grpo_bit_for_bit(alpha, k) -> None:
    moving = moving_reference_iterate(P_REFS, 2.0, 9, k, 1.0, alpha=alpha, eps=1e-5)
    staged = staged_iterate(P_REFS, 2.0, 9, k, alpha=alpha, eps=1e-5)
    assert np.array_equal(moving.logit_p, staged.logit_p)
    assert np.array_equal(moving.logit_p_ref, staged.logit_p_ref)
    assert np.array_equal(moving.stage, staged.stage)


def test_mixup_zero_is_the_plain_recurrence() -> None:
    moving = moving_reference_iterate(P_REFS, 2.0, 12, 2, 0.0, eps=1e-5)
    plain = theory.iterate(P_REFS, P_REFS, 2.0, 12, eps=1e-5)
    assert np.max(np.abs(moving.p - plain)) < 1e-15
    assert np.all(moving.logit_p_ref == theory.logit(P_REFS))


def test_the_reference_moves_by_the_mixing_rule_and_the_path_lies_between() -> None:
    k, a = 3, 0.6
    path = moving_reference_iterate(P_REFS, 2.0, 12, k, a, eps=1e-5)
    for n in range(1, 13):
        step = theory.pos_map_logit(path.logit_p[n - 1], path.logit_p_ref[n], 2.0, eps=1e-5)
        assert np.array_equal(path.logit_p[n], step)
        if n % k == 0 and n < 12:
            np.testing.assert_array_equal(
                path.logit_p_ref[n + 1], a * path.logit_p[n] + (1 - a) * path.logit_p_ref[n])
        elif n < 12:
            assert np.array_equal(path.logit_p_ref[n + 1], path.logit_p_ref[n])
    staged = staged_iterate(P_REFS, 2.0, 12, k, eps=1e-5).logit_p[-1]
    plain = theory.iterate_logit(theory.logit(P_REFS), theory.logit(P_REFS), 2.0, 12, eps=1e-5)
    # the moving reference moves less than the reset: the logit between plain and staged
    assert np.all(path.logit_p[-1] > plain[-1] + 1e-3)
    assert np.all(path.logit_p[-1] < staged - 1e-3)


def _softmax_mix(log_pi: np.ndarray, log_ref: np.ndarray, a: float) -> np.ndarray:
    mixed = a * log_pi + (1 - a) * log_ref  # TRL's parameter mix on tabular logits
    return np.exp(mixed - np.logaddexp.reduce(mixed))


def test_mixing_tabular_logits_gives_the_two_dimensional_map() -> None:
    # K = 7 outputs, 3 successes, an uneven profile within each class: the exact policy
    # iteration (Theorem 2's optimum, theory.policy_iterate) with TRL's parameter mix of the
    # reference every k steps has the success logits of moving_reference_iterate
    pi0 = np.array([0.02, 0.05, 0.01, 0.3, 0.12, 0.4, 0.1])
    mask = np.array([1, 1, 1, 0, 0, 0, 0])
    for a, k, alpha in [(0.6, 2, 1.0), (0.25, 1, 1.0), (0.9, 3, 0.5)]:
        ref, pi = pi0.copy(), pi0.copy()
        logits = [theory.logit(pi0[:3].sum())]
        for n in range(1, 10):
            pi = theory.policy_iterate(ref, mask, 1.5, 1, alpha=alpha, pi_0=pi, eps=1e-5)[-1]
            logits.append(np.log(pi[:3].sum()) - np.log(pi[3:].sum()))
            if n % k == 0:
                ref = _softmax_mix(np.log(pi), np.log(ref), a)
        path = moving_reference_iterate(pi0[:3].sum(), 1.5, 9, k, a, alpha=alpha, eps=1e-5)
        np.testing.assert_allclose(path.logit_p, logits, rtol=0, atol=1e-10)


def test_the_mixed_success_logit_needs_equal_within_class_ratios() -> None:
    ref = np.array([0.1, 0.2, 0.3, 0.4])  # successes: the first two
    lr = np.log(0.3 / 0.7)
    # class-proportional pi: the formula holds exactly, and p is not the arithmetic mix
    pi = np.concatenate([ref[:2] * 0.8 / 0.3, ref[2:] * 0.2 / 0.7])
    mixed = _softmax_mix(np.log(pi), np.log(ref), 0.5)
    lm = np.log(mixed[:2].sum() / mixed[2:].sum())
    assert abs(lm - float(mixed_reference_logit(np.log(4.0), lr, 0.5))) < 1e-13
    assert abs(mixed[:2].sum() - (0.5 * 0.8 + 0.5 * 0.3)) > 0.01
    # a pi with PoS 0.8 but another within-class profile: the mixed PoS differs
    other = np.array([0.7, 0.1, 0.1, 0.1])
    mixed_other = _softmax_mix(np.log(other), np.log(ref), 0.5)
    assert abs(np.log(mixed_other[:2].sum() / mixed_other[2:].sum()) - lm) > 0.05


def test_mixed_reference_logit_ends_are_exact() -> None:
    lp = np.array([-np.inf, -2.0, 0.5, np.inf])
    lr = np.array([-np.inf, 1.0, -0.5, 3.0])
    assert np.array_equal(mixed_reference_logit(lp, lr, 1.0), lp)
    assert np.array_equal(mixed_reference_logit(lp, lr, 0.0), lr)
    np.testing.assert_allclose(mixed_reference_logit(lp, lr, 0.25)[1:3], [0.25, -0.25])
    with pytest.raises(ValueError, match="mixup_alpha"):
        mixed_reference_logit(lp, lr, 1.5)
    with pytest.raises(ValueError, match="sync_steps"):
        moving_reference_iterate(0.2, 1.0, 5, 0, 0.5)
    with pytest.raises(ValueError, match="mixup_alpha"):
        moving_reference_iterate(0.2, 1.0, 5, 2, -0.1)
