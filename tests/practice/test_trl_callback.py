"""PoSProbeCallback on a real, short trl.GRPOTrainer run, and the theory settings it reads."""

from __future__ import annotations

import csv
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grpo_companion import theory
from grpo_companion.practice import CSV_COLUMNS, PoSProbeCallback
from grpo_companion.practice.trl_bridge import (
    iteration_of_step,
    predict_limits,
    predict_path,
    theory_reading,
)
from grpo_companion.theory.kl_estimators import reverse_kl_fixed_points, reverse_kl_pos

from . import _tiny

LETTERS = {"A", "B", "C", "D"}


def says_target(prompt: str, completion: str) -> int:
    """The toy verifiable task: reply with a letter (A to D) first.

    Four of the 18 words pass, so a random model starts near PoS 0.2: a measured
    p_ref of 0 (which the theory reads as "absorbed at 0") is unlikely.
    """
    words = completion.split()
    return int(bool(words) and words[0] in LETTERS)


def reward_func(prompts, completions, **_):
    return [float(says_target(p, c)) for p, c in zip(prompts, completions, strict=True)]


def _rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return _tiny.save_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.mark.slow
def test_a_short_grpo_run_writes_the_csv_and_plot(model_path, tmp_path):
    from datasets import Dataset

    probes = ["say A", "say B"]
    callback = PoSProbeCallback(probes, says_target, tmp_path / "probe", every=2, n_samples=8,
                                batch_size=16, seed=0)
    dataset = Dataset.from_dict({"prompt": ["say A", "say B", "say C", "say D"] * 4})
    trainer = _tiny.trainer(model_path, tmp_path / "run", reward_func, dataset=dataset,
                            callbacks=[callback], max_steps=4, learning_rate=0.05, beta=0.1,
                            num_generations=4, per_device_train_batch_size=8,
                            max_completion_length=2, temperature=1.0)
    trainer.train()

    fields, rows = _rows(tmp_path / "probe" / "pos_probe.csv")
    assert tuple(fields) == CSV_COLUMNS
    assert [(int(r["step"]), int(r["prompt"])) for r in rows] == [
        (s, p) for s in (0, 2, 4) for p in (0, 1)]
    assert {int(r["n"]) for r in rows} == {8}
    measured = np.array([float(r["measured_pos"]) for r in rows])
    assert np.all((measured >= 0) & (measured <= 1))
    assert np.all(np.isclose(measured * 8, np.round(measured * 8)))
    first = rows[:2]
    for r in first:  # step 0 is the reference: the prediction there is p_ref itself
        assert float(r["p_ref"]) == float(r["measured_pos"]) == float(r["predicted_pos"])
        assert int(r["theory_iteration"]) == 0
    # one GRPO iteration per optimiser step here (num_iterations = 1, no accumulation)
    assert [int(r["theory_iteration"]) for r in rows[2:]] == [2, 2, 4, 4]
    settings = theory_reading(trainer.args)
    p_ref = np.array([float(r["p_ref"]) for r in first])
    expected = predict_path(p_ref, 4, settings)
    got = np.array([float(r["predicted_pos"]) for r in rows]).reshape(3, 2)
    np.testing.assert_allclose(got, expected[[0, 2, 4]], rtol=0, atol=1e-15)

    record = json.loads((tmp_path / "probe" / "pos_probe.json").read_text())
    assert record["prompts"] == probes and record["theory"]["beta"] == 0.1
    assert record["theory"]["calibration"]["group_size"] == 4
    assert record["theory"]["kl_target"] == "forward"

    import matplotlib.image

    image = matplotlib.image.imread(tmp_path / "probe" / "pos_probe.png")
    assert image.shape[0] > 100 and image.shape[1] > 100
    rgb = image[..., :3]
    assert rgb.std() > 0.05 and (rgb < 0.5).mean() > 0.002  # drawn on, not a blank canvas
    leftovers = [p.name for p in (tmp_path / "probe").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temporary files left behind


@pytest.mark.slow
def test_the_zero_variance_share_is_recorded_next_to_trls(model_path, tmp_path):
    """The probe prompts are the training prompts, one group each per step: the callback's
    predicted share is the mean of p^G + (1-p)^G over its measured PoS, and its logged
    share is what TRL logged at the next step (whose groups that policy sampled)."""
    from datasets import Dataset

    from grpo_companion.practice.diagnose import zero_variance_share

    probes = ["say A", "say B"]
    callback = PoSProbeCallback(probes, says_target, tmp_path / "probe", every=1, n_samples=8,
                                batch_size=16, seed=0)
    trainer = _tiny.trainer(model_path, tmp_path / "run", reward_func,
                            dataset=Dataset.from_dict({"prompt": probes * 4}),
                            callbacks=[callback], max_steps=3, learning_rate=0.05,
                            num_generations=4, per_device_train_batch_size=8,
                            max_completion_length=2, logging_strategy="steps", logging_steps=1)
    trainer.train()
    logged = {r["step"]: r["frac_reward_zero_std"] for r in trainer.state.log_history
              if "frac_reward_zero_std" in r}
    assert sorted(logged) == [1, 2, 3]
    _, rows = _rows(tmp_path / "probe" / "pos_probe.csv")
    for step in (0, 1, 2, 3):
        mine = [r for r in rows if int(r["step"]) == step]
        measured = [float(r["measured_pos"]) for r in mine]
        assert float(mine[0]["predicted_zero_std"]) == pytest.approx(
            zero_variance_share(measured, 4), abs=1e-12)
        got = {r["logged_zero_std"] for r in mine}
        if step + 1 in logged:
            assert {float(g) for g in got} == {float(logged[step + 1])}
        else:
            assert got == {""}  # no later step: nothing logged yet (NaN, written empty)


def _events(callback, model, tokenizer, args, *, main=True, steps=(0, 1, 2)):
    from transformers import TrainerControl, TrainerState

    state = TrainerState(is_world_process_zero=main)
    control = TrainerControl()
    kwargs = {"model": model, "processing_class": tokenizer}
    callback.on_train_begin(args, state, control, **kwargs)
    for step in steps[1:]:
        state.global_step = step
        callback.on_step_end(args, state, control, **kwargs)
    callback.on_train_end(args, state, control, **kwargs)


@pytest.fixture(scope="module")
def model(model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path)


def test_only_the_main_process_writes(model, tmp_path):
    callback = PoSProbeCallback(["say A"], says_target, tmp_path / "probe", every=1, n_samples=4)
    args = _tiny.grpo_config(tmp_path / "run", max_completion_length=2)
    _events(callback, model, _tiny.tokenizer(), args, main=False)
    assert len(callback.rows) == 3
    assert not (tmp_path / "probe").exists()


def test_without_an_out_dir_it_keeps_rows_and_writes_nothing(model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    callback = PoSProbeCallback(["say A"], says_target, None, every=1, n_samples=4)
    args = _tiny.grpo_config(tmp_path / "run", max_completion_length=2)
    _events(callback, model, _tiny.tokenizer(), args, main=True)
    assert len(callback.rows) == 3
    assert not any(tmp_path.glob("pos_probe*"))


def test_sampling_leaves_the_model_mode_and_the_rng_alone(model, tmp_path):
    callback = PoSProbeCallback(["say A", "say B"], says_target, tmp_path, n_samples=5,
                                batch_size=3)
    args = _tiny.grpo_config(tmp_path / "run", max_completion_length=2)
    for training in (True, False):
        model.train(training)
        rng = torch.get_rng_state()
        counts, n = callback._count_successes(model, _tiny.tokenizer(), args, step=0)
        assert model.training is training and torch.equal(rng, torch.get_rng_state())
        assert n == 5 and counts.shape == (2,) and np.all((0 <= counts) & (counts <= 5))
    again, _ = callback._count_successes(model, _tiny.tokenizer(), args, step=0)
    np.testing.assert_array_equal(again, counts)  # its own seed: reproducible


def test_a_users_file_is_not_overwritten_unless_asked(model, tmp_path):
    (tmp_path / "pos_probe.csv").write_text("mine\n")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        PoSProbeCallback(["say A"], says_target, tmp_path)
    callback = PoSProbeCallback(["say A"], says_target, tmp_path, every=1, n_samples=2,
                                overwrite=True)
    _events(callback, model, _tiny.tokenizer(),
            _tiny.grpo_config(tmp_path / "run", max_completion_length=1), steps=(0, 1))
    fields, rows = _rows(tmp_path / "pos_probe.csv")
    assert tuple(fields) == CSV_COLUMNS and len(rows) == 2


def test_a_file_that_appears_before_the_first_write_is_kept(model, tmp_path):
    callback = PoSProbeCallback(["say A"], says_target, tmp_path, n_samples=2)
    (tmp_path / "pos_probe.png").write_bytes(b"not ours")
    with pytest.raises(FileExistsError):
        _events(callback, model, _tiny.tokenizer(),
                _tiny.grpo_config(tmp_path / "run", max_completion_length=1), steps=(0,))
    assert (tmp_path / "pos_probe.png").read_bytes() == b"not ours"


def test_batch_scaling_records_no_prediction(model, tmp_path):
    callback = PoSProbeCallback(["say A"], says_target, tmp_path, every=1, n_samples=2)
    args = _tiny.grpo_config(tmp_path / "run", max_completion_length=1, scale_rewards="batch")
    _events(callback, model, _tiny.tokenizer(), args, steps=(0, 1))
    _, rows = _rows(tmp_path / "pos_probe.csv")
    assert all(r["predicted_pos"] == "" and r["predicted_limit"] == "" and r["regime"] == "none"
               for r in rows)
    note = json.loads((tmp_path / "pos_probe.json").read_text())["theory"]["note"]
    assert note.startswith("no per-prompt prediction") and "batch" in note
    assert (tmp_path / "pos_probe.png").stat().st_size > 1000


def test_a_verifier_must_answer_zero_or_one(model, tmp_path):
    callback = PoSProbeCallback(["say A"], lambda p, c: 0.5, tmp_path, n_samples=1)
    with pytest.raises(ValueError, match="0 or 1"):
        _events(callback, model, _tiny.tokenizer(),
                _tiny.grpo_config(tmp_path / "run", max_completion_length=1), steps=(0,))


@pytest.mark.parametrize("bad", [{"every": 0}, {"n_samples": 1.5}, {"p_ref": [0.5, 0.5]},
                                 {"steps_per_iteration": 0}])
def test_bad_arguments_are_refused(tmp_path, bad):
    with pytest.raises(ValueError):
        PoSProbeCallback(["say A"], says_target, tmp_path, **bad)


# ------------------------------------------------------------- the theory's reading
def _args(**changes):
    base = dict(num_generations=8, beta=0.1, scale_rewards="group", use_bias_correction_kl=True,
                gradient_accumulation_steps=4, steps_per_generation=4, num_iterations=10,
                multi_objective_aggregation="sum_then_normalize")
    return SimpleNamespace(**{**base, **changes})


def test_settings_follow_the_config(tmp_path):
    real = theory_reading(_tiny.grpo_config(tmp_path, num_generations=4, beta=0.1,
                                             per_device_train_batch_size=4))
    assert real.calibration == dataclasses.replace(theory.CALIBRATIONS["trl"], group_size=4)
    assert (real.kl, real.kl_target, real.steps_per_iteration) == ("k3_ratio", "forward", 1.0)

    paper = theory_reading(_args())  # Appendix A/H: G = 16 there; mu = 10, accumulation 4
    assert paper.steps_per_iteration == 10.0
    assert [iteration_of_step(s, paper) for s in (0, 9, 10, 25)] == [0, 0, 1, 2]
    none = theory_reading(_args(scale_rewards=False))
    assert none.calibration == dataclasses.replace(theory.CALIBRATIONS["mean_only"], group_size=8)
    assert theory_reading(_args(use_bias_correction_kl=False)).kl_target == "reverse"
    assert not theory_reading(_args(scale_rewards="batch")).predicts
    assert not theory_reading(_args(multi_objective_aggregation="normalize_then_sum")).predicts


P_REF = np.array([0.0, 0.05, 0.3, 0.9, 1.0])


def test_forward_prediction_is_the_papers_recurrence():
    settings = theory_reading(_args())
    cal = dataclasses.replace(theory.CALIBRATIONS["trl"], group_size=8)
    np.testing.assert_array_equal(predict_path(P_REF, 6, settings),
                                  theory.iterate(P_REF, P_REF, 0.1, 6, calibration=cal))
    limits, regimes = predict_limits(P_REF, settings)
    assert regimes[0] == "absorbed" and limits[0] == 0 and limits[-1] == 1
    interior = [i for i, r in enumerate(regimes) if r == "fixed_point"]
    for i in interior:  # a fixed point of the map
        np.testing.assert_allclose(theory.pos_map(limits[i], P_REF[i], 0.1, calibration=cal),
                                   limits[i], rtol=1e-9)


def test_reverse_kl_prediction_settles_on_the_reverse_kl_fixed_point():
    settings = theory_reading(_args(use_bias_correction_kl=False, beta=2.0))
    path = predict_path(P_REF[1:4], 3, settings)
    w_plus, w_minus = settings.calibration.weights(path[1])
    np.testing.assert_allclose(path[2], reverse_kl_pos(P_REF[1:4], w_plus, w_minus, 2.0))
    limits, regimes = predict_limits(P_REF[1:4], settings)
    for p, limit, regime in zip(P_REF[1:4], limits, regimes, strict=True):
        if regime == "fixed_point":
            roots = reverse_kl_fixed_points(p, 2.0, calibration=settings.calibration)
            assert np.min(np.abs(roots - limit)) < 1e-8


def test_beta_zero_predicts_a_climb_to_one_without_dividing_by_zero():
    settings = theory_reading(_args(beta=0.0))
    assert "beta = 0" in settings.note
    with np.errstate(all="raise"):
        path = predict_path(P_REF, 3, settings)
        limits, regimes = predict_limits(P_REF, settings)
    np.testing.assert_array_equal(path[0], P_REF)
    np.testing.assert_array_equal(path[1:], np.tile([0.0, 1, 1, 1, 1], (3, 1)))
    assert regimes == ["absorbed"] + ["saturates"] * 4 and list(limits) == [0, 1, 1, 1, 1]


def test_no_prediction_is_nan_not_a_guess():
    settings = theory_reading(_args(scale_rewards="batch"))
    assert np.isnan(predict_path(P_REF, 2, settings)).all()
    limits, regimes = predict_limits(P_REF, settings)
    assert np.isnan(limits).all() and set(regimes) == {"none"}


WORKER = r'''
import json, os, sys
import torch
import torch.distributed as dist
sys.path.insert(0, os.environ["GRPO_ROOT"])
from transformers import AutoModelForCausalLM
from tests.practice import _tiny
from tests.practice.test_trl_callback import _events, says_target
from grpo_companion.practice import PoSProbeCallback

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
out = os.environ["GRPO_OUT"]
model = AutoModelForCausalLM.from_pretrained(os.environ["GRPO_MODEL"])
callback = PoSProbeCallback(["say A", "say B"], says_target, os.path.join(out, "probe"),
                            every=1, n_samples=5, batch_size=4)
_events(callback, model, _tiny.tokenizer(),
        _tiny.grpo_config(os.path.join(out, "run"), max_completion_length=2),
        main=rank == 0, steps=(0, 1))
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"rows": callback.rows, "wrote": len(callback._claimed)}, f)
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_two_processes_share_the_sampling_and_one_writes(model_path, tmp_path):
    """As under ``accelerate launch`` (here two CPU processes, gloo): counts are summed."""
    import os
    import socket
    import subprocess
    import sys

    from ..setup._load import ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "GRPO_ROOT": str(ROOT), "GRPO_OUT": str(tmp_path),
           "GRPO_MODEL": model_path, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "worker.py")],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["rows"] == ranks[1]["rows"]  # the same all-reduced counts everywhere
    assert {row["n"] for row in ranks[0]["rows"]} == {6}  # 2 processes x ceil(5 / 2)
    assert (ranks[0]["wrote"], ranks[1]["wrote"]) == (3, 0)
    _, rows = _rows(tmp_path / "probe" / "pos_probe.csv")
    assert len(rows) == 4
