"""The configuration of a toy GRPO run: :class:`TrainConfig`, nested by concern.

Two switches (``task``, ``exact``) and six sections: :class:`RunConfig` (length, seed,
device, records), :class:`GRPOConfig` (the objective and the sampled update),
:class:`OptimConfig` (optimiser and exact solver), :class:`BanditConfig`,
:class:`SequenceConfig` and :class:`ModelConfig` (the tasks and the transformer). Each field
is declared once: its type carries its check and TRL name (:mod:`grpo_companion.rl.checks`),
the docstring under it is its help, and tyro derives ``python -m grpo_companion train`` from
them (:mod:`grpo_companion.rl.cli`). Building a config checks every value and touches no
device and no memory probe (:func:`grpo_companion.rl.machine.check_machine` asks the machine
when a run is prepared). Field names are unique across sections, so ``TrainConfig.flat(beta=0.5)``
and ``config.replace(seed=3)`` name a field alone, and the command line spells it
``--field-name``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import torch

from grpo_companion.rl import losses
from grpo_companion.rl.checks import (
    TRL,
    Choice,
    Flag,
    Int,
    Real,
    Reals,
    Text,
    check_fields,
    merge_preset,
)
from grpo_companion.theory.normalizations import EPS_PLACEMENTS, NORMALIZATIONS

Task = Literal["bandit", "sequence"]
TASKS: tuple[str, ...] = typing.get_args(Task)
Optimizer = Literal["adam", "sgd", "lbfgs"]
OPTIMIZERS: tuple[str, ...] = typing.get_args(Optimizer)
Dtype = Literal["float32", "float64"]
DTYPES: tuple[str, ...] = typing.get_args(Dtype)
KL_CHOICES = losses.KL_CHOICES
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

#: What TRL's ``scale_rewards`` values are here (the note of the TRL name table).
_SCALE_REWARDS = (
    '"group" is normalization="mean_std" with eps=1e-4 outside the square root '
    '(eps_placement="std") and Bessel\'s ddof=1, the calibration "trl" (--calibration=trl); '
    '"none" is normalization="mean_only" (--calibration=mean_only); "batch" (one standard '
    "deviation over the whole batch) has no per-prompt equivalent and is not supported")
_SCALE = TRL("scale_rewards")


class _Checked:
    """Validates every field with the check in its type when the section is built."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class RunConfig(_Checked):
    """How long the run is, its seed, its device, and what it records."""

    iterations: Annotated[int, Int(1)] = 20
    """outer GRPO iterations M"""
    seed: Annotated[int, Int(0, MAX_SEED, text="an int in [0, 2**64 - 1]",
                             why="generators take 64-bit seeds")] = 0
    """seed of every random draw (task, sampling, pre-training)"""
    device: Annotated[str, Text()] = "auto"
    """auto (CUDA when available), cpu, cuda, or one CUDA device by its index, as in torch (e.g. ``cuda:1``)"""
    dtype: Annotated[Dtype, Choice(values=DTYPES)] = "float32"
    """precision of the tabular policies in sampled mode (exact mode always uses float64, the transformer always float32)"""
    progress: Annotated[bool, Flag()] = True
    """show a progress bar"""
    checkpoint_every: Annotated[int, Int(1)] = 1
    """write the checkpoint every this many iterations (and after the last)"""
    eval_every: Annotated[int | None, Int(1, optional=True)] = None
    """compute the per-prompt metrics (metrics.csv, TrainResult.metrics) every this many iterations, and always at iteration 0 and the last; None means every iteration for the bandit (its metrics are exact and cheap), every 50 for the sequence task (its sampled evaluation would otherwise cost several training iterations each time)"""


@dataclass(frozen=True)
class GRPOConfig(_Checked):
    """The GRPO objective (Algorithm 1, eqs. 4-6, 9, 13, 17) and its sampled update."""

    beta: Annotated[float, Real(BETA_RANGE[0], BETA_RANGE[1], or_zero=True,
                                why="beyond it the KL term over- or underflows float32 and the "
                                    "exact solve loses precision"), TRL("beta")] = 0.1
    """weight of the KL penalty; 0 means none, and no forward pass of pi_ref during training (TRL's default, DAPO's setting; not with exact, which divides by beta)"""
    alpha: Annotated[float, Real(0.0, 1.0)] = 1.0
    """reference share of the KL anchor, 1 for GRPO (eq. 6), 0 for Mirror GRPO (eq. 9), in between two-KL (eq. 17)"""
    ref_reset_every: Annotated[int | None, Int(1, optional=True)] = None
    """set pi_ref <- pi every this many iterations (DeepSeekMath's iterative GRPO); None means never"""
    ref_mixup_alpha: Annotated[float, Real(0.0, 1.0)] = 1.0
    """at each reset, pi_ref's parameters become a theta + (1 - a) theta_ref with this a (TRL's sync_ref_model with ref_model_mixup_alpha; on the bandit's logits the recurrence of theory.analyses.staged.moving_reference_iterate); 1 means pi_ref <- pi"""
    normalization: Annotated[Literal[tuple(NORMALIZATIONS)],  # type: ignore[valid-type]
                             Choice(values=NORMALIZATIONS.keys),
                             TRL("scale_rewards", _SCALE_REWARDS)] = "mean_std"
    """reward normalisation of the group advantages, a name registered in theory.NORMALIZATIONS (mean_std is GRPO's whitening, eq. 4; mean_only Dr. GRPO's centring, eq. 13)"""
    eps: Annotated[float, Real(EPS_MIN, finite=True, or_zero=True,
                               why="a smaller one overflows 1 / eps"), _SCALE] = 1e-5
    """smoothing constant of the group standard deviation"""
    eps_placement: Annotated[Literal[EPS_PLACEMENTS],  # type: ignore[valid-type]
                             Choice(values=EPS_PLACEMENTS), _SCALE] = "sqrt"
    """sqrt divides r - mean by sqrt(var + eps), the paper's eq. (4); std divides it by std + eps, as TRL"""
    ddof: Annotated[int, Int(0, 1, text="0 or 1"), _SCALE] = 0
    """group variance; 0 divides by G (the paper), 1 by G - 1 (Bessel, as TRL)"""
    exact_group_size: Annotated[int | None, Int(2, optional=True)] = None
    """in exact mode, the exact expected weights of a group of this many samples; None means the paper's population weights"""
    group_size: Annotated[int, Int(2, why="a group of one output has no spread to normalise"),
                          TRL("num_generations")] = 16
    """G, outputs sampled per prompt"""
    mu: Annotated[int, Int(1), TRL("num_iterations")] = 1
    """optimiser steps per outer iteration on the same samples"""
    clip_eps_low: Annotated[float | None, Real(0.0, 1.0, optional=True), TRL("epsilon")] = 0.2
    """PPO clipping range below 1 (the ratio is kept >= 1 - clip_eps_low); None means no clipping"""
    clip_eps_high: Annotated[float | None,
                             Real(0.0, CLIP_EPS_HIGH_MAX, or_inf=True, optional=True,
                                  why="1 + clip_eps_high must be a float32; inf: no upper "
                                      "clipping"),
                             TRL("epsilon_high")] = None
    """clipping range above 1 (DAPO's clip-higher); None means the same as clip_eps_low"""
    kl: Annotated[Literal[tuple(KL_CHOICES)],  # type: ignore[valid-type]
                  Choice(values=KL_CHOICES),
                  TRL("use_bias_correction_kl", 'True is kl="k3_ratio", False is kl="k3"')
                  ] = "k3"
    """KL penalty in the loss, a per-token estimator of theory.kl_estimators, or exact (bandit only, the exact KL of the tabular policies)"""
    loss_type: Annotated[Literal[losses.LOSS_TYPES],  # type: ignore[valid-type]
                         Choice(values=losses.LOSS_TYPES), TRL("loss_type")] = "grpo"
    """how the per-token losses are averaged into one number, as TRL's loss_type"""
    temperature: Annotated[float, Real(TEMPERATURE_RANGE[0], TEMPERATURE_RANGE[1],
                                       why="beyond it the tempered logits leave the float "
                                           "range, or sampling is greedy or uniform"),
                           TRL("temperature")] = 1.0
    """sampling temperature (also applied to the log-probabilities of the loss)"""
    prompts_per_iteration: Annotated[int | None, Int(1, optional=True)] = None
    """prompts drawn per iteration; None means every bandit prompt, or 64 sequence prompts"""


