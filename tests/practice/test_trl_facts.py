"""trl_facts against the installed TRL itself: its GRPOConfig, read now, never copied numbers."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from grpo_companion import theory
from grpo_companion.practice import trl_facts
from grpo_companion.practice.trl_bridge import advantage_calibration
from grpo_companion.rl import losses
from grpo_companion.theory.analyses import trained_loss
from grpo_companion.theory.kl_estimators import ESTIMATOR_TARGETS


@pytest.fixture(scope="module")
def trl():
    return pytest.importorskip("trl")


@pytest.fixture(scope="module")
def fresh(trl, tmp_path_factory):
    """``trl.GRPOConfig()`` with its defaults (on the CPU, reporting nowhere)."""
    return trl.GRPOConfig(output_dir=str(tmp_path_factory.mktemp("out")), use_cpu=True,
                          report_to=[])


def test_the_version_is_the_installed_one(trl):
    assert trl_facts.trl_version() == trl.__version__
    assert trl_facts.installed_reading().trl_version == trl.__version__


def test_every_option_is_a_field_of_the_installed_grpo_config(trl):
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    missing = [o.name for o in trl_facts.OPTIONS if o.name not in fields]
    assert missing == [], f"TRL {trl.__version__} has no {missing}: update trl_facts.OPTIONS"
    assert set(trl_facts.grpo_defaults()) == {o.name for o in trl_facts.OPTIONS}


def test_defaults_are_those_of_a_fresh_grpo_config(fresh):
    defaults = trl_facts.grpo_defaults()
    for name, value in defaults.items():
        got = getattr(fresh, name)
        if name == "steps_per_generation" and value is None:  # resolved after construction
            assert got == fresh.gradient_accumulation_steps
        elif name == "scale_rewards":  # booleans are normalised after construction
            assert got == {True: "group", False: "none"}.get(value, value)
        else:
            assert got == value, (name, got, value)
    assert trl_facts.grpo_defaults(["beta", "no_such_option"]) == {"beta": fresh.beta}


def test_the_reading_of_the_defaults_follows_the_installed_config(fresh):
    r = trl_facts.installed_reading()
    assert r == trl_facts.installed_reading(fresh)
    assert r.beta == fresh.beta and r.kl_active == (fresh.beta > 0)
    assert r.kl == ("k3_ratio" if fresh.use_bias_correction_kl else "k3")
    assert r.kl_target == ESTIMATOR_TARGETS[r.kl]
    assert r.group_size == fresh.num_generations and r.mu == fresh.num_iterations
    assert r.calibration == advantage_calibration(fresh.scale_rewards, fresh.num_generations)
    assert r.clip_low == fresh.epsilon
    assert r.clip_high == (fresh.epsilon if fresh.epsilon_high is None else fresh.epsilon_high)
    assert (r.loss_type, r.temperature, r.learning_rate) == (
        fresh.loss_type, fresh.temperature, fresh.learning_rate)


@pytest.mark.parametrize(("changes", "calibration", "kl", "settles"), [
    ({"scale_rewards": "group", "beta": 0.1}, "trl", "k3_ratio", "the paper's fixed point"),
    ({"scale_rewards": "none", "beta": 0.1}, "mean_only", "k3_ratio", "the paper's fixed point"),
    ({"scale_rewards": "batch", "beta": 0.1}, None, "k3_ratio", "no per-prompt prediction"),
    ({"use_bias_correction_kl": False, "beta": 0.1}, "trl", "k3", "the reverse-KL fixed point"),
    ({"beta": 0.0}, "trl", "k3_ratio", "PoS 1 (no anchor)"),
])
def test_a_config_maps_to_the_theory_objects(trl, tmp_path, changes, calibration, kl, settles):
    settings = {"num_generations": 4, "per_device_train_batch_size": 4,
                "use_bias_correction_kl": True, **changes}
    args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **settings)
    r = trl_facts.installed_reading(args)
    expected = (None if calibration is None else
                dataclasses.replace(theory.CALIBRATIONS[calibration], group_size=4))
    assert r.calibration == expected and r.predicts == (expected is not None)
    assert r.kl == kl and r.settles_at == settles


def test_a_trl_without_the_bias_correction_option_is_plain_k3(trl):
    old = SimpleNamespace(beta=0.04, scale_rewards="group", num_generations=8)
    assert trl_facts.kl_estimator(old) == "k3"
    assert trl_facts.installed_reading(old).kl_target == "reverse"


def test_option_rows_state_the_installed_defaults(fresh):
    rows = trl_facts.option_rows()
    assert [r["name"] for r in rows] == [o.name for o in trl_facts.OPTIONS]
    for row in rows:
        assert row["value"] == row["default"] == trl_facts.grpo_defaults()[row["name"]]
        assert row["implies"] and "unknown" not in row["implies"]
    beta = next(r for r in rows if r["name"] == "beta")
    assert ("no KL term" in beta["implies"]) == (fresh.beta == 0)
    changed = {r["name"]: r for r in trl_facts.option_rows(
        SimpleNamespace(**{**trl_facts.grpo_defaults(), "scale_rewards": "batch"}))}
    assert "no per-prompt recurrence" in changed["scale_rewards"]["implies"]
    with pytest.raises(ValueError, match="no entry"):
        trl_facts.describe("not_an_option", 1)


def test_without_trl_every_call_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now raises ImportError
    for call in (trl_facts.trl_version, trl_facts.grpo_defaults, trl_facts.installed_reading,
                 trl_facts.option_rows):
        with pytest.raises(trl_facts.TRLNotInstalledError, match="pip install") as info:
            call()
        assert isinstance(info.value, ImportError) and "TRL is not installed" in str(info.value)


# ----------------------------------------------- what rl.losses says about TRL's defaults
CLAIM = re.compile(r"TRL (\d+\.\d+) defaults\s+to\s+``(\w+)=([^`]+)``")


def _docstrings(module) -> str:
    texts = [module.__doc__ or ""]
    for _, obj in inspect.getmembers(module, inspect.isfunction):
        if obj.__module__ == module.__name__:
            texts.append(obj.__doc__ or "")
    return "\n".join(texts)


def test_the_trl_defaults_in_the_losses_docstrings_are_the_installed_ones(trl):
    """Every "TRL x.y defaults to ``name=value``" of rl.losses, against trl.GRPOConfig.

    On a TRL upgrade that changes a default, this fails: reword the docstring
    (and chapter 7's and chapter 11's glued prose follows by itself).
    """
    claims = CLAIM.findall(_docstrings(losses))
    names = {name for _, name, _ in claims}
    assert {"use_bias_correction_kl", "scale_rewards", "beta", "loss_type"} <= names, claims
    installed = ".".join(trl.__version__.split(".")[:2])
    defaults = trl_facts.grpo_defaults(names)
    for version, name, value in claims:
        assert version == installed, (
            f"rl.losses speaks of TRL {version} but {trl.__version__} is installed: re-check "
            f"its {name} and reword")
        assert ast.literal_eval(value) == defaults[name], (name, value, defaults[name])


@pytest.mark.parametrize("bias_correction", [True, False])
def test_beta_and_mu_rows_name_the_estimators_own_fixed_points_and_round(bias_correction):
    # the rows once said "forward KL" and "approaches Theorem 2's exact step" whatever the
    # estimator; both hold for k3_ratio only. The numbers behind the plain-k3 wording:
    config = SimpleNamespace(beta=1.0, use_bias_correction_kl=bias_correction,
                             num_iterations=4, scale_rewards="group", num_generations=8)
    beta_row = trl_facts.describe("beta", 1.0, config)
    mu_row = trl_facts.describe("num_iterations", 4, config)
    cal = theory.Calibration(normalization="mean_std", group_size=8)
    lp, lr = np.float64(-0.8473), np.float64(-0.8473)  # from p_ref 0.3
    est = "k3_ratio" if bias_correction else "k3"
    solved = trained_loss.round_step_logit(lp, lr, 1.0, estimator=est, calibration=cal)
    forward = trained_loss.exact_step_logit(lp, lr, 1.0, estimator="k3_ratio",
                                                   calibration=cal)
    reverse = trained_loss.exact_step_logit(lp, lr, 1.0, estimator="k3", calibration=cal)
    if bias_correction:
        assert "forward KL" in beta_row and "reverse" not in beta_row
        assert "Theorem 2's exact step" in mu_row
        assert solved == pytest.approx(forward, abs=1e-9)
    else:
        assert "reverse KL" in beta_row and "forward" not in beta_row
        assert "p (1 - p) Omega(p) = beta (p - p_ref)" in beta_row
        assert "round_step_logit" in mu_row and "neither Theorem 2's step nor" in mu_row
        assert abs(solved - forward) > 0.1 and abs(solved - reverse) > 0.1
