"""What the trainer asks of a task: the :class:`GRPOTask` protocol, and its two tasks.

One GRPO iteration (Algorithm 1, lines 4-8) needs four things of a task, whatever its
policy is: a batch of prompts, ``G`` sampled outputs per prompt, the verifier's 0/1
reward of each, and the per-token log-probabilities of those outputs under any policy
(for the ratio and the KL). After an iteration the trainer asks it for the per-prompt
metrics, among them the success probability (PoS), exact where the task can compute it.
:class:`BanditGRPO` (a tabular softmax policy over ``K`` outputs: everything exact) and
:class:`SequenceGRPO` (a tiny transformer writing the sum of two numbers: the PoS of
held-out prompts estimated from samples) implement it; a new task implements the same
methods and :func:`make_grpo_task` builds it from a
:class:`~grpo_companion.rl.train_config.TrainConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from grpo_companion.rl import losses
from grpo_companion.rl.policies import TabularSoftmaxPolicy, TinyCausalTransformer
from grpo_companion.rl.tasks import (
    EOS,
    PAD,
    VOCAB_SIZE,
    ArithmeticTask,
    BanditTask,
    make_arithmetic_task,
    make_bandit_task,
)
from grpo_companion.rl.train_config import EVAL_SEED_FACTOR, TrainConfig


@dataclass
class Groups:
    """The groups of one iteration: ``group`` outputs of pi_old for each chosen prompt.

    ``chosen`` are the task's indices of the prompts, ``prompts`` what the policies
    are conditioned on (the indices themselves for the bandit, token sequences for
    the addition task), ``completions`` ``(prompts * group, tokens)`` the sampled
    outputs, row ``i * group + j`` the ``j``-th of prompt ``i``, and ``mask`` which of
    their tokens count.
    """

    chosen: torch.Tensor
    prompts: torch.Tensor
    completions: torch.Tensor
    mask: torch.Tensor
    group: int


class GRPOTask(Protocol):
    """The methods a task offers the trainer (Algorithm 1, lines 4-8, and the metrics).

    ``data`` is the task itself (prompts and verifier, e.g. a
    :class:`~grpo_companion.rl.tasks.BanditTask`) and ``tracked`` the indices of the
    prompts whose metrics are recorded. Sampling and drawing prompts use the run's
    generator only, so that a seed fixes the run.
    """

    data: Any
    tracked: np.ndarray

    def choose_prompts(self, generator: torch.Generator) -> torch.Tensor:
        """Line 4: the indices of this iteration's prompts."""
        ...

    def sample(self, policy: nn.Module, chosen: torch.Tensor,
               generator: torch.Generator) -> Groups:
        """Line 6: ``group_size`` outputs of ``policy`` (pi_old) for each prompt."""
        ...

    def score(self, groups: Groups) -> torch.Tensor:
        """Line 7: the verifier's reward, 0 or 1, of each output ``(rows,)``."""
        ...

    def log_probs(self, policy: nn.Module, groups: Groups) -> torch.Tensor:
        """Per-token log-probabilities ``(rows, tokens)`` of the outputs under ``policy``."""
        ...

    def evaluate(self, policy: nn.Module, ref_policy: nn.Module, prev: nn.Module,
                 iteration: int) -> dict[str, torch.Tensor]:
        """Per tracked prompt: ``success_prob`` (the PoS), ``kl_ref``, ``kl_prev``, ``entropy``."""
        ...

    def clip_fraction(self, chosen: torch.Tensor, per_prompt: torch.Tensor) -> np.ndarray:
        """The clipped share of each tracked prompt's tokens (NaN where not trained)."""
        ...


def _random_prompts(pool: np.ndarray, count: int, generator: torch.Generator,
                    device: torch.device) -> torch.Tensor:
    pick = torch.randperm(len(pool), generator=generator, device=device)[:count]
    return torch.as_tensor(pool, device=device)[pick]


