"""TrainConfig declared once: validation, command line, variants and TRL names from its fields."""

import argparse
import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_companion import theory
from grpo_companion.rl import cli
from grpo_companion.rl import config as fields
from grpo_companion.rl.trainer import TrainConfig, calibration_fields

ROOT = Path(__file__).resolve().parents[2]
FIELDS = dataclasses.fields(TrainConfig)

#: A valid configuration in which no field has its default value.
NON_DEFAULT = {
    "task": "bandit", "exact": True, "iterations": 3, "seed": 7, "device": "cpu",
    "dtype": "float64", "progress": False, "checkpoint_every": 2, "eval_every": 2,
    "beta": 0.25, "alpha": 0.5, "ref_reset_every": 2, "ref_mixup_alpha": 0.6,
    "normalization": "mean_only", "eps": 1e-3,
    "eps_placement": "std",
    "ddof": 1, "exact_group_size": 8, "group_size": 4, "mu": 2, "clip_eps_low": 0.1,
    "clip_eps_high": 0.3, "kl": "k2", "loss_type": "dapo", "optimizer": "sgd", "lr": 0.05,
    "temperature": 0.9, "prompts_per_iteration": 3, "n_prompts": 6, "n_outputs": 5,
    "n_success": 2, "p_ref": (0.2, 0.6), "p_ref_beta": (1.0, 3.0), "p_ref_zero_fraction": 0.3,
    "logit_scale": 0.5, "max_operand": 9, "n_eval_prompts": 20, "grpo_prompts": 10,
    "eval_samples": 3,
    "carry_error_span": 4.0, "sft_steps": 7, "sft_batch_size": 16, "sft_lr": 1e-3,
    "d_model": 8, "n_layers": 1, "n_heads": 2, "exact_tol": 1e-9, "exact_step": 0.25,
    "exact_max_iter": 40,
}
#: Fields that only a sampled sequence run accepts, with non-default values.
SEQUENCE_ONLY = {"grpo_beta_multipliers": (2.0, 0.5)}
#: The field TRL uses for each name, as the issue states them.
TRL_NAMES = {"epsilon": "--clip-eps", "epsilon_high": "--clip-eps-high",
             "num_generations": "--group-size", "num_iterations": "--mu",
             "scale_rewards": "--normalization", "beta": "--beta", "loss_type": "--loss-type",
             "use_bias_correction_kl": "--kl", "temperature": "--temperature",
             "learning_rate": "--lr"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    cli.add_train_arguments(parser)
    return parser


def _parse(*argv: str) -> TrainConfig:
    return cli.config_from_args(_parser().parse_args(["--out", "unused", *argv]))


@pytest.fixture(scope="module")
def train_help() -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "grpo_companion", "train", "--help"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    if "No module named" in out.stderr:
        pytest.skip(f"lead CLI dependencies missing: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_non_default_table_covers_every_field():
    assert set(NON_DEFAULT) | set(SEQUENCE_ONLY) == {f.name for f in FIELDS}
    config = TrainConfig(**NON_DEFAULT)
    assert all(getattr(config, f.name) != f.default or f.name in ("task", *SEQUENCE_ONLY)
               for f in FIELDS)
    sequence = TrainConfig(task="sequence", grpo_prompts=10, **SEQUENCE_ONLY)
    assert all(getattr(sequence, name) != getattr(TrainConfig(), name) for name in SEQUENCE_ONLY)


def test_every_field_is_in_train_help_with_help_text(train_help):
    actions = {a.dest: a for a in _parser()._actions}
    for f in FIELDS:
        action = actions.get(f.name)
        assert action is not None, f"{f.name} has no command-line option"
        assert action.help and action.help.split("(default:")[0].strip(), f.name
        assert action.option_strings[0] in train_help, f.name
    # the options nobody could reach before
    for option in ("--carry-error-span", "--sft-batch-size", "--sft-lr", "--logit-scale",
                   "--exact-tol", "--exact-step", "--exact-max-iter"):
        assert option in train_help


def test_cli_defaults_round_trip_to_the_dataclass():
    assert _parse() == TrainConfig()


def _argv(values: dict) -> list[str]:
    """Command-line words for ``values``, written by hand (not by the generator)."""
    options = {"clip_eps_low": "--clip-eps"}
    argv = []
    for name, value in values.items():
        option = options.get(name, "--" + name.replace("_", "-"))
        if isinstance(value, bool):
            argv.append(option if value else "--no-" + option[2:])
        elif isinstance(value, tuple | list):
            argv += [option, *map(str, value)]
        else:
            argv += [option, "none" if value is None else str(value)]
    return argv


def test_every_field_round_trips_through_the_command_line():
    assert _parse(*_argv(NON_DEFAULT)) == TrainConfig(**NON_DEFAULT)
    assert _parse(*_argv(TrainConfig().to_dict())) == TrainConfig()


def test_existing_spellings_still_work():
    config = _parse("--no-progress", "--exact", "--clip-eps", "inf", "--p-ref", "0.1", "0.9",
                    "--p-ref-beta", "2", "5", "--lr", "none")
    assert (config.progress, config.exact, config.clip_eps_low) == (False, True, None)
    assert config.p_ref == (0.1, 0.9) and config.p_ref_beta == (2.0, 5.0) and config.lr is None
    assert _parse("--clip-eps-low", "0.1").clip_eps_low == 0.1


@pytest.mark.parametrize("f", FIELDS, ids=[f.name for f in FIELDS])
def test_every_field_is_validated_with_its_name(f):
    with pytest.raises(ValueError, match=rf"^{f.name} must be .*, got ") as info:
        TrainConfig(**{f.name: object()})
    assert f.metadata["check"].describe() in str(info.value)


def test_help_shows_the_valid_range_of_the_check():
    actions = {a.dest: a for a in _parser()._actions}
    assert "[1e-06, 1e+06]" in actions["beta"].help
    assert "an int >= 2" in actions["group_size"].help
    assert "(default: 0.5 2.0)" in actions["p_ref_beta"].help


def test_validation_reads_the_normalisation_registry_when_it_runs():
    name = "test_config_doubled"
    with pytest.raises(ValueError, match="normalization"):
        TrainConfig(normalization=name)
    theory.register_normalization(name, lambda succ, fail, n, cal, ops: (2 * fail, 2 * succ),
                                  summary="twice the centred reward (test)")
    try:
        assert TrainConfig(normalization=name).calibration.normalization == name
        variant = theory.Variant(theory.Calibration(name), theory.Anchor.mirror())
        assert TrainConfig(variant=variant).variant == variant
    finally:
        theory.unregister_normalization(name)


# ------------------------------------------------------------------- variants
VARIANTS = [
    theory.Variant(),
    theory.Variant("trl", theory.Anchor.mirror()),
    theory.Variant("mean_only", theory.Anchor.two_kl(0.3)),
    theory.Variant("rloo"),
    theory.Variant(theory.Calibration("mean_std", eps=1e-4, group_size=8, ddof=1),
                   theory.Anchor(0.5)),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_a_variant_sets_the_calibration_and_alpha_and_round_trips(variant):
    config = TrainConfig(variant=variant, beta=0.3)
    assert config.variant == variant and config.beta == 0.3
    cal = variant.calibration
    assert (config.normalization, config.eps, config.eps_placement, config.ddof,
            config.exact_group_size, config.alpha) == (
        cal.normalization, cal.eps, cal.eps_placement, cal.ddof, cal.group_size, variant.alpha)
    assert TrainConfig(**config.to_dict()) == config
    assert dataclasses.replace(config, beta=0.5).variant == variant


def test_a_variant_and_a_conflicting_field_are_refused_naming_both():
    trl = theory.Variant("trl")
    with pytest.raises(ValueError, match=r"variant=.* sets eps=0\.0001, but eps=0\.001"):
        TrainConfig(variant=trl, eps=1e-3)
    with pytest.raises(ValueError, match=r"alpha=1\.0, but alpha=0\.0"):
        TrainConfig(variant=trl, alpha=0.0)
    assert TrainConfig(variant=trl, eps=1e-4, ddof=1).eps == 1e-4  # agreeing is fine
    with pytest.raises(ValueError, match="variant must be a theory.Variant"):
        TrainConfig(variant="trl")


def test_calibration_preset_on_the_command_line(capsys, tmp_path):
    config = _parse("--calibration", "trl", "--alpha", "0")
    assert config.variant == theory.Variant("trl", theory.Anchor.mirror())
    assert _parse("--calibration", "mean_only").normalization == "mean_only"
    with pytest.raises(ValueError, match="--calibration trl sets --eps=0.0001, but --eps=0.01"):
        _parse("--calibration", "trl", "--eps", "0.01")
    out = tmp_path / "run"
    assert cli.main(["--out", str(out), "--calibration", "trl", "--ddof", "0"]) == 2
    assert "--ddof" in capsys.readouterr().err and not out.exists()


def test_trl_group_scaling_is_the_trl_calibration():
    fields_of_trl = calibration_fields(theory.CALIBRATIONS["trl"])
    assert fields_of_trl == {"normalization": "mean_std", "eps": 1e-4, "eps_placement": "std",
                             "ddof": 1, "exact_group_size": None}
    assert calibration_fields(theory.CALIBRATIONS["mean_only"])["normalization"] == "mean_only"


# ------------------------------------------------------------------- TRL names
def test_train_help_has_the_trl_name_table(train_help):
    assert fields.trl_table_text(TrainConfig) in train_help
    table = train_help[train_help.index("TRL GRPOConfig"):]
    rows = {line.split()[0]: line for line in table.splitlines()[1:] if not line.startswith("   ")}
    assert set(rows) == set(TRL_NAMES)
    for trl_name, option in TRL_NAMES.items():
        assert f" {option} " in rows[trl_name], trl_name
    bias = table[table.index("use_bias_correction_kl"):]
    assert 'True is kl="k3_ratio", False is kl="k3"' in " ".join(bias.split())
    scale = " ".join(table[table.index("scale_rewards"):].split())
    assert all(word in scale for word in ("--eps", "--eps-placement", "--ddof", "mean_only",
                                          '"batch"', "not supported"))


def test_api_page_holds_the_generated_table():
    assert fields.trl_table_markdown(TrainConfig) in (ROOT / "api" / "rl.md").read_text()


def test_every_field_is_declared_once_with_its_metadata():
    for f in FIELDS:
        assert isinstance(f.metadata["check"], fields.Check) and f.metadata["help"], f.name
    assert math.isinf(TrainConfig(clip_eps_high=math.inf).clip_eps_high)
    doc = TrainConfig.__doc__
    assert all(f"``{f.name}``" in doc for f in FIELDS)


def test_building_a_config_probes_no_device_and_no_memory(monkeypatch):
    """A config is data: made, replaced and compared anywhere; the machine is asked at run time."""
    import dataclasses

    from grpo_companion.rl import machine as trainer

    def probe(*_args, **_kwargs):
        raise AssertionError("building a TrainConfig probed the machine")

    monkeypatch.setattr(torch.cuda, "is_available", probe)
    monkeypatch.setattr(torch.cuda, "get_device_properties", probe)
    monkeypatch.setattr(trainer, "memory_limit_bytes", probe)
    config = TrainConfig(task="bandit", device="cuda:1", exact_group_size=8, progress=False)
    again = dataclasses.replace(config, seed=3, iterations=10**9, eval_every=10**9)
    assert again.device == "cuda:1" and again != config
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu' or 'cuda"):
        TrainConfig(device="tpu")  # the form of the device is still checked at once
    with pytest.raises(AssertionError, match="probed the machine"):
        trainer.check_machine(again)  # the machine is asked here, and by prepare_run


def test_check_machine_refuses_what_this_machine_cannot_hold():
    from grpo_companion.rl import trainer

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            trainer.check_machine(TrainConfig(device="cuda", progress=False))
        with pytest.raises(ValueError, match="no CUDA"):
            trainer.prepare_run(TrainConfig(device="cuda", progress=False))
    with pytest.raises(ValueError, match="GiB"):
        trainer.check_machine(TrainConfig(task="bandit", group_size=100_000, n_prompts=100_000,
                                          progress=False))
    trainer.check_machine(TrainConfig(task="bandit", progress=False))  # the defaults fit
