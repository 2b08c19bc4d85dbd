"""``AdditionToy.grpo_trainer``: TRL's GRPOTrainer on the toy, set up for a CPU."""

from __future__ import annotations

import pytest

from grpo_companion.practice import addition_toy


def test_grpo_trainer_builds_and_trains(tmp_path):
    toy = addition_toy.build(tmp_path / "reference", pairs=[(3, 7), (4, 8)], sft_steps=2)
    trainer = toy.grpo_trainer(tmp_path / "run", max_steps=1, learning_rate=1e-3, seed=1,
                               num_generations=2, beta=0.5)
    args = trainer.args
    assert (args.per_device_train_batch_size, args.num_generations) == (4, 2)
    assert args.max_completion_length == toy.answers.shape[1]
    assert (args.beta, args.max_steps, args.seed, args.use_cpu) == (0.5, 1, 1, True)
    assert args.report_to == [] and not args.gradient_checkpointing
    trainer.train()
    assert trainer.state.global_step == 1
    with pytest.raises(ValueError, match="max_steps"):
        toy.grpo_trainer(tmp_path / "bad", max_steps=0)
