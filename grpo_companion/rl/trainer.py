"""The GRPO trainer: Algorithm 1 (sampled) and the exact tabular iteration.

``train(config)`` runs outer iterations n = 1..M. In **sampled** mode each
iteration follows Algorithm 1: freeze pi_old <- pi, sample G outputs per
prompt, score them with the verifier, compute group advantages
(:func:`~grpo_companion.rl.losses.group_advantages`) and take ``mu`` optimiser
steps on :func:`~grpo_companion.rl.losses.grpo_loss`. pi_old's per-token
log-probabilities are those of the first loss evaluation (taken before any
step, so no separate forward pass of pi_old), and with ``beta = 0`` pi_ref is
not run at all during training. In **exact** mode
(tabular bandit only) every sample average is replaced by its expectation:
the calibration weights come from the exact PoS (log-odds) of pi_{n-1} through
:class:`grpo_companion.theory.Calibration`, the objective is
:func:`~grpo_companion.rl.losses.exact_objective` (eq. (6), (9), (17)) and it
is maximised to convergence (mirror ascent, float64), so the PoS sequence is the
paper's recurrence (Theorems 2, 4, 9) up to optimisation error.

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

Reliability. Everything that can be checked is checked before anything is
written (:func:`prepare_run`: the configuration, including an estimate of its
memory, the output folder and, on resume, the checkpoint). One run writes a
folder at a time: it holds an ``flock`` on ``<out>/.lock`` from before the
folder's checks to the end of the run (:class:`~grpo_companion.rl.io.FolderLock`),
and the lock file is removed when the run ends. Checkpoints record a
fingerprint of the code behind the numbers (:func:`run_fingerprint`: the
registered normalisation's ``gains`` and the KL code in use) and a resume made
with other code is refused. A folder holding only what a run stopped before
its first checkpoint left is started again rather than refused. ``run.json``
records the status: ``"running"``, ``"complete"``, ``"failed"`` (with the
error: the run diverged, an exact solve did not converge, a file could not be
written) or ``"interrupted"``. A metric or parameter that becomes inf or NaN
stops the run (:class:`TrainingFault`) instead of being written. Checkpoints
have a constant size (the metrics go to the append-only ``history.bin``, see
:mod:`grpo_companion.rl.history`, one record per iteration, NaN for the metrics
of an iteration that is not evaluated) and load with ``weights_only=True``.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import hashlib
import inspect
import json
import math
import os
import platform
import sys
import textwrap
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm  # plain text bar: tqdm.auto warns on stderr without ipywidgets

from grpo_companion.host import memory_limit_bytes
from grpo_companion.rl import config as _config
from grpo_companion.rl import io, losses
from grpo_companion.rl.config import Choice, Flag, Int, Real, Reals, Text, knob
from grpo_companion.rl.history import HISTORY, HistoryError, MetricHistory
from grpo_companion.rl.policies import TabularSoftmaxPolicy, TinyCausalTransformer
from grpo_companion.rl.tasks import (
    EOS,
    PAD,
    VOCAB_SIZE,
    ArithmeticTask,
    BanditTask,
    make_arithmetic_task,
    make_bandit_task,
    pretrain_reference,
)
from grpo_companion.theory.finite_group import group_table
from grpo_companion.theory.normalizations import EPS_PLACEMENTS, NORMALIZATIONS

TASKS = ("bandit", "sequence")
KL_CHOICES = ("exact", *losses.KL_ESTIMATORS)
OPTIMIZERS = ("adam", "sgd", "lbfgs")
DTYPES = ("float32", "float64")
METRICS = ("success_prob", "kl_ref", "kl_prev", "entropy", "clip_fraction")
ITERATION_METRICS = ("loss", "mean_reward", "clip_fraction")
CHECKPOINT = "checkpoint.pt"
#: Bumped when the checkpoint layout changes (older checkpoints are refused, not misread).
CHECKPOINT_FORMAT = 3
#: Files a run folder holds (the history only until the run completes).
RUN_FILES = ("run.json", CHECKPOINT, HISTORY, "metrics.csv", "iterations.csv")
_LOG_TINY = math.log(1e-300)
#: ``run.json`` fields that may differ between an interrupted run and its resumption.
RUN_ONLY_FIELDS = ("progress", "device")
#: Valid ranges of the knobs whose extremes break float arithmetic: outside them the KL
#: term over- or underflows float32, tempered logits leave the float range, or one
#: optimiser step moves logits beyond what float32 holds (and the exact solve loses
#: precision). They are far wider than any useful setting.
BETA_RANGE = (1e-6, 1e6)
LR_MAX = 1e3
TEMPERATURE_RANGE = (1e-3, 1e3)
MAX_SEED = 2**64 - 1  # torch and numpy generators take 64-bit seeds
#: The sequence task seeds the evaluation of iteration n with ``seed * EVAL_SEED_FACTOR + n``
#: (and the pre-training with ``seed + 1``); both must stay within MAX_SEED.
EVAL_SEED_FACTOR = 1_000_003
#: Smallest non-zero ``eps``: a subnormal one overflows ``1 / eps`` in the calibration.
EPS_MIN = 1e-300
#: Largest finite ``clip_eps_high``: the upper bound ``1 + clip_eps_high`` of the ratio must be
#: a float32 (a larger one fails inside the loss); ``inf`` means no upper clipping.
CLIP_EPS_HIGH_MAX = 1e6
#: Bytes of one row of ``iterations.csv`` kept in memory (a dict of four Python numbers,
#: measured with tracemalloc on CPython 3.11: 296).
_ITERATION_ROW_BYTES = 296
#: Bytes per prompt and group member of the exact finite-group weights (the binomial
#: weights of every cell, as ``theory.finite_group`` counts them).
_EXACT_GROUP_BYTES = 32
#: ``eval_every`` of the sequence task when none is given. With the default sizes one
#: evaluation (256 prompts x 50 samples, then pi_ref's and pi_old's log-probabilities of
#: them) costs about 8 training iterations (64 prompts x 16), so one every 50 iterations
#: costs under a fifth of the training time (``benchmarks/bench_trainer.py`` measures it).
SEQUENCE_EVAL_EVERY = 50
#: A logit gap of this many nats moves a whole class below float64's smallest number
#: from anywhere in the tabular policies' range (logits >= ZERO_LOGIT = -1e4).
_EXACT_GAP_CAP = 3.0e4


class TrainingFault(RuntimeError):
    """A run that cannot go on: it diverged, a solve failed, or its files cannot be written.

    ``run.json`` is then marked ``"failed"`` with the message, the last
    checkpoint stays, and the command line prints the message (exit status 1).
    """


def calibration_fields(calibration: Any) -> dict[str, Any]:
    """The fields of a :class:`TrainConfig` that a ``theory.Calibration`` sets."""
    return {"normalization": calibration.normalization, "eps": calibration.eps,
            "eps_placement": calibration.eps_placement, "ddof": calibration.ddof,
            "exact_group_size": calibration.group_size}


def variant_fields(variant: Any) -> dict[str, Any]:
    """The fields of a :class:`TrainConfig` that a ``theory.Variant`` sets (calibration, alpha)."""
    from grpo_companion.theory.variants import Variant

    if not isinstance(variant, Variant):
        raise ValueError(f"variant must be a theory.Variant or None, got {variant!r}")
    return {**calibration_fields(variant.calibration), "alpha": variant.alpha}


RUN, OBJECTIVE, SAMPLED, BANDIT, SEQUENCE, SOLVERS = (
    "run", "objective", "sampled updates", "bandit task", "sequence task", "solvers")

#: What TRL's ``scale_rewards`` values are here (the note of the TRL name table).
_SCALE_REWARDS = (
    '"group" is normalization="mean_std" with eps=1e-4 outside the square root '
    '(eps_placement="std") and Bessel\'s ddof=1, the calibration "trl" (--calibration=trl); '
    '"none" is normalization="mean_only" (--calibration=dr_grpo); "batch" (one standard '
    "deviation over the whole batch) has no per-prompt equivalent and is not supported")


@_config.accepts_preset("variant", variant_fields,
                        label=lambda v: f"variant={getattr(v, 'name', v)!r}")
@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a toy GRPO run in one place (Algorithm 1, App. B).

    Each field is declared once, with its help text and valid values (see
    :mod:`grpo_companion.rl.config`); the validation, the ``train`` command
    line and the TRL name table are generated from these declarations. Every
    field is validated on construction; a bad value raises ``ValueError``
    naming the field, its value and the valid range.

    ``TrainConfig(variant=theory.Variant(...), ...)`` takes the calibration
    (``normalization``, ``eps``, ``eps_placement``, ``ddof`` and, from its
    ``group_size``, ``exact_group_size``) and ``alpha`` from a GRPO variant; a
    field passed as well must agree with it. :attr:`variant` and
    :attr:`calibration` give them back (the variant's label is not kept).

    The fields, by group (default, meaning, valid values):
    """

    task: str = knob(
        "bandit", "bandit: a tabular softmax policy over K outputs per prompt; sequence: a "
        "tiny transformer learning two-digit addition", Choice(values=TASKS), group=RUN)
    exact: bool = knob(
        False, "bandit only: every sample average replaced by its expectation and each "
        "iteration solved to convergence (the paper's recurrence), in float64; the sampling "
        "knobs (group_size, mu, clip_eps_*, kl, loss_type, optimizer, lr, temperature, "
        "prompts_per_iteration) are ignored", Flag(), group=RUN)
    iterations: int = knob(20, "outer GRPO iterations M", Int(1), group=RUN)
    seed: int = knob(
        0, "seed of every random draw (task, sampling, pre-training)",
        Int(0, MAX_SEED, text="an int in [0, 2**64 - 1]", why="generators take 64-bit seeds"),
        group=RUN)
    device: str = knob("auto", "auto (CUDA when available), cpu or cuda[:N]", Text(), group=RUN)
    dtype: str = knob(
        "float32", "precision of the tabular policies in sampled mode (exact mode always uses "
        "float64, the transformer always float32)", Choice(values=DTYPES), group=RUN)
    progress: bool = knob(True, "show a progress bar", Flag(), group=RUN)
    checkpoint_every: int = knob(
        1, "write the checkpoint every this many iterations (and after the last)",
        Int(1), group=RUN)
    eval_every: int | None = knob(
        None, "compute the per-prompt metrics (metrics.csv, TrainResult.metrics) every this "
        "many iterations, and always at iteration 0 and the last; none: every iteration for "
        "the bandit (its metrics are exact and cheap), every "
        f"{SEQUENCE_EVAL_EVERY} for the sequence task (its sampled evaluation would otherwise "
        "cost several training iterations each time)", Int(1, optional=True), group=RUN)

    beta: float = knob(
        0.1, "weight of the KL penalty; 0: none, and no forward pass of pi_ref during training "
        "(TRL's default, DAPO's setting; not with exact, which divides by beta)",
        Real(*BETA_RANGE, or_zero=True,
             why="beyond it the KL term over- or underflows float32 and the exact solve loses "
                 "precision"),
        group=OBJECTIVE, trl="beta")
    alpha: float = knob(
        1.0, "reference share of the KL anchor: 1 is GRPO (eq. 6), 0 Mirror GRPO (eq. 9), "
        "in between two-KL (eq. 17)", Real(0.0, 1.0), group=OBJECTIVE)
    ref_reset_every: int | None = knob(
        None, "set pi_ref <- pi every this many iterations (DeepSeekMath's iterative GRPO); "
        "none: never", Int(1, optional=True), group=OBJECTIVE)
    normalization: str = knob(
        "mean_std", "reward normalisation of the group advantages, a name registered in "
        "theory.NORMALIZATIONS (mean_std: GRPO's whitening, eq. 4; mean_only: Dr. GRPO's "
        "centring, eq. 13)", Choice(values=lambda: tuple(NORMALIZATIONS)),
        group=OBJECTIVE, trl=("scale_rewards", _SCALE_REWARDS))
    eps: float = knob(
        1e-5, "smoothing constant of the group standard deviation",
        Real(EPS_MIN, finite=True, or_zero=True, why="a smaller one overflows 1 / eps"),
        group=OBJECTIVE, trl=("scale_rewards", ""))
    eps_placement: str = knob(
        "sqrt", "sqrt: (r - mean) / sqrt(var + eps), the paper's eq. (4); std: "
        "(r - mean) / (std + eps), as TRL", Choice(values=EPS_PLACEMENTS),
        group=OBJECTIVE, trl=("scale_rewards", ""))
    ddof: int = knob(
        0, "group variance: 0 divides by G (the paper), 1 by G - 1 (Bessel, as TRL)",
        Int(0, 1, text="0 or 1"), group=OBJECTIVE, trl=("scale_rewards", ""))
    exact_group_size: int | None = knob(
        None, "exact mode: the exact expected weights of a group of this many samples; none: "
        "the paper's population weights", Int(2, optional=True), group=OBJECTIVE)

    group_size: int = knob(
        16, "G, outputs sampled per prompt",
        Int(2, why="a group of one output has no spread to normalise"), group=SAMPLED,
        trl="num_generations")
    mu: int = knob(1, "optimiser steps per outer iteration on the same samples", Int(1),
                   group=SAMPLED, trl="num_iterations")
    clip_eps_low: float | None = knob(
        0.2, "PPO clipping range below 1 (the ratio is kept >= 1 - clip_eps_low); none: no "
        "clipping", Real(0.0, 1.0, optional=True, none_words=("none", "inf")),
        group=SAMPLED, options=("--clip-eps", "--clip-eps-low"), trl="epsilon")
    clip_eps_high: float | None = knob(
        None, "clipping range above 1 (DAPO's clip-higher); none: the same as clip_eps_low",
        Real(0.0, CLIP_EPS_HIGH_MAX, or_inf=True, optional=True,
             why="1 + clip_eps_high must be a float32; inf: no upper clipping"),
        group=SAMPLED, trl="epsilon_high")
    kl: str = knob(
        "k3", "KL penalty in the loss: the per-token estimators "
        f"{', '.join(losses.KL_ESTIMATORS)}, or exact (bandit only: the exact KL of the tabular "
        "policies)", Choice(values=KL_CHOICES),
        group=SAMPLED, trl=("use_bias_correction_kl", 'True is kl="k3_ratio", False is '
                            'kl="k3"'))
    loss_type: str = knob(
        "grpo", "how the per-token losses are averaged into one number, as TRL's loss_type",
        Choice(values=losses.LOSS_TYPES), group=SAMPLED, trl="loss_type")
    optimizer: str = knob(
        "adam", "adam, sgd, or lbfgs (each of the mu steps is a full L-BFGS solve of the "
        "sampled objective, fresh every iteration)", Choice(values=OPTIMIZERS),
        group=SAMPLED)
    lr: float | None = knob(
        None, "learning rate; none: 0.1 for the bandit, 1e-3 for the sequence task",
        Real(0.0, LR_MAX, open_low=True, optional=True,
             why="a larger step moves the logits beyond what float32 holds"),
        group=SAMPLED, trl="learning_rate")
    temperature: float = knob(
        1.0, "sampling temperature (also applied to the log-probabilities of the loss)",
        Real(*TEMPERATURE_RANGE, why="beyond it the tempered logits leave the float range, "
                                     "or sampling is greedy or uniform"),
        group=SAMPLED, trl="temperature")
    prompts_per_iteration: int | None = knob(
        None, "prompts drawn per iteration; none: every bandit prompt, 64 sequence prompts",
        Int(1, optional=True), group=SAMPLED)

    n_prompts: int = knob(256, "number of prompts", Int(1), group=BANDIT)
    n_outputs: int = knob(16, "K, outputs per prompt", Int(2), group=BANDIT)
    n_success: int | None = knob(
        None, "size of each prompt's success set; none: K // 10, at least 1",
        Int(1, optional=True), group=BANDIT)
    p_ref: tuple[float, ...] | None = knob(
        None, "reference PoS values, cycled over the prompts; none: draws from "
        "Beta(p_ref_beta), and 0 for a fraction p_ref_zero_fraction of the prompts",
        Reals(Real(0.0, 1.0), optional=True), group=BANDIT)
    p_ref_beta: tuple[float, float] = knob(
        (0.5, 2.0), "parameters A, B of the Beta law of the reference PoS",
        Reals(Real(0.0, open_low=True, finite=True), 2), group=BANDIT, metavar=("A", "B"))
    p_ref_zero_fraction: float = knob(
        0.1, "fraction of the prompts whose reference PoS is 0 (without p_ref)",
        Real(0.0, 1.0), group=BANDIT)
    logit_scale: float = knob(
        1.0, "standard deviation of the random reference logits within the success and the "
        "failure sets", Real(0.0, finite=True), group=BANDIT)

    max_operand: int = knob(49, "largest operand of the additions", Int(1, 99), group=SEQUENCE)
    n_eval_prompts: int = knob(256, "held-out prompts whose PoS is tracked", Int(1),
                               group=SEQUENCE)
    grpo_prompts: int | None = knob(
        None, "GRPO trains on a fixed set of this many training prompts (ArithmeticTask."
        "grpo_pool: the first of a seeded shuffle; pre-training still uses every training "
        "prompt); none: on all of them", Int(1, optional=True), group=SEQUENCE)
    grpo_beta_multipliers: tuple[float, ...] | None = knob(
        None, "per-prompt KL weights: the i-th prompt of the GRPO pool (grpo_pool's order) is "
        "penalised with beta * multipliers[i % len(multipliers)], so that one run spreads the "
        "fixed points over prompts; needs grpo_prompts and beta > 0; none: beta for every "
        "prompt", Reals(Real(1e-3, 1e3), optional=True), group=SEQUENCE)
    eval_samples: int = knob(50, "samples per held-out prompt for the PoS estimate", Int(1),
                             group=SEQUENCE)
    carry_error_span: float = knob(
        6.0, "the pre-training data forgets a carry with probability min(1, (u - 9) / span), "
        "u the sum of the units digits", Real(0.0, open_low=True, finite=True),
        group=SEQUENCE)
    sft_steps: int = knob(600, "supervised pre-training steps of the reference", Int(0),
                          group=SEQUENCE)
    sft_batch_size: int = knob(256, "batch size of the pre-training", Int(1), group=SEQUENCE)
    sft_lr: float = knob(3e-3, "learning rate of the pre-training (Adam)",
                         Real(0.0, open_low=True, finite=True), group=SEQUENCE)
    d_model: int = knob(64, "transformer width", Int(1), group=SEQUENCE)
    n_layers: int = knob(2, "transformer layers", Int(1), group=SEQUENCE)
    n_heads: int = knob(4, "attention heads (d_model must be a multiple)", Int(1),
                        group=SEQUENCE)

    exact_tol: float = knob(
        1e-12, "stationarity gap at which the exact solve stops; also the gradient tolerance "
        "of sampled-mode L-BFGS", Real(0.0, open_low=True, finite=True), group=SOLVERS)
    exact_step: float = knob(
        0.5, "mirror-ascent step of the exact solve, times beta",
        Real(0.0, 1.0, open_low=True), group=SOLVERS)
    exact_max_iter: int = knob(
        500, "iteration cap of the exact solve and of sampled-mode L-BFGS", Int(1),
        group=SOLVERS)

    def __post_init__(self) -> None:
        _config.check_fields(self)
        self._check_combinations()

    def _check_combinations(self) -> None:
        """The checks that involve several fields (each field is already valid alone)."""
        def bad(name: str, valid: str) -> ValueError:
            return ValueError(f"{name} must be {valid}, got {getattr(self, name)!r}")

        losses._clip_bounds(self.clip_eps_low, self.clip_eps_high)
        if self.n_success is not None and self.n_success >= self.n_outputs:
            raise bad("n_success", f"None or an int in [1, {self.n_outputs - 1}]")
        n_pairs = (self.max_operand + 1) ** 2
        if self.n_eval_prompts >= n_pairs:
            raise bad("n_eval_prompts", f"an int in [1, {n_pairs - 1}] (max_operand="
                                        f"{self.max_operand})")
        if self.d_model % self.n_heads:
            raise bad("d_model", f"a multiple of n_heads={self.n_heads}")
        if self.exact and self.task != "bandit":
            raise bad("exact", "False for task='sequence' (exact mode needs a tabular policy)")
        if self.exact and self.beta == 0:
            raise ValueError(
                "exact=True cannot be combined with beta=0: the exact iteration pi ∝ pi_ref "
                "exp(A / beta) divides by beta; use beta > 0, or exact=False (sampled GRPO "
                "without a KL penalty)")
        if self.kl == "exact" and self.task != "bandit":
            raise bad("kl", f"one of {losses.KL_ESTIMATORS} for task='sequence' "
                            "(the exact KL needs a tabular policy)")
        if self.grpo_beta_multipliers is not None:
            if self.task != "sequence" or self.grpo_prompts is None or self.beta == 0:
                raise bad("grpo_beta_multipliers", "None unless task='sequence', grpo_prompts "
                          "is set and beta > 0 (the multipliers scale beta per GRPO prompt)")
            low, high = BETA_RANGE
            for m in self.grpo_beta_multipliers:
                if not low <= self.beta * m <= high:
                    raise bad("grpo_beta_multipliers", f"multipliers m with beta * m in "
                              f"[{low:g}, {high:g}] (beta={self.beta:g}), got {m!r}")
        pool = n_pairs - self.n_eval_prompts
        if self.grpo_prompts is not None and self.grpo_prompts > pool:
            raise bad("grpo_prompts", f"None or an int in [1, {pool}] (the training prompts "
                                      f"left by n_eval_prompts={self.n_eval_prompts})")
        if self.prompts_per_iteration is not None:
            limit = self.n_prompts if self.task == "bandit" else self.grpo_prompts or pool
            if self.prompts_per_iteration > limit:
                raise bad("prompts_per_iteration", f"None or an int in [1, {limit}]")
        if not self.exact and self.optimizer == "lbfgs" and self.beta == 0 and (
                self.clip_eps_low is None or self.clip_eps_low == math.inf):
            raise ValueError(
                "optimizer='lbfgs' cannot be combined with beta=0 and clip_eps_low=None: "
                "without a KL penalty or clipping the sampled objective is unbounded, so there "
                "is no minimum to reach; set beta > 0 or clip_eps_low, or use optimizer='adam' "
                "or 'sgd'")
        if not self.exact and self.optimizer == "lbfgs" and self.kl == "k1" and self.beta > 0:
            raise ValueError(
                "optimizer='lbfgs' cannot be combined with kl='k1': L-BFGS minimises the "
                "sampled objective to convergence, and the k1 penalty (log pi - log pi_ref on "
                "the sampled outputs) is unbounded below, so there is no minimum to reach; use "
                f"kl={' or '.join(repr(k) for k in KL_CHOICES if k != 'k1')}, or optimizer='adam' "
                "or 'sgd'")
        if self.task == "sequence":
            limit = (MAX_SEED - self.iterations) // EVAL_SEED_FACTOR
            if self.seed > limit:
                raise bad("seed", f"an int in [0, {limit}] for task='sequence' (the evaluation "
                          f"of iteration n is seeded with seed * {EVAL_SEED_FACTOR} + n, which "
                          "must fit in 64 bits)")
        parse_device(self.device)  # its form; whether this machine has it: check_machine

    @property
    def evaluation_interval(self) -> int:
        """``eval_every``, or the task's default when it is None."""
        if self.eval_every is not None:
            return self.eval_every
        return 1 if self.task == "bandit" else SEQUENCE_EVAL_EVERY

    def evaluated(self, iteration: int) -> bool:
        """Whether the per-prompt metrics are computed after ``iteration`` (0: pi_ref)."""
        return (iteration % self.evaluation_interval == 0 or iteration == self.iterations)

    @property
    def eval_iterations(self) -> tuple[int, ...]:
        """The iterations whose per-prompt metrics are computed, in order (0 and the last)."""
        every = self.evaluation_interval
        last = () if self.iterations % every == 0 else (self.iterations,)
        return (*range(0, self.iterations + 1, every), *last)

    @property
    def n_evaluations(self) -> int:
        """``len(eval_iterations)``, without listing them."""
        return self.iterations // self.evaluation_interval + 1 + (
            self.iterations % self.evaluation_interval != 0)

    @property
    def calibration(self) -> Any:
        """The run's calibration: the one place a config becomes a ``theory.Calibration``.

        ``exact_group_size`` sets its ``group_size`` (exact mode's expected
        finite-group weights); sampled mode uses the table of the same calibration
        for groups of ``group_size``.
        """
        from grpo_companion import theory

        return theory.Calibration(normalization=self.normalization, eps=self.eps,
                                  eps_placement=self.eps_placement,
                                  group_size=self.exact_group_size, ddof=self.ddof)

    @property
    def variant(self) -> Any:
        """The run's GRPO variant: its :attr:`calibration` and the anchor with share ``alpha``."""
        from grpo_companion.theory.variants import Anchor, Variant

        return Variant(self.calibration, Anchor(self.alpha))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dictionary of every field."""
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}


TrainConfig.__doc__ = (TrainConfig.__doc__ or "") + _config.fields_doc(TrainConfig)


def check_machine(config: TrainConfig) -> None:
    """Refuse a run this machine cannot hold: ``ValueError`` naming the field.

    The checks that depend on the machine rather than on the configuration: the device
    exists, ``exact_group_size``'s weights fit the host's memory, the run's largest
    arrays (:func:`estimate_memory`) fit the device's, and the normalisation's gains are
    finite for the run's group (its advantage table is built). :func:`prepare_run` (so :func:`train`
    and the command line) calls it before anything is written; building or ``replace()``-ing
    a :class:`TrainConfig` does not, so that a configuration can be made, compared and saved
    on any machine without a device or memory probe.
    """
    device = resolve_device(config.device)
    if config.exact_group_size is not None:
        # the weights are numpy arrays (host memory), built every exact iteration; the
        # calibration alone holds a few arrays of exact_group_size values
        per_member = (_EXACT_GROUP_BYTES * config.n_prompts if config.exact else 0) + 64
        host = memory_limit_bytes()
        largest = int(host // per_member) - 1
        if config.exact_group_size > largest:
            raise ValueError(
                f"exact_group_size must be None or an int in [2, {largest}] on this machine "
                f"(its weights need about {per_member} bytes per group member"
                f"{' with n_prompts=' + str(config.n_prompts) if config.exact else ''}, and it "
                f"has {host / 2**30:.3g} GiB of memory), got {config.exact_group_size!r}")
    need, what = estimate_memory(config)
    have = _device_memory(device)
    if need > have:
        raise ValueError(
            f"this configuration needs about {need / 2**30:.3g} GiB ({what}), more than "
            f"the {have / 2**30:.3g} GiB of memory of {device}; make it smaller")
    # the normalisation's gains must be finite for the group the run uses (registration tries
    # a few group sizes only): refused here, before anything is written, not in iteration 1
    size = config.exact_group_size if config.exact else config.group_size
    if size is not None:
        group_table(config.calibration, size)


def _device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return memory_limit_bytes()


def estimate_memory(config: TrainConfig) -> tuple[float, str]:
    """A lower estimate of the peak memory of a run, in bytes, and what dominates it.

    Counts the largest tensors of each phase (a few float arrays per sampled
    output or policy entry, transformer activations per token, the exact
    finite-group weights), the metric history and the rows of ``iterations.csv``
    kept in memory; real use is higher by a modest factor. Used to
    refuse, before anything is allocated, runs that cannot fit.
    """
    item = 8 if config.exact or config.dtype == "float64" else 4
    tracked = config.n_prompts if config.task == "bandit" else config.n_eval_prompts
    history = 8.0 * config.n_evaluations * tracked * (len(METRICS) + 1)
    parts = {"the metric history": history,
             "the rows of iterations.csv (one per iteration)":
                 float(_ITERATION_ROW_BYTES) * config.iterations}
    if config.task == "bandit":
        table = float(config.n_prompts) * config.n_outputs
        parts["the tabular policies"] = table * 8 * 8
        if config.exact and config.exact_group_size is not None:
            parts["the exact finite-group weights (exact_group_size x n_prompts)"] = (
                float(_EXACT_GROUP_BYTES) * (config.exact_group_size + 1) * config.n_prompts)
        if not config.exact:
            batch = config.prompts_per_iteration or config.n_prompts
            rows = float(batch) * config.group_size
            parts[f"{rows:.3g} sampled outputs per iteration (group_size x prompts)"] = (
                rows * (3 * 8 + 10 * item) + 4 * batch * config.n_outputs * item)
    else:
        n_pairs = (config.max_operand + 1) ** 2
        batch = config.prompts_per_iteration or min(
            64, config.grpo_prompts or n_pairs - config.n_eval_prompts)
        length = 7 + len(str(2 * config.max_operand)) + 1
        d, layers, vocab = config.d_model, config.n_layers, VOCAB_SIZE
        params = layers * 12.0 * d * d + (vocab + length) * d + d * vocab
        parts["the transformer's parameters and optimiser state"] = params * 4 * 5
        # activations per sequence: ~12 d-wide tensors per layer (qkv, attention, MLP 4d,
        # norms) plus heads x length x length attention weights, and the logits
        per_row = length * (layers * (12.0 * d + config.n_heads * length) + 2 * vocab) * 4
        train_rows = float(batch) * config.group_size
        parts[f"{train_rows:.3g} sampled sequences per iteration (group_size x prompts)"] = (
            train_rows * per_row * 2)  # activations kept for the backward pass
        eval_rows = float(config.n_eval_prompts) * config.eval_samples
        parts[f"{eval_rows:.3g} evaluation sequences (n_eval_prompts x eval_samples)"] = (
            eval_rows * per_row)
        parts[f"{config.sft_batch_size} pre-training sequences per step"] = (
            float(config.sft_batch_size) * per_row * 2)
    what = max(parts, key=parts.__getitem__)
    return float(sum(parts.values())), f"mostly {what}"


def parse_device(device: str) -> torch.device | None:
    """The device ``device`` names (None for ``"auto"``), without asking what this machine has."""
    if device == "auto":
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from err
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    return parsed


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> CUDA if available, else CPU; otherwise check the request."""
    resolved = parse_device(device)
    if resolved is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device must be 'auto' or 'cpu' on this machine (no CUDA), "
                         f"got {device!r}")
    return resolved


