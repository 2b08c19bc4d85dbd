"""The bookkeeping of a run, kept out of the algorithm: one record per iteration.

The training loop (:func:`grpo_companion.rl.trainer.training_loop`) hands a
:class:`Recorder` one :class:`IterationRecord` per iteration; the recorder keeps the
metrics in memory (for :class:`TrainResult`), refuses numbers that are not finite
(:class:`~grpo_companion.rl.run_state.TrainingFault`), appends the record to
``history.bin`` (:mod:`grpo_companion.rl.history`), writes the checkpoint every
``checkpoint_every`` iterations, shows the progress bar and calls the callback. Around
the run it writes ``run.json`` (``"running"``, then ``"complete"``, ``"failed"`` with the
error, or ``"interrupted"``) and at the end ``metrics.csv`` and ``iterations.csv``. This
module also checks an output folder and a checkpoint before a run starts.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm  # plain text bar: tqdm.auto warns on stderr without ipywidgets

from grpo_companion.rl import io
from grpo_companion.rl.fingerprint import RUN_ONLY_FIELDS, check_fingerprint
from grpo_companion.rl.history import HISTORY, HistoryError, MetricHistory
from grpo_companion.rl.run_state import RunState, TrainingFault
from grpo_companion.rl.train_config import ITERATION_METRICS, METRICS, TrainConfig

CHECKPOINT = "checkpoint.pt"
#: Bumped when the checkpoint layout changes (older checkpoints are refused, not misread).
CHECKPOINT_FORMAT = 3
#: Files a run folder holds (the history only until the run completes).
RUN_FILES = ("run.json", CHECKPOINT, HISTORY, "metrics.csv", "iterations.csv")


@dataclass
class TrainResult:
    """What :func:`~grpo_companion.rl.trainer.train` returns (notebook-friendly, no pandas).

    ``metrics[name]`` is a float64 array ``(len(eval_iterations), n_prompts)``
    for each name in ``METRICS``: row ``i`` is iteration ``eval_iterations[i]``
    (``config.eval_iterations``: 0, the reference policy, every
    ``eval_every``-th iteration and the last; with ``eval_every=1``, the
    bandit's default, row ``n`` is iteration ``n``); ``p_ref``
    is the reference PoS per tracked prompt (exact for the bandit, estimated
    like ``success_prob`` for the sequence task); ``prompt_ids`` are the task's
    indices of the tracked prompts; ``iteration_rows`` are the rows of
    ``iterations.csv`` (every iteration); ``reference_state`` (sequence task) is the state dict
    of the reference policy in force at the end (pi_ref unless
    ``ref_reset_every``), which :func:`~grpo_companion.rl.trainer.train` accepts back to skip the
    supervised pre-training of another run.
    """

    config: TrainConfig
    metrics: dict[str, np.ndarray]
    p_ref: np.ndarray
    prompt_ids: np.ndarray
    iteration_rows: list[dict[str, float]]
    out_dir: Path | None = None
    device: str = "cpu"
    sft_losses: list[float] = field(default_factory=list)
    reference_state: dict[str, torch.Tensor] | None = None
    eval_iterations: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        if len(self.eval_iterations) == 0:  # built by hand: every iteration
            self.eval_iterations = np.arange(self.metrics["success_prob"].shape[0])

    @property
    def success_prob(self) -> np.ndarray:
        return self.metrics["success_prob"]

    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows, one per (evaluated iteration, prompt), as written to ``metrics.csv``."""
        out = []
        for i, it in enumerate(self.eval_iterations):
            for j, prompt in enumerate(self.prompt_ids):
                row: dict[str, Any] = {"iteration": int(it), "prompt": int(prompt),
                                       "p_ref": float(self.p_ref[j])}
                row.update({m: float(self.metrics[m][i, j]) for m in METRICS})
                out.append(row)
        return out



def _versions(device: torch.device) -> dict[str, str]:
    import grpo_companion

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "numpy": np.__version__, "grpo_companion": grpo_companion.__version__,
            "platform": platform.platform(), "device": str(device),
            "device_name": name or platform.machine()}

