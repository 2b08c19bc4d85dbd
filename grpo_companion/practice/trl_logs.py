"""A real ``trl.GRPOTrainer`` run whose logs can be held against the theory, step by step.

:func:`logged_run` trains the toy of :mod:`grpo_companion.practice.addition_toy` with
TRL's own trainer and ``logging_steps=1``, and records next to TRL's logged metrics
(``loss``, ``grad_norm``, ``kl``, ``frac_reward_zero_std``, ``clip_ratio/*``,
``entropy``, ...):

- the **exact PoS** of every prompt under the policy that samples each step's groups
  (measured at the start of the step, before its update, by enumeration:
  :meth:`~grpo_companion.practice.addition_toy.AdditionToy.exact_pos`);
- the **advantages and completion lengths** that TRL's ``_compute_loss`` received at
  each optimiser step (read from its inputs; nothing in the loss is changed).

:func:`loss_at_ratio_one` is the value the loss must have when every importance ratio is
1 (each step of a run with ``num_iterations = 1``), and :func:`zero_variance_check`
holds the logged ``frac_reward_zero_std`` against the exact prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from grpo_companion.practice.diagnose import zero_variance_prob

__all__ = ["LoggedRun", "logged_run", "logged_runs", "loss_at_ratio_one",
           "zero_variance_check"]


@dataclass
class LoggedRun:
    """What :func:`logged_run` recorded.

    Attributes
    ----------
    args : trl.GRPOConfig
    history : list of dict
        TRL's log, one entry per optimiser step (``trainer.state.log_history``).
    pos : ndarray, shape (steps + 1, prompts)
        Exact PoS before step ``s + 1`` (row ``s``); the last row is after training.
    inputs : list of dict
        Per optimiser step: ``step`` (0-based), ``advantages`` and ``lengths`` (float64
        arrays, one entry per completion, prompts in the batch's order).
    seconds : float
        Wall time of ``trainer.train()``.
    """

    args: Any
    history: list[dict[str, Any]]
    pos: np.ndarray
    inputs: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = math.nan

    def logged(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of one logged metric (steps 1-based, as TRL counts them)."""
        rows = [r for r in self.history if key in r and "step" in r]
        return (np.array([r["step"] for r in rows], dtype=np.int64),
                np.array([float(r[key]) for r in rows]))


def logged_run(toy: Any, out_dir: str | Path, *, max_steps: int, seed: int = 0,
               learning_rate: float = 1e-3, **settings: Any) -> LoggedRun:
    """Train ``toy`` with TRL's ``GRPOTrainer`` for ``max_steps`` steps, logging every step.

    One group of ``num_generations`` (TRL's default unless in ``settings``) per prompt per
    step; ``settings`` are further ``GRPOConfig`` fields. What a CPU toy needs is set
    here (``use_cpu``, no gradient checkpointing, no saving or reporting).
    """
    import time

    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpo_companion.practice.trl_facts import grpo_defaults

    group = int(settings.pop("num_generations", grpo_defaults(["num_generations"])
                             ["num_generations"]))
    args = GRPOConfig(
        output_dir=str(out_dir), per_device_train_batch_size=len(toy.prompts) * group,
        num_generations=group, max_completion_length=toy.answers.shape[1],
        learning_rate=learning_rate, max_steps=max_steps, gradient_checkpointing=False,
        use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_steps=1,
        disable_tqdm=True, dataloader_num_workers=0, seed=seed, **settings)
    pos: list[np.ndarray] = []

    class _ExactPoS(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            pos.append(toy.exact_pos(model, float(args.temperature)))

        def on_train_end(self, args, state, control, model=None, **kwargs):
            pos.append(toy.exact_pos(model, float(args.temperature)))

    trainer = GRPOTrainer(model=str(toy.model_dir), reward_funcs=toy.reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": toy.prompts}),
                          processing_class=toy.tokenizer, callbacks=[_ExactPoS()])
    trainer.remove_callback(transformers.PrinterCallback)
    run = LoggedRun(args=args, history=[], pos=np.empty((0, len(toy.prompts))))
    compute_loss = trainer._compute_loss

    def recording(model: Any, inputs: dict[str, Any]) -> Any:
        run.inputs.append({
            "step": int(trainer.state.global_step),
            "advantages": inputs["advantages"].detach().double().cpu().numpy().ravel(),
            "lengths": inputs["completion_mask"].sum(1).double().cpu().numpy()})
        return compute_loss(model, inputs)

    trainer._compute_loss = recording  # reads the inputs; the loss is TRL's, unchanged
    started = time.perf_counter()
    trainer.train()
    run.seconds = time.perf_counter() - started
    run.history = [dict(r) for r in trainer.state.log_history if "loss" in r]
    run.pos = np.array(pos)
    return run


def _run_alone(job: tuple[Any, str, dict[str, Any]]) -> LoggedRun:
    """One :func:`logged_run` in a spawned process: offline, quiet, one torch thread."""
    import os
    import warnings

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    warnings.filterwarnings("ignore")
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    toy, out_dir, keywords = job
    return logged_run(toy, out_dir, **keywords)


def logged_runs(toy: Any, out_dir: str | Path, settings: dict[str, dict[str, Any]], *,
                workers: int = 1, **common: Any) -> dict[str, LoggedRun]:
    """:func:`logged_run` for each ``name -> GRPOConfig settings`` of ``settings``.

    ``common`` holds the keywords of every run (``max_steps``, ``seed``, ...); each run
    writes under ``out_dir / name``. With ``workers > 1`` the runs go to that many spawned
    processes, each on one torch thread (as a notebook that sets one thread runs them): a
    run's numbers do not depend on where it runs, since TRL seeds each trainer from
    ``seed``, so on a machine with several cores this only saves time.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    jobs = {name: (toy, str(Path(out_dir) / name), {**common, **s})
            for name, s in settings.items()}
    if workers == 1 or len(jobs) == 1:
        return {name: _run_alone(job) for name, job in jobs.items()}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        return dict(zip(jobs, pool.map(_run_alone, jobs.values()), strict=True))


def loss_at_ratio_one(advantages: Any, lengths: Any, beta: float, kl: float) -> float:
    """TRL's loss (``loss_type="dapo"``) when every importance ratio is 1.

    Each completion's tokens carry ``-A_i * ratio + beta * kl_token``; with ratio 1 and the
    sum over the batch's tokens divided by their number, the loss is
    ``-sum_i A_i l_i / sum_i l_i + beta * kl``, where ``kl`` is the mean per-token KL
    that TRL logs. The first term vanishes when a group's completions have equal
    lengths, since its advantages sum to zero.
    """
    a = np.asarray(advantages, dtype=np.float64).ravel()
    lengths = np.asarray(lengths, dtype=np.float64).ravel()
    if a.shape != lengths.shape or a.size == 0:
        raise ValueError(f"advantages and lengths must be two non-empty arrays of one shape, "
                         f"got {a.shape} and {lengths.shape}")
    return float(-np.sum(a * lengths) / np.sum(lengths) + beta * kl)


def zero_variance_check(observed: Any, pos: Any, group_size: int) -> dict[str, Any]:
    """The logged zero-variance share against its exact prediction, step by step.

    ``observed[t]`` is a step's logged ``frac_reward_zero_std`` and ``pos[t]`` the exact
    PoS of the prompts that sampled it (one group per prompt). Returns the predictions,
    their binomial standard errors, the share of steps within 3 of them, the pooled
    standardised total and the mean squared errors of the prediction and of two
    alternatives: the run's mean logged share (one fitted constant) and the prompt-blind
    prediction from the prompts' mean PoS.
    """
    observed = np.asarray(observed, dtype=np.float64)
    pos = np.asarray(pos, dtype=np.float64)
    if pos.ndim != 2 or observed.shape != (pos.shape[0],):
        raise ValueError(f"observed must have one share per row of pos, got shapes "
                         f"{observed.shape} and {pos.shape}")
    z = zero_variance_prob(pos, group_size)
    n = pos.shape[1]
    predicted = z.mean(1)
    se = np.sqrt(np.sum(z * (1 - z), axis=1)) / n
    blind = zero_variance_prob(pos.mean(1), group_size)
    within = np.abs(observed - predicted) <= 3 * se
    pooled = float(np.sum(observed - predicted) / math.sqrt(float(np.sum(se ** 2))))
    return {"predicted": predicted, "se": se, "share_within_3se": float(within.mean()),
            "pooled_z": pooled,
            "mse": float(np.mean((observed - predicted) ** 2)),
            "mse_constant": float(np.mean((observed - observed.mean()) ** 2)),
            "mse_prompt_blind": float(np.mean((observed - blind) ** 2))}
