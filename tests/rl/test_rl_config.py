"""TrainConfig declared once, nested by concern: validation, command line, variants, TRL names."""

import ast
import dataclasses
import inspect
import math
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

from grpo_companion import theory
from grpo_companion.rl import checks, cli, train_config
from grpo_companion.rl.train_config import SECTIONS, TrainConfig, calibration_fields, section_of

ROOT = Path(__file__).resolve().parents[2]
#: (class, field, check) of every field: the two switches and the sections' fields.
_HINTS = typing.get_type_hints(TrainConfig, include_extras=True)
FIELDS = [(TrainConfig, f, _HINTS[f.name].__metadata__[0]) for f in dataclasses.fields(TrainConfig)
          if f.name in ("task", "exact")] + [
    (cls, f, c) for cls in SECTIONS.values() for f, c in checks.checked_fields(cls)]
NAMES = [f.name for _, f, _ in FIELDS]
DEFAULTS = TrainConfig().to_dict()

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
TRL_NAMES = {"epsilon": "--clip-eps-low", "epsilon_high": "--clip-eps-high",
             "num_generations": "--group-size", "num_iterations": "--mu",
             "scale_rewards": "--normalization", "beta": "--beta", "loss_type": "--loss-type",
             "use_bias_correction_kl": "--kl", "temperature": "--temperature",
             "learning_rate": "--lr"}


def _parse(*argv: str) -> TrainConfig:
    return cli.parse_command(["--out", "unused", *argv]).config


@pytest.fixture(scope="module")
def train_help() -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "grpo_companion", "train", "--help"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    if "No module named" in out.stderr:
        pytest.skip(f"lead CLI dependencies missing: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0, out.stderr
    return out.stdout


def _flat_text(text: str) -> str:
    """Help text without its boxes and line breaks."""
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", text).split())


def _field_docstrings() -> dict[str, str]:
    """The docstring under every field of train_config's classes, read from the source."""
    tree = ast.parse(inspect.getsource(train_config))
    docs = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            body = node.body
            for stmt, after in zip(body, body[1:], strict=False):
                if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr) and \
                        isinstance(after.value, ast.Constant):
                    docs[stmt.target.id] = after.value.value
    return docs


# ----------------------------------------------------------- one declaration
def test_the_config_is_nested_by_concern_and_each_name_is_declared_once():
    assert set(SECTIONS) == {"run", "grpo", "optim", "bandit", "sequence", "model"}
    assert len(NAMES) == len(set(NAMES)) == len(section_of()) + 2
    config = TrainConfig()
    for cls, f, _ in FIELDS:
        owner = config if cls is TrainConfig else getattr(config, section_of()[f.name])
        assert isinstance(owner, cls) and hasattr(owner, f.name)


def test_every_field_has_a_one_line_docstring_and_a_check():
    docs = _field_docstrings()
    for _, f, check in FIELDS:
        assert isinstance(check, checks.Check), f.name
        assert docs.get(f.name, "").strip() and "\n" not in docs[f.name], f.name


def test_no_field_docstring_has_a_colon_outside_code():
    """The API pages read a field's docstring with napoleon, which takes the text before a colon
    for the field's type: "0: none" would render as a type "0" and a description "none"."""
    for name, doc in _field_docstrings().items():
        assert ":" not in re.sub(r"``[^`]*``", "", doc), name


def test_the_table_of_section_names_fails_on_a_duplicate():
    @dataclasses.dataclass(frozen=True)
    class Twice:
        beta: float = 0.1

    section_of.cache_clear()
    SECTIONS["twice"] = Twice
    try:
        with pytest.raises(TypeError, match="'beta' is declared twice"):
            section_of()
    finally:
        del SECTIONS["twice"]
        section_of.cache_clear()


def test_non_default_table_covers_every_field():
    assert set(NON_DEFAULT) | set(SEQUENCE_ONLY) == set(NAMES)
    config = TrainConfig.flat(**NON_DEFAULT).to_dict()
    assert all(config[name] != DEFAULTS[name] or name in ("task", *SEQUENCE_ONLY)
               for name in NAMES)
    sequence = TrainConfig.flat(task="sequence", grpo_prompts=10, **SEQUENCE_ONLY).to_dict()
    assert all(sequence[name] != DEFAULTS[name] for name in SEQUENCE_ONLY)


