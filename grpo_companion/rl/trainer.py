"""The GRPO trainer: the training loop and one iteration of Algorithm 1, read top to bottom.

:func:`train` runs the outer iterations n = 1..M of :func:`training_loop`. In **sampled**
mode each is :func:`grpo_iteration`, the paper's Algorithm 1: freeze pi_old, sample G
outputs per prompt, score them with the verifier, compute group advantages and take
``mu`` optimiser steps on :func:`~grpo_companion.rl.losses.grpo_loss`. What depends on
the task is behind the :class:`~grpo_companion.rl.grpo_tasks.GRPOTask` protocol; the
bookkeeping (``run.json``, history, checkpoints, callbacks) is a
:class:`~grpo_companion.rl.recorder.Recorder` the loop hands one record per iteration.
In **exact** mode (tabular bandit) the iteration is
:func:`~grpo_companion.rl.exact.exact_iteration`, the paper's recurrence.

Logged per evaluated iteration and prompt (``metrics.csv``, ``TrainResult.metrics``;
iteration 0 is pi_ref). The evaluated iterations are 0, every ``eval_every``-th
and the last: by default every iteration for the bandit, whose metrics are exact
and cheap, and every ``SEQUENCE_EVAL_EVERY``-th for the sequence task, whose
sampled evaluation of the held-out prompts costs several training iterations:

- ``success_prob``: PoS; exact for the bandit, otherwise the fraction of
  ``eval_samples`` verified samples (held-out prompts).
- ``kl_ref``, ``kl_prev``: KL(pi_n||pi_ref) (the reference in force during
  iteration n, before any reset) and KL(pi_n||pi_{n-1}); exact for the
  bandit, otherwise the mean over the evaluation samples of the sequence
  log-ratio (unbiased; the policy's log-probabilities are those the sampler
  drew from, equal to a separate forward pass up to float rounding).
- ``entropy``: exact for the bandit, otherwise the mean negative sequence
  log-probability of the evaluation samples.
- ``clip_fraction``: fraction of this prompt's sampled tokens whose clipped
  branch was in force, averaged over the ``mu`` steps; ``nan`` if the prompt
  was not trained on in that iteration (always the case for held-out
  prompts, and in exact mode).

``iterations.csv`` has one row per iteration, evaluated or not: ``loss`` (mean
over the mu steps), ``mean_reward`` of the sampled outputs and the batch
``clip_fraction``.

Reliability: :func:`prepare_run` checks everything before anything is written (the
configuration and what the machine holds, the output folder, on resume the checkpoint and
the fingerprint of the code behind it, :func:`~grpo_companion.rl.fingerprint.run_fingerprint`);
a run holds an ``flock`` on its folder; a metric or parameter that becomes inf or NaN stops
the run (:class:`~grpo_companion.rl.run_state.TrainingFault`) instead of being written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_companion.rl import io, losses
from grpo_companion.rl.exact import exact_iteration
from grpo_companion.rl.fingerprint import run_fingerprint, source_digest
from grpo_companion.rl.grpo_tasks import Groups
from grpo_companion.rl.machine import check_machine, estimate_memory, resolve_device
from grpo_companion.rl.recorder import (
    CHECKPOINT as CHECKPOINT,
)
from grpo_companion.rl.recorder import (
    CHECKPOINT_FORMAT as CHECKPOINT_FORMAT,
)
from grpo_companion.rl.recorder import (
    RUN_FILES as RUN_FILES,
)
from grpo_companion.rl.recorder import (
    IterationRecord,
    Recorder,
    TrainResult,
    check_out_contents,
    check_out_dir,
    check_out_place,
    load_checkpoint,
)
from grpo_companion.rl.run_state import RunState, TrainingFault, frozen_copy, mixed_reference
from grpo_companion.rl.train_config import (
    ITERATION_METRICS as ITERATION_METRICS,
)
from grpo_companion.rl.train_config import (
    KL_CHOICES as KL_CHOICES,
)
from grpo_companion.rl.train_config import (
    METRICS as METRICS,
)
from grpo_companion.rl.train_config import (
    SEQUENCE_EVAL_EVERY as SEQUENCE_EVAL_EVERY,
)
from grpo_companion.rl.train_config import (
    TrainConfig,
    calibration_fields,
    parse_device,
    variant_fields,
)

# its own functions, and the names it had before its parts moved to modules of their own
__all__ = ["FixedLogProbs", "PreparedRun", "TrainConfig", "TrainResult", "TrainingFault",
           "calibration_fields", "check_machine", "check_out_contents", "check_out_dir",
           "estimate_memory", "grpo_iteration", "parse_device", "prepare_run", "resolve_device",
           "run_fingerprint", "source_digest", "train", "training_loop", "variant_fields"]


def training_loop(state: RunState, recorder: Recorder) -> None:
    """Iterations ``state.iteration + 1 .. M`` of GRPO (Algorithm 1, lines 3-12), each recorded.

    Each iteration freezes pi_old, updates the policy (:func:`grpo_iteration`, or in exact
    mode :func:`~grpo_companion.rl.exact.exact_iteration`), computes the per-prompt metrics
    where ``config.evaluated(n)``, resets pi_ref every ``ref_reset_every`` iterations
    (DeepSeekMath's iterative GRPO; with ``ref_mixup_alpha < 1`` it mixes pi_ref toward pi,
    TRL's ``sync_ref_model``) and hands the recorder one
    :class:`~grpo_companion.rl.recorder.IterationRecord`.
    """
    config = state.config
    for n in range(state.iteration + 1, config.run.iterations + 1):
        state.iteration = n
        evaluated = config.evaluated(n)
        # line 5, pi_old <- pi. A frozen copy only where pi_old is read after the policy has
        # moved (the metrics' kl_prev, the exact KL): otherwise the policy itself samples,
        # before its first step, and the first loss gives pi_old's log-probabilities
        keep_prev = evaluated or config.exact or config.grpo.kl == "exact"
        prev = frozen_copy(state.policy) if keep_prev else state.policy
        if config.exact:
            stats = exact_iteration(state, prev)
            clip_fraction = np.full(len(state.tracked), math.nan)
        else:
            stats, clip_fraction = grpo_iteration(state, prev)
        metrics = _evaluate(state, prev, clip_fraction) if evaluated else None
        if config.grpo.ref_reset_every and n % config.grpo.ref_reset_every == 0:
            state.ref_policy = mixed_reference(state.ref_policy, state.policy,
                                             config.grpo.ref_mixup_alpha)
        recorder.record(state, IterationRecord(n, {"iteration": n, **stats}, metrics))


def grpo_iteration(state: RunState, prev: torch.nn.Module) -> tuple[dict[str, float], np.ndarray]:
    """One iteration of Algorithm 1 (lines 4, 6-11) on ``state.policy``; ``prev`` is pi_old.

    Returns the iteration's ``loss`` (mean over the ``mu`` steps), ``mean_reward`` and
    ``clip_fraction``, and the clipped share of each tracked prompt's tokens.
    pi_old's per-token log-probabilities are those of the first loss (taken before any
    step), and pi_ref is run only where the loss has a KL to it (``beta, alpha > 0``).
    """
    grpo, task = state.config.grpo, state.grpo_task
    group = grpo.group_size
    with torch.no_grad():
        chosen = task.choose_prompts(state.generator)  # line 4: a batch of prompts
        groups = task.sample(prev, chosen, state.generator)  # line 6: G outputs of pi_old each
        rewards = task.score(groups).to(state.dtype)  # line 7: the verifier's 0/1 rewards
        state.chosen, state.rewards = chosen, rewards.view(len(chosen), group)  # for callbacks
        try:  # line 8: group advantages (the calibration's table for groups of G)
            advantages = losses.group_advantages(
                state.rewards, dataclasses.replace(state.calibration, group_size=None)).view(-1)
        except ValueError as err:  # the table refuses gains that are not finite
            raise state.weights_fault(str(err)) from None
        fixed = _fixed_log_probs(state, prev, groups)
    beta: float | torch.Tensor = grpo.beta if state.prompt_beta is None else (
        state.prompt_beta[chosen].repeat_interleave(group))
    loss_of = functools.partial(  # line 10's loss, all but the policy's log-probabilities
        losses.grpo_loss, ref_logp=fixed.ref, advantages=advantages, mask=groups.mask,
        clip_eps_low=grpo.clip_eps_low, clip_eps_high=grpo.clip_eps_high, beta=beta, kl=grpo.kl,
        loss_type=grpo.loss_type, max_completion_length=groups.mask.shape[1], alpha=grpo.alpha)

    def tabular() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """kl="exact": pi (differentiable), pi_ref and pi_old on the batch's prompts."""
        if fixed.tabular_ref is None or fixed.tabular_prev is None:
            return None
        return (state.policy.log_probs(chosen, temperature=grpo.temperature),
                fixed.tabular_ref, fixed.tabular_prev)

    mask_f = groups.mask.to(next(state.policy.parameters()).dtype)
    clipped_tokens = torch.zeros_like(mask_f)
    step_losses: list[float] = []
    for _ in range(grpo.mu):  # lines 9-11: mu optimiser steps (line 10) on the same groups
        logp = task.log_probs(state.policy, groups)
        if fixed.prev is None:  # the first loss: the policy is still pi_old
            fixed.prev = logp.detach()
        loss = loss_of(logp, fixed.prev, tabular=tabular())
        clipped = losses.clipped_tokens(logp.detach(), fixed.prev, advantages,
                                        clip_eps_low=grpo.clip_eps_low,
                                        clip_eps_high=grpo.clip_eps_high)
        if state.optimizer is not None:  # Adam or SGD: one step
            state.optimizer.zero_grad()
            loss.backward()
            state.optimizer.step()
        else:  # L-BFGS: a full solve of the same loss, by a fresh optimiser
            _lbfgs_solve(state, len(chosen), lambda: loss_of(
                task.log_probs(state.policy, groups), fixed.prev, tabular=tabular()))
        step_losses.append(float(loss.detach()))
        clipped_tokens += clipped.to(mask_f.dtype) * mask_f
    per_prompt = clipped_tokens.view(len(chosen), -1).sum(1) / (
        mask_f.view(len(chosen), -1).sum(1) * grpo.mu)
    stats = {"loss": float(np.mean(step_losses)), "mean_reward": float(rewards.mean()),
             "clip_fraction": float(clipped_tokens.sum() / (mask_f.sum() * grpo.mu))}
    return stats, task.clip_fraction(chosen, per_prompt)


