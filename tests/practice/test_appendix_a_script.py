"""scripts/appendix_a_trl.py: its command line, its defaults (the paper's) and its dry run.

The script itself needs the Qwen weights, GSM8K and GPUs; nothing here loads a
model or a dataset.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..setup._load import ROOT, script

app = script("appendix_a_trl")


def test_help_works_without_touching_trl():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "appendix_a_trl.py"), "--help"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "Appendix A" in out and "--dry-run" in out and "--probe-samples" in out


def test_defaults_are_the_papers_values():
    ns = app.parse_args([])
    assert ns.model == "Qwen/Qwen2.5-0.5B-Instruct"                    # App. A, setup
    assert (ns.learning_rate, ns.epsilon, ns.beta, ns.mu) == (5e-6, 0.2, 0.1, 10)  # App. A
    assert (ns.group_size, ns.per_device_batch, ns.grad_accum) == (16, 16, 4)    # App. H
    assert (ns.max_completion_length, ns.temperature) == (200, 0.1)               # App. H
    assert ns.probe_samples == 50 and ns.epochs == 1                              # App. A
    assert ns.vllm and ns.scale_rewards == "group"
    # where the paper is silent: the DeepSeekMath per-sequence average and plain k3
    assert ns.loss_type == "grpo" and ns.kl_bias_correction is False


def test_dry_run_builds_the_config_and_loads_nothing(tmp_path, monkeypatch, capsys):
    import datasets
    import transformers
    import trl

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run must not load a model, a tokenizer or a dataset")

    for module, name in [(transformers.AutoModelForCausalLM, "from_pretrained"),
                         (transformers.AutoTokenizer, "from_pretrained"),
                         (datasets, "load_dataset"), (trl, "GRPOTrainer")]:
        monkeypatch.setattr(module, name, refuse)
    out = tmp_path / "run"
    assert app.main(["--dry-run", "--output-dir", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    config = printed["grpo_config"]
    assert config["learning_rate"] == 5e-6 and config["epsilon"] == 0.2
    assert config["beta"] == 0.1 and config["num_iterations"] == 10
    assert config["num_generations"] == 16 and config["per_device_train_batch_size"] == 16
    assert config["gradient_accumulation_steps"] == 4 and config["max_completion_length"] == 200
    assert config["temperature"] == 0.1 and config["loss_type"] == "grpo"
    assert config["use_vllm"] and config["vllm_mode"] == "server"
    assert printed["prompts_per_step_on_7_training_gpus"] == 28  # App. H
    theory = printed["theory"]
    assert theory["beta"] == 0.1 and theory["group_size"] == 16
    assert theory["calibration"]["normalization"] == "mean_std"
    assert theory["calibration"]["eps"] == 1e-4 and theory["calibration"]["ddof"] == 1
    assert theory["kl"] == "k3" and theory["kl_target"] == "reverse"
    assert theory["steps_per_iteration"] == 10.0  # mu x steps_per_generation / accumulation
    assert not out.exists()


def test_the_config_follows_the_flags():
    ns = app.parse_args(["--kl-bias-correction", "--scale-rewards", "none", "--no-vllm",
                         "--beta", "0.04", "--precision", "fp32"])
    config = app.build_config(ns, dry_run=True)
    assert config.use_bias_correction_kl and config.scale_rewards == "none"
    assert not config.use_vllm and config.beta == 0.04 and not config.bf16
    theory = app.summary(ns, config)["theory"]
    assert theory["kl_target"] == "forward"
    assert theory["calibration"]["normalization"] == "mean_only"


@pytest.mark.parametrize(("completion", "gold", "expected"), [
    ("... so she has 18 eggs.\n#### 18", "18", 1),
    ("The answer is 1,234.", "1234", 1),
    ("#### 17", "18", 0),
    ("I do not know", "3", 0),
    ("3 apples and 4 pears: #### -2.5", "-2.5", 1),
])
def test_the_answer_check(completion, gold, expected):
    assert app.is_correct(completion, gold) == expected


def test_the_reward_reads_gsm8k_answers_and_chat_completions():
    answers = ["Natalia sold 48/2 = 24 clips.\n#### 72", "#### 1,000"]
    completions = [[{"role": "assistant", "content": "So 72 in total. #### 72"}], "1000"]
    assert app.gold_answer(answers[1]) == "1000"
    assert app.correctness_reward(None, completions, answers) == [1.0, 1.0]