@dataclass(frozen=True)
class OptimConfig(_Checked):
    """The optimiser of the sampled update, and the solver of the exact one."""

    optimizer: Annotated[Optimizer, Choice(values=OPTIMIZERS)] = "adam"
    """adam, sgd, or lbfgs (each of the mu steps is a full L-BFGS solve of the sampled objective, fresh every iteration)"""
    lr: Annotated[float | None,
                  Real(0.0, LR_MAX, open_low=True, optional=True,
                       why="a larger step moves the logits beyond what float32 holds"),
                  TRL("learning_rate")] = None
    """learning rate; None means 0.1 for the bandit, 1e-3 for the sequence task"""
    exact_tol: Annotated[float, Real(0.0, open_low=True, finite=True)] = 1e-12
    """stationarity gap at which the exact solve stops; also the gradient tolerance of sampled-mode L-BFGS"""
    exact_step: Annotated[float, Real(0.0, 1.0, open_low=True)] = 0.5
    """mirror-ascent step of the exact solve, times beta"""
    exact_max_iter: Annotated[int, Int(1)] = 500
    """iteration cap of the exact solve and of sampled-mode L-BFGS"""


@dataclass(frozen=True)
class BanditConfig(_Checked):
    """The bandit task: a tabular softmax policy over K outputs for each prompt."""

    n_prompts: Annotated[int, Int(1)] = 256
    """number of prompts"""
    n_outputs: Annotated[int, Int(2)] = 16
    """K, outputs per prompt"""
    n_success: Annotated[int | None, Int(1, optional=True)] = None
    """size of each prompt's success set; None means K // 10, at least 1"""
    p_ref: Annotated[tuple[float, ...] | None, Reals(Real(0.0, 1.0), optional=True)] = None
    """reference PoS values, cycled over the prompts; None means draws from Beta(p_ref_beta), and 0 for a fraction p_ref_zero_fraction of the prompts"""
    p_ref_beta: Annotated[tuple[float, float],
                          Reals(Real(0.0, open_low=True, finite=True), 2)] = (0.5, 2.0)
    """parameters A, B of the Beta law of the reference PoS"""
    p_ref_zero_fraction: Annotated[float, Real(0.0, 1.0)] = 0.1
    """fraction of the prompts whose reference PoS is 0 (without p_ref)"""
    logit_scale: Annotated[float, Real(0.0, finite=True)] = 1.0
    """standard deviation of the random reference logits within the success and the failure sets"""


@dataclass(frozen=True)
class SequenceConfig(_Checked):
    """The sequence task: two-digit additions, with a reference pre-trained to forget carries."""

    max_operand: Annotated[int, Int(1, 99)] = 49
    """largest operand of the additions"""
    n_eval_prompts: Annotated[int, Int(1)] = 256
    """held-out prompts whose PoS is tracked"""
    grpo_prompts: Annotated[int | None, Int(1, optional=True)] = None
    """GRPO trains on a fixed set of this many training prompts (ArithmeticTask.grpo_pool, the first of a seeded shuffle; pre-training still uses every training prompt); None means all of them"""
    grpo_beta_multipliers: Annotated[tuple[float, ...] | None,
                                     Reals(Real(1e-3, 1e3), optional=True)] = None
    """per-prompt KL weights; the i-th prompt of the GRPO pool (grpo_pool's order) is penalised with beta * multipliers[i % len(multipliers)], so that one run spreads the fixed points over prompts; needs grpo_prompts and beta > 0; None means beta for every prompt"""
    eval_samples: Annotated[int, Int(1)] = 50
    """samples per held-out prompt for the PoS estimate"""
    carry_error_span: Annotated[float, Real(0.0, open_low=True, finite=True)] = 6.0
    """the pre-training data forgets a carry with probability min(1, (u - 9) / span), u the sum of the units digits"""


