"""Staged GRPO (App. C.2): the reference is reset to the last iterate every K steps."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_companion import theory
from grpo_companion.theory.staged import staged_iterate

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
    run = train(TrainConfig(exact=True, n_prompts=2, n_outputs=6, n_success=2, p_ref=p_refs,
                            iterations=6, beta=2.0, ref_reset_every=3, eps=1e-5, seed=0,
                            progress=False))
    staged = staged_iterate(run.p_ref, 2.0, 6, 3, eps=1e-5)
    plain = theory.iterate(run.p_ref, run.p_ref, 2.0, 6, eps=1e-5)
    assert np.max(np.abs(run.success_prob - staged.p)) < 1e-9
    assert np.max(np.abs(run.success_prob - plain)) > 1e-2