@dataclass
class IterationRecord:
    """What one iteration hands the recorder.

    ``row`` is the iteration's line of ``iterations.csv`` (``iteration``, ``loss``,
    ``mean_reward``, ``clip_fraction``; None for iteration 0, pi_ref), ``metrics`` the
    per-prompt metrics (``METRICS``, numpy arrays over the tracked prompts), or None
    for an iteration that is not evaluated.
    """

    iteration: int
    row: dict[str, float] | None
    metrics: dict[str, np.ndarray] | None


class Recorder:
    """The bookkeeping of one run (see the module docstring); ``out`` None keeps it in memory."""

    def __init__(self, config: TrainConfig, out: Path | None, n_tracked: int,
                 device: torch.device) -> None:
        self.config, self.out, self.n_tracked = config, out, n_tracked
        self.history = (None if out is None else
                        MetricHistory(out / HISTORY, METRICS, ITERATION_METRICS, n_tracked))
        self.metrics: dict[str, list[np.ndarray]] = {m: [] for m in METRICS}
        self.eval_iterations: list[int] = []
        self.iteration_rows: list[dict[str, float]] = []
        self.callback: Callable[[int], None] | None = None
        self.status: dict[str, Any] = {"config": config.to_dict(), "seed": config.run.seed,
                                       "versions": _versions(device), "status": "running"}
        self.bar: Any = None

    # ------------------------------------------------------------ around the run
    @contextlib.contextmanager
    def running(self, state: RunState, *, fresh: bool, final: bool) -> Iterator[None]:
        """``run.json`` says ``"running"`` inside the block, and why the block ended after it.

        ``fresh``: no checkpoint is continued (a history of an earlier start is removed);
        ``final``: the continued checkpoint is the last one (it holds the whole history).
        """
        out, started = self.out, time.time()
        try:
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                io.remove_stale_temporaries(out, RUN_FILES)
                if fresh:  # a reused folder: no history of the old start
                    (out / HISTORY).unlink(missing_ok=True)
                io.atomic_write_json(out / "run.json", self.status)
                if not fresh and not final:
                    assert self.history is not None
                    self.history.continue_after_read()
            yield
            if out is not None:
                self.status.update(status="complete", elapsed_s=time.time() - started)
                io.atomic_write_json(out / "run.json", self.status)
                assert self.history is not None
                self.history.remove()  # the final checkpoint holds the whole history
        except BaseException as err:
            if self.history is not None:
                self.history.close()
            if out is not None and out.is_dir():
                interrupted = isinstance(err, KeyboardInterrupt)
                self.status.update(status="interrupted" if interrupted else "failed",
                                   iteration=state.iteration, elapsed_s=time.time() - started,
                                   error=f"{type(err).__name__}: {err}" if str(err) else
                                   type(err).__name__)
                with contextlib.suppress(OSError):  # a full or read-only disk: keep the error
                    io.atomic_write_json(out / "run.json", self.status)
            raise

    def start(self, state: RunState, metrics: dict[str, np.ndarray]) -> None:
        """The record of iteration 0 (pi_ref), which starts the history."""
        self._store(0, metrics)
        self._check_finite(state, None, metrics=True)
        if self.history is not None:
            self.history.start()
            self.history.append(self._last(), None)

    def open_progress(self, state: RunState) -> None:
        """The progress bar of the iterations left (``config.run.progress``)."""
        self.bar = tqdm(total=self.config.run.iterations, initial=state.iteration, desc="GRPO",
                        disable=not self.config.run.progress)

    # ------------------------------------------------------------ each iteration
    def record(self, state: RunState, record: IterationRecord) -> None:
        """Keep, check, append, checkpoint, show and call back one iteration."""
        n, config = record.iteration, self.config
        evaluated = record.metrics is not None
        if record.metrics is not None:
            self._store(n, record.metrics)
        assert record.row is not None
        self.iteration_rows.append(record.row)
        self._check_finite(state, record.row, metrics=evaluated)
        if self.out is not None:
            assert self.history is not None
            self.history.append(self._last() if evaluated else self._missing(), record.row)
            if n % config.run.checkpoint_every == 0 or n == config.run.iterations:
                digest = self.history.sync()
                final = n == config.run.iterations
                io.atomic_torch_save(self.out / CHECKPOINT,
                                     self.checkpoint(state, digest, final=final))
                state.checkpointed = n
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                pos=f"{float(np.mean(self.metrics['success_prob'][-1])):.3f}")
        if self.callback is not None:
            self.callback(n)

    def finish(self, state: RunState) -> TrainResult:
        """The run's result, and (with ``out``) ``metrics.csv`` and ``iterations.csv``."""
        if self.bar is not None:
            self.bar.close()
        metrics = {m: np.stack(v) for m, v in self.metrics.items()}
        if state.config.task == "bandit":
            p_ref = np.asarray(state.task.p_ref, dtype=np.float64)
        else:
            p_ref = metrics["success_prob"][0]
        reference_state = None
        if state.config.task == "sequence":
            reference_state = {k: v.detach().clone()
                               for k, v in state.ref_policy.state_dict().items()}
        result = TrainResult(
            config=state.config, metrics=metrics, p_ref=p_ref, prompt_ids=np.asarray(state.tracked),
            iteration_rows=self.iteration_rows, out_dir=self.out, device=str(state.device),
            sft_losses=state.sft_losses, reference_state=reference_state,
            eval_iterations=np.asarray(self.eval_iterations, dtype=np.int64))
        if self.out is not None:
            io.atomic_write_csv(self.out / "metrics.csv", result.rows(),
                                ["iteration", "prompt", "p_ref", *METRICS])
            io.atomic_write_csv(self.out / "iterations.csv", self.iteration_rows,
                                ["iteration", *ITERATION_METRICS])
        return result

    def _store(self, iteration: int, metrics: dict[str, np.ndarray]) -> None:
        for name in METRICS:
            self.metrics[name].append(metrics[name])
        self.eval_iterations.append(iteration)

    def _last(self) -> dict[str, np.ndarray]:
        return {m: self.metrics[m][-1] for m in METRICS}

    def _missing(self) -> dict[str, np.ndarray]:
        """The history record of an iteration that is not evaluated: NaN for every metric."""
        return {m: np.full(self.n_tracked, math.nan) for m in METRICS}

    def _check_finite(self, state: RunState, row: dict[str, float] | None, *,
                      metrics: bool) -> None:
        """Stop a run whose policy or metrics stopped being numbers (no silent NaN in files)."""
        bad = [name for name, p in state.policy.named_parameters()
               if not bool(torch.isfinite(p).all())]
        bad += [m for m in METRICS if metrics and m != "clip_fraction"  # NaN by design
                if not np.isfinite(self.metrics[m][-1]).all()]
        if row is not None and not math.isfinite(row["loss"]):
            bad.append("loss")
        if bad:
            hint = "lower --lr or raise --beta" if not self.config.exact else (
                "change --beta or --eps")
            raise TrainingFault(
                f"training diverged at iteration {state.iteration}: {', '.join(bad)} became inf "
                f"or NaN ({hint}); {state.checkpoint_note()}")

    # ------------------------------------------------------------ checkpoints
    def checkpoint(self, state: RunState, history_digest: str, *, final: bool) -> dict[str, Any]:
        """The checkpoint: constant size, except the final one, which holds the history too.

        ``history.bin`` has one record per iteration (the metrics of an iteration
        that is not evaluated are NaN there); the final checkpoint holds the
        metrics of the evaluated iterations only, as :class:`TrainResult` does.
        """
        snapshot = {
            "format": CHECKPOINT_FORMAT,
            "iteration": state.iteration,
            "config": state.config.to_dict(),
            "policy": state.policy.state_dict(),
            "ref_policy": state.ref_policy.state_dict(),
            "optimizer": None if state.optimizer is None else state.optimizer.state_dict(),
            "generator": state.generator.get_state(),
            "sft_losses": state.sft_losses,
            "history_records": state.iteration + 1,
            "history_sha256": history_digest,
            "fingerprint": state.fingerprint,
        }
        if final:
            snapshot["metrics"] = {m: torch.as_tensor(np.stack(v)) for m, v in self.metrics.items()}
            snapshot["iteration_rows"] = self.iteration_rows
        return snapshot

    def resume(self, state: RunState, snapshot: dict[str, Any], path: Path) -> None:
        """Restore a checked checkpoint (:func:`load_checkpoint`) into ``state`` and the history."""
        try:
            state.iteration = state.checkpointed = snapshot["iteration"]
            state.policy.load_state_dict(snapshot["policy"])
            state.ref_policy.load_state_dict(snapshot["ref_policy"])
            if state.optimizer is not None:
                state.optimizer.load_state_dict(snapshot["optimizer"])
            state.generator.set_state(snapshot["generator"])
            state.sft_losses = [float(v) for v in snapshot["sft_losses"]]
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"cannot resume from {str(path)!r}: its saved state does not fit "
                             f"this run ({type(err).__name__}: {str(err)[:200]})") from None
        evaluated = [n for n in self.config.eval_iterations if n <= state.iteration]
        try:
            if "metrics" in snapshot:
                metrics = {m: list(snapshot["metrics"][m].double().cpu().numpy()) for m in METRICS}
                rows = [dict(r) for r in snapshot["iteration_rows"]]
            else:
                assert self.history is not None
                every, rows = self.history.read(snapshot["history_records"],
                                                snapshot["history_sha256"])
                if any(len(v) != state.iteration + 1 for v in every.values()):
                    raise ValueError("one record per iteration")
                metrics = {m: [v[n] for n in evaluated] for m, v in every.items()}
        except HistoryError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"cannot resume from {str(path)!r}: its metrics are damaged "
                             f"({type(err).__name__})") from None
        if len(rows) != state.iteration or any(
                len(v) != len(evaluated) or np.shape(v[-1]) != (self.n_tracked,)
                for v in metrics.values()):
            raise ValueError(f"cannot resume from {str(path)!r}: its metrics do not match its "
                             "iteration count")
        self.metrics, self.iteration_rows, self.eval_iterations = metrics, rows, evaluated