@dataclass(frozen=True)
class ModelConfig(_Checked):
    """The sequence task's transformer and its supervised pre-training (the reference)."""

    d_model: Annotated[int, Int(1)] = 64
    """transformer width"""
    n_layers: Annotated[int, Int(1)] = 2
    """transformer layers"""
    n_heads: Annotated[int, Int(1)] = 4
    """attention heads (d_model must be a multiple)"""
    sft_steps: Annotated[int, Int(0)] = 600
    """supervised pre-training steps of the reference"""
    sft_batch_size: Annotated[int, Int(1)] = 256
    """batch size of the pre-training"""
    sft_lr: Annotated[float, Real(0.0, open_low=True, finite=True)] = 3e-3
    """learning rate of the pre-training (Adam)"""


#: The sections of :class:`TrainConfig`, by attribute name.
SECTIONS: dict[str, type] = {"run": RunConfig, "grpo": GRPOConfig, "optim": OptimConfig,
                             "bandit": BanditConfig, "sequence": SequenceConfig,
                             "model": ModelConfig}


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


@functools.cache
def section_of() -> dict[str, str]:
    """The section of every field, by field name (``{"beta": "grpo", ...}``)."""
    where: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.name in where or f.name in ("task", "exact"):
                raise TypeError(f"field {f.name!r} is declared twice")
            where[f.name] = section
    return where


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a toy GRPO run (Algorithm 1, App. B): two switches and five sections.

    ``TrainConfig(task="sequence", grpo=GRPOConfig(beta=0.5), run=RunConfig(seed=3))``
    builds one section by section; :meth:`flat` takes the fields by name alone, and
    :meth:`replace` changes some. Every field is validated on construction; a bad value
    raises ``ValueError`` naming the field, its value and the valid range, and so does
    a combination of fields that cannot run together. :attr:`variant` and
    :attr:`calibration` are the run's GRPO variant, as the theory takes it.
    """

    task: Annotated[Task, Choice(values=TASKS)] = "bandit"
    """bandit, a tabular softmax policy over K outputs per prompt, or sequence, a tiny transformer learning two-digit addition"""
    exact: Annotated[bool, Flag()] = False
    """bandit only, every sample average replaced by its expectation and each iteration solved to convergence (the paper's recurrence), in float64; the fields of the sampled update (group_size, mu, clip_eps_*, kl, loss_type, temperature, prompts_per_iteration, optimizer, lr) are not used"""
    run: RunConfig = field(default_factory=RunConfig)
    """how long, which seed, where, what is recorded"""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """the objective and the sampled update"""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """the optimiser and the exact solver"""
    bandit: BanditConfig = field(default_factory=BanditConfig)
    """the bandit task"""
    sequence: SequenceConfig = field(default_factory=SequenceConfig)
    """the sequence task"""
    model: ModelConfig = field(default_factory=ModelConfig)
    """the sequence task's transformer"""

    def __post_init__(self) -> None:
        Choice(values=TASKS).validate("task", self.task)
        Flag().validate("exact", self.exact)
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"{name} must be a {cls.__name__}, got "
                                 f"{getattr(self, name)!r}")
        self._check_combinations()

    # ----------------------------------------------------------- by field name
    @classmethod
    def flat(cls, *, variant: Any = None, **fields: Any) -> TrainConfig:
        """The config with these fields, each named alone (``beta=0.5``, not its section).

        ``variant=theory.Variant(...)`` sets the calibration (``normalization``, ``eps``,
        ``eps_placement``, ``ddof`` and, from its ``group_size``, ``exact_group_size``)
        and ``alpha``; a field passed as well must agree with it.
        """
        if variant is not None:
            fields = merge_preset(variant_fields(variant), fields,
                                  label=f"variant={getattr(variant, 'name', variant)!r}")
        return cls()._with(fields)

    def replace(self, **fields: Any) -> TrainConfig:
        """A copy with these fields changed, each named alone (``config.replace(seed=3)``)."""
        return self._with(fields)

    def _with(self, fields: dict[str, Any]) -> TrainConfig:
        where = section_of()
        unknown = sorted(set(fields) - set(where) - {"task", "exact"})
        if unknown:
            raise TypeError(f"TrainConfig has no field {unknown[0]!r}")
        by_section: dict[str, dict[str, Any]] = {}
        for name, value in fields.items():
            if name not in ("task", "exact"):
                by_section.setdefault(where[name], {})[name] = value
        changes: dict[str, Any] = {k: fields[k] for k in ("task", "exact") if k in fields}
        for section, values in by_section.items():
            changes[section] = dataclasses.replace(getattr(self, section), **values)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field by its name, in one JSON-ready level (names are unique across sections)."""
        out: dict[str, Any] = {"task": self.task, "exact": self.exact}
        for section in SECTIONS:
            for name, value in dataclasses.asdict(getattr(self, section)).items():
                out[name] = list(value) if isinstance(value, tuple) else value
        return out

    # ------------------------------------------------------------ combinations
    def _check_combinations(self) -> None:
        """The checks that involve several fields (each field is already valid alone)."""
        run, grpo, optim = self.run, self.grpo, self.optim
        bandit, sequence, model = self.bandit, self.sequence, self.model

        def bad(section: Any, name: str, valid: str) -> ValueError:
            return ValueError(f"{name} must be {valid}, got {getattr(section, name)!r}")

        losses._clip_bounds(grpo.clip_eps_low, grpo.clip_eps_high)
        if grpo.ref_mixup_alpha != 1.0 and grpo.ref_reset_every is None:
            raise bad(grpo, "ref_mixup_alpha", "1.0 when ref_reset_every is None (it mixes "
                      "pi_ref toward pi at each reset)")
        if bandit.n_success is not None and bandit.n_success >= bandit.n_outputs:
            raise bad(bandit, "n_success", f"None or an int in [1, {bandit.n_outputs - 1}]")
        n_pairs = (sequence.max_operand + 1) ** 2
        if sequence.n_eval_prompts >= n_pairs:
            raise bad(sequence, "n_eval_prompts", f"an int in [1, {n_pairs - 1}] "
                                                  f"(max_operand={sequence.max_operand})")
        if model.d_model % model.n_heads:
            raise bad(model, "d_model", f"a multiple of n_heads={model.n_heads}")
        if self.exact and self.task != "bandit":
            raise bad(self, "exact", "False for task='sequence' (exact mode needs a tabular "
                                     "policy)")
        if self.exact and grpo.beta == 0:
            raise ValueError(
                "exact=True cannot be combined with beta=0: the exact iteration pi ∝ pi_ref "
                "exp(A / beta) divides by beta; use beta > 0, or exact=False (sampled GRPO "
                "without a KL penalty)")
        if grpo.kl == "exact" and self.task != "bandit":
            raise bad(grpo, "kl", f"one of {losses.KL_ESTIMATORS} for task='sequence' "
                                  "(the exact KL needs a tabular policy)")
        if sequence.grpo_beta_multipliers is not None:
            if self.task != "sequence" or sequence.grpo_prompts is None or grpo.beta == 0:
                raise bad(sequence, "grpo_beta_multipliers",
                          "None unless task='sequence', grpo_prompts is set and beta > 0 "
                          "(the multipliers scale beta per GRPO prompt)")
            low, high = BETA_RANGE
            for m in sequence.grpo_beta_multipliers:
                if not low <= grpo.beta * m <= high:
                    raise bad(sequence, "grpo_beta_multipliers",
                              f"multipliers m with beta * m in [{low:g}, {high:g}] "
                              f"(beta={grpo.beta:g}), got {m!r}")
        pool = n_pairs - sequence.n_eval_prompts
        if sequence.grpo_prompts is not None and sequence.grpo_prompts > pool:
            raise bad(sequence, "grpo_prompts", f"None or an int in [1, {pool}] (the training "
                      f"prompts left by n_eval_prompts={sequence.n_eval_prompts})")
        if grpo.prompts_per_iteration is not None:
            limit = bandit.n_prompts if self.task == "bandit" else sequence.grpo_prompts or pool
            if grpo.prompts_per_iteration > limit:
                raise bad(grpo, "prompts_per_iteration", f"None or an int in [1, {limit}]")
        if not self.exact and optim.optimizer == "lbfgs" and grpo.beta == 0 and (
                grpo.clip_eps_low is None or grpo.clip_eps_low == math.inf):
            raise ValueError(
                "optimizer='lbfgs' cannot be combined with beta=0 and clip_eps_low=None: "
                "without a KL penalty or clipping the sampled objective is unbounded, so there "
                "is no minimum to reach; set beta > 0 or clip_eps_low, or use optimizer='adam' "
                "or 'sgd'")
        if not self.exact and optim.optimizer == "lbfgs" and grpo.kl == "k1" and grpo.beta > 0:
            raise ValueError(
                "optimizer='lbfgs' cannot be combined with kl='k1': L-BFGS minimises the "
                "sampled objective to convergence, and the k1 penalty (log pi - log pi_ref on "
                "the sampled outputs) is unbounded below, so there is no minimum to reach; use "
                f"kl={' or '.join(repr(k) for k in KL_CHOICES if k != 'k1')}, or optimizer='adam' "
                "or 'sgd'")
        if self.task == "sequence":
            limit = (MAX_SEED - run.iterations) // EVAL_SEED_FACTOR
            if run.seed > limit:
                raise bad(run, "seed", f"an int in [0, {limit}] for task='sequence' (the "
                          f"evaluation of iteration n is seeded with seed * {EVAL_SEED_FACTOR} "
                          "+ n, which must fit in 64 bits)")
        parse_device(run.device)  # its form; whether this machine has it: machine.check_machine

    # ----------------------------------------------------------------- derived
    @property
    def evaluation_interval(self) -> int:
        """``eval_every``, or the task's default when it is None."""
        if self.run.eval_every is not None:
            return self.run.eval_every
        return 1 if self.task == "bandit" else SEQUENCE_EVAL_EVERY

    def evaluated(self, iteration: int) -> bool:
        """Whether the per-prompt metrics are computed after ``iteration`` (0: pi_ref)."""
        return iteration % self.evaluation_interval == 0 or iteration == self.run.iterations

    @property
    def eval_iterations(self) -> tuple[int, ...]:
        """The iterations whose per-prompt metrics are computed, in order (0 and the last)."""
        every, last_iteration = self.evaluation_interval, self.run.iterations
        last = () if last_iteration % every == 0 else (last_iteration,)
        return (*range(0, last_iteration + 1, every), *last)

    @property
    def n_evaluations(self) -> int:
        """``len(eval_iterations)``, without listing them."""
        every, iterations = self.evaluation_interval, self.run.iterations
        return iterations // every + 1 + (iterations % every != 0)

    @property
    def calibration(self) -> Any:
        """The run's calibration, the one place a config becomes a ``theory.Calibration``.

        ``exact_group_size`` sets its ``group_size`` (exact mode's expected
        finite-group weights); sampled mode uses the table of the same calibration
        for groups of ``group_size``.
        """
        from grpo_companion import theory

        g = self.grpo
        return theory.Calibration(normalization=g.normalization, eps=g.eps,
                                  eps_placement=g.eps_placement,
                                  group_size=g.exact_group_size, ddof=g.ddof)

    @property
    def variant(self) -> Any:
        """The run's GRPO variant, its :attr:`calibration` and the anchor with share ``alpha``."""
        from grpo_companion.theory.variants import Anchor, Variant

        return Variant(self.calibration, Anchor(self.grpo.alpha))


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