@dataclass
class TrainResult:
    """What :func:`train` returns (notebook-friendly, no pandas).

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
    ``ref_reset_every``), which :func:`train` accepts back to skip the
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


class _Run:
    """State of one run: task, policies, optimiser, RNG, metrics so far."""

    def __init__(self, config: TrainConfig, device: torch.device) -> None:
        self.config, self.device = config, device
        # bound once: a normalisation registered again later does not change this run
        self.calibration = config.calibration
        self.fingerprint = run_fingerprint(config, self.calibration)
        self.dtype = torch.float64 if config.exact or config.dtype == "float64" else torch.float32
        self.generator = torch.Generator(device=device).manual_seed(config.seed)
        self.sft_losses: list[float] = []
        self.task: BanditTask | ArithmeticTask
        self.policy: torch.nn.Module
        self.task, self.policy, self.tracked = _TASK_ADAPTERS[config.task].build(config, device,
                                                                         self.dtype)
        self.ref_policy = _frozen_copy(self.policy)
        # the KL weight of every task prompt (a per-prompt beta), or None: config.beta for all
        self.prompt_beta: torch.Tensor | None = None
        if config.grpo_beta_multipliers is not None:
            pool = self.task.grpo_pool(config.grpo_prompts, config.seed)
            mult = np.resize(np.asarray(config.grpo_beta_multipliers, dtype=np.float64), len(pool))
            weights = np.full(len(self.task.operands), config.beta)
            weights[pool] = config.beta * mult
            self.prompt_beta = torch.as_tensor(weights, device=device)
        default_lr = 0.1 if config.task == "bandit" else 1e-3
        self.lr = config.lr if config.lr is not None else default_lr
        self.optimizer = self._make_optimizer()
        self.iteration = 0
        self.checkpointed: int | None = None  # iteration of the last checkpoint on disk
        self.chosen: torch.Tensor | None = None  # the prompts of the last sampled iteration
        self.rewards: torch.Tensor | None = None  # their groups' rewards (prompts, group_size)
        # the per-prompt metrics of the evaluated iterations only (config.evaluated)
        self.metrics: dict[str, list[np.ndarray]] = {m: [] for m in METRICS}
        self.eval_iterations: list[int] = []
        self.iteration_rows: list[dict[str, float]] = []

    def _make_optimizer(self) -> torch.optim.Optimizer | None:
        params = self.policy.parameters()
        if self.config.exact or self.config.optimizer == "lbfgs":
            return None
        if self.config.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        return torch.optim.SGD(params, lr=self.lr)

    def pretrain(self, reference_state: dict[str, torch.Tensor] | None = None) -> None:
        """Supervised pre-training of the sequence task's reference policy.

        With ``reference_state`` the policy and pi_ref are loaded from it instead.
        """
        if reference_state is not None:
            try:
                self.policy.load_state_dict(reference_state)
            except (RuntimeError, KeyError) as err:
                raise ValueError(f"reference_state does not fit the model of this config "
                                 f"(d_model, n_layers, n_heads, max_operand): {err}") from err
            self.ref_policy = _frozen_copy(self.policy)
        elif self.config.task == "sequence" and self.config.sft_steps > 0:
            sft_generator = torch.Generator(device=self.device).manual_seed(self.config.seed + 1)
            self.sft_losses = pretrain_reference(
                self.task, self.policy, steps=self.config.sft_steps,
                batch_size=self.config.sft_batch_size, lr=self.config.sft_lr,
                generator=sft_generator)
            self.ref_policy = _frozen_copy(self.policy)

    def state(self, history_digest: str, *, final: bool) -> dict[str, Any]:
        """The checkpoint: constant size, except the final one, which holds the history too.

        ``history.bin`` has one record per iteration (the metrics of an iteration
        that is not evaluated are NaN there); the final checkpoint holds the
        metrics of the evaluated iterations only, as :class:`TrainResult` does.
        """
        state = {
            "format": CHECKPOINT_FORMAT,
            "iteration": self.iteration,
            "config": self.config.to_dict(),
            "policy": self.policy.state_dict(),
            "ref_policy": self.ref_policy.state_dict(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "sft_losses": self.sft_losses,
            "history_records": self.iteration + 1,
            "history_sha256": history_digest,
            "fingerprint": self.fingerprint,
        }
        if final:
            state["metrics"] = {m: torch.as_tensor(np.stack(v)) for m, v in self.metrics.items()}
            state["iteration_rows"] = self.iteration_rows
        return state

    def load(self, state: dict[str, Any], path: Path) -> None:
        """Restore the state of a checkpoint (not the history); ValueError if it does not fit."""
        try:
            self.iteration = self.checkpointed = state["iteration"]
            self.policy.load_state_dict(state["policy"])
            self.ref_policy.load_state_dict(state["ref_policy"])
            if self.optimizer is not None:
                self.optimizer.load_state_dict(state["optimizer"])
            self.generator.set_state(state["generator"])
            self.sft_losses = [float(v) for v in state["sft_losses"]]
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"cannot resume from {str(path)!r}: its saved state does not fit "
                             f"this run ({type(err).__name__}: {str(err)[:200]})") from None

    def load_history(self, state: dict[str, Any], history: MetricHistory | None,
                     path: Path) -> None:
        """The metrics so far: from a final checkpoint, or from ``history.bin`` (checked)."""
        evaluated = [n for n in self.config.eval_iterations if n <= self.iteration]
        try:
            if "metrics" in state:
                metrics = {m: list(state["metrics"][m].double().cpu().numpy()) for m in METRICS}
                rows = [dict(r) for r in state["iteration_rows"]]
            else:
                assert history is not None
                every, rows = history.read(state["history_records"], state["history_sha256"])
                if any(len(v) != self.iteration + 1 for v in every.values()):
                    raise ValueError("one record per iteration")
                metrics = {m: [v[n] for n in evaluated] for m, v in every.items()}
        except HistoryError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"cannot resume from {str(path)!r}: its metrics are damaged "
                             f"({type(err).__name__})") from None
        if len(rows) != self.iteration or any(
                len(v) != len(evaluated) or np.shape(v[-1]) != (len(self.tracked),)
                for v in metrics.values()):
            raise ValueError(f"cannot resume from {str(path)!r}: its metrics do not match its "
                             "iteration count")
        self.metrics, self.iteration_rows, self.eval_iterations = metrics, rows, evaluated


def _frozen_copy(module: torch.nn.Module) -> torch.nn.Module:
    clone = copy.deepcopy(module)
    clone.requires_grad_(False)
    return clone.eval()


def _exact_step(run: _Run, old: TabularSoftmaxPolicy) -> dict[str, float]:
    """One exact GRPO iteration: maximise eq. (6)/(9)/(17) to convergence.

    The objective :func:`~grpo_companion.rl.losses.exact_objective` is concave
    in the policy pi but not in its logits (it flattens out where the softmax
    saturates, which derails generic quasi-Newton solvers). It is maximised by
    mirror ascent on the simplex, ``pi <- pi * exp(step * dJ/dpi) / Z``, with
    ``dJ/dpi`` from autograd and ``step = exact_step / beta``: the objective is
    beta-strongly concave and beta-smooth relative to the negative entropy, so
    this converges linearly at rate ``1 - exact_step``. Iterations stop when
    the largest spread of ``dJ/dpi`` over each support (the stationarity gap,
    in logit units after dividing by beta) is below ``exact_tol``; a run that
    fails to get there raises ``RuntimeError``. float64 throughout.
    """
    config, task = run.config, run.task
    with torch.no_grad():
        prev_logp = old.log_probs()
        ref_logp = run.ref_policy.log_probs()
        logit_prev = task.success_logit(prev_logp).cpu().numpy()
    w_plus, w_minus, capped, log_w = _exact_weights(run, logit_prev)
    w_plus, w_minus = (torch.as_tensor(w, device=run.device) for w in (w_plus, w_minus))
    success = task.success.to(run.device)
    step = config.exact_step / config.beta
    logits = run.policy.logits
    for _ in range(config.exact_max_iter):
        logp = torch.log_softmax(logits.detach(), dim=-1).requires_grad_(True)
        objective = losses.exact_objective(
            logp, success, w_plus, w_minus, beta=config.beta, ref_logp=ref_logp,
            prev_logp=prev_logp, alpha=config.alpha)
        (grad_logp,) = torch.autograd.grad(objective.sum(), logp)
        with torch.no_grad():
            probs = logp.exp()
            # dJ/dlogp = pi * dJ/dpi, so dJ/dpi is recovered where pi is a normal
            # float64 (outputs below 1e-300 carry no mass that could show in a PoS).
            support = logp > _LOG_TINY
            grad_pi = torch.where(support, grad_logp / torch.where(support, probs, 1.0), 0.0)
            high = grad_pi.masked_fill(~support, -math.inf).amax(dim=-1)
            low = grad_pi.masked_fill(~support, math.inf).amin(dim=-1)
            gap = float((high - low).max()) / config.beta
            if gap <= config.exact_tol:
                break
            # a constant per prompt does not change the step; taking off the largest keeps
            # the numbers near 0 where the policy has mass (tiny beta, huge weights)
            logits.copy_(torch.log_softmax(logp + step * (grad_pi - high[:, None]), dim=-1))
    else:
        raise TrainingFault(f"exact inner solve did not converge in exact_max_iter="
                            f"{config.exact_max_iter} steps at iteration {run.iteration} "
                            f"(stationarity gap {gap:.3g} > exact_tol={config.exact_tol})")
    value = objective.detach()
    if capped.any():
        # the weights were scaled down where the step is beyond float64 anyway; report the
        # objective with the true weights, each term formed in log space (no inf * 0)
        value = _exact_objective_log(logits.detach(), success, log_w, config, ref_logp,
                                     prev_logp)
    return {"loss": -float(value.mean()), "mean_reward": math.nan, "clip_fraction": math.nan}


def _weights_fault(run: _Run, detail: str) -> TrainingFault:
    """The run stops because its normalisation gave weights that are not numbers."""
    name = run.calibration.normalization
    return TrainingFault(
        f"the weights of normalisation {name!r} are not finite at iteration {run.iteration} "
        f"({detail}); its gains function is not a number at the success probabilities this "
        f"run reached (fix or choose the normalisation); {_checkpoint_note(run)}")


def _exact_weights(run: _Run, logit_prev: np.ndarray) -> tuple[
        np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Calibration weights for the exact step, finite even where they overflow float64.

    Only ``Omega / beta = (w+ + w-) / beta``, the logit gap between the classes
    after the step, decides the maximiser. Where it exceeds ``_EXACT_GAP_CAP``
    nats (``eps = 0`` near p in {0, 1}, where ``w-`` or ``w+`` is beyond
    float64) the step moves the losing class below float64's smallest number
    whatever the exact gap, so both weights are scaled by one factor to make
    the gap equal to the cap: the same float64 policy, without inf * 0.
    Returns the weights, where they were scaled, and the true log-weights. Weights
    that are not numbers (a registered ``gains`` undefined at some PoS) stop the run
    with :class:`TrainingFault`, naming the normalisation.
    """
    config, cal = run.config, run.calibration
    try:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # checked below
            w_plus, w_minus = (np.asarray(w, dtype=np.float64)
                               for w in cal.weights_of_logit(logit_prev))
            log_plus, log_minus = (np.asarray(w, dtype=np.float64)
                                   for w in cal.log_weights_of_logit(logit_prev))
    except ValueError as err:  # the calibration refuses gains that are not finite
        raise _weights_fault(run, str(err)) from None
    bad = np.isnan(w_plus) | np.isnan(w_minus) | np.isnan(log_plus) | np.isnan(log_minus)
    if bad.any():
        raise _weights_fault(run, f"NaN for {int(bad.sum())} of {bad.size} prompts")
    log_omega = np.logaddexp(log_plus, log_minus)
    log_cap = math.log(config.beta * _EXACT_GAP_CAP)
    capped = log_omega > log_cap
    if capped.any():
        with np.errstate(under="ignore"):
            w_plus = np.where(capped, np.exp(log_plus - log_omega + log_cap), w_plus)
            w_minus = np.where(capped, np.exp(log_minus - log_omega + log_cap), w_minus)
    return w_plus, w_minus, capped, (log_plus, log_minus)


