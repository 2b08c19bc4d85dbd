"""Reliability probes of ``python -m grpo_companion train``: one writer per folder, a run's
identity on ``--resume``, folders left by a stop before the first checkpoint, and values
that used to be accepted and then crash mid-run.

Each test names the failure it guards against ("before: ...").
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from test_rl_reliability import FAST, SMALL, _cli, _one_line_error, _subprocess

from grpo_companion import theory
from grpo_companion.rl import losses
from grpo_companion.rl import run_state as trainer_module
from grpo_companion.rl.trainer import (
    TrainConfig,
    TrainingFault,
    check_machine,
    estimate_memory,
    prepare_run,
    train,
)

RESULT_FILES = ["checkpoint.pt", "iterations.csv", "metrics.csv", "run.json"]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ------------------------------------------------------- 1. one writer per folder
def test_a_second_writer_is_refused_while_a_run_holds_the_folder(tmp_path, capsys):
    # before: the second run passed the empty-folder check too and both wrote the folder
    out = tmp_path / "run"
    first = prepare_run(TrainConfig.flat(**FAST), out_dir=out)  # holds the folder from here
    listing = _names(out) if out.exists() else []
    status, stdout, err = _cli(["--out", out, *SMALL, "--beta", "0.3"], capsys)
    assert status == 2 and "done" not in stdout
    _one_line_error(err)
    assert "in use" in err and str(out) in err
    assert (_names(out) if out.exists() else []) == listing  # nothing of the first touched
    first.run()
    assert _names(out) == RESULT_FILES
    assert json.loads((out / "run.json").read_text())["config"]["beta"] == 0.1


def test_two_runs_started_together_on_one_folder_give_one_run(tmp_path):
    # before: both exited 0 and one silently replaced the other's files, or one died with
    # FileNotFoundError (a temporary removed by the other's cleanup)
    out = tmp_path / "run"
    betas = ("0.1", "0.3")
    processes = [_subprocess("--out", out, *SMALL, "--beta", beta) for beta in betas]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in processes]
    codes = [code for code, _ in results]
    assert sorted(codes) == [0, 2], results
    winner = betas[codes.index(0)]
    _one_line_error(results[codes.index(2)][1])
    assert json.loads((out / "run.json").read_text())["config"]["beta"] == float(winner)
    assert _names(out) == RESULT_FILES


def test_a_lock_file_left_by_a_killed_run_does_not_block_the_folder(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("")  # what a SIGKILL leaves: the file, no lock on it
    status, _, err = _cli(["--out", out, *SMALL], capsys)
    assert status == 0, err
    assert _names(out) == RESULT_FILES


# ------------------------------------------------------------- 2. a run's identity
def _gains_a(succ, fail, n, cal, ops):
    return fail, succ


def _gains_b(succ, fail, n, cal, ops):
    return 2 * fail, 2 * succ


@pytest.fixture
def custom_normalization():
    theory.register_normalization("probe_norm", _gains_a, summary="probe", replace=True)
    yield "probe_norm"
    theory.unregister_normalization("probe_norm")


def test_resume_refuses_a_normalisation_registered_again(tmp_path, capsys,
                                                         custom_normalization):
    # before: --resume went on silently with the other definition (exit 0)
    out = tmp_path / "run"
    args = ["--out", out, *SMALL, "--normalization", custom_normalization]
    status, _, err = _cli(args, capsys)
    assert status == 0, err
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    theory.register_normalization(custom_normalization, _gains_b, summary="probe",
                                  replace=True)
    status, _, err = _cli([*args, "--resume"], capsys)
    assert status == 2
    _one_line_error(err)
    assert "normalisation 'probe_norm'" in err and "changed" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_resume_refuses_changed_kl_estimator_code(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    status, _, err = _cli(["--out", out, *SMALL], capsys)
    assert status == 0, err

    def kl_penalty(logp, anchor_logp, kl, prev_logp=None):  # another estimator's code
        return (anchor_logp - logp).square()

    monkeypatch.setattr(losses, "kl_penalty", kl_penalty)
    status, _, err = _cli(["--out", out, *SMALL, "--resume"], capsys)
    assert status == 2
    _one_line_error(err)
    assert "KL" in err and "changed" in err


def test_resume_refuses_a_checkpoint_without_fingerprint(tmp_path, capsys):
    # an older trainer's checkpoint cannot show which code made it: refused, not trusted
    out = tmp_path / "run"
    status, _, err = _cli(["--out", out, *SMALL], capsys)
    assert status == 0, err
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    state.pop("fingerprint", None)
    torch.save(state, out / "checkpoint.pt")
    status, _, err = _cli(["--out", out, *SMALL, "--resume"], capsys)
    assert status == 2
    _one_line_error(err)
    assert "fingerprint" in err


def test_resume_with_the_same_code_still_works(tmp_path, capsys, custom_normalization):
    out = tmp_path / "run"
    args = ["--out", out, *SMALL, "--normalization", custom_normalization]

    def stop(n):
        if n == 2:
            raise KeyboardInterrupt

    config = TrainConfig.flat(**FAST, normalization=custom_normalization)
    with pytest.raises(KeyboardInterrupt):
        train(config, out_dir=out, callback=stop)
    status, _, err = _cli([*args, "--resume"], capsys)
    assert status == 0, err
    assert _names(out) == RESULT_FILES


# ------------------------------------------ 3. stops before the first checkpoint
def _interrupted_before_checkpoint(out: Path) -> None:
    config = TrainConfig.flat(**{**FAST, "checkpoint_every": 10})

    def stop(n):
        raise KeyboardInterrupt  # at iteration 1, before any checkpoint

    with pytest.raises(KeyboardInterrupt):
        train(config, out_dir=out, callback=stop)
    assert not (out / "checkpoint.pt").exists()


@pytest.mark.parametrize("resume", [False, True])
def test_a_folder_stopped_before_its_first_checkpoint_is_reused(tmp_path, capsys, resume):
    # before: a fresh run said "not empty" and --resume said "no checkpoint" (exit 2 both)
    out = tmp_path / "run"
    _interrupted_before_checkpoint(out)
    record = json.loads((out / "run.json").read_text())
    record["status"] = "running"  # as a SIGKILL leaves it
    (out / "run.json").write_text(json.dumps(record))
    (out / ".checkpoint.pt.x1y2.tmp").write_bytes(b"partial")
    (out / ".lock").write_text("")
    status, stdout, err = _cli(["--out", out, *SMALL, *(["--resume"] if resume else [])],
                               capsys)
    assert status == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "no checkpoint" in lines[0] and "Traceback" not in err
    assert "done" in stdout
    assert _names(out) == RESULT_FILES


def test_a_folder_with_other_files_is_not_reused(tmp_path, capsys):
    out = tmp_path / "run"
    _interrupted_before_checkpoint(out)
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    status, _, err = _cli(["--out", out, *SMALL], capsys)
    assert status == 2
    _one_line_error(err)
    assert "not empty" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def _sequence(sft_steps: int) -> list[str]:
    """A tiny sequence-task run; with many ``sft_steps`` it stays in pre-training."""
    return ["--task", "sequence", "--max-operand", "9", "--n-eval-prompts", "4",
            "--eval-samples", "2", "--group-size", "2", "--prompts-per-iteration", "2",
            "--d-model", "8", "--n-heads", "1", "--n-layers", "1", "--sft-batch-size", "16",
            "--sft-steps", str(sft_steps), "--iterations", "1", "--no-progress"]


SEQUENCE = _sequence(100_000)


def _wait_for_status(path: Path, process: subprocess.Popen, after: float, status: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.stderr.read()
        if path.exists() and path.stat().st_mtime >= after:
            try:
                if json.loads(path.read_text()).get("status") == status:
                    return
            except json.JSONDecodeError:
                pass
        assert time.monotonic() < deadline, f"{path} never said {status!r}"
        time.sleep(0.02)


def test_signals_during_pretraining_then_rerun(tmp_path, capsys, monkeypatch):
    # before: after SIGKILL the same command said "not empty" (exit 2); after SIGTERM it
    # promised "--resume continues from the last checkpoint", and --resume then exited 2
    out = tmp_path / "run"
    started = time.time() - 1
    killed = _subprocess("--out", out, *SEQUENCE)
    _wait_for_status(out / "run.json", killed, started, "running")  # pre-training
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    started = time.time()
    again = _subprocess("--out", out, *SEQUENCE)  # the same command
    _wait_for_status(out / "run.json", again, started, "running")
    again.send_signal(signal.SIGTERM)
    code = again.wait(timeout=60)
    err = again.stderr.read()
    assert code == 143, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2 and "no checkpoint" in lines[0], err  # the reuse note, the stop
    assert "--resume continues" not in err and "rerun the same command" in lines[1]
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    # the rerun it advises works (its pre-training shortened here: only the folder matters)
    monkeypatch.setattr(trainer_module, "pretrain_reference", lambda *args, **kwargs: [])
    status, stdout, err = _cli(["--out", out, *SEQUENCE], capsys)
    assert status == 0 and "done" in stdout, err
    assert _names(out) == RESULT_FILES


# ------------------------------------------- 4. values that crashed mid-run
@pytest.mark.parametrize(("args", "option", "valid"), [
    (["--eps", "1e-310"], "--eps", "1e-300"),
    (["--group-size", "1"], "--group-size", ">= 2"),
    (["--clip-eps-high", "1e39"], "--clip-eps-high", "inf"),
    (["--exact", "--exact-group-size", str(10**11)], "--exact-group-size", "an int in [2, "),
    ([*_sequence(0), "--seed", str(2 * 10**13)], "--seed", "an int in [0, "),
])
def test_values_that_crashed_mid_run_are_refused_up_front(tmp_path, capsys, args, option,
                                                          valid):
    # before: accepted, then a traceback (exit 1) with run.json and history.bin left behind
    out = tmp_path / "run"
    status, _, err = _cli(["--out", out, *SMALL, *args], capsys)
    assert status == 2 and not out.exists(), err
    _one_line_error(err)
    assert f"error: {option} must be" in err and valid in err


def test_clip_eps_high_inf_still_means_no_upper_clipping(tmp_path, capsys):
    status, _, err = _cli(["--out", tmp_path / "run", *SMALL, "--clip-eps-high", "inf"],
                          capsys)
    assert status == 0, err


def _nan_at_one_fifth(succ, fail, n, cal, ops):
    # 0/0 at succ = 1/5 exactly (a group of 5 with one success); finite elsewhere
    return fail * (succ - 0.2) / (succ - 0.2), succ


def _nan_below_a_hundredth(succ, fail, n, cal, ops):
    root = ops.sqrt(succ - 0.01)  # NaN for p < 0.01
    return fail * root, succ * root


def test_gains_not_finite_for_the_group_size_are_refused_before_the_run(tmp_path):
    # before: ValueError from inside the first iteration, after run.json was written
    theory.register_normalization("probe_nan", _nan_at_one_fifth, summary="x", replace=True)
    try:
        with pytest.raises(ValueError, match="probe_nan.*not finite"):
            train(TrainConfig.flat(**FAST, group_size=5, normalization="probe_nan"),
                  out_dir=tmp_path / "run")
        assert not (tmp_path / "run").exists()
    finally:
        theory.unregister_normalization("probe_nan")


def test_population_weights_not_finite_stop_with_a_true_message(tmp_path):
    # before: a ValueError traceback from the theory (or "diverged ... change --beta")
    theory.register_normalization("probe_sqrt", _nan_below_a_hundredth, summary="x",
                                  replace=True)
    try:
        config = TrainConfig.flat(**FAST, exact=True, normalization="probe_sqrt",
                                  p_ref=(0.001, 0.5))
        with pytest.raises(TrainingFault) as caught:
            train(config, out_dir=tmp_path / "run")
        message = str(caught.value)
        assert "probe_sqrt" in message and "not finite" in message
        assert "--lr" not in message and "--beta" not in message
        record = json.loads((tmp_path / "run" / "run.json").read_text())
        assert record["status"] == "failed"
    finally:
        theory.unregister_normalization("probe_sqrt")


def test_memory_estimate_counts_the_iteration_rows():
    # before: the rows of iterations.csv, kept in memory for every iteration, were left out
    config = TrainConfig.flat(**{**FAST, "iterations": 10**6, "eval_every": 10**6})
    need, _ = estimate_memory(config)
    assert need >= 10**6 * 200
    too_large = TrainConfig.flat(**{**FAST, "iterations": 10**9, "eval_every": 10**9})  # builds
    with pytest.raises(ValueError, match="GiB"):
        check_machine(too_large)
    with pytest.raises(ValueError, match="GiB"):
        prepare_run(too_large)


def test_exact_group_size_is_in_the_memory_estimate():
    small = estimate_memory(TrainConfig.flat(**FAST, exact=True))[0]
    large = estimate_memory(TrainConfig.flat(**FAST, exact=True, exact_group_size=10**6))[0]
    assert large - small >= 8 * 32 * 10**6
    assert math.isfinite(large)