def load_checkpoint(path: Path, config: TrainConfig, device: torch.device,
                     fingerprint: dict[str, str]) -> dict[str, Any]:
    """Read and check a checkpoint (``weights_only=True``); ValueError naming the file if bad."""
    try:
        snapshot = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many types for a damaged file
        # torch's own message may advise weights_only=False, which must never be followed
        # for a file of unknown origin: it is not repeated here
        raise ValueError(f"cannot resume from {str(path)!r}: it is not a readable checkpoint "
                         f"({type(err).__name__}); it is empty, truncated or corrupted, or "
                         "not written by this trainer") from None
    expected = {"format": int, "iteration": int, "config": dict, "policy": dict,
                "ref_policy": dict, "generator": torch.Tensor, "sft_losses": list,
                "history_records": int, "history_sha256": str}
    if not isinstance(snapshot, dict):
        raise ValueError(f"cannot resume from {str(path)!r}: it does not hold a checkpoint "
                         f"of this trainer (a {type(snapshot).__name__})")
    if snapshot.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"cannot resume from {str(path)!r}: checkpoint format "
                         f"{snapshot.get('format')!r}, this trainer reads {CHECKPOINT_FORMAT}")
    for key, kind in expected.items():
        if not isinstance(snapshot.get(key), kind):
            raise ValueError(f"cannot resume from {str(path)!r}: its entry {key!r} is missing "
                             "or damaged")
    saved = {k: v for k, v in snapshot["config"].items() if k not in RUN_ONLY_FIELDS}
    wanted = {k: v for k, v in config.to_dict().items() if k not in RUN_ONLY_FIELDS}
    if saved != wanted:
        diff = sorted(k for k in wanted.keys() | saved.keys() if saved.get(k) != wanted.get(k))
        shown = ", ".join(f"{k} (checkpoint {saved.get(k)!r}, now {wanted.get(k)!r})"
                          for k in diff[:6])
        raise ValueError(f"cannot resume from {str(path)!r}: the configuration differs from "
                         f"the checkpointed run in {shown}")
    check_fingerprint(path, snapshot.get("fingerprint"), fingerprint)
    if not 0 <= snapshot["iteration"] <= config.run.iterations or (
            snapshot["history_records"] != snapshot["iteration"] + 1):
        raise ValueError(f"cannot resume from {str(path)!r}: its iteration count is damaged")
    return snapshot