def test_flat_nested_and_replace_agree():
    nested = TrainConfig(task="sequence", grpo=train_config.GRPOConfig(beta=0.5, group_size=8),
                         run=train_config.RunConfig(seed=3), sequence=train_config.SequenceConfig(
                             grpo_prompts=10))
    flat = TrainConfig.flat(task="sequence", beta=0.5, group_size=8, seed=3, grpo_prompts=10)
    assert nested == flat == TrainConfig.flat(**flat.to_dict())
    assert flat.replace(seed=4).run.seed == 4 and flat.replace(seed=4).grpo == flat.grpo
    with pytest.raises(TypeError, match="no field 'betta'"):
        TrainConfig.flat(betta=0.5)
    with pytest.raises(ValueError, match="grpo must be a GRPOConfig"):
        TrainConfig(grpo={"beta": 0.5})


# ------------------------------------------------------------- command line
def test_every_field_is_in_train_help_with_its_docstring(train_help):
    text, docs = _flat_text(train_help), _field_docstrings()
    for name in NAMES:
        assert checks.option_of(name) in text, name
        assert " ".join(docs[name].split()[:6]) in text, name


def test_cli_defaults_round_trip_to_the_dataclass():
    assert _parse() == TrainConfig()


def _argv(values: dict) -> list[str]:
    """Command-line words for ``values``, written by hand (not by the generator)."""
    argv = []
    for name, value in values.items():
        option = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(option if value else "--no-" + option[2:])
        elif isinstance(value, tuple | list):
            argv += [option, *map(str, value)]
        else:
            argv += [option, "None" if value is None else str(value)]
    return argv


def test_every_field_round_trips_through_the_command_line():
    assert _parse(*_argv(NON_DEFAULT)) == TrainConfig.flat(**NON_DEFAULT)
    assert _parse(*_argv(DEFAULTS)) == TrainConfig()


def test_spellings_of_the_command_line():
    config = _parse("--no-progress", "--exact", "--clip-eps-low", "None", "--p-ref", "0.1", "0.9",
                    "--p-ref-beta", "2", "5", "--lr", "None", "--clip-eps-high", "inf")
    assert (config.run.progress, config.exact, config.grpo.clip_eps_low) == (False, True, None)
    assert config.bandit.p_ref == (0.1, 0.9) and config.bandit.p_ref_beta == (2.0, 5.0)
    assert config.optim.lr is None and math.isinf(config.grpo.clip_eps_high)
    assert _parse("--clip-eps-low", "0.1").grpo.clip_eps_low == 0.1


@pytest.mark.parametrize("argv, words", [
    (["--iterations", "x"], "--iterations: invalid literal"),
    (["--group-size", "1"], "--group-size must be an int >= 2"),
    (["--kl", "k9"], "invalid choice 'k9' for argument '--kl'"),
    (["--betta", "1"], "Unrecognized options: --betta"),
    (["--task", "sequence", "--exact"], "--exact must be False for task='sequence'"),
])
def test_bad_options_give_one_line_naming_the_option(argv, words):
    with pytest.raises(ValueError) as info:
        _parse(*argv)
    message = str(info.value)
    assert words in message and "\n" not in message and "\u2502" not in message