def _exact_objective_log(logp: torch.Tensor, success: torch.Tensor,
                         log_w: tuple[np.ndarray, np.ndarray], config: TrainConfig,
                         ref_logp: torch.Tensor, prev_logp: torch.Tensor) -> torch.Tensor:
    """The exact objective with each ``w+ pi(o)`` formed as ``exp(log w+ + log pi(o))``."""
    log_plus, log_minus = (torch.as_tensor(w, device=logp.device)[:, None] for w in log_w)
    gain = torch.where(success, torch.exp(logp + log_plus), -torch.exp(logp + log_minus))
    zero = torch.zeros_like(log_plus[:, 0])
    penalty = losses.exact_objective(logp, success, zero, zero, beta=config.beta,
                                     ref_logp=ref_logp, prev_logp=prev_logp, alpha=config.alpha)
    return gain.sum(dim=-1) + penalty


# ------------------------------------------------------------------ sampled mode
# One outer iteration of Algorithm 1, written top to bottom in _sampled_step; what
# depends on the task is in a task adapter, what depends on the optimiser in an
# optimiser adapter.
@dataclass
class _Samples:
    """The groups of one iteration: G outputs of pi_old for each chosen prompt."""

    chosen: torch.Tensor  # task indices of the prompts
    prompts: torch.Tensor  # what the policies are conditioned on
    completions: torch.Tensor  # (prompts * G, tokens)
    mask: torch.Tensor  # which completion tokens count
    group: int