def check_out_dir(out_dir: str | Path, *, resume: bool) -> Path:
    """Validate the output folder (nothing is written); ``ValueError`` if it cannot be used.

    A fresh run needs an absent or empty folder that can be created and
    written (not under a file, not on a read-only file system); ``resume=True``
    needs a writable folder holding a checkpoint. A folder holding only what a
    run stopped before its first checkpoint left is usable by both (see
    :func:`check_out_contents`). :func:`~grpo_companion.rl.trainer.prepare_run` makes the
    same checks while it holds the folder's lock.
    """
    out = check_out_place(Path(out_dir))
    check_out_contents(out, resume=resume)
    return out


def check_out_place(out: Path) -> Path:
    """The folder is not a file and can be created and written where it is."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir must be a directory, got the file {str(out)!r}")
    existing = out
    while not existing.exists():  # the nearest folder that exists decides
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"out_dir {str(out)!r} cannot be created: {str(existing)!r} is a "
                         "file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"out_dir {str(out)!r} cannot be written: {str(existing)!r} is "
                         "read-only (permissions or a read-only file system)")
    return out


def check_out_contents(out: Path, *, resume: bool) -> tuple[bool, str | None]:
    """What the folder holds decides how the run starts: ``(resume, notice)``.

    ``resume`` is whether the run continues a checkpoint; ``notice`` is one line
    to show when the folder is reused. The lock file of :class:`io.FolderLock`
    does not count. A folder without a checkpoint that holds nothing but this
    trainer's leftovers (a ``run.json`` of ours, ``history.bin``, temporaries of
    its atomic writes: what a run stopped before its first checkpoint leaves) is
    started again, with or without ``resume``; any other file makes a fresh run
    refuse the folder (``ValueError``), and so does ``resume`` without a checkpoint.
    """
    names = set()
    if out.is_dir():
        names = {p.name for p in out.iterdir()} - {io.LOCK_NAME}
    checkpoint = out / CHECKPOINT
    if resume and checkpoint.is_file():
        return True, None
    if not names and not resume:
        return False, None
    if names and not checkpoint.exists() and _only_leftovers(out, names):
        left = ", ".join(sorted(names))
        how = "--resume has nothing to continue, so the run starts" if resume else "starting"
        return False, (f"{str(out)!r} holds no checkpoint, only what a run stopped before its "
                       f"first checkpoint left ({left}); {how} again there")
    if resume:
        raise ValueError(f"resume needs {str(checkpoint)!r}, which does not exist")
    raise ValueError(f"out_dir {str(out)!r} is not empty; choose a new folder or resume")


def _only_leftovers(out: Path, names: set[str]) -> bool:
    """Whether each of ``names`` in ``out`` is a file this trainer leaves before a checkpoint."""
    temporaries = tuple(f".{name}." for name in RUN_FILES)
    for name in names:
        path = out / name
        if path.is_symlink() or not path.is_file():
            return False
        if name == HISTORY or (name.startswith(temporaries) and name.endswith(".tmp")):
            continue
        if name != "run.json":
            return False
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if not (isinstance(record, dict) and {"config", "status", "versions"} <= record.keys()):
            return False
    return True

