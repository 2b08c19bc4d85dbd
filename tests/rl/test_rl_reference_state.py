"""``train(..., reference_state=...)``: reuse one pre-trained pi_ref across runs."""

import numpy as np
import pytest
import torch

from grpo_companion.rl.trainer import TrainConfig, train

SEQUENCE = {"task": "sequence", "max_operand": 19, "n_eval_prompts": 16, "eval_samples": 4,
            "sft_steps": 10, "sft_batch_size": 32, "iterations": 2, "mu": 2,
            "prompts_per_iteration": 8, "group_size": 4, "d_model": 16, "n_heads": 2,
            "progress": False}


def test_reused_reference_gives_the_same_run_as_pretraining():
    config = TrainConfig.flat(**SEQUENCE)
    full = train(config)
    assert full.reference_state is not None and full.sft_losses
    reused = train(config, reference_state=full.reference_state)
    assert reused.sft_losses == []
    for name, values in full.metrics.items():
        np.testing.assert_array_equal(reused.metrics[name], values)
    # The state is copied in, not aliased: training did not change the caller's tensors.
    again = train(config, reference_state=full.reference_state)
    np.testing.assert_array_equal(again.success_prob, full.success_prob)


def test_reference_is_shared_by_variants_of_the_objective():
    base = train(TrainConfig.flat(**SEQUENCE))
    mirror = train(TrainConfig.flat(**{**SEQUENCE, "alpha": 0.0, "sft_steps": 0}),
                   reference_state=base.reference_state)
    np.testing.assert_array_equal(mirror.p_ref, base.p_ref)  # same pi_ref, same eval draws
    np.testing.assert_array_equal(mirror.metrics["entropy"][0], base.metrics["entropy"][0])
    for name, tensor in base.reference_state.items():  # pi_ref handed on unchanged
        assert torch.equal(mirror.reference_state[name], tensor)


def test_reference_state_is_validated(tmp_path):
    state = train(TrainConfig.flat(**SEQUENCE)).reference_state
    with pytest.raises(ValueError, match="reference_state"):
        train(TrainConfig.flat(**{**SEQUENCE, "d_model": 8}), reference_state=state)
    with pytest.raises(ValueError, match="reference_state"):
        train(TrainConfig.flat(n_prompts=4, n_outputs=3, iterations=1, progress=False),
              reference_state=state)
    with pytest.raises(ValueError, match="reference_state"):
        train(TrainConfig.flat(**SEQUENCE), out_dir=tmp_path, resume=True, reference_state=state)
    assert train(TrainConfig.flat(n_prompts=4, n_outputs=3, iterations=1,
                                  progress=False)).reference_state is None