@dataclass
class _Anchors:
    """Log-probabilities that stay fixed during the mu steps of an iteration.

    ``old`` is filled by the first evaluation of the loss: it happens before any
    optimiser step, where the policy is pi_old, so its detached per-token
    log-probabilities are pi_old's and no separate forward pass of pi_old is
    needed (for every mu; for mu = 1 the ratio is then exactly 1).
    """

    old: torch.Tensor | None  # per token, under pi_old (None until the first loss)
    ref: torch.Tensor | None  # per token, under pi_ref (None when no KL to pi_ref is needed)
    exact_ref: torch.Tensor | None = None  # kl="exact": the tabular pi_ref of the prompts
    exact_prev: torch.Tensor | None = None  # kl="exact": the tabular pi_old of the prompts


def _random_prompts(run: _Run, pool: np.ndarray, count: int) -> torch.Tensor:
    pick = torch.randperm(len(pool), generator=run.generator, device=run.device)[:count]
    return torch.as_tensor(pool, device=run.device)[pick]


class _BanditSteps:
    """Task adapter of the bandit: a tabular policy, exact metrics, every prompt tracked."""

    @staticmethod
    def build(config: TrainConfig, device: torch.device, dtype: torch.dtype) -> tuple[
            BanditTask, torch.nn.Module, np.ndarray]:
        task = make_bandit_task(
            config.n_prompts, config.n_outputs, n_success=config.n_success,
            p_ref=config.p_ref, p_ref_beta=config.p_ref_beta,
            p_ref_zero_fraction=config.p_ref_zero_fraction,
            logit_scale=config.logit_scale, seed=config.seed)
        policy = TabularSoftmaxPolicy(task.ref_logits.to(device=device, dtype=dtype))
        return task, policy, np.arange(config.n_prompts)

    @staticmethod
    def choose_prompts(run: _Run) -> torch.Tensor:
        n = run.config.n_prompts
        count = run.config.prompts_per_iteration or n
        if count == n:
            return torch.arange(n, device=run.device)
        return _random_prompts(run, np.arange(n), count)

    @staticmethod
    def sample(run: _Run, policy: torch.nn.Module, chosen: torch.Tensor, group: int) -> tuple[
            torch.Tensor, torch.Tensor, torch.Tensor]:
        completions, mask = policy.sample(chosen, group, temperature=run.config.temperature,
                                          generator=run.generator)
        return chosen, completions, mask

    @staticmethod
    def reward(run: _Run, chosen: torch.Tensor, completions: torch.Tensor, mask: torch.Tensor,
               group: int) -> torch.Tensor:
        return run.task.reward(chosen, completions, group)

    @staticmethod
    def clip_fraction(run: _Run, chosen: torch.Tensor, per_prompt: torch.Tensor) -> np.ndarray:
        fraction = np.full(len(run.tracked), math.nan)
        fraction[chosen.cpu().numpy()] = per_prompt.cpu().numpy()
        return fraction

    @staticmethod
    def metrics(run: _Run, old: torch.nn.Module) -> dict[str, torch.Tensor]:
        logp = run.policy.log_probs()
        return {
            "success_prob": run.task.success_prob(logp),
            "kl_ref": losses.tabular_kl(logp, run.ref_policy.log_probs()),
            "kl_prev": losses.tabular_kl(logp, old.log_probs()),
            "entropy": -(logp.exp() * logp).sum(-1),
        }


