"""Reliability of ``train``: no silent NaN, no lost or stale files, a clear error for every fault.

Each test states the failure it guards against (issue 10). Command-line runs go
through ``grpo_companion.rl.cli.main`` in-process where that is enough, and
through a subprocess where the exit status, stderr or a signal is the point.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_companion import theory
from grpo_companion.rl import cli, io, losses
from grpo_companion.rl import trainer as trainer_module
from grpo_companion.rl.trainer import TrainConfig, TrainingFault, train

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--n-prompts", "8", "--n-outputs", "4", "--iterations", "3", "--no-progress"]
FAST = {"n_prompts": 8, "n_outputs": 4, "iterations": 3, "progress": False}


def _cli(args, capsys):
    """Run the command in-process; returns (status, stdout, stderr)."""
    try:
        status = cli.main([str(a) for a in args])
    except SystemExit as stop:  # argparse errors
        status = stop.code
    out = capsys.readouterr()
    return status, out.out, out.err


def _subprocess(*args, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "grpo_companion.rl.cli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT, **kwargs)


def _one_line_error(err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "error:" in lines[0] and "Traceback" not in err


def _metric_columns(path: Path) -> dict[str, list[float]]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {k: [float(r[k]) for r in rows] for k in rows[0]}


# ------------------------------------------------------------------ silent NaN
def test_exact_eps0_run_is_finite_and_follows_the_recurrence(tmp_path, capsys):
    # before: Calibration(eps=0).weights_of_logit(1500) was (nan, inf) and every metric
    # from iteration 3 on was NaN, yet the run was marked complete with exit status 0
    out = tmp_path / "run"
    status, stdout, err = _cli(["--exact", "--eps", "0", "--out", out, *SMALL,
                                "--n-prompts", "16", "--iterations", "4"], capsys)
    assert status == 0, err
    assert "nan" not in stdout
    columns = _metric_columns(out / "metrics.csv")
    for name in ("success_prob", "kl_ref", "kl_prev", "entropy"):
        assert all(math.isfinite(v) for v in columns[name]), name
    losses_ = _metric_columns(out / "iterations.csv")["loss"]
    assert all(math.isfinite(v) for v in losses_)
    # the trained PoS is the paper's recurrence with eps = 0 (p -> 1 within two steps)
    p = np.array(columns["success_prob"]).reshape(5, 16)
    p_ref = p[0]
    inner = p_ref > 0
    predicted = theory.iterate(p_ref[inner], p_ref[inner], 0.1, 4, eps=0.0)
    np.testing.assert_allclose(p[:, inner], predicted, atol=1e-12)
    assert np.all(p[:, ~inner] == 0)  # p_ref = 0 stays absorbed


def test_a_run_that_diverges_fails_clearly_instead_of_writing_nan(tmp_path, monkeypatch,
                                                                   capsys):
    real_step = trainer_module.grpo_iteration

    def poisoned(run, old):
        stats, clip = real_step(run, old)
        if run.iteration == 2:
            with torch.no_grad():
                run.policy.logits[0, 0] = math.nan
            stats = {**stats, "loss": math.nan}
        return stats, clip

    monkeypatch.setattr(trainer_module, "grpo_iteration", poisoned)
    out = tmp_path / "run"
    status, stdout, err = _cli(["--out", out, *SMALL], capsys)
    assert status == 1 and "done" not in stdout
    _one_line_error(err)
    assert "diverged at iteration 2" in err
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and "diverged" in record["error"]
    assert not (out / "metrics.csv").exists()


# ---------------------------------------------------- combinations that must run
def test_lbfgs_with_k1_is_refused_up_front(tmp_path, capsys):
    # before: accepted, then "invalid multinomial distribution" mid-run (k1 is unbounded below)
    out = tmp_path / "run"
    status, _, err = _cli(["--optimizer", "lbfgs", "--kl", "k1", "--out", out, *SMALL], capsys)
    assert status == 2 and not out.exists()
    _one_line_error(err)
    assert "lbfgs" in err and "k1" in err


def test_lbfgs_with_k3_ratio_runs(tmp_path):
    # before: crashed at iteration 7 with "value cannot be converted to type float without
    # overflow" (k3_ratio was exp(logp - old) * expm1(d), inf * 0 in float32)
    config = TrainConfig.flat(optimizer="lbfgs", kl="k3_ratio", n_prompts=8, n_outputs=4,
                              group_size=4, iterations=7, progress=False)
    result = train(config)
    for name in ("success_prob", "kl_ref", "kl_prev", "entropy"):
        assert np.isfinite(result.metrics[name]).all()


def test_k3_ratio_is_finite_where_its_factors_over_and_underflow():
    logp = torch.tensor([-200.0, -90.0, -1.5, -1.0, -0.2], requires_grad=True)  # float32
    anchor = torch.full((5,), -1.0)
    old = torch.full((5,), -1.0)
    value = losses.kl_penalty(logp, anchor, "k3_ratio", old)
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(logp.grad).all()
    # the same numbers as the textbook formula in float64, where that one is finite
    lp64 = logp.detach().double()
    d = anchor.double() - lp64
    naive = torch.exp(lp64 - old.double()) * (torch.expm1(d) - d)
    np.testing.assert_allclose(value.detach().double().numpy(), naive.numpy(), rtol=1e-5,
                               atol=1e-30)


# ------------------------------------------------------------- bad usage: exit 2
@pytest.mark.parametrize(("args", "names"), [
    (["--beta", "1e300"], "--beta"), (["--beta", "1e-300"], "--beta"),
    (["--lr", "1e300"], "--lr"), (["--temperature", "1e-300"], "--temperature"),
    (["--temperature", "1e300"], "--temperature"), (["--seed", str(2**70)], "--seed"),
    (["--group-size", "100000", "--n-prompts", "100000"], "GiB"),
    (["--task", "sequence", "--group-size", "100000", "--prompts-per-iteration", "2000"],
     "GiB"),
    (["--iterations", str(10**12)], "GiB"),
])
def test_values_that_would_crash_mid_run_are_refused_up_front(tmp_path, capsys, args, names):
    out = tmp_path / "run"
    status, _, err = _cli(["--out", out, *SMALL, *args], capsys)
    assert status == 2 and not out.exists()
    _one_line_error(err)
    assert names in err


def test_out_under_a_file_is_refused(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    status, _, err = _cli(["--out", blocker / "run", *SMALL], capsys)
    assert status == 2
    _one_line_error(err)
    assert str(blocker) in err and "is a file" in err


def _read_only_dir(tmp_path: Path) -> Path:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if not os.access(locked, os.W_OK):
        return locked
    if sys.platform.startswith("linux") and not os.access("/proc/sys", os.W_OK):
        return Path("/proc/sys")  # root ignores permissions, not a read-only mount
    pytest.skip("no read-only folder available")


def test_out_on_a_read_only_place_is_refused(tmp_path, capsys):
    locked = _read_only_dir(tmp_path)
    try:
        status, _, err = _cli(["--out", locked / "h10_run", *SMALL], capsys)
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert status == 2 and not (locked / "h10_run").exists()
    _one_line_error(err)
    assert "read-only" in err and str(locked) in err


def _finished_run(tmp_path: Path, capsys) -> Path:
    out = tmp_path / "run"
    status, _, err = _cli(["--out", out, *SMALL], capsys)
    assert status == 0, err
    return out


def test_resume_with_other_options_is_a_clear_error(tmp_path, capsys):
    # before: refused with a ValueError traceback and exit status 1
    out = _finished_run(tmp_path, capsys)
    before = (out / "run.json").read_bytes()
    status, _, err = _cli(["--out", out, *SMALL, "--beta", "0.3", "--resume"], capsys)
    assert status == 2
    _one_line_error(err)
    assert "beta" in err and "checkpoint" in err
    assert (out / "run.json").read_bytes() == before


def _torch_save(path: Path, obj: object) -> None:
    torch.save(obj, path)


class NotAllowed:  # a pickled object that only weights_only=False would load
    pass


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "not_a_checkpoint",
                                    "pickled_object", "missing_entry"])
def test_damaged_checkpoint_is_a_clear_error(tmp_path, capsys, damage):
    # before: RuntimeError, UnpicklingError (advising weights_only=False), EOFError or KeyError
    out = _finished_run(tmp_path, capsys)
    path = out / "checkpoint.pt"
    data = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(bytes(range(256)) * 64)
    elif damage == "not_a_checkpoint":
        _torch_save(path, {"hello": torch.zeros(2)})
    elif damage == "pickled_object":
        _torch_save(path, {"format": 2, "object": NotAllowed()})
    else:
        state = torch.load(path, weights_only=True)
        del state["policy"]
        _torch_save(path, state)
    before = sorted(p.name for p in out.iterdir())
    status, _, err = _cli(["--out", out, *SMALL, "--resume"], capsys)
    assert status == 2
    _one_line_error(err)
    assert str(path) in err
    assert "weights_only" not in err  # never advise loading untrusted pickles
    assert sorted(p.name for p in out.iterdir()) == before


def test_damaged_history_is_a_clear_error(tmp_path, capsys):
    config = TrainConfig.flat(**{**FAST, "iterations": 4})

    def stop(n):
        if n == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, out_dir=tmp_path / "run", callback=stop)
    history = tmp_path / "run" / "history.bin"
    data = bytearray(history.read_bytes())
    data[10] ^= 0xFF
    history.write_bytes(bytes(data))
    status, _, err = _cli(["--out", tmp_path / "run", *SMALL, "--iterations", "4", "--resume"],
                          capsys)
    assert status == 2
    _one_line_error(err)
    assert "history.bin" in err and "does not match" in err


# ------------------------------------------------------- failures are recorded
def test_a_run_that_fails_midway_is_marked_failed(tmp_path):
    # an exact solve that cannot converge in one step: a known fault, not a traceback
    config = TrainConfig.flat(**FAST, exact=True, exact_max_iter=1)
    with pytest.raises(TrainingFault, match="did not converge"):
        train(config, out_dir=tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "failed" and "did not converge" in record["error"]


def test_an_interrupted_run_is_marked_interrupted(tmp_path):
    def stop(n):
        if n == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig.flat(**FAST), out_dir=tmp_path / "run", callback=stop)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"


# ------------------------------------------------------------- litter and cost
def test_resume_removes_temporaries_of_a_killed_write(tmp_path):
    config = TrainConfig.flat(**FAST)

    def stop(n):
        if n == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, out_dir=tmp_path / "run", callback=stop)
    out = tmp_path / "run"
    stale = [out / ".checkpoint.pt.k9x2_a.tmp", out / ".run.json.abc.tmp",
             out / ".metrics.csv.q.tmp"]
    for path in stale:
        path.write_bytes(os.urandom(2048))
    keep = [out / ".notes.tmp", out / "mine.txt"]
    for path in keep:
        path.write_text("user file")
    train(config, out_dir=out, resume=True)
    assert not any(path.exists() for path in stale)
    assert all(path.exists() for path in keep)


def test_checkpoint_size_does_not_grow_with_the_run(tmp_path):
    # before: the checkpoint carried the whole metric history (quadratic I/O over a run)
    sizes = []
    out = tmp_path / "run"
    config = TrainConfig.flat(**{**FAST, "n_prompts": 64, "iterations": 12})
    train(config, out_dir=out, callback=lambda n: sizes.append((out / "checkpoint.pt")
                                                               .stat().st_size))
    growing = sizes[:-1]  # the final checkpoint holds the history, once
    assert max(growing) - min(growing) <= 64, sizes
    assert not (out / "history.bin").exists()


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_result_files_follow_the_umask(tmp_path, umask):
    # before: every result file was 0600, whatever the umask
    previous = os.umask(umask)
    try:
        train(TrainConfig.flat(**FAST), out_dir=tmp_path / "run")
    finally:
        os.umask(previous)
    for path in (tmp_path / "run").iterdir():
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path.name


def test_stale_temporary_names_match_only_our_files(tmp_path):
    (tmp_path / ".checkpoint.pt.x.tmp").write_text("")
    (tmp_path / ".checkpoint.ptx.y.tmp").write_text("")  # another name, kept
    removed = io.remove_stale_temporaries(tmp_path, ["checkpoint.pt"])
    assert [p.name for p in removed] == [".checkpoint.pt.x.tmp"]
    assert (tmp_path / ".checkpoint.ptx.y.tmp").exists()


# --------------------------------------------- signals: byte-identical resumes
def _wait_for_checkpoint(path: Path, process: subprocess.Popen, after: float,
                         timeout: float = 120.0) -> bool:
    """Wait until ``process`` wrote ``path`` (after time ``after``); False if it ended first."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_mtime > after):
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.02)
    return True


