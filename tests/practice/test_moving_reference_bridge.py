"""The bridge predicts TRL's ``sync_ref_model`` runs with the moving-reference recurrence.

Checked against TRL's own ``SyncRefModelCallback`` (offline, on a tabular model whose
parameters are the logits): exact GRPO iterations with TRL's callback mixing the reference
have the bridge's predicted success probabilities.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grpo_companion import theory
from grpo_companion.practice import trl_coverage, trl_facts, trl_questions
from grpo_companion.practice.trl_bridge import (
    PredictedPath,
    predict_limits,
    predict_path,
    theory_reading,
)
from grpo_companion.rl.policies import TabularSoftmaxPolicy
from grpo_companion.theory.analyses.staged import moving_reference_iterate

from . import _tiny

P_REF = np.array([0.0, 0.05, 0.3, 0.7])


def _config(tmp_path, **changes):
    return _tiny.grpo_config(tmp_path, **{"beta": 0.5, "sync_ref_model": True,
                                          "ref_model_sync_steps": 4,
                                          "ref_model_mixup_alpha": 0.6,
                                          "num_iterations": 2, **changes})


def test_the_settings_read_the_sync(tmp_path):
    settings = theory_reading(_config(tmp_path))
    assert settings.steps_per_iteration == 2 and settings.ref_sync_every == 2
    assert settings.ref_mixup_alpha == 0.6 and settings.predicts and settings.moving_reference
    assert settings.record()["ref_sync_every"] == 2 and "moving reference" in settings.note
    assert trl_coverage.ref_sync_iterations(_config(tmp_path)) == 2


def test_the_prediction_is_the_moving_reference_recurrence(tmp_path):
    settings = theory_reading(_config(tmp_path))
    path = predict_path(P_REF, 9, settings)
    expected = moving_reference_iterate(P_REF, 0.5, 9, 2, 0.6, calibration=settings.calibration)
    np.testing.assert_allclose(path, expected.p, rtol=0, atol=1e-15)
    fixed = predict_path(P_REF, 9, theory_reading(_config(tmp_path, sync_ref_model=False)))
    assert np.max(np.abs(path - fixed)) > 1e-2
    # one iteration at a time, and back, bit for bit
    stepper = PredictedPath(P_REF, settings)
    for n in (3, 5, 9, 2):
        assert np.array_equal(stepper.at(n), path[n])


def test_mixup_zero_and_no_sync_keep_the_fixed_reference_prediction(tmp_path):
    plain = theory_reading(_config(tmp_path, sync_ref_model=False))
    assert plain.ref_sync_every is None and "ref_sync_every" not in plain.record()
    zero = theory_reading(_config(tmp_path, ref_model_mixup_alpha=0.0))
    assert zero.record() == plain.record()
    assert np.array_equal(predict_path(P_REF, 6, zero), predict_path(P_REF, 6, plain))


@pytest.mark.parametrize(("changes", "why"), [
    ({"ref_model_sync_steps": 3}, "inside an iteration"),
    ({"use_bias_correction_kl": False}, "plain k3"),
])
def test_syncs_the_recurrence_does_not_describe_are_refused(tmp_path, changes, why):
    settings = theory_reading(_config(tmp_path, **changes))
    assert not settings.predicts and any(
        r.startswith("sync_ref_model=") and why in r for r in settings.reasons)


def test_beta_zero_makes_the_sync_inert(tmp_path):
    settings = theory_reading(_config(tmp_path, beta=0.0))
    assert settings.predicts and settings.ref_sync_every is None


def test_limits_fixed_point_and_reading(tmp_path):
    config = _config(tmp_path)
    settings = theory_reading(config)
    limits, regimes = predict_limits(P_REF, settings)
    assert regimes == ["absorbed", "saturates", "saturates", "saturates"]
    assert limits[0] == 0 and np.all(limits[1:] > 1 - 1e-6)
    assert trl_questions.fixed_point(0.3, config) is None
    assert trl_questions.fixed_point(0.3, _config(tmp_path, sync_ref_model=False)) is not None
    assert "follows the policy" in trl_facts.installed_reading(config).settles_at


def _exact_iteration(pi, ref, mask, beta, calibration):
    probs = theory.policy_iterate(ref, mask, beta, 1, pi_0=pi, calibration=calibration)[-1]
    return torch.log(torch.as_tensor(probs))


@pytest.mark.parametrize(("k", "a"), [(1, 0.6), (3, 0.3), (2, 1.0)])
def test_trls_sync_callback_with_exact_iterations_follows_the_prediction(tmp_path, monkeypatch,
                                                                         k, a):
    from trl.trainer import callbacks
    from trl.trainer.callbacks import SyncRefModelCallback

    # no Accelerator in this process: the callback asks only whether DeepSpeed ZeRO-3 is on
    monkeypatch.setattr(callbacks, "AcceleratorState",
                        lambda: SimpleNamespace(deepspeed_plugin=None))
    config = _config(tmp_path, num_iterations=1, ref_model_sync_steps=k,
                     ref_model_mixup_alpha=a)
    settings = theory_reading(config)
    assert settings.ref_sync_every == (k if a > 0 else None)
    mask = np.array([1, 1, 0, 0, 0, 0])
    rng = np.random.default_rng(4)
    rows = []
    for p0 in (0.1, 0.4):  # uneven profile within each class
        s, f = rng.dirichlet(np.ones(2)) * p0, rng.dirichlet(np.ones(4)) * (1 - p0)
        rows.append(np.concatenate([s, f]))
    start = torch.log(torch.as_tensor(np.array(rows)))
    model, ref = TabularSoftmaxPolicy(start), TabularSoftmaxPolicy(start)
    callback = SyncRefModelCallback(ref_model=ref, accelerator=None)
    success = []
    for step in range(1, 10):  # one optimiser step per iteration: the exact optimum
        with torch.no_grad():
            ref_probs = ref.log_probs().exp().numpy()
            pi = model.log_probs().exp().numpy()
            for i in range(len(rows)):
                model.logits[i] = _exact_iteration(pi[i], ref_probs[i], mask, settings.beta,
                                                   settings.calibration)
        callback.on_step_end(config, SimpleNamespace(global_step=step), None, model=model)
        success.append(model.log_probs().exp()[:, :2].sum(-1).detach().numpy())
    predicted = predict_path([r[:2].sum() for r in rows], 9, settings)
    np.testing.assert_allclose(np.array(success), predicted[1:], rtol=0, atol=1e-9)