class _SequenceSteps:
    """Task adapter of the addition task: a tiny transformer, PoS estimated on held-out prompts."""

    @staticmethod
    def build(config: TrainConfig, device: torch.device, dtype: torch.dtype) -> tuple[
            ArithmeticTask, torch.nn.Module, np.ndarray]:
        task = make_arithmetic_task(
            max_operand=config.max_operand, n_eval_prompts=config.n_eval_prompts,
            carry_error_span=config.carry_error_span, seed=config.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = TinyCausalTransformer(
                VOCAB_SIZE, task.max_len, d_model=config.d_model,
                n_layers=config.n_layers, n_heads=config.n_heads, eos_id=EOS, pad_id=PAD)
        return task, model.to(device), task.eval_idx

    @staticmethod
    def choose_prompts(run: _Run) -> torch.Tensor:
        pool = run.task.grpo_pool(run.config.grpo_prompts, run.config.seed)
        return _random_prompts(run, pool, run.config.prompts_per_iteration or min(64, len(pool)))

    @staticmethod
    def sample(run: _Run, policy: torch.nn.Module, chosen: torch.Tensor, group: int) -> tuple[
            torch.Tensor, torch.Tensor, torch.Tensor]:
        prompts = run.task.prompts(chosen)
        completions, mask = policy.sample(prompts, group, temperature=run.config.temperature,
                                          generator=run.generator,
                                          max_new_tokens=run.task.max_new_tokens)
        return prompts, completions, mask

    @staticmethod
    def reward(run: _Run, chosen: torch.Tensor, completions: torch.Tensor, mask: torch.Tensor,
               group: int) -> torch.Tensor:
        return run.task.reward(chosen, completions, mask, group)

    @staticmethod
    def clip_fraction(run: _Run, chosen: torch.Tensor, per_prompt: torch.Tensor) -> np.ndarray:
        return np.full(len(run.tracked), math.nan)  # the tracked prompts are never trained on

    @staticmethod
    def metrics(run: _Run, old: torch.nn.Module) -> dict[str, torch.Tensor]:
        config, task, n = run.config, run.task, run.config.eval_samples
        generator = torch.Generator(device=run.device).manual_seed(
            config.seed * EVAL_SEED_FACTOR + run.iteration)
        idx = torch.as_tensor(task.eval_idx, device=run.device)
        prompts = task.prompts(idx)
        # the sampler gives the policy's log-probabilities of its draws (no extra pass)
        completions, mask, tokens = run.policy.sample_with_logprobs(
            prompts, n, max_new_tokens=task.max_new_tokens, temperature=config.temperature,
            generator=generator)

        def seq_logp(per_token: torch.Tensor) -> torch.Tensor:
            return (per_token * mask).sum(1).view(-1, n)

        def logp_of(policy: torch.nn.Module) -> torch.Tensor:
            return seq_logp(policy.token_logprobs(prompts, completions, n,
                                                  temperature=config.temperature))

        logp = seq_logp(tokens)
        kl_prev = torch.zeros_like(logp[:, 0]) if old is run.policy else (
            logp - logp_of(old)).mean(1)  # pi_0 = pi_ref: no previous policy
        return {
            "success_prob": task.reward(idx, completions, mask, n).view(-1, n).mean(1),
            "kl_ref": (logp - logp_of(run.ref_policy)).mean(1),
            "kl_prev": kl_prev,
            "entropy": -logp.mean(1),
        }


_TASK_ADAPTERS: dict[str, Any] = {"bandit": _BanditSteps, "sequence": _SequenceSteps}


def _anchors(run: _Run, old: torch.nn.Module, s: _Samples) -> _Anchors:
    """pi_ref's per-token log-probabilities where the loss has a KL to pi_ref (beta, alpha > 0)."""
    config, temp = run.config, run.config.temperature
    penalised = config.beta > 0
    needs_ref = penalised and config.kl != "exact" and config.alpha > 0
    ref_logp = (run.ref_policy.token_logprobs(s.prompts, s.completions, s.group, temperature=temp)
                if needs_ref else None)
    if config.kl != "exact" or not penalised:
        return _Anchors(None, ref_logp)
    return _Anchors(None, ref_logp, run.ref_policy.log_probs(s.chosen, temperature=temp),
                    old.log_probs(s.chosen, temperature=temp))


def _sampled_loss(run: _Run, s: _Samples, advantages: torch.Tensor,
                  anchors: _Anchors) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled GRPO loss of the current policy, and which tokens were clipped.

    With ``kl="exact"`` the per-token KL estimate is left out and the exact KL
    of the tabular policies on the chosen prompts is added instead.
    """
    config, temp = run.config, run.config.temperature
    exact_kl = config.kl == "exact"
    logp = run.policy.token_logprobs(s.prompts, s.completions, s.group, temperature=temp)
    if anchors.old is None:  # the first loss of the iteration: the policy is still pi_old
        anchors.old = logp.detach()
    beta: float | torch.Tensor = 0.0 if exact_kl else config.beta
    if run.prompt_beta is not None:
        beta = run.prompt_beta[s.chosen].repeat_interleave(s.group)
    per_token, clipped = losses.per_token_loss(
        logp, anchors.old, anchors.ref, advantages, clip_eps_low=config.clip_eps_low,
        clip_eps_high=config.clip_eps_high, beta=beta,
        kl="k3" if exact_kl else config.kl, alpha=config.alpha)
    mask_f = s.mask.to(anchors.old.dtype)
    loss = losses.aggregate(per_token, mask_f, loss_type=config.loss_type,
                            max_completion_length=s.mask.shape[1])
    if exact_kl and config.beta > 0:
        current = run.policy.log_probs(s.chosen, temperature=temp)
        penalty = torch.zeros((), dtype=loss.dtype, device=run.device)
        if config.alpha > 0:
            penalty = penalty + config.alpha * losses.tabular_kl(current, anchors.exact_ref).mean()
        if config.alpha < 1:
            penalty = penalty + (1 - config.alpha) * losses.tabular_kl(
                current, anchors.exact_prev).mean()
        loss = loss + config.beta * penalty
    return loss, clipped


Objective = Callable[[], tuple[torch.Tensor, torch.Tensor]]


def _first_order_step(run: _Run, objective: Objective, n_prompts: int) -> tuple[
        torch.Tensor, torch.Tensor]:
    """One step of the run's Adam or SGD; returns the loss and clipping before it."""
    loss, clipped = objective()
    assert run.optimizer is not None
    run.optimizer.zero_grad()
    loss.backward()
    run.optimizer.step()
    return loss, clipped


def _lbfgs_step(run: _Run, objective: Objective, n_prompts: int) -> tuple[
        torch.Tensor, torch.Tensor]:
    """One full L-BFGS solve, by a fresh optimiser; returns the loss and clipping at its start."""
    config = run.config
    lbfgs = torch.optim.LBFGS(run.policy.parameters(), lr=1.0, max_iter=config.exact_max_iter,
                              tolerance_grad=config.exact_tol / n_prompts,
                              tolerance_change=0.0, history_size=50,
                              line_search_fn="strong_wolfe")
    first: list[torch.Tensor] = []

    def closure() -> torch.Tensor:
        lbfgs.zero_grad()
        loss, clipped = objective()
        loss.backward()
        if not first:
            first.extend([loss.detach(), clipped])
        return loss

    lbfgs.step(closure)
    return first[0], first[1]


def _sampled_step(run: _Run, old: torch.nn.Module) -> tuple[dict[str, float], np.ndarray]:
    """One outer iteration of Algorithm 1 (lines 4-11)."""
    config, task = run.config, _TASK_ADAPTERS[run.config.task]
    group = config.group_size
    chosen = task.choose_prompts(run)  # line 4: a batch of prompts
    run.chosen = chosen  # read by callbacks (rl.long_run): which prompts this iteration trained
    n_prompts = len(chosen)
    with torch.no_grad():  # lines 5-8: G outputs of pi_old each, rewards, advantages
        prompts, completions, mask = task.sample(run, old, chosen, group)
        rewards = task.reward(run, chosen, completions, mask, group).to(run.dtype)
        run.rewards = rewards.view(n_prompts, group)  # read by callbacks, as run.chosen
        samples = _Samples(chosen, prompts, completions, mask, group)
        try:
            advantages = losses.group_advantages(
                rewards.view(n_prompts, group),
                dataclasses.replace(run.calibration, group_size=None)).view(-1)
        except ValueError as err:  # the group table refuses gains that are not finite
            raise _weights_fault(run, str(err)) from None
        anchors = _anchors(run, old, samples)

    def objective() -> tuple[torch.Tensor, torch.Tensor]:
        return _sampled_loss(run, samples, advantages, anchors)

    step = _lbfgs_step if run.optimizer is None else _first_order_step
    mask_f = mask.to(next(run.policy.parameters()).dtype)  # that of the log-probabilities
    clipped_tokens = torch.zeros_like(mask_f)
    step_losses: list[float] = []
    for _ in range(config.mu):  # lines 9-11: mu optimiser steps on the same samples
        loss, clipped = step(run, objective, n_prompts)
        step_losses.append(float(loss.detach()))
        clipped_tokens += clipped.to(mask_f.dtype) * mask_f
    per_prompt = clipped_tokens.view(n_prompts, -1).sum(1) / (
        mask_f.view(n_prompts, -1).sum(1) * config.mu)
    stats = {"loss": float(np.mean(step_losses)), "mean_reward": float(rewards.mean()),
             "clip_fraction": float(clipped_tokens.sum() / (mask_f.sum() * config.mu))}
    return stats, task.clip_fraction(run, chosen, per_prompt)


def _evaluate(run: _Run, old: torch.nn.Module, clip_fraction: np.ndarray) -> None:
    """Append this iteration's per-prompt metrics (see the module docstring)."""
    with torch.no_grad():
        values = _TASK_ADAPTERS[run.config.task].metrics(run, old)
    for name, value in values.items():
        run.metrics[name].append(value.double().cpu().numpy())
    run.metrics["clip_fraction"].append(clip_fraction)
    run.eval_iterations.append(run.iteration)


def _versions(device: torch.device) -> dict[str, str]:
    import grpo_companion

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "numpy": np.__version__, "grpo_companion": grpo_companion.__version__,
            "platform": platform.platform(), "device": str(device),
            "device_name": name or platform.machine()}