def test_bad_options_exit_2_with_one_line_on_stderr(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "grpo_companion", "train", "--out",
                          str(tmp_path / "run"), "--group-size", "1"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and not (tmp_path / "run").exists()
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("python -m grpo_companion train: error: --group-size must be")


@pytest.mark.parametrize("name", NAMES)
def test_every_field_is_validated_with_its_name(name):
    check = dict((f.name, c) for _, f, c in FIELDS)[name]
    with pytest.raises(ValueError, match=rf"^{name} must be .*, got ") as info:
        TrainConfig.flat(**{name: object()})
    assert check.describe() in str(info.value)


def test_validation_reads_the_normalisation_registry_when_it_runs():
    name = "test_config_doubled"
    with pytest.raises(ValueError, match="normalization"):
        TrainConfig.flat(normalization=name)
    theory.register_normalization(name, lambda succ, fail, n, cal, ops: (2 * fail, 2 * succ),
                                  summary="twice the centred reward (test)")
    try:
        assert TrainConfig.flat(normalization=name).calibration.normalization == name
        variant = theory.Variant(theory.Calibration(name), theory.Anchor.mirror())
        assert TrainConfig.flat(variant=variant).variant == variant
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
    config = TrainConfig.flat(variant=variant, beta=0.3)
    assert config.variant == variant and config.grpo.beta == 0.3
    cal = variant.calibration
    assert (config.grpo.normalization, config.grpo.eps, config.grpo.eps_placement, config.grpo.ddof,
            config.grpo.exact_group_size, config.grpo.alpha) == (
        cal.normalization, cal.eps, cal.eps_placement, cal.ddof, cal.group_size, variant.alpha)
    assert TrainConfig.flat(**config.to_dict()) == config
    assert config.replace(beta=0.5).variant == variant


def test_a_variant_and_a_conflicting_field_are_refused_naming_both():
    trl = theory.Variant("trl")
    with pytest.raises(ValueError, match=r"variant=.* sets eps=0\.0001, but eps=0\.001"):
        TrainConfig.flat(variant=trl, eps=1e-3)
    with pytest.raises(ValueError, match=r"alpha=1\.0, but alpha=0\.0"):
        TrainConfig.flat(variant=trl, alpha=0.0)
    assert TrainConfig.flat(variant=trl, eps=1e-4, ddof=1).grpo.eps == 1e-4  # agreeing is fine
    with pytest.raises(ValueError, match="variant must be a theory.Variant"):
        TrainConfig.flat(variant="trl")


def test_calibration_preset_on_the_command_line(capsys, tmp_path):
    config = _parse("--calibration", "trl", "--alpha", "0")
    assert config.variant == theory.Variant("trl", theory.Anchor.mirror())
    assert _parse("--calibration", "mean_only").grpo.normalization == "mean_only"
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
    assert checks.trl_table_text(SECTIONS.values()) in train_help
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
    assert checks.trl_table_markdown(SECTIONS.values()) in (ROOT / "api" / "rl.md").read_text()


def test_inf_is_no_upper_clipping():
    assert math.isinf(TrainConfig.flat(clip_eps_high=math.inf).grpo.clip_eps_high)


def test_building_a_config_probes_no_device_and_no_memory(monkeypatch):
    """A config is data: made, replaced and compared anywhere; the machine is asked at run time."""

    from grpo_companion.rl import machine as trainer

    def probe(*_args, **_kwargs):
        raise AssertionError("building a TrainConfig probed the machine")

    monkeypatch.setattr(torch.cuda, "is_available", probe)
    monkeypatch.setattr(torch.cuda, "get_device_properties", probe)
    monkeypatch.setattr(trainer, "memory_limit_bytes", probe)
    config = TrainConfig.flat(task="bandit", device="cuda:1", exact_group_size=8, progress=False)
    again = config.replace(seed=3, iterations=10**9, eval_every=10**9)
    assert again.run.device == "cuda:1" and again != config
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu' or 'cuda"):
        TrainConfig.flat(device="tpu")  # the form of the device is still checked at once
    with pytest.raises(AssertionError, match="probed the machine"):
        trainer.check_machine(again)  # the machine is asked here, and by prepare_run


def test_check_machine_refuses_what_this_machine_cannot_hold():
    from grpo_companion.rl import trainer

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            trainer.check_machine(TrainConfig.flat(device="cuda", progress=False))
        with pytest.raises(ValueError, match="no CUDA"):
            trainer.prepare_run(TrainConfig.flat(device="cuda", progress=False))
    with pytest.raises(ValueError, match="GiB"):
        trainer.check_machine(TrainConfig.flat(task="bandit", group_size=100_000, n_prompts=100_000,
                                               progress=False))
    trainer.check_machine(TrainConfig.flat(task="bandit", progress=False))  # the defaults fit


def test_tyro_reads_the_declarations_without_a_warning():
    """A type tyro cannot read (e.g. a Literal of a tuple subclass) only warns, then misparses."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.parse_command(["--out", "x"]).config == TrainConfig()
