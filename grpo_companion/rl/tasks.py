"""Toy tasks with verifiable (binary) rewards: a bandit and two-digit addition.

Reward 1 means the verifier accepted the output, 0 otherwise (Section 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

#: Logit standing in for log 0: exp(ZERO_LOGIT - logsumexp) underflows to exactly 0
#: in float32 and float64, while sums like 0 * (logit difference) stay finite.
ZERO_LOGIT = -1.0e4


@dataclass(frozen=True)
class BanditTask:
    """N prompts, K outputs each, a success set per prompt (the verifier).

    Attributes
    ----------
    success
        Boolean tensor ``(n_prompts, n_outputs)``: ``r(q, o) = 1`` iff True.
    ref_logits
        float64 logits ``(n_prompts, n_outputs)`` of the reference policy.
    p_ref
        float64 array ``(n_prompts,)``: the reference PoS each prompt was built
        with, eq. (2) (equal to the PoS of ``ref_logits`` up to rounding).
    """

    success: torch.Tensor
    ref_logits: torch.Tensor
    p_ref: np.ndarray

    @property
    def n_prompts(self) -> int:
        return self.success.shape[0]

    def reward(
        self, prompts: torch.Tensor, completions: torch.Tensor, group_size: int
    ) -> torch.Tensor:
        """Verifier: rewards ``(rows,)`` for completions ``(rows, 1)`` of ``prompts``."""
        rows = prompts.repeat_interleave(group_size)
        return self.success[rows, completions[:, 0]].to(torch.get_default_dtype())

    def success_prob(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Exact PoS ``P_pi(success)`` for every prompt, eq. (7).

        Computed as ``s / (s + f)`` from the success and failure masses, which
        stays within [0, 1] despite rounding.
        """
        success = self.success.to(log_probs.device)
        probs = log_probs.exp()
        mass_s, mass_f = (probs * success).sum(dim=-1), (probs * ~success).sum(dim=-1)
        return mass_s / (mass_s + mass_f)

    def success_logit(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Exact ``logit P_pi(success)`` per prompt, accurate near 0 and 1.

        A prompt without success (or failure) mass gets about -1e4 (+1e4),
        the log-odds of ``ZERO_LOGIT``.
        """
        success = self.success.to(log_probs.device)
        log_s = torch.logsumexp(log_probs.masked_fill(~success, ZERO_LOGIT), dim=-1)
        log_f = torch.logsumexp(log_probs.masked_fill(success, ZERO_LOGIT), dim=-1)
        return log_s - log_f


def make_bandit_task(
    n_prompts: int,
    n_outputs: int,
    *,
    n_success: int | None = None,
    p_ref: Sequence[float] | np.ndarray | None = None,
    p_ref_beta: tuple[float, float] = (0.5, 2.0),
    p_ref_zero_fraction: float = 0.1,
    logit_scale: float = 1.0,
    seed: int = 0,
) -> BanditTask:
    """Build a bandit whose reference success probabilities are set exactly.

    Each prompt gets a random success set of ``n_success`` outputs (default:
    a tenth of the outputs, at least one) and random Gaussian logits (standard
    deviation ``logit_scale``) that shape the reference *within* the success and
    the failure sets. The two sets are then given total mass ``p_ref`` and
    ``1 - p_ref``, so the reference PoS is exactly ``p_ref``.

    Parameters
    ----------
    p_ref
        Reference PoS values, repeated cyclically over the prompts (e.g.
        ``[0.2, 0.5]`` gives prompts alternating between the two). If None,
        a fraction ``p_ref_zero_fraction`` of the prompts gets ``p_ref = 0``
        and the others a draw from ``Beta(*p_ref_beta)``.
    """
    for name, value, low in (("n_prompts", n_prompts, 1), ("n_outputs", n_outputs, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if n_success is None:
        n_success = max(1, n_outputs // 10)
    if isinstance(n_success, bool) or not isinstance(n_success, int) or not (
        1 <= n_success < n_outputs
    ):
        raise ValueError(f"n_success must be an int in [1, {n_outputs - 1}], got {n_success!r}")
    if not 0.0 <= p_ref_zero_fraction <= 1.0:
        raise ValueError(f"p_ref_zero_fraction must be in [0, 1], got {p_ref_zero_fraction!r}")
    if len(p_ref_beta) != 2 or not all(b > 0 and math.isfinite(b) for b in p_ref_beta):
        raise ValueError(f"p_ref_beta must be two finite numbers > 0, got {p_ref_beta!r}")
    if not logit_scale >= 0 or math.isinf(logit_scale):
        raise ValueError(f"logit_scale must be a finite number >= 0, got {logit_scale!r}")
    rng = np.random.default_rng(seed)
    if p_ref is None:
        values = rng.beta(*p_ref_beta, size=n_prompts)
        values[rng.random(n_prompts) < p_ref_zero_fraction] = 0.0
    else:
        given = np.asarray(p_ref, dtype=np.float64).ravel()
        if given.size == 0 or not np.all((given >= 0) & (given <= 1)):
            raise ValueError(f"p_ref must be a non-empty list of values in [0, 1], got {p_ref!r}")
        values = np.resize(given, n_prompts)
    success = np.zeros((n_prompts, n_outputs), dtype=bool)
    chosen = np.argsort(rng.random((n_prompts, n_outputs)), axis=1)[:, :n_success]
    np.put_along_axis(success, chosen, True, axis=1)
    shape = torch.as_tensor(rng.normal(scale=logit_scale, size=(n_prompts, n_outputs)))
    mask = torch.as_tensor(success)
    within_s = torch.log_softmax(shape.masked_fill(~mask, -math.inf), dim=1)
    within_f = torch.log_softmax(shape.masked_fill(mask, -math.inf), dim=1)
    p = torch.as_tensor(values)
    with np.errstate(divide="ignore"):
        log_s = torch.as_tensor(np.log(values)).clamp(min=ZERO_LOGIT)
        log_f = torch.log1p(-p).clamp(min=ZERO_LOGIT)
    logits = torch.where(mask, log_s[:, None] + within_s, log_f[:, None] + within_f)
    return BanditTask(success=mask, ref_logits=logits.clamp(min=ZERO_LOGIT), p_ref=values)


# Vocabulary of the arithmetic task.
DIGITS = tuple(range(10))
PLUS, EQUALS, EOS, BOS, PAD = 10, 11, 12, 13, 14
VOCAB_SIZE = 15
PROMPT_LENGTH = 7  # BOS a1 a0 + b1 b0 =


@dataclass(frozen=True)
class ArithmeticTask:
    """Two-digit addition ``"ab+cd="`` answered in decimal digits then EOS.

    Prompts are written with two digits per operand (``"07+12="``); the
    verifier accepts a completion iff its tokens up to the first EOS spell
    ``a + b`` without leading zeros.

    The reference policy is trained (:func:`pretrain_reference`) on imperfect
    data: when the units digits carry (``u = a%10 + b%10 >= 10``), the data
    "forgets the carry" (answers ``a + b - 10``) with probability
    ``min(1, (u - 9) / carry_error_span)``. Prompts without a carry are
    always answered correctly. Over the held-out prompts the reference PoS
    therefore spreads from about 1 (no carry) to about 0 (large carries).

    Attributes
    ----------
    operands
        int64 array ``(n_pairs, 2)`` of all ``(a, b)`` with ``0 <= a, b <= max_operand``.
    train_idx, eval_idx
        Disjoint prompt indices: the RL/SFT training prompts and the held-out
        evaluation prompts on which the PoS is tracked.
    """

    operands: np.ndarray
    train_idx: np.ndarray
    eval_idx: np.ndarray
    carry_error_span: float

    @property
    def max_new_tokens(self) -> int:
        return len(str(int(self.operands.sum(axis=1).max()))) + 1

    @property
    def max_len(self) -> int:
        return PROMPT_LENGTH + self.max_new_tokens

    def prompts(self, idx: torch.Tensor) -> torch.Tensor:
        """Prompt tokens ``(len(idx), 7)`` for prompt indices ``idx``."""
        a, b = (torch.as_tensor(self.operands[:, i], device=idx.device)[idx] for i in (0, 1))
        fixed = torch.full_like(a, 0)
        cols = [fixed + BOS, a // 10, a % 10, fixed + PLUS, b // 10, b % 10, fixed + EQUALS]
        return torch.stack(cols, dim=1)

    def answer_tokens(self, values: np.ndarray) -> np.ndarray:
        """Tokens ``(len(values), max_new_tokens)``: digits, EOS, then PAD."""
        out = np.full((len(values), self.max_new_tokens), PAD, dtype=np.int64)
        for row, value in enumerate(values):
            digits = [int(c) for c in str(int(value))] + [EOS]
            out[row, : len(digits)] = digits
        return out

    def grpo_pool(self, count: int | None, seed: int) -> np.ndarray:
        """The training prompts GRPO draws from: ``count`` of them (None: all), sorted.

        The first ``count`` of a shuffle of ``train_idx`` seeded by
        ``seed``, so a run and its analysis agree on the set.
        """
        if count is None:
            return self.train_idx
        if isinstance(count, bool) or not isinstance(count, int) or not (
                1 <= count <= len(self.train_idx)):
            raise ValueError(f"count must be None or an int in [1, {len(self.train_idx)}], "
                             f"got {count!r}")
        order = np.random.default_rng([seed, 0x6770]).permutation(len(self.train_idx))
        return np.sort(self.train_idx[order[:count]])

    def error_rate(self, idx: np.ndarray) -> np.ndarray:
        """Probability that the SFT data forgets the carry, per prompt."""
        units = self.operands[idx, 0] % 10 + self.operands[idx, 1] % 10
        return np.clip((units - 9) / self.carry_error_span, 0.0, 1.0)

    def reward(
        self, idx: torch.Tensor, completions: torch.Tensor, mask: torch.Tensor, group_size: int
    ) -> torch.Tensor:
        """Verifier for completions ``(rows, T)`` of prompts ``idx`` (vectorised)."""
        del mask  # the answer's own EOS position decides which tokens must match
        sums = self.operands[idx.cpu().numpy()].sum(axis=1)
        target = torch.as_tensor(self.answer_tokens(sums), device=completions.device)
        target = target.repeat_interleave(group_size, dim=0)
        relevant = torch.cumsum((target == EOS).long(), dim=1) - (target == EOS).long() == 0
        correct = ((completions == target) | ~relevant).all(dim=1)
        return correct.to(torch.get_default_dtype())


def check_answer(a: int, b: int, completion: Sequence[int]) -> bool:
    """Reference (scalar, readable) verifier: is ``completion`` ``str(a + b)`` + EOS?"""
    if EOS not in completion:
        return False
    body = list(completion[: list(completion).index(EOS)])
    if not body or any(t not in DIGITS for t in body):
        return False
    text = "".join(str(t) for t in body)
    return text == str(a + b)


def make_arithmetic_task(
    *, max_operand: int = 49, n_eval_prompts: int = 256, carry_error_span: float = 6.0,
    seed: int = 0,
) -> ArithmeticTask:
    """All pairs ``0 <= a, b <= max_operand``; a random ``n_eval_prompts`` held out."""
    if isinstance(max_operand, bool) or not isinstance(max_operand, int) or not (
        1 <= max_operand <= 99
    ):
        raise ValueError(f"max_operand must be an int in [1, 99], got {max_operand!r}")
    n_pairs = (max_operand + 1) ** 2
    if isinstance(n_eval_prompts, bool) or not isinstance(n_eval_prompts, int) or not (
        1 <= n_eval_prompts < n_pairs
    ):
        raise ValueError(f"n_eval_prompts must be an int in [1, {n_pairs - 1}], "
                         f"got {n_eval_prompts!r}")
    if not carry_error_span > 0 or math.isinf(carry_error_span):
        raise ValueError(f"carry_error_span must be a finite number > 0, "
                         f"got {carry_error_span!r}")
    grid = np.arange(max_operand + 1)
    operands = np.stack(np.meshgrid(grid, grid, indexing="ij"), axis=-1).reshape(-1, 2)
    order = np.random.default_rng(seed).permutation(n_pairs)
    return ArithmeticTask(operands=operands, train_idx=np.sort(order[n_eval_prompts:]),
                          eval_idx=np.sort(order[:n_eval_prompts]),
                          carry_error_span=float(carry_error_span))


def sft_batch(
    task: ArithmeticTask, batch_size: int, generator: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of imperfect supervised data: (tokens, completion mask)."""
    pick = torch.randint(len(task.train_idx), (batch_size,), generator=generator,
                         device=device).cpu().numpy()
    idx = task.train_idx[pick]
    wrong = torch.rand(batch_size, generator=generator, device=device).cpu().numpy()
    carry = task.operands[idx, 0] % 10 + task.operands[idx, 1] % 10 >= 10
    forget = carry & (wrong < task.error_rate(idx))
    answers = task.operands[idx].sum(axis=1) - 10 * forget
    completion = torch.as_tensor(task.answer_tokens(answers), device=device)
    prompts = task.prompts(torch.as_tensor(idx, device=device))
    mask = torch.cumsum((completion == EOS).long(), dim=1) - (completion == EOS).long() == 0
    return torch.cat([prompts, completion], dim=1), mask


def pretrain_reference(
    task: ArithmeticTask,
    model: nn.Module,
    *,
    steps: int,
    batch_size: int = 256,
    lr: float = 3e-3,
    generator: torch.Generator,
) -> list[float]:
    """Supervised pre-training of the reference policy on imperfect data.

    Cross-entropy on the completion tokens (answer digits and EOS) of
    :func:`sft_batch` batches, Adam with a linear learning-rate decay to zero.
    Returns the loss of every step.
    """
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    losses = []
    model.train()
    for _ in range(steps):
        tokens, mask = sft_batch(task, batch_size, generator, device)
        logits = model(tokens[:, :-1])[:, PROMPT_LENGTH - 1:]
        nll = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), tokens[:, PROMPT_LENGTH:], reduction="none"
        )
        loss = (nll * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses
