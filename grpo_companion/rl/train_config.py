"""The configuration of a toy GRPO run: :class:`TrainConfig`.

Every knob of :func:`grpo_companion.rl.trainer.train` is a field of
:class:`TrainConfig`, declared once with its help and valid values
(:mod:`grpo_companion.rl.config`). Building a config checks its values and touches no
device; :func:`grpo_companion.rl.machine.check_machine` asks the machine when a run is
prepared.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from grpo_companion.rl import config as _config
from grpo_companion.rl import losses
from grpo_companion.rl.config import Choice, Flag, Int, Real, Reals, Text, knob
from grpo_companion.theory.normalizations import EPS_PLACEMENTS, NORMALIZATIONS

TASKS = ("bandit", "sequence")
KL_CHOICES = losses.KL_CHOICES
OPTIMIZERS = ("adam", "sgd", "lbfgs")
DTYPES = ("float32", "float64")
#: The per-prompt metrics of an evaluated iteration (``metrics.csv``), in order.
METRICS = ("success_prob", "kl_ref", "kl_prev", "entropy", "clip_fraction")
#: The statistics of every iteration (``iterations.csv``), after its number.
ITERATION_METRICS = ("loss", "mean_reward", "clip_fraction")
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
#: ``eval_every`` of the sequence task when none is given. With the default sizes one
#: evaluation (256 prompts x 50 samples, then pi_ref's and pi_old's log-probabilities of
#: them) costs about 8 training iterations (64 prompts x 16), so one every 50 iterations
#: costs under a fifth of the training time (``benchmarks/bench_trainer.py`` measures it).
SEQUENCE_EVAL_EVERY = 50


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
    ref_mixup_alpha: float = knob(
        1.0, "at each reset, pi_ref's parameters become a theta + (1 - a) theta_ref with this "
        "a (TRL's sync_ref_model with ref_model_mixup_alpha; on the bandit's logits the "
        "recurrence of theory.staged.moving_reference_iterate); 1: pi_ref <- pi",
        Real(0.0, 1.0), group=OBJECTIVE)
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
        if self.ref_mixup_alpha != 1.0 and self.ref_reset_every is None:
            raise bad("ref_mixup_alpha", "1.0 when ref_reset_every is None (it mixes pi_ref "
                      "toward pi at each reset)")
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
        parse_device(self.device)  # its form; whether this machine has it: machine.check_machine

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
