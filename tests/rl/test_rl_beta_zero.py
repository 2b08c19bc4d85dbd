"""beta = 0: reference-free GRPO (TRL's default, DAPO's setting).

Without the KL penalty the maximiser of each iteration's objective puts all
the mass on the success set wherever the policy has some: the theory's
recurrence logit p_n = logit p_ref + Omega(p_{n-1}) / beta climbs to 1 for
every p_ref > 0 as beta -> 0, and p_ref = 0 stays 0 (no success is ever
sampled, so no advantage ever points to one).
"""


import numpy as np
import pytest

from grpo_companion.rl import trainer
from grpo_companion.rl.policies import TabularSoftmaxPolicy, TinyCausalTransformer
from grpo_companion.rl.trainer import TrainConfig, train

P_REF = (0.0, 0.05, 0.2, 0.5)


def test_sampled_bandit_without_kl_climbs_to_one_and_zero_stays_zero():
    config = TrainConfig.flat(n_prompts=64, n_outputs=8, n_success=1, p_ref=P_REF, beta=0.0,
                              group_size=16, mu=4, iterations=30, progress=False, seed=0)
    result = train(config)
    pos = result.success_prob
    for value in P_REF:
        cols = result.p_ref == value
        mean = pos[:, cols].mean(axis=1)
        if value == 0:
            assert np.all(pos[:, cols] < 1e-30)  # never sampled, never rewarded
            continue
        assert mean[0] == pytest.approx(value, abs=1e-6)
        assert np.all(np.diff(mean[::5]) > 0), (value, mean[::5])  # rising
        assert pos[-1, cols].min() > 0.95, (value, pos[-1, cols].min())  # towards 1
    # with a KL penalty the same run is held back: the limit is below 1 (Theorem 2)
    held = train(config.replace(beta=2.0))
    live = result.p_ref > 0
    assert held.success_prob[-1, live].mean() < pos[-1, live].mean() - 0.05


def _count_calls(monkeypatch, cls):
    """Who calls ``cls.token_logprobs`` during each sampled step: 'policy', 'ref' or 'other'."""
    steps: list[list[str]] = []
    calls: list[object] = []
    original, step = cls.token_logprobs, trainer.grpo_iteration

    def spy(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    def spy_step(run, old):
        calls.clear()
        out = step(run, old)
        steps.append(["policy" if c is run.policy else "ref" if c is run.ref_policy else "other"
                      for c in calls])
        return out

    monkeypatch.setattr(cls, "token_logprobs", spy)
    monkeypatch.setattr(trainer, "grpo_iteration", spy_step)
    return steps


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_beta_zero_runs_no_reference_forward_pass(monkeypatch, beta):
    steps = _count_calls(monkeypatch, TinyCausalTransformer)
    train(TrainConfig.flat(task="sequence", max_operand=9, n_eval_prompts=8, eval_samples=2,
                           sft_steps=2, sft_batch_size=8, iterations=2, mu=2, group_size=4,
                           prompts_per_iteration=4, d_model=8, n_heads=2, beta=beta,
                           progress=False))
    assert len(steps) == 2
    for calls in steps:  # one pass per loss, a reference pass only with the KL penalty
        assert calls.count("policy") == 2 and "other" not in calls
        assert calls.count("ref") == (1 if beta > 0 else 0)


def test_beta_zero_with_exact_kl_skips_the_tabular_reference(monkeypatch):
    seen: list[object] = []
    original = TabularSoftmaxPolicy.log_probs

    def spy(self, *args, **kwargs):
        seen.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TabularSoftmaxPolicy, "log_probs", spy)
    refs: list[object] = []
    step = trainer.grpo_iteration

    def record(run, old):
        seen.clear()
        out = step(run, old)
        refs.append(sum(s is run.ref_policy for s in seen))
        return out

    monkeypatch.setattr(trainer, "grpo_iteration", record)
    result = train(TrainConfig.flat(n_prompts=8, n_outputs=4, iterations=2, kl="exact", beta=0.0,
                                    progress=False))
    assert refs == [0, 0]
    assert np.all(np.isfinite(result.metrics["kl_ref"]))  # still reported by the evaluation


def test_exact_mode_refuses_beta_zero_naming_both_fields():
    with pytest.raises(ValueError, match="exact=True cannot be combined with beta=0") as info:
        TrainConfig.flat(exact=True, beta=0.0)
    assert "\n" not in str(info.value)


def test_lbfgs_without_kl_or_clipping_is_refused_and_k1_is_then_harmless():
    with pytest.raises(ValueError, match="beta=0 and clip_eps_low=None"):
        TrainConfig.flat(optimizer="lbfgs", beta=0.0, clip_eps_low=None)
    TrainConfig.flat(optimizer="lbfgs", beta=0.0, kl="k1")  # no penalty: the estimator is unused
    with pytest.raises(ValueError, match="k1"):
        TrainConfig.flat(optimizer="lbfgs", beta=0.1, kl="k1")


def test_beta_zero_on_the_command_line_and_in_help():
    from grpo_companion.rl import cli

    config = cli.parse_command(["--out", "x", "--beta", "0"]).config
    assert config.grpo.beta == 0.0
    with pytest.raises(ValueError, match=r"--beta must be 0 or a number in \[1e-06, 1e\+06\]"):
        cli.parse_command(["--out", "x", "--beta", "1e-9"])