class _TokenLogProbs:
    """``log_probs`` of both tasks: their policies share ``token_logprobs``."""

    temperature: float

    def log_probs(self, policy: nn.Module, groups: Groups) -> torch.Tensor:
        return policy.token_logprobs(groups.prompts, groups.completions, groups.group,
                                     temperature=self.temperature)


class BanditGRPO(_TokenLogProbs):
    """The bandit as a :class:`GRPOTask`: a tabular policy, exact metrics, every prompt tracked."""

    def __init__(self, config: TrainConfig, data: BanditTask, tracked: np.ndarray,
                 device: torch.device) -> None:
        self.data, self.tracked, self.device = data, tracked, device
        self.group_size, self.temperature = config.grpo.group_size, config.grpo.temperature
        self.count = config.grpo.prompts_per_iteration or config.bandit.n_prompts

    @staticmethod
    def build(config: TrainConfig, device: torch.device, dtype: torch.dtype) -> tuple[
            BanditTask, nn.Module, np.ndarray]:
        """The task, pi_ref as a tabular policy, and the tracked prompts (all)."""
        task = make_bandit_task(
            config.bandit.n_prompts, config.bandit.n_outputs, n_success=config.bandit.n_success,
            p_ref=config.bandit.p_ref, p_ref_beta=config.bandit.p_ref_beta,
            p_ref_zero_fraction=config.bandit.p_ref_zero_fraction,
            logit_scale=config.bandit.logit_scale, seed=config.run.seed)
        policy = TabularSoftmaxPolicy(task.ref_logits.to(device=device, dtype=dtype))
        return task, policy, np.arange(config.bandit.n_prompts)

    def choose_prompts(self, generator: torch.Generator) -> torch.Tensor:
        n = self.data.n_prompts
        if self.count == n:  # every prompt, in order: no draw
            return torch.arange(n, device=self.device)
        return _random_prompts(np.arange(n), self.count, generator, self.device)

    def sample(self, policy: nn.Module, chosen: torch.Tensor,
               generator: torch.Generator) -> Groups:
        completions, mask = policy.sample(chosen, self.group_size, temperature=self.temperature,
                                          generator=generator)
        return Groups(chosen, chosen, completions, mask, self.group_size)

    def score(self, groups: Groups) -> torch.Tensor:
        return self.data.reward(groups.chosen, groups.completions, groups.group)

    def evaluate(self, policy: nn.Module, ref_policy: nn.Module, prev: nn.Module,
                 iteration: int) -> dict[str, torch.Tensor]:
        """Exact: the PoS (eq. 7), both KLs and the entropy of the tabular policies."""
        logp = policy.log_probs()
        return {
            "success_prob": self.data.success_prob(logp),
            "kl_ref": losses.tabular_kl(logp, ref_policy.log_probs()),
            "kl_prev": losses.tabular_kl(logp, prev.log_probs()),
            "entropy": -(logp.exp() * logp).sum(-1),
        }

    def clip_fraction(self, chosen: torch.Tensor, per_prompt: torch.Tensor) -> np.ndarray:
        fraction = np.full(len(self.tracked), math.nan)
        fraction[chosen.cpu().numpy()] = per_prompt.cpu().numpy()
        return fraction