@dataclasses.dataclass
class FixedLogProbs:
    """Log-probabilities that stay fixed during the ``mu`` steps of an iteration.

    ``prev``: pi_old's per token, filled by the first loss (the policy is still pi_old
    then, so no separate forward pass of pi_old is needed); ``ref``: pi_ref's per token
    where the loss has a per-token KL to pi_ref, else None; ``tabular_ref``,
    ``tabular_prev``: with ``kl="exact"`` and ``beta > 0``, the tabular pi_ref and pi_old
    of the batch's prompts.
    """

    prev: torch.Tensor | None
    ref: torch.Tensor | None
    tabular_ref: torch.Tensor | None = None
    tabular_prev: torch.Tensor | None = None


def _fixed_log_probs(state: RunState, prev: torch.nn.Module, groups: Groups) -> FixedLogProbs:
    """pi_ref's log-probabilities where the loss has a KL to pi_ref (beta, alpha > 0)."""
    config, temp = state.config, state.config.grpo.temperature
    penalised = config.grpo.beta > 0
    needs_ref = penalised and config.grpo.kl != "exact" and config.grpo.alpha > 0
    ref_logp = state.grpo_task.log_probs(state.ref_policy, groups) if needs_ref else None
    if config.grpo.kl != "exact" or not penalised:
        return FixedLogProbs(None, ref_logp)
    return FixedLogProbs(None, ref_logp,
                         state.ref_policy.log_probs(groups.chosen, temperature=temp),
                         prev.log_probs(groups.chosen, temperature=temp))