def _write_outputs(run: _Run, result: TrainResult, out: Path) -> None:
    io.atomic_write_csv(out / "metrics.csv", result.rows(),
                        ["iteration", "prompt", "p_ref", *METRICS])
    io.atomic_write_csv(out / "iterations.csv", run.iteration_rows,
                        ["iteration", *ITERATION_METRICS])


def _result(run: _Run, out: Path | None) -> TrainResult:
    metrics = {m: np.stack(v) for m, v in run.metrics.items()}
    if run.config.task == "bandit":
        p_ref = np.asarray(run.task.p_ref, dtype=np.float64)
    else:
        p_ref = metrics["success_prob"][0]
    reference_state = None
    if run.config.task == "sequence":
        reference_state = {k: v.detach().clone() for k, v in run.ref_policy.state_dict().items()}
    return TrainResult(config=run.config, metrics=metrics, p_ref=p_ref,
                       prompt_ids=np.asarray(run.tracked), iteration_rows=run.iteration_rows,
                       out_dir=out, device=str(run.device), sft_losses=run.sft_losses,
                       reference_state=reference_state,
                       eval_iterations=np.asarray(run.eval_iterations, dtype=np.int64))


def check_out_dir(out_dir: str | Path, *, resume: bool) -> Path:
    """Validate the output folder (nothing is written); ``ValueError`` if it cannot be used.

    A fresh run needs an absent or empty folder that can be created and
    written (not under a file, not on a read-only file system); ``resume=True``
    needs a writable folder holding a checkpoint. A folder holding only what a
    run stopped before its first checkpoint left is usable by both (see
    :func:`check_out_contents`). :func:`prepare_run` makes the same checks
    while it holds the folder's lock.
    """
    out = _check_out_place(Path(out_dir))
    check_out_contents(out, resume=resume)
    return out


