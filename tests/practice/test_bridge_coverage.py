"""Every GRPOConfig field is classified, and a setting outside the theory predicts nothing.

The classification is :mod:`grpo_companion.practice.trl_coverage`; the bridge
(:func:`~grpo_companion.practice.trl_bridge.theory_reading`) and the callback read it.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging

import numpy as np
import pytest

from grpo_companion.practice import PoSProbeCallback, trl_facts
from grpo_companion.practice.trl_bridge import predict_limits, predict_path, theory_reading

from . import _tiny
from .test_trl_callback import _events, reward_func, says_target


@pytest.fixture(scope="module")
def trl():
    return pytest.importorskip("trl")


@pytest.fixture(scope="module")
def trl_coverage():
    from grpo_companion.practice import trl_coverage

    return trl_coverage


def test_every_field_of_the_installed_grpo_config_is_classified(trl, trl_coverage):
    """Fails on a TRL (or transformers) upgrade that adds an option nobody has read yet."""
    names = [f.name for f in dataclasses.fields(trl.GRPOConfig)]
    unclassified = [n for n in names if trl_coverage.classify(n) == "unclassified"]
    assert unclassified == [], (
        f"TRL {trl.__version__}: classify {unclassified} in grpo_companion/practice/"
        "trl_coverage.py (RULES if it changes the advantage, the loss, the KL, the reference, "
        "the sampling or the pace; IRRELEVANT otherwise)")
    assert {trl_coverage.classify(n) for n in names} == {"relevant", "irrelevant"}
    for rule in trl_coverage.RULES:  # every relevant rule says what the covered values mean
        assert rule.covered and rule.acts_on in trl_coverage.ACTS_ON, rule.name
    assert all(why for why in trl_coverage.IRRELEVANT.values())
    assert not set(trl_coverage.IRRELEVANT) & {r.name for r in trl_coverage.RULES}


#: A changed value for every rule that can put a run outside the theory.
CHANGED = {
    "entropy_coef": 0.1,
    "top_entropy_quantile": 0.2,
    "sync_ref_model": True,
    "reward_weights": [1.0, 0.5],
    "loss_type": "cispo",
    "importance_sampling_level": "sequence",
    "scale_rewards": "batch",
    "multi_objective_aggregation": "normalize_then_sum",
    "use_adaptive_entropy": True,
    "mask_truncated_completions": True,
    "delta": 0.9,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.05,
    "repetition_penalty": 1.2,
    "generation_kwargs": {"suppress_tokens": [3]},
    "vllm_structured_outputs_regex": "[A-D]",
    "max_tool_calling_iterations": 2,
    "router_aux_loss_coef": 0.01,
    "weight_decay": 0.1,
    "neftune_noise_alpha": 5.0,
}


#: Settings that make the changed value outside the theory: a sync of the reference is
#: predicted (the moving-reference recurrence) unless it falls inside an iteration.
ALONGSIDE = {"sync_ref_model": {"num_iterations": 2, "ref_model_sync_steps": 3}}


def _config(tmp_path, **changes):
    return _tiny.grpo_config(tmp_path, **{"beta": 0.1, **changes})


def test_the_changed_values_cover_every_rule_that_can_refuse(trl_coverage):
    assert set(CHANGED) == {r.name for r in trl_coverage.RULES if r.can_be_outside}


def test_the_installed_defaults_are_covered(trl, trl_coverage, tmp_path):
    fresh = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    for rule in trl_coverage.RULES:
        if hasattr(fresh, rule.name):
            assert rule.outside(getattr(fresh, rule.name), fresh) is None, rule.name
    settings = theory_reading(fresh)
    assert settings.predicts and settings.reasons == ()
    assert trl_facts.installed_reading(fresh).predicts


@pytest.mark.parametrize(("name", "value"), sorted(CHANGED.items()))
def test_a_setting_outside_the_theory_predicts_nothing(tmp_path, name, value):
    alongside = ALONGSIDE.get(name, {})
    # the same run with the option at its default
    default = theory_reading(_config(tmp_path, **alongside))
    assert default.predicts and default.reasons == () and default.calibration is not None
    assert np.isfinite(predict_path([0.3], 2, default)).all()

    changed = theory_reading(_config(tmp_path, **alongside, **{name: value}))
    assert not changed.predicts and changed.calibration is None
    assert len(changed.reasons) == 1 and changed.reasons[0].startswith(f"{name}=")
    assert changed.note.startswith("no per-prompt prediction: ") and name in changed.note
    assert changed.record()["reasons"] == list(changed.reasons)
    assert np.isnan(predict_path([0.3, 0.6], 3, changed)).all()
    limits, regimes = predict_limits([0.3, 0.6], changed)
    assert np.isnan(limits).all() and regimes == ["none", "none"]
    reading = trl_facts.installed_reading(_config(tmp_path, **alongside, **{name: value}))
    assert not reading.predicts and reading.settles_at == "no per-prompt prediction"


def test_several_reasons_are_all_given(tmp_path):
    settings = theory_reading(_config(tmp_path, entropy_coef=0.1, sync_ref_model=True,
                                       **ALONGSIDE["sync_ref_model"],
                                       scale_rewards="batch"))
    assert [r.split("=")[0] for r in settings.reasons] == [
        "scale_rewards", "entropy_coef", "sync_ref_model"]


@pytest.mark.parametrize("changes", [
    {}, {"epsilon_high": 0.28}, {"epsilon": 1.0, "epsilon_high": 1e12}, {"loss_type": "grpo"},
    {"loss_type": "dr_grpo"}, {"loss_type": "bnpo"}, {"scale_rewards": "none"}, {"delta": 1.5},
    {"temperature": 0.7}, {"num_iterations": 2}, {"learning_rate": 1e-3}, {"beta": 0.0},
    {"use_bias_correction_kl": False}, {"reward_weights": [1.0]}, {"top_k": 0},
    {"generation_kwargs": {}}, {"off_policy_mask_threshold": 0.5}, {"logging_steps": 3},
    {"entropy_target": 0.5}, {"ref_model_sync_steps": 10}, {"sapo_temperature_neg": 2.0},
])
def test_covered_and_irrelevant_changes_still_predict(tmp_path, changes):
    settings = theory_reading(_config(tmp_path, **changes))
    assert settings.predicts and settings.reasons == (), settings.reasons


def test_an_option_nobody_classified_predicts_only_at_its_default(trl, tmp_path):
    """A TRL upgrade's new option: at its default nothing changes, changed it is outside."""

    @dataclasses.dataclass
    class Upgraded(trl.GRPOConfig):
        brand_new_knob: float = 0.0

    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to=[], beta=0.1)
    assert theory_reading(Upgraded(**base)).predicts
    changed = theory_reading(Upgraded(**base, brand_new_knob=1.0))
    assert not changed.predicts
    assert changed.reasons[0].startswith("brand_new_knob=1.0") and "not classified" in \
        changed.reasons[0]