class SequenceGRPO(_TokenLogProbs):
    """The addition task as a :class:`GRPOTask`: a tiny transformer, held-out prompts tracked.

    GRPO draws its prompts from ``data.grpo_pool`` (``config.sequence.grpo_prompts``); the
    tracked prompts are the held-out ones, whose PoS is the share of
    ``config.sequence.eval_samples`` verified samples (the evaluation of iteration ``n`` is
    seeded with ``seed * EVAL_SEED_FACTOR + n``).
    """

    def __init__(self, config: TrainConfig, data: ArithmeticTask, tracked: np.ndarray,
                 device: torch.device) -> None:
        self.data, self.tracked, self.device = data, tracked, device
        self.group_size, self.temperature = config.grpo.group_size, config.grpo.temperature
        self.pool = data.grpo_pool(config.sequence.grpo_prompts, config.run.seed)
        self.count = config.grpo.prompts_per_iteration or min(64, len(self.pool))
        self.seed, self.eval_samples = config.run.seed, config.sequence.eval_samples

    @staticmethod
    def build(config: TrainConfig, device: torch.device, dtype: torch.dtype) -> tuple[
            ArithmeticTask, nn.Module, np.ndarray]:
        """The task, an untrained transformer (seeded by the run's seed), the held-out prompts."""
        task = make_arithmetic_task(
            max_operand=config.sequence.max_operand, n_eval_prompts=config.sequence.n_eval_prompts,
            carry_error_span=config.sequence.carry_error_span, seed=config.run.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.run.seed)
            model = TinyCausalTransformer(
                VOCAB_SIZE, task.max_len, d_model=config.model.d_model,
                n_layers=config.model.n_layers, n_heads=config.model.n_heads, eos_id=EOS,
                pad_id=PAD)
        return task, model.to(device), task.eval_idx

    def choose_prompts(self, generator: torch.Generator) -> torch.Tensor:
        return _random_prompts(self.pool, self.count, generator, self.device)

    def sample(self, policy: nn.Module, chosen: torch.Tensor,
               generator: torch.Generator) -> Groups:
        prompts = self.data.prompts(chosen)
        completions, mask = policy.sample(prompts, self.group_size, temperature=self.temperature,
                                          generator=generator,
                                          max_new_tokens=self.data.max_new_tokens)
        return Groups(chosen, prompts, completions, mask, self.group_size)

    def score(self, groups: Groups) -> torch.Tensor:
        return self.data.reward(groups.chosen, groups.completions, groups.mask, groups.group)

    def evaluate(self, policy: nn.Module, ref_policy: nn.Module, prev: nn.Module,
                 iteration: int) -> dict[str, torch.Tensor]:
        """Sampled: the verified share and the mean sequence log-ratios of held-out samples."""
        task, n, temp = self.data, self.eval_samples, self.temperature
        generator = torch.Generator(device=self.device).manual_seed(
            self.seed * EVAL_SEED_FACTOR + iteration)
        idx = torch.as_tensor(task.eval_idx, device=self.device)
        prompts = task.prompts(idx)
        # the sampler gives the policy's log-probabilities of its draws (no extra pass)
        completions, mask, tokens = policy.sample_with_logprobs(
            prompts, n, max_new_tokens=task.max_new_tokens, temperature=temp,
            generator=generator)

        def seq_logp(per_token: torch.Tensor) -> torch.Tensor:
            return (per_token * mask).sum(1).view(-1, n)

        def logp_of(other: nn.Module) -> torch.Tensor:
            return seq_logp(other.token_logprobs(prompts, completions, n, temperature=temp))

        logp = seq_logp(tokens)
        kl_prev = torch.zeros_like(logp[:, 0]) if prev is policy else (
            logp - logp_of(prev)).mean(1)  # pi_0 = pi_ref: no previous policy
        return {
            "success_prob": task.reward(idx, completions, mask, n).view(-1, n).mean(1),
            "kl_ref": (logp - logp_of(ref_policy)).mean(1),
            "kl_prev": kl_prev,
            "entropy": -logp.mean(1),
        }

    def clip_fraction(self, chosen: torch.Tensor, per_prompt: torch.Tensor) -> np.ndarray:
        return np.full(len(self.tracked), math.nan)  # the tracked prompts are never trained on


def make_grpo_task(config: TrainConfig, device: torch.device,
                   dtype: torch.dtype) -> tuple[GRPOTask, nn.Module]:
    """The config's task as a :class:`GRPOTask`, and its policy (pi_ref before pre-training)."""
    kind = BanditGRPO if config.task == "bandit" else SequenceGRPO
    data, policy, tracked = kind.build(config, device, dtype)
    return kind(config, data, tracked, device), policy
