"""Command line: help, validation before any output, small runs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_companion.rl import cli

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--n-prompts", "8", "--n-outputs", "4", "--iterations", "2", "--no-progress"]


def _run(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_help_lists_every_option():
    # every field is checked by tests/rl/test_rl_config.py; here the standalone entry point
    out = _run("-m", "grpo_companion.rl.cli", "--help")
    assert out.returncode == 0
    for option in ("--task", "--out", "--beta", "--alpha", "--normalization", "--group-size",
                   "--mu", "--clip-eps-low", "--kl", "--iterations", "--seed", "--device",
                   "--exact", "--resume", "--loss-type", "--eps-placement", "--ddof",
                   "--calibration", "--no-progress", "TRL GRPOConfig"):
        assert option in out.stdout


def test_lead_cli_train_subcommand_help():
    out = _run("-m", "grpo_companion", "train", "--help")
    if "No module named" in out.stderr:
        pytest.skip(f"lead CLI dependencies missing: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0 and "--clip-eps-low" in out.stdout


@pytest.mark.parametrize("bad", [
    ["--beta", "-1"], ["--alpha", "2"], ["--kl", "k9"], ["--group-size", "0"],
    ["--task", "sequence", "--exact"], ["--clip-eps-low", "3"], ["--device", "tpu"],
    ["--clip-eps-low", "None", "--clip-eps-high", "0.3"], ["--eps", "nan"], ["--lr", "none"],
])
def test_invalid_options_exit_2_without_output(tmp_path, bad, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        status = cli.main(["--out", str(out), *SMALL, *bad])
        raise SystemExit(status)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err
    assert not out.exists()


def test_small_runs_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["--out", str(out), *SMALL, "--kl", "exact", "--loss-type", "bnpo"]) == 0
    assert {"metrics.csv", "iterations.csv", "run.json", "checkpoint.pt"} <= {
        p.name for p in out.iterdir()}
    assert cli.main(["--out", str(out), *SMALL]) == 2  # not empty, no --resume
    assert "not empty" in capsys.readouterr().err
    assert cli.main(["--out", str(out), *SMALL, "--kl", "exact", "--loss-type", "bnpo",
                     "--resume"]) == 0
    exact = tmp_path / "exact"
    assert cli.main(["--out", str(exact), *SMALL, "--exact", "--alpha", "0"]) == 0
    assert "done" in capsys.readouterr().out