def test_the_rows_say_covered_or_outside(trl_coverage, tmp_path):
    rows = {r["name"]: r for r in trl_coverage.coverage_rows(_config(tmp_path,
                                                                     entropy_coef=0.1))}
    assert rows["entropy_coef"]["status"] == "outside" and rows["entropy_coef"]["value"] == 0.1
    assert rows["beta"]["status"] == "covered" and rows["beta"]["text"]
    assert set(rows) == {r.name for r in trl_coverage.RULES}


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_callback_measures_and_says_why_it_predicts_nothing(model_path, tmp_path, caplog):
    """A real (tiny) GRPOTrainer run with an entropy bonus: PoS measured, no prediction."""
    from datasets import Dataset

    callback = PoSProbeCallback(["say A", "say B"], says_target, tmp_path / "probe", every=1,
                                n_samples=4, batch_size=8)
    dataset = Dataset.from_dict({"prompt": ["say A", "say B"] * 4})
    trainer = _tiny.trainer(model_path, tmp_path / "run", reward_func, dataset=dataset,
                            callbacks=[callback], max_steps=2, learning_rate=0.05, beta=0.1,
                            entropy_coef=0.1, max_completion_length=2)
    with caplog.at_level(logging.WARNING, logger="grpo_companion.practice.trl_callback"):
        trainer.train()
    rows = _csv(tmp_path / "probe" / "pos_probe.csv")
    assert [int(r["step"]) for r in rows] == [0, 0, 1, 1, 2, 2]
    assert all(0 <= float(r["measured_pos"]) <= 1 and int(r["n"]) == 4 for r in rows)
    assert all(r["predicted_pos"] == r["predicted_limit"] == "" and r["regime"] == "none"
               for r in rows)
    theory = json.loads((tmp_path / "probe" / "pos_probe.json").read_text())["theory"]
    assert theory["note"].startswith("no per-prompt prediction: entropy_coef=0.1")
    assert theory["reasons"] == [callback.reading.reasons[0]]
    assert any("no per-prompt prediction: entropy_coef=0.1" in m for m in caplog.messages)


def test_the_callback_with_an_uncovered_setting_outside_a_trainer(model, tmp_path):
    callback = PoSProbeCallback(["say A"], says_target, tmp_path, every=1, n_samples=2)
    args = _tiny.grpo_config(tmp_path / "run", max_completion_length=1, beta=0.1,
                             loss_type="cispo")
    _events(callback, model, _tiny.tokenizer(), args, steps=(0, 1))
    rows = _csv(tmp_path / "pos_probe.csv")
    assert len(rows) == 2 and all(r["regime"] == "none" for r in rows)
    assert "loss_type='cispo'" in json.loads((tmp_path / "pos_probe.json").read_text())[
        "theory"]["note"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return _tiny.save_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def model(model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path)