def _check_out_place(out: Path) -> Path:
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


# ------------------------------------------------------------ a run's identity
def _code_text(code: types.CodeType) -> str:
    """A code object as text without its file name and line numbers (nested code too)."""
    consts = [_code_text(c) if isinstance(c, types.CodeType) else repr(c)
              for c in code.co_consts]
    return "\n".join([code.co_code.hex(), repr(code.co_names), repr(code.co_varnames),
                      *consts])


def _syntax_text(source: str) -> str:
    """The syntax tree of ``source`` without docstrings, comments, layout or line numbers.

    The raw text where it does not parse on its own (a lambda in the middle of a call
    spread over lines).
    """
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def source_digest(function: Any) -> str:
    """SHA-256 of what a function computes: its source's syntax tree, else its byte code.

    The source is what a person edits; its syntax tree (``_syntax_text``) does not
    change with the line the function starts at, its docstring, comments, layout or
    the Python version. A function without a source file (built by ``exec``) is
    hashed by its byte code and constants. Only the function's own text counts: the
    helpers it calls and the globals it reads are not followed.
    """
    target = function if inspect.isroutine(function) or inspect.isclass(function) else (
        type(function))
    try:
        text = _syntax_text(inspect.getsource(target))
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        text = (_code_text(code) if code is not None else
                f"{target.__module__}.{target.__qualname__}")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _kl_functions(config: TrainConfig) -> tuple[Callable[..., Any], ...]:
    """The code of :mod:`losses` that computes the run's KL term."""
    if config.exact:
        return (losses.exact_objective, losses.tabular_kl)
    if config.kl == "exact":
        return (losses.tabular_kl,)
    return (losses.kl_penalty,)


def run_fingerprint(config: TrainConfig, calibration: Any) -> dict[str, str]:
    """What determines a run's numbers besides the seed, as digests (stored in checkpoints).

    ``config``: the configuration (less ``RUN_ONLY_FIELDS``); ``normalization``: the
    source of the registered normalisation's ``gains`` (and of its log-space
    kernels, with its ``uses_eps``/``uses_ddof`` flags), so that a name registered
    again or an edited function is seen; ``kl``: the source of the KL code in use
    (:func:`grpo_companion.rl.losses.kl_penalty`, or the exact KL). Only these pieces are
    hashed, not
    the whole package: an edit elsewhere (the book, plotting, a docstring of another
    module) does not make a checkpoint unusable.
    """
    fields = {k: v for k, v in config.to_dict().items() if k not in RUN_ONLY_FIELDS}
    definition = calibration.definition
    parts = [definition.name, source_digest(definition.gains),
             repr((definition.uses_eps, definition.uses_ddof))]
    if definition.kernels is not None:
        kernels = definition.kernels
        parts += [source_digest(f) for f in (kernels.inverse, kernels.elasticity,
                                             kernels.log_inverse_without_eps)]
        parts.append(repr(kernels.unbounded_without_eps))
    kl = _kl_functions(config)
    return {
        "config": hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest(),
        "normalization": hashlib.sha256("\n".join(parts).encode()).hexdigest(),
        "normalization_name": definition.name,
        "kl": hashlib.sha256("\n".join(source_digest(f) for f in kl).encode()).hexdigest(),
        "kl_code": ", ".join(f"losses.{f.__name__}" for f in kl),
    }


def _check_fingerprint(path: Path, saved: Any, current: dict[str, str]) -> None:
    """Refuse a checkpoint made by other code than the run's (``ValueError``, one line)."""
    if not isinstance(saved, dict) or not all(isinstance(saved.get(k), str) for k in current):
        raise ValueError(
            f"cannot resume from {str(path)!r}: it has no fingerprint of the code that made it "
            "(an older version of this trainer wrote it), so a changed normalisation or KL "
            "estimator could not be detected; start the run again in a new folder")
    changed = []
    if saved["config"] != current["config"]:
        changed.append("the configuration")
    if saved["normalization"] != current["normalization"]:
        changed.append(f"the normalisation {current['normalization_name']!r} (its gains "
                       "function was edited or registered again)")
    if saved["kl"] != current["kl"]:
        changed.append(f"the KL estimator code ({current['kl_code']})")
    if changed:
        raise ValueError(
            f"cannot resume from {str(path)!r}: {' and '.join(changed)} changed since the "
            "checkpoint was written, so the resumed run would not be the same run; resume with "
            "the code that wrote it, or start a new run in another folder")