def _lbfgs_solve(state: RunState, n_prompts: int, loss_now: Callable[[], torch.Tensor]) -> None:
    """Minimise ``loss_now`` by a fresh L-BFGS (strong Wolfe line search) to ``exact_tol``."""
    config = state.config
    lbfgs = torch.optim.LBFGS(state.policy.parameters(), lr=1.0,
                              max_iter=config.optim.exact_max_iter,
                              tolerance_grad=config.optim.exact_tol / n_prompts,
                              tolerance_change=0.0, history_size=50,
                              line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        lbfgs.zero_grad()
        loss = loss_now()
        loss.backward()
        return loss

    lbfgs.step(closure)


def _evaluate(state: RunState, prev: torch.nn.Module,
              clip_fraction: np.ndarray) -> dict[str, np.ndarray]:
    """The per-prompt metrics of the policy after an iteration (see the module docstring)."""
    with torch.no_grad():
        values = state.grpo_task.evaluate(state.policy, state.ref_policy, prev, state.iteration)
    metrics = {name: value.double().cpu().numpy() for name, value in values.items()}
    return {**metrics, "clip_fraction": clip_fraction}


class PreparedRun:
    """A run whose configuration, output folder and checkpoint have all been checked.

    :func:`prepare_run` builds it without writing anything but the folder's lock
    (every problem is a ``ValueError``); :meth:`run` then trains. Any exception
    from :meth:`run` marks ``run.json`` as ``"failed"`` (``"interrupted"`` for
    Ctrl-C) with the message before it propagates. ``lock`` (an acquired
    :class:`io.FolderLock` of ``out``) is released when :meth:`run` ends or by
    :meth:`close`; ``notice`` is a line to show before the run (a reused folder).
    ``run_state`` is the run's :class:`~grpo_companion.rl.run_state.RunState` and
    ``recorder`` its :class:`~grpo_companion.rl.recorder.Recorder`.
    """

    def __init__(self, config: TrainConfig, out: Path | None, resume: bool,
                 reference_state: dict[str, torch.Tensor] | None, *,
                 lock: io.FolderLock | None = None, notice: str | None = None) -> None:
        self.config, self.out, self.resume = config, out, resume
        self.lock, self.notice = lock, notice
        self.device = resolve_device(config.run.device)
        self.run_state = RunState(config, self.device)
        self.reference_state = reference_state
        self.recorder = Recorder(config, out, len(self.run_state.tracked), self.device)
        self.checkpoint: dict[str, Any] | None = None
        if resume:
            assert out is not None
            self.checkpoint = load_checkpoint(out / CHECKPOINT, config, self.device,
                                              self.run_state.fingerprint)
            self.recorder.resume(self.run_state, self.checkpoint, out / CHECKPOINT)

    def run(self, callback: Callable[[int], None] | None = None,
            on_start: Callable[[], None] | None = None) -> TrainResult:
        """Train (see :func:`train`).

        ``on_start`` is called once, after the pre-training and the evaluation
        of iteration 0 and before the first GRPO iteration (not on resume):
        where ``run_state`` holds pi_ref and the policy is still equal to it.
        """
        state, recorder, fresh = self.run_state, self.recorder, self.checkpoint is None
        recorder.callback = callback
        try:
            with recorder.running(state, fresh=fresh,
                                  final=not fresh and "metrics" in (self.checkpoint or {})):
                if fresh:
                    state.pretrain(self.reference_state)
                    recorder.start(state, _evaluate(state, state.policy,
                                                  np.full(len(state.tracked), math.nan)))
                    if on_start is not None:
                        on_start()
                recorder.open_progress(state)
                training_loop(state, recorder)
                return recorder.finish(state)
        finally:
            self.close()

    def close(self) -> None:
        """Release the folder (its lock file is removed); :meth:`run` does it when it ends."""
        if self.lock is not None:
            self.lock.release()

    def __del__(self) -> None:  # a prepared run that never ran does not keep its folder
        with contextlib.suppress(Exception):
            self.close()


def prepare_run(
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    reference_state: dict[str, torch.Tensor] | None = None,
) -> PreparedRun:
    """Check everything about a run without writing anything; ``ValueError`` if it cannot start.

    Checks the configuration, the output folder
    (:func:`~grpo_companion.rl.recorder.check_out_dir`) and, with ``resume``, the checkpoint:
    readable with ``weights_only=True``, of the same configuration and code
    (:func:`~grpo_companion.rl.fingerprint.run_fingerprint`), its saved state fitting the
    policies. See :func:`train`.

    With ``out_dir``, the folder is locked first (:class:`io.FolderLock`; it is
    created if needed) and stays locked until the run ends, so the checks of its
    contents and the run are one writer's: a folder another run holds is refused
    (``ValueError``). If a check fails, the lock is released and a folder created
    for it is removed again.
    """
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
    check_machine(config)
    if reference_state is not None and (config.task != "sequence" or resume):
        raise ValueError("reference_state must be None for task='bandit' or with resume=True, "
                         f"got a state dict (task={config.task!r}, resume={resume})")
    if resume and out_dir is None:
        raise ValueError("resume=True needs out_dir, got None")
    if out_dir is None:
        return PreparedRun(config, None, False, reference_state)
    out = check_out_place(Path(out_dir))
    created = []  # the folders the lock creates, deepest first
    missing = out
    while not missing.exists() and missing.parent != missing:
        created.append(missing)
        missing = missing.parent
    lock = io.FolderLock(out)
    try:
        try:
            lock.acquire()
        except io.FolderBusy:
            raise ValueError(f"out_dir {str(out)!r} is in use by another run (it holds "
                             f"{str(lock.path)!r}); wait for that run to end, or choose "
                             "another folder") from None
        resume, notice = check_out_contents(out, resume=resume)
        return PreparedRun(config, out, resume, reference_state, lock=lock, notice=notice)
    except BaseException:
        lock.release()
        for folder in created:
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def train(
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    callback: Callable[[int], None] | None = None,
    reference_state: dict[str, torch.Tensor] | None = None,
) -> TrainResult:
    """Run GRPO on a toy task (Algorithm 1, or its exact iteration).

    Parameters
    ----------
    config
        Every knob of the run, see :class:`TrainConfig`.
    out_dir
        Where to write ``run.json`` (configuration, seed, versions, device,
        status), ``metrics.csv``, ``iterations.csv`` and ``checkpoint.pt`` (the
        checkpoint after every ``checkpoint_every`` iterations and at the end;
        while the run goes on, its metrics so far are in ``history.bin``, so
        that each checkpoint costs the same). All writes are atomic; files get
        the permissions the umask gives new files. None keeps everything in
        memory.
    resume
        Continue the run checkpointed in ``out_dir``; its configuration must
        equal ``config`` (``progress`` and ``device`` may differ) and its code
        fingerprint the current code's
        (:func:`~grpo_companion.rl.fingerprint.run_fingerprint`; a checkpoint without
        one, from an older trainer, is refused). The resumed run ends with the same
        results as an uninterrupted one. Temporary files left by a killed run are
        removed. Without a checkpoint, a folder holding only a stopped run's leftovers
        is started afresh, as without ``resume``.
    callback
        Called with the iteration number after each iteration (and its
        checkpoint); an exception raised there stops the run, as an
        interruption would.
    reference_state
        Sequence task only: start from this reference policy (the
        ``reference_state`` of an earlier :class:`TrainResult` whose config has
        the same model fields) instead of pre-training one, e.g. to compare
        GRPO variants from one pi_ref without repeating the SFT. The run then
        has no ``sft_losses``. With the same seed and model fields the results
        equal those of a run that pre-trains. Not with ``resume`` (the
        checkpoint holds pi_ref).

    Returns
    -------
    TrainResult
        Metrics per evaluated iteration (``eval_iterations``) and prompt as numpy
        arrays; the training statistics of every iteration in ``iteration_rows``.

    Raises
    ------
    ValueError
        Before anything is written, if the run cannot start (see :func:`prepare_run`),
        including when another run holds ``out_dir``.
    TrainingFault
        If the run diverges (a metric or parameter becomes inf or NaN), an exact
        inner solve does not converge, or the resumed history does not match
        its checkpoint; ``run.json`` then says ``"failed"`` with the message.
    """
    return prepare_run(config, out_dir=out_dir, resume=resume,
                       reference_state=reference_state).run(callback)