@pytest.mark.slow
def test_signals_during_resume_give_identical_files(tmp_path):
    args = ["--n-prompts", "16", "--n-outputs", "8", "--iterations", "40", "--no-progress",
            "--seed", "3"]
    config = cli.parse_command(["--out", "unused", *args]).config
    train(config, out_dir=tmp_path / "full")
    cut = tmp_path / "cut"

    def stop(n):
        if n == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, out_dir=cut, callback=stop)
    for sig in (signal.SIGKILL, signal.SIGINT, signal.SIGTERM):  # each while resuming
        started = time.time()
        process = _subprocess("--out", cut, *args, "--resume")
        if not _wait_for_checkpoint(cut / "checkpoint.pt", process, started):
            break  # finished before the signal: nothing left to interrupt
        process.send_signal(sig)
        code = process.wait(timeout=60)
        err = process.stderr.read()
        if code == 0 and json.loads((cut / "run.json").read_text())["status"] == "complete":
            break  # on a loaded machine the run can end between the checkpoint and the signal
        if sig != signal.SIGKILL:  # SIGKILL cannot be seen; the others are recorded
            assert code == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err
            _one_line_error(err)
            assert json.loads((cut / "run.json").read_text())["status"] == "interrupted"
    train(config, out_dir=cut, resume=True)
    for name in ("metrics.csv", "iterations.csv"):
        assert (cut / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
    assert sorted(p.name for p in cut.iterdir()) == ["checkpoint.pt", "iterations.csv",
                                                     "metrics.csv", "run.json"]


class _SignalWhilePickled:
    """An object whose pickling sends the process a signal, in the middle of ``torch.save``."""

    def __init__(self, signum):
        self.signum = signum

    def __reduce__(self):
        signal.raise_signal(self.signum)
        return (int, (7,))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_checkpoint_write_is_delivered_after_the_file_is_complete(tmp_path,
                                                                                  signum):
    # without holding, the interrupt is raised inside torch.save, whose zip writer then fails
    # with RuntimeError on the way out and the file is lost; held, the checkpoint is written
    # whole and the interrupt arrives afterwards, as the same exception
    class Stop(KeyboardInterrupt):
        pass

    def stop(sig, frame):
        raise Stop

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        path = tmp_path / "checkpoint.pt"
        payload = {"weights": torch.arange(2000.0), "marker": _SignalWhilePickled(signum),
                   "tail": torch.ones(2000)}
        with pytest.raises(KeyboardInterrupt) as caught:
            io.atomic_torch_save(path, payload)
        assert (signum == signal.SIGTERM) == isinstance(caught.value, Stop)
        loaded = torch.load(path, weights_only=False)  # our own file: int is rebuilt
        assert loaded["marker"] == 7 and torch.equal(loaded["tail"], torch.ones(2000))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
        assert signal.getsignal(signal.SIGTERM) is stop  # the handlers are put back
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