def _load_checkpoint(path: Path, config: TrainConfig, device: torch.device,
                     fingerprint: dict[str, str]) -> dict[str, Any]:
    """Read and check a checkpoint (``weights_only=True``); ValueError naming the file if bad."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many types for a damaged file
        # torch's own message may advise weights_only=False, which must never be followed
        # for a file of unknown origin: it is not repeated here
        raise ValueError(f"cannot resume from {str(path)!r}: it is not a readable checkpoint "
                         f"({type(err).__name__}); it is empty, truncated or corrupted, or "
                         "not written by this trainer") from None
    expected = {"format": int, "iteration": int, "config": dict, "policy": dict,
                "ref_policy": dict, "generator": torch.Tensor, "sft_losses": list,
                "history_records": int, "history_sha256": str}
    if not isinstance(state, dict):
        raise ValueError(f"cannot resume from {str(path)!r}: it does not hold a checkpoint "
                         f"of this trainer (a {type(state).__name__})")
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"cannot resume from {str(path)!r}: checkpoint format "
                         f"{state.get('format')!r}, this trainer reads {CHECKPOINT_FORMAT}")
    for key, kind in expected.items():
        if not isinstance(state.get(key), kind):
            raise ValueError(f"cannot resume from {str(path)!r}: its entry {key!r} is missing "
                             "or damaged")
    saved = {k: v for k, v in state["config"].items() if k not in RUN_ONLY_FIELDS}
    wanted = {k: v for k, v in config.to_dict().items() if k not in RUN_ONLY_FIELDS}
    if saved != wanted:
        diff = sorted(k for k in wanted.keys() | saved.keys() if saved.get(k) != wanted.get(k))
        shown = ", ".join(f"{k} (checkpoint {saved.get(k)!r}, now {wanted.get(k)!r})"
                          for k in diff[:6])
        raise ValueError(f"cannot resume from {str(path)!r}: the configuration differs from "
                         f"the checkpointed run in {shown}")
    _check_fingerprint(path, state.get("fingerprint"), fingerprint)
    if not 0 <= state["iteration"] <= config.iterations or (
            state["history_records"] != state["iteration"] + 1):
        raise ValueError(f"cannot resume from {str(path)!r}: its iteration count is damaged")
    return state


class PreparedRun:
    """A run whose configuration, output folder and checkpoint have all been checked.

    :func:`prepare_run` builds it without writing anything but the folder's lock
    (every problem is a ``ValueError``); :meth:`run` then trains. Any exception
    from :meth:`run` marks ``run.json`` as ``"failed"`` (``"interrupted"`` for
    Ctrl-C) with the message before it propagates. ``lock`` (an acquired
    :class:`io.FolderLock` of ``out``) is released when :meth:`run` ends or by
    :meth:`close`; ``notice`` is a line to show before the run (a reused folder).
    """

    def __init__(self, config: TrainConfig, out: Path | None, resume: bool,
                 reference_state: dict[str, torch.Tensor] | None, *,
                 lock: io.FolderLock | None = None, notice: str | None = None) -> None:
        self.config, self.out, self.resume = config, out, resume
        self.lock, self.notice = lock, notice
        self.device = resolve_device(config.device)
        self.run_state = _Run(config, self.device)
        self.reference_state = reference_state
        self.checkpoint: dict[str, Any] | None = None
        self.history: MetricHistory | None = None
        if out is not None:
            self.history = MetricHistory(out / HISTORY, METRICS, ITERATION_METRICS,
                                         len(self.run_state.tracked))
        if resume:
            assert out is not None
            self.checkpoint = _load_checkpoint(out / CHECKPOINT, config, self.device,
                                               self.run_state.fingerprint)
            self.run_state.load(self.checkpoint, out / CHECKPOINT)
            self.run_state.load_history(self.checkpoint, self.history, out / CHECKPOINT)

    def run(self, callback: Callable[[int], None] | None = None,
            on_start: Callable[[], None] | None = None) -> TrainResult:
        """Train (see :func:`train`).

        ``on_start`` is called once, after the pre-training and the evaluation
        of iteration 0 and before the first GRPO iteration (not on resume):
        where ``run_state`` holds pi_ref and the policy is still equal to it.
        """
        config, out, run = self.config, self.out, self.run_state
        started = time.time()
        record: dict[str, Any] = {"config": config.to_dict(), "seed": config.seed,
                                  "versions": _versions(self.device), "status": "running"}
        try:
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                io.remove_stale_temporaries(out, RUN_FILES)
                if self.checkpoint is None:  # a reused folder: no history of the old start
                    (out / HISTORY).unlink(missing_ok=True)
                io.atomic_write_json(out / "run.json", record)
            if self.checkpoint is not None:
                assert self.history is not None
                if "metrics" not in self.checkpoint:
                    self.history.continue_after_read()
            else:
                run.pretrain(self.reference_state)
                _evaluate(run, run.policy, np.full(len(run.tracked), math.nan))
                _check_finite(run, None)
                if self.history is not None:
                    self.history.start()
                    self.history.append(_last_metrics(run), None)
                if on_start is not None:
                    on_start()
            result = self._loop(callback)
            if out is not None:
                _write_outputs(run, result, out)
                record.update(status="complete", elapsed_s=time.time() - started)
                io.atomic_write_json(out / "run.json", record)
                assert self.history is not None
                self.history.remove()  # the final checkpoint holds the whole history
            return result
        except BaseException as err:
            if self.history is not None:
                self.history.close()
            if out is not None and out.is_dir():
                interrupted = isinstance(err, KeyboardInterrupt)
                record.update(status="interrupted" if interrupted else "failed",
                              iteration=run.iteration, elapsed_s=time.time() - started,
                              error=f"{type(err).__name__}: {err}" if str(err) else
                              type(err).__name__)
                with contextlib.suppress(OSError):  # a full or read-only disk: keep the error
                    io.atomic_write_json(out / "run.json", record)
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Release the folder (its lock file is removed); :meth:`run` does it when it ends."""
        if self.lock is not None:
            self.lock.release()

    def __del__(self) -> None:  # a prepared run that never ran does not keep its folder
        with contextlib.suppress(Exception):
            self.close()

    def _loop(self, callback: Callable[[int], None] | None) -> TrainResult:
        config, out, run = self.config, self.out, self.run_state
        bar = tqdm(range(run.iteration + 1, config.iterations + 1), disable=not config.progress,
                   desc="GRPO", initial=run.iteration, total=config.iterations)
        for n in bar:
            run.iteration = n
            evaluate = config.evaluated(n)
            # pi_old is needed after the step only by the metrics (kl_prev) and the exact
            # steps; otherwise the policy itself samples, before it is updated
            keep_old = evaluate or config.exact or config.kl == "exact"
            old = _frozen_copy(run.policy) if keep_old else run.policy
            if config.exact:
                stats, clip_fraction = _exact_step(run, old), np.full(len(run.tracked), math.nan)
            else:
                stats, clip_fraction = _sampled_step(run, old)
            if evaluate:
                _evaluate(run, old, clip_fraction)
            row = {"iteration": n, **stats}
            run.iteration_rows.append(row)
            _check_finite(run, row, metrics=evaluate)
            if config.ref_reset_every and n % config.ref_reset_every == 0:
                run.ref_policy = _frozen_copy(run.policy)
            if out is not None:
                assert self.history is not None
                self.history.append(_last_metrics(run) if evaluate else _no_metrics(run), row)
                if n % config.checkpoint_every == 0 or n == config.iterations:
                    digest = self.history.sync()
                    io.atomic_torch_save(out / CHECKPOINT,
                                         run.state(digest, final=n == config.iterations))
                    run.checkpointed = n
            bar.set_postfix(pos=f"{float(np.mean(run.metrics['success_prob'][-1])):.3f}")
            if callback is not None:
                callback(n)
        bar.close()
        return _result(run, out)


def _last_metrics(run: _Run) -> dict[str, np.ndarray]:
    return {m: run.metrics[m][-1] for m in METRICS}


def _no_metrics(run: _Run) -> dict[str, np.ndarray]:
    """The history record of an iteration that is not evaluated: NaN for every metric."""
    return {m: np.full(len(run.tracked), math.nan) for m in METRICS}


def _check_finite(run: _Run, row: dict[str, float] | None, *, metrics: bool = True) -> None:
    """Stop a run whose policy or metrics stopped being numbers (no silent NaN in the files)."""
    bad = [name for name, p in run.policy.named_parameters() if not bool(torch.isfinite(p).all())]
    bad += [m for m in METRICS if metrics and m != "clip_fraction"  # NaN by design: untrained
            if not np.isfinite(run.metrics[m][-1]).all()]
    if row is not None and not math.isfinite(row["loss"]):
        bad.append("loss")
    if bad:
        hint = ("lower --lr or raise --beta" if not run.config.exact else
                "change --beta or --eps")
        raise TrainingFault(
            f"training diverged at iteration {run.iteration}: {', '.join(bad)} became inf or "
            f"NaN ({hint}); {_checkpoint_note(run)}")


def _checkpoint_note(run: _Run) -> str:
    """What is left to continue from: the last checkpoint, or none yet."""
    if run.checkpointed is None:
        return "no checkpoint was written yet"
    return f"the last checkpoint is from iteration {run.checkpointed}"


def prepare_run(
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    reference_state: dict[str, torch.Tensor] | None = None,
) -> PreparedRun:
    """Check everything about a run without writing anything; ``ValueError`` if it cannot start.

    Checks the configuration, the output folder (:func:`check_out_dir`) and, with
    ``resume``, the checkpoint: readable with ``weights_only=True``, of the same
    configuration and code (:func:`run_fingerprint`), its saved state fitting the
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
    out = _check_out_place(Path(out_dir))
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
        fingerprint the current code's (:func:`run_fingerprint`; a checkpoint
        without one, from an older trainer, is refused). The resumed run ends
        with the same results as an uninterrupted one. Temporary files left by
        a killed run are removed. Without a checkpoint, a folder holding only a
        stopped run's leftovers is started afresh, as without ``resume``.
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
