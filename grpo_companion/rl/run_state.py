"""The state of one training run: task, policies, optimiser, random generator.

:class:`RunState` is what a checkpoint saves and what the GRPO iteration
(:func:`grpo_companion.rl.trainer.grpo_iteration`) reads and updates; callbacks read
the prompts and rewards of the last iteration from it (``chosen``, ``rewards``).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from grpo_companion.rl.fingerprint import run_fingerprint
from grpo_companion.rl.grpo_tasks import GRPOTask, make_grpo_task
from grpo_companion.rl.tasks import ArithmeticTask, BanditTask, pretrain_reference
from grpo_companion.rl.train_config import TrainConfig


class TrainingFault(RuntimeError):
    """A run that cannot go on: it diverged, a solve failed, or its files cannot be written.

    ``run.json`` is then marked ``"failed"`` with the message, the last
    checkpoint stays, and the command line prints the message (exit status 1).
    """


def frozen_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` without gradients, in evaluation mode (pi_old, pi_ref)."""
    clone = copy.deepcopy(module)
    clone.requires_grad_(False)
    return clone.eval()


def mixed_reference(ref: nn.Module, policy: nn.Module, mixup_alpha: float) -> nn.Module:
    """pi_ref after a sync: parameters ``a theta + (1 - a) theta_ref``, as TRL's
    ``SyncRefModelCallback`` (``sync_ref_model=True``, ``a = ref_model_mixup_alpha``).

    ``a = 1`` is :func:`frozen_copy` of the policy (the trainer's plain reset, bit for bit),
    ``a = 0`` keeps ``ref``. A new frozen module; ``ref`` and ``policy`` are not changed.
    For the bandit's tabular logits this mixes log-probabilities, whose success logit
    follows :func:`grpo_companion.theory.analyses.staged.mixed_reference_logit`.
    """
    if not 0.0 <= mixup_alpha <= 1.0:
        raise ValueError(f"mixup_alpha must be a number in [0, 1], got {mixup_alpha!r}")
    if mixup_alpha == 1.0:
        return frozen_copy(policy)
    mixed = frozen_copy(ref)
    if mixup_alpha == 0.0:
        return mixed
    with torch.no_grad():
        for target, source in zip(mixed.parameters(), policy.parameters(), strict=True):
            target.mul_(1.0 - mixup_alpha).add_(source.detach(), alpha=mixup_alpha)
    return mixed


class RunState:
    """One run's task, policies, optimiser and generator, and where it is.

    Attributes
    ----------
    grpo_task
        The task as the trainer uses it (:class:`~grpo_companion.rl.grpo_tasks.GRPOTask`);
        ``task`` is its data (a ``BanditTask`` or an ``ArithmeticTask``) and ``tracked``
        the prompts whose metrics are recorded.
    policy, ref_policy
        pi being trained and pi_ref (frozen; reset to pi every ``ref_reset_every``).
    prompt_beta
        The KL weight of every task prompt (``grpo_beta_multipliers``), or None: ``beta``.
    optimizer
        Adam or SGD; None for L-BFGS, which is built afresh for each step.
    iteration, checkpointed
        The last iteration done, and that of the last checkpoint on disk (None: none yet).
    chosen, rewards
        The prompts of the last iteration and their groups' rewards ``(prompts, group_size)``.
    """

    def __init__(self, config: TrainConfig, device: torch.device) -> None:
        self.config, self.device = config, device
        # bound once: a normalisation registered again later does not change this run
        self.calibration = config.calibration
        self.fingerprint = run_fingerprint(config, self.calibration)
        double = config.exact or config.run.dtype == "float64"
        self.dtype = torch.float64 if double else torch.float32
        self.generator = torch.Generator(device=device).manual_seed(config.run.seed)
        self.sft_losses: list[float] = []
        self.grpo_task: GRPOTask
        self.grpo_task, self.policy = make_grpo_task(config, device, self.dtype)
        self.task: BanditTask | ArithmeticTask = self.grpo_task.data
        self.tracked = self.grpo_task.tracked
        self.ref_policy = frozen_copy(self.policy)
        self.prompt_beta: torch.Tensor | None = None
        if config.sequence.grpo_beta_multipliers is not None:
            pool = self.task.grpo_pool(config.sequence.grpo_prompts, config.run.seed)
            mult = np.resize(np.asarray(config.sequence.grpo_beta_multipliers,
                                        dtype=np.float64), len(pool))
            weights = np.full(len(self.task.operands), config.grpo.beta)
            weights[pool] = config.grpo.beta * mult
            self.prompt_beta = torch.as_tensor(weights, device=device)
        default_lr = 0.1 if config.task == "bandit" else 1e-3
        self.lr = config.optim.lr if config.optim.lr is not None else default_lr
        self.optimizer: torch.optim.Optimizer | None = None
        if not config.exact and config.optim.optimizer == "adam":
            self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.lr)
        elif not config.exact and config.optim.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.policy.parameters(), lr=self.lr)
        self.iteration = 0
        self.checkpointed: int | None = None
        self.chosen: torch.Tensor | None = None
        self.rewards: torch.Tensor | None = None

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
            self.ref_policy = frozen_copy(self.policy)
        elif self.config.task == "sequence" and self.config.model.sft_steps > 0:
            sft_generator = torch.Generator(device=self.device).manual_seed(
                self.config.run.seed + 1)
            self.sft_losses = pretrain_reference(
                self.task, self.policy, steps=self.config.model.sft_steps,
                batch_size=self.config.model.sft_batch_size, lr=self.config.model.sft_lr,
                generator=sft_generator)
            self.ref_policy = frozen_copy(self.policy)

    def checkpoint_note(self) -> str:
        """What is left to continue from: the last checkpoint, or none yet."""
        if self.checkpointed is None:
            return "no checkpoint was written yet"
        return f"the last checkpoint is from iteration {self.checkpointed}"

    def weights_fault(self, detail: str) -> TrainingFault:
        """The run stops because its normalisation gave weights that are not numbers."""
        name = self.calibration.normalization
        return TrainingFault(
            f"the weights of normalisation {name!r} are not finite at iteration "
            f"{self.iteration} ({detail}); its gains function is not a number at the success "
            f"probabilities this run reached (fix or choose the normalisation); "
            f"{self.checkpoint_note()}")
