"""Trainer: outputs, determinism, resume after an interruption, validation."""

import json

import numpy as np
import pytest
import torch

from grpo_companion.rl.trainer import TrainConfig, train

BANDIT = {"n_prompts": 32, "n_outputs": 10, "iterations": 5, "mu": 3, "progress": False,
          "group_size": 8, "ref_reset_every": 2, "alpha": 0.5}
SEQUENCE = {"task": "sequence", "max_operand": 19, "n_eval_prompts": 16, "eval_samples": 4,
            "sft_steps": 10, "sft_batch_size": 32, "iterations": 3, "mu": 2,
            "prompts_per_iteration": 8, "group_size": 4, "d_model": 16, "n_heads": 2,
            "progress": False, "loss_type": "dr_grpo", "kl": "k3_ratio"}


class Interrupt(Exception):
    pass


def _stop_at(k):
    def callback(n):
        if n == k:
            raise Interrupt

    return callback


@pytest.mark.parametrize("settings", [BANDIT, SEQUENCE], ids=["bandit", "sequence"])
def test_interrupted_run_resumes_to_identical_results(tmp_path, settings):
    config = TrainConfig.flat(**settings)
    full = train(config, out_dir=tmp_path / "full")
    with pytest.raises(Interrupt):
        train(config, out_dir=tmp_path / "cut", callback=_stop_at(2))
    cut = tmp_path / "cut"
    assert (cut / "checkpoint.pt").is_file() and not (cut / "metrics.csv").exists()
    record = json.loads((cut / "run.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("Interrupt")
    resumed = train(config, out_dir=cut, resume=True)
    assert json.loads((cut / "run.json").read_text())["status"] == "complete"
    for name in ("metrics.csv", "iterations.csv"):
        assert (cut / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
    for name, values in full.metrics.items():
        np.testing.assert_array_equal(resumed.metrics[name], values)
    assert sorted(p.name for p in cut.iterdir()) == ["checkpoint.pt", "iterations.csv",
                                                     "metrics.csv", "run.json"]


def test_same_seed_same_results_other_seed_differs():
    config = TrainConfig.flat(**BANDIT)
    a, b = train(config), train(config)
    for name in a.metrics:
        np.testing.assert_array_equal(a.metrics[name], b.metrics[name])
    c = train(TrainConfig.flat(**{**BANDIT, "seed": 1}))
    assert not np.array_equal(a.success_prob, c.success_prob)


def test_outputs_are_tidy_and_recorded(tmp_path):
    config = TrainConfig.flat(**BANDIT)
    result = train(config, out_dir=tmp_path)
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0] == "iteration,prompt,p_ref,success_prob,kl_ref,kl_prev,entropy,clip_fraction"
    assert len(lines) == 1 + (config.run.iterations + 1) * config.bandit.n_prompts
    first = lines[1 + config.bandit.n_prompts].split(",")  # iteration 1, prompt 0
    assert float(first[3]) == result.success_prob[1, 0]
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "complete" and record["seed"] == 0
    assert record["config"] == config.to_dict()
    assert {"python", "torch", "numpy", "grpo_companion", "device"} <= set(record["versions"])
    assert record["versions"]["device"] == result.device == "cpu"
    assert len(result.rows()) == len(lines) - 1
    assert len(result.iteration_rows) == config.run.iterations


def test_reference_reset_zeroes_kl_to_reference():
    # After the reset at iteration 2 the reference is pi_2: KL(pi_3||pi_ref) = KL(pi_3||pi_2).
    result = train(TrainConfig.flat(**{**BANDIT, "alpha": 1.0}))
    np.testing.assert_allclose(result.metrics["kl_ref"][3], result.metrics["kl_prev"][3])
    assert np.all(result.metrics["kl_ref"][2] >= result.metrics["kl_prev"][2] - 1e-12)


def test_default_dtype_is_untouched():
    before = torch.get_default_dtype()
    train(TrainConfig.flat(**{**BANDIT, "iterations": 1, "exact": True}))
    assert torch.get_default_dtype() == before


@pytest.mark.parametrize(("overrides", "name"), [
    ({"beta": -0.1}, "beta"), ({"beta": 1e-7}, "beta"), ({"alpha": 1.5}, "alpha"),
    ({"group_size": 0}, "group_size"),
    ({"kl": "k7"}, "kl"), ({"loss_type": "mean"}, "loss_type"), ({"mu": 0}, "mu"),
    ({"clip_eps_low": 2.0}, "clip_eps_low"), ({"device": "tpu"}, "device"),
    ({"task": "sequence", "exact": True}, "exact"), ({"task": "sequence", "kl": "exact"}, "kl"),
    ({"normalization": "std"}, "normalization"), ({"eps": -1.0}, "eps"),
    ({"prompts_per_iteration": 10_000}, "prompts_per_iteration"), ({"iterations": 0}, "iter"),
])
def test_config_rejects_bad_values(overrides, name):
    with pytest.raises(ValueError, match=name) as info:
        TrainConfig.flat(**overrides)
    assert "got" in str(info.value)


def test_resume_checks_configuration_and_folder(tmp_path):
    config = TrainConfig.flat(**{**BANDIT, "iterations": 2})
    train(config, out_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="beta"):
        train(TrainConfig.flat(**{**BANDIT, "iterations": 2, "beta": 0.3}),
              out_dir=tmp_path / "run", resume=True)
    with pytest.raises(ValueError, match="not empty"):
        train(config, out_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="checkpoint"):
        train(config, out_dir=tmp_path / "new", resume=True)
    assert not (tmp_path / "new").exists()
