"""A moving reference (TRL's sync_ref_model): ``ref_reset_every`` with ``ref_mixup_alpha``.

Exact-mode training follows :func:`grpo_companion.theory.analyses.staged.moving_reference_iterate`;
``ref_mixup_alpha = 1`` is the plain reset, bit for bit; the mix is TRL's own callback's.
"""

import hashlib
import json

import numpy as np
import pytest
import torch

from grpo_companion import theory
from grpo_companion.rl import fingerprint, trainer
from grpo_companion.rl.policies import TabularSoftmaxPolicy, TinyCausalTransformer
from grpo_companion.rl.run_state import frozen_copy, mixed_reference
from grpo_companion.rl.trainer import TrainConfig, train
from grpo_companion.theory.analyses.staged import moving_reference_iterate, staged_iterate

EXACT = {"exact": True, "n_prompts": 24, "n_outputs": 8, "n_success": 3, "iterations": 8,
         "progress": False, "p_ref_zero_fraction": 0.1, "seed": 1, "beta": 4.0, "eps": 1e-2}


@pytest.mark.parametrize(("k", "a", "alpha"), [(1, 0.5, 1.0), (3, 0.6, 1.0), (2, 0.25, 1.0),
                                               (2, 0.5, 0.5)])
def test_exact_training_follows_the_moving_reference_recurrence(k, a, alpha):
    config = TrainConfig.flat(**{**EXACT, "ref_reset_every": k, "ref_mixup_alpha": a,
                              "alpha": alpha})
    run = train(config)
    path = moving_reference_iterate(run.p_ref, 4.0, 8, k, a, alpha=alpha, eps=1e-2)
    trained = theory.logit(run.success_prob)
    finite = np.isfinite(path.logit_p)
    assert np.array_equal(finite, np.isfinite(trained))  # p_ref = 0 stays 0
    np.testing.assert_allclose(trained[finite], path.logit_p[finite], rtol=0, atol=1e-8)
    # the check tells the moving reference from the reset and from the fixed reference
    staged = staged_iterate(run.p_ref, 4.0, 8, k, alpha=alpha, eps=1e-2).logit_p
    plain = theory.iterate_logit(theory.logit(run.p_ref), theory.logit(run.p_ref), 4.0, 8,
                                 alpha=alpha, eps=1e-2)
    assert np.max(np.abs(trained[finite] - staged[finite])) > 1e-2
    assert np.max(np.abs(trained[finite] - plain[finite])) > 1e-2


@pytest.mark.parametrize("settings", [
    {**EXACT, "ref_reset_every": 3},
    {"task": "bandit", "n_prompts": 8, "n_outputs": 6, "iterations": 4, "mu": 2,
     "group_size": 4, "ref_reset_every": 2, "alpha": 0.5, "progress": False, "seed": 3},
])
def test_mixup_one_is_the_plain_reset_bit_for_bit(settings, monkeypatch):
    new = train(TrainConfig.flat(**{**settings, "ref_mixup_alpha": 1.0}))
    # the reset as the trainer wrote it before the option: pi_ref <- frozen_copy(pi)
    monkeypatch.setattr(trainer, "mixed_reference", lambda ref, policy, a: frozen_copy(policy))
    old = train(TrainConfig.flat(**settings))
    np.testing.assert_array_equal(new.success_prob, old.success_prob)
    for name, values in old.metrics.items():
        np.testing.assert_array_equal(new.metrics[name], values)


def test_sampled_training_mixes_the_reference_at_each_reset(monkeypatch):
    seen = []

    def spy(ref, policy, a):
        mixed = mixed_reference(ref, policy, a)
        seen.append((ref.logits.clone(), policy.logits.detach().clone(), mixed.logits.clone()))
        return mixed

    monkeypatch.setattr(trainer, "mixed_reference", spy)
    config = TrainConfig.flat(task="bandit", n_prompts=6, n_outputs=5, iterations=4, mu=1,
                              group_size=4, ref_reset_every=2, ref_mixup_alpha=0.3, progress=False)
    train(config)
    assert len(seen) == 2
    for ref, policy, mixed in seen:
        torch.testing.assert_close(mixed, 0.3 * policy + 0.7 * ref, rtol=0, atol=1e-6)  # float32
    assert not torch.equal(seen[1][0], seen[0][0])  # the second reset starts from the mix


def _trl_sync(model, target, alpha):
    from trl.trainer.callbacks import SyncRefModelCallback

    SyncRefModelCallback._sync_target_model(model, target, alpha)


@pytest.mark.parametrize("a", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("make", [
    lambda: TabularSoftmaxPolicy(torch.randn(3, 5, dtype=torch.float64)),
    lambda: TinyCausalTransformer(7, 6, d_model=8, n_heads=2, n_layers=1, eos_id=5, pad_id=6),
])
def test_the_mix_is_trls_sync_callback(a, make):
    torch.manual_seed(0)
    policy, ref = make(), make()
    ours = mixed_reference(frozen_copy(ref), policy, a)
    theirs = frozen_copy(ref)
    _trl_sync(policy, theirs, a)  # SyncRefModelCallback's own parameter update, in place
    for mine, trl_param in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(mine, trl_param, rtol=0, atol=1e-6 if a not in (0, 1) else 0)
    assert all(not p.requires_grad for p in ours.parameters())


def test_tabular_mix_has_the_theorys_success_logit():
    torch.manual_seed(1)
    success = torch.tensor([True, True, False, False, False])
    base = torch.log_softmax(torch.randn(4, 5, dtype=torch.float64), -1)
    factor = torch.where(success, 1.3, -0.4) * torch.arange(1, 5, dtype=torch.float64)[:, None]
    policy = TabularSoftmaxPolicy(base + factor)  # class-proportional to the reference
    ref = TabularSoftmaxPolicy(base)

    def success_logit(module):
        logp = module.log_probs()
        return (torch.logsumexp(logp[:, success], -1)
                - torch.logsumexp(logp[:, ~success], -1)).detach().numpy()

    mixed = mixed_reference(ref, policy, 0.35)
    expected = theory.analyses.staged.mixed_reference_logit(success_logit(policy),
                                                            success_logit(ref), 0.35)
    np.testing.assert_allclose(success_logit(mixed), expected, rtol=0, atol=1e-12)


def test_the_default_keeps_the_fingerprint_of_older_checkpoints():
    config = TrainConfig.flat(**{**EXACT, "ref_reset_every": 3})
    cal = theory.Calibration(normalization=config.grpo.normalization, eps=config.grpo.eps)
    fields = {k: v for k, v in config.to_dict().items()
              if k not in fingerprint.RUN_ONLY_FIELDS and k != "ref_mixup_alpha"}
    older = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    assert fingerprint.run_fingerprint(config, cal)["config"] == older
    mixed = TrainConfig.flat(**{**EXACT, "ref_reset_every": 3, "ref_mixup_alpha": 0.5})
    assert fingerprint.run_fingerprint(mixed, cal)["config"] != older


def test_bad_mixup_values_are_refused():
    with pytest.raises(ValueError, match="ref_mixup_alpha"):
        TrainConfig.flat(ref_mixup_alpha=1.5, ref_reset_every=2)
    with pytest.raises(ValueError, match="ref_mixup_alpha must be 1.0 when ref_reset_every"):
        TrainConfig.flat(ref_mixup_alpha=0.5)
    with pytest.raises(ValueError, match="mixup_alpha"):
        mixed_reference(TabularSoftmaxPolicy(torch.zeros(1, 2)),
                        TabularSoftmaxPolicy(torch.zeros(1, 2)), -0.1)
