"""A per-prompt KL weight (``grpo_beta_multipliers``): the loss and the trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_companion.rl import TrainConfig, losses
from grpo_companion.rl.trainer import prepare_run


def _batch(seed: int = 0, batch: int = 6, tokens: int = 4):
    gen = torch.Generator().manual_seed(seed)
    logp = -2.0 * torch.rand(batch, tokens, generator=gen, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    ref = logp + 0.5 * torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    adv = torch.randn(batch, generator=gen, dtype=torch.float64)
    return logp, old, ref, adv


@pytest.mark.parametrize("kl", ["k1", "k2", "k3", "k3_ratio"])
@pytest.mark.parametrize("alpha", [1.0, 0.4])
def test_a_beta_per_sequence_is_each_row_with_its_own_beta(kl, alpha):
    logp, old, ref, adv = _batch()
    betas = torch.tensor([0.0, 0.03, 0.1, 0.3, 1.0, 3.0], dtype=torch.float64)
    got, _ = losses.per_token_loss(logp, old, ref, adv, beta=betas, kl=kl, alpha=alpha)
    for i, b in enumerate(betas.tolist()):
        row, _ = losses.per_token_loss(logp, old, ref, adv, beta=b, kl=kl, alpha=alpha)
        torch.testing.assert_close(got[i], row[i], rtol=0, atol=0)


def test_a_bad_beta_tensor_is_refused():
    logp, old, ref, adv = _batch()
    for bad in (torch.ones(5), torch.tensor([0.1, -1, 0.1, 0.1, 0.1, 0.1]),
                torch.full((6,), float("nan"))):
        with pytest.raises(ValueError, match="beta must be a number >= 0 or a tensor"):
            losses.per_token_loss(logp, old, ref, adv, beta=bad)


SMALL = dict(task="sequence", device="cpu", progress=False, d_model=16, n_layers=1, n_heads=2,
             sft_steps=5, max_operand=9, n_eval_prompts=8, eval_samples=4, group_size=4,
             iterations=2, grpo_prompts=6, prompts_per_iteration=6, beta=0.1, kl="k3")


def test_the_trainer_gives_each_pool_prompt_its_multiplied_beta():
    config = TrainConfig.flat(**SMALL, grpo_beta_multipliers=(1.0, 10.0, 0.5))
    run = prepare_run(config).run_state
    pool = run.task.grpo_pool(config.sequence.grpo_prompts, config.run.seed)
    np.testing.assert_allclose(run.prompt_beta[torch.as_tensor(pool)].numpy(),
                               0.1 * np.array([1.0, 10.0, 0.5, 1.0, 10.0, 0.5]))
    assert prepare_run(TrainConfig.flat(**SMALL)).run_state.prompt_beta is None


def test_multipliers_of_one_change_nothing():
    plain = prepare_run(TrainConfig.flat(**SMALL)).run(lambda n: None)
    ones = prepare_run(TrainConfig.flat(**SMALL, grpo_beta_multipliers=(1.0,))).run(lambda n: None)
    assert [r["loss"] for r in plain.iteration_rows] == [r["loss"] for r in ones.iteration_rows]
    other = prepare_run(TrainConfig.flat(**SMALL, grpo_beta_multipliers=(30.0,))).run(
        lambda n: None)
    assert [r["loss"] for r in plain.iteration_rows] != [r["loss"] for r in other.iteration_rows]


@pytest.mark.parametrize(("changes", "words"), [
    (dict(grpo_prompts=None), "grpo_beta_multipliers"),
    (dict(beta=0.0), "grpo_beta_multipliers"),
    (dict(grpo_beta_multipliers=(1e-4,)), "grpo_beta_multipliers"),
    (dict(beta=1e4, grpo_beta_multipliers=(1e3,)), "beta \\* m in"),
])
def test_bad_multipliers_are_refused(changes, words):
    settings = {**SMALL, "grpo_beta_multipliers": (1.0, 2.0), **changes}
    with pytest.raises(ValueError, match=words):
        TrainConfig.flat(**settings)


def test_the_cli_offers_the_multipliers(capsys):
    from grpo_companion.rl.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--grpo-beta-multipliers" in capsys.readouterr().out
