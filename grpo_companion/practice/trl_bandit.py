"""TRL's own loss and advantages driven on a bandit, where every expectation is exact.

:class:`TRLBandit` holds a real ``trl.GRPOTrainer`` and calls two of its methods with
inputs we choose, so that all of the arithmetic is TRL's:

- ``_generate_and_score_completions`` computes the group advantages of rewards we
  choose (:func:`trl_advantages`, :meth:`TRLBandit.advantages`, :meth:`TRLBandit.table`);
- ``_compute_loss`` computes the loss of one micro-batch, with its one model call
  (``_get_per_token_logps_and_entropies``) replaced on the instance by one that returns
  the per-token log-probabilities we pass (:meth:`TRLBandit.loss`).

On the two-outcome bandit (one token decides: success with probability ``p =
sigmoid(L)``), an expectation over groups of ``G`` is a finite sum over the number of
successes ``k``, so :meth:`TRLBandit.expected_loss` is TRL's expected loss, exactly, and
:meth:`TRLBandit.drift` minus its exact gradient in ``L``; :meth:`TRLBandit.round_pos`
and :meth:`TRLBandit.rounds` are generation rounds of TRL's loss (``num_iterations``
gradient steps on one batch, or the round solved). The same calls serve any tabular
policy: :meth:`TRLBandit.loss` takes any log-probabilities, with gradients. The
method is the one of ``tests/practice/test_trl_equivalence.py``, which calls
:func:`trl_loss` and :func:`trl_advantages` from here. What the theory says for the
same ``GRPOConfig`` is :mod:`grpo_companion.practice.trl_questions`'s.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

__all__ = ["TRLBandit", "log_outcome", "trl_advantages", "trl_loss"]

F64 = torch.float64


def _check_open(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating) \
            or not 0 < value < 1:
        raise ValueError(f"{name} must be a probability in (0, 1), got {value!r}")


def log_outcome(logit: torch.Tensor, success: torch.Tensor) -> torch.Tensor:
    """``log P(outcome)`` of each row of the two-outcome bandit with success logit ``logit``."""
    return torch.where(success, torch.nn.functional.logsigmoid(logit),
                       torch.nn.functional.logsigmoid(-logit))


def trl_loss(trainer: Any, logp: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
    """``trainer._compute_loss(model, inputs)`` with ``logp`` as the model's per-token
    log-probabilities: its one model call, ``_get_per_token_logps_and_entropies``, is
    replaced on the instance for the call (and restored), so the rest is TRL's code."""
    def logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **_):
        if logits_to_keep != logp.shape[1]:
            raise ValueError(f"logp has {logp.shape[1]} tokens per completion but the inputs "
                             f"have {logits_to_keep}")
        return logp, torch.zeros_like(logp), None

    trainer._get_per_token_logps_and_entropies = logps_and_entropies
    try:
        return trainer._compute_loss(trainer.model, inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies


def trl_advantages(trainer: Any, rows: list[dict[str, Any]],
                   dtype: torch.dtype = F64) -> torch.Tensor:
    """TRL's advantages of ``rows``, computed by ``trainer._generate_and_score_completions``.

    ``rows`` are the dataset rows of one generation batch (groups of ``num_generations``
    in order); the trainer's reward functions score them (a reward function that returns
    a column of the rows lets the caller choose every reward). ``dtype``: the default
    dtype while TRL runs, which the reward tensor it allocates takes: ``torch.float64``
    to compare at 1e-12, ``torch.float32`` for what a run computes.
    """
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    if not rows:
        raise ValueError("rows must hold at least one dataset row, got none")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return trainer._generate_and_score_completions(list(rows))["advantages"]
    finally:
        torch.set_default_dtype(previous)


class TRLBandit:
    """A ``GRPOTrainer`` whose advantages and loss we feed (see the module docstring).

    Parameters
    ----------
    model_dir
        A saved causal LM and tokenizer (only its config and vocabulary matter: the model
        is never run).
    tokenizer
        Its tokenizer.
    prompt_ids : torch.Tensor
        The token ids of one prompt, shape ``(1, n)`` or ``(n,)``.
    out_dir
        The trainer's ``output_dir`` (nothing is written there).
    **settings
        ``GRPOConfig`` fields (``beta``, ``scale_rewards``, ``num_generations``, ...); by
        default one group per batch (``per_device_train_batch_size = G``) and completions
        of one token (``max_completion_length = 1``).
    """

    def __init__(self, model_dir: str | Path, tokenizer: Any, prompt_ids: torch.Tensor,
                 out_dir: str | Path, **settings: Any) -> None:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        from grpo_companion.practice.trl_facts import grpo_defaults

        group = int(settings.pop("num_generations",
                                 grpo_defaults(["num_generations"])["num_generations"]))
        self.prompt_ids = torch.as_tensor(prompt_ids).reshape(1, -1)
        self.prompt = tokenizer.decode(self.prompt_ids[0])
        self.group_size = group
        base = dict(per_device_train_batch_size=group, max_completion_length=1,
                    gradient_checkpointing=False, use_cpu=True, bf16=False, report_to=[],
                    save_strategy="no", logging_strategy="no", disable_tqdm=True,
                    dataloader_num_workers=0)
        args = GRPOConfig(output_dir=str(out_dir), num_generations=group, **{**base, **settings})
        self.trainer = GRPOTrainer(
            model=str(model_dir), args=args, processing_class=tokenizer,
            reward_funcs=lambda prompts, completions, target, **_: [float(t) for t in target],
            train_dataset=Dataset.from_dict({"prompt": [self.prompt], "target": [1]}))
        self.trainer.current_gradient_accumulation_steps = 1  # the training loop sets it
        self.trainer.model.train()
        self.beta = float(args.beta)

    # ------------------------------------------------------------- advantages
    def advantages(self, rewards: Any) -> torch.Tensor:
        """TRL's advantages of groups of 0/1 ``rewards`` (a flat list, groups of ``G`` in
        order), computed by ``_generate_and_score_completions`` in float64."""
        rows = [{"prompt": self.prompt, "target": int(r)} for r in np.ravel(rewards)]
        return trl_advantages(self.trainer, rows, F64)

    def table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(plus[k], minus[k])`` for ``k = 0..G``: TRL's advantage of a success and minus
        that of a failure in a group with ``k`` successes."""
        g = self.group_size
        adv = self.advantages([int(i < k) for k in range(g + 1) for i in range(g)])
        adv = adv.reshape(g + 1, g)
        return adv[:, 0].clone(), -adv[:, -1].clone()

    # ------------------------------------------------------------------- loss
    def loss(self, logp: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's ``_compute_loss`` with ``logp`` as the model's per-token log-probabilities."""
        return trl_loss(self.trainer, logp, inputs)

    def inputs(self, advantages: torch.Tensor, prev_logp: torch.Tensor,
               ref_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        """The ``inputs`` dict of ``_compute_loss`` for one group (rows: completions)."""
        g = advantages.shape[0]
        return {"prompt_ids": self.prompt_ids.expand(g, -1),
                "prompt_mask": torch.ones_like(self.prompt_ids).expand(g, -1),
                "completion_ids": torch.zeros(mask.shape, dtype=torch.long),
                "completion_mask": mask.long(), "advantages": advantages,
                "old_per_token_logps": prev_logp, "ref_per_token_logps": ref_logp,
                "num_items_in_batch": mask.sum()}

    def expected_loss(self, logit: torch.Tensor, p_prev: float, p_ref: float,
                      table: tuple[torch.Tensor, torch.Tensor] | None = None,
                      lengths: tuple[int, int] = (1, 1), *,
                      uniform_kl: bool = True) -> torch.Tensor:
        """TRL's loss in expectation over groups of ``G`` drawn with PoS ``p_prev``, for the
        bandit with success logit ``logit``.

        ``lengths``: tokens of a success and of a failure; only the first token is chosen by
        the policy, the others have probability 1 under every policy (they count in the
        averages). ``uniform_kl=False`` removes the KL term from the groups whose rewards
        are all equal, by giving them the current policy as their reference (k3 and its
        gradient vanish there): the variant that keeps the KL only where there is an
        advantage.
        """
        plus, minus = self.table() if table is None else table
        g = self.group_size
        width = max(lengths)
        pmf = stats.binom.pmf(np.arange(g + 1), g, p_prev)
        l_old = torch.tensor(math.log(p_prev / (1 - p_prev)), dtype=F64)
        l_ref = torch.tensor(math.log(p_ref / (1 - p_ref)), dtype=F64)
        rest = torch.zeros(g, width - 1, dtype=F64)
        total = torch.zeros((), dtype=F64)
        for k in range(g + 1):
            success = torch.arange(g) < k
            n_tokens = torch.where(success, lengths[0], lengths[1])
            mask = torch.arange(width)[None, :] < n_tokens[:, None]
            ref = logit.detach() if (k in (0, g) and not uniform_kl) else l_ref
            inputs = self.inputs(torch.where(success, plus[k], -minus[k]),
                                 torch.cat([log_outcome(l_old, success)[:, None], rest], 1),
                                 torch.cat([log_outcome(ref, success)[:, None], rest], 1),
                                 mask)
            logp = torch.cat([log_outcome(logit, success)[:, None], rest], 1)
            total = total + float(pmf[k]) * self.loss(logp, inputs)
        return total

    def drift(self, p: float, p_ref: float,
              table: tuple[torch.Tensor, torch.Tensor] | None = None,
              lengths: tuple[int, int] = (1, 1), *, uniform_kl: bool = True) -> float:
        """Minus the exact expected gradient of TRL's loss in ``L``, on policy (``p_prev = p``)."""
        logit = torch.tensor(math.log(p / (1 - p)), dtype=F64, requires_grad=True)
        loss = self.expected_loss(logit, p, p_ref, table, lengths, uniform_kl=uniform_kl)
        (grad,) = torch.autograd.grad(loss, logit)
        return -grad.item()

    def fixed_point(self, p_ref: float, table: tuple[torch.Tensor, torch.Tensor] | None = None,
                    lengths: tuple[int, int] = (1, 1), *, uniform_kl: bool = True,
                    bracket: tuple[float, float] = (-12.0, 12.0)) -> float | None:
        """Where TRL's expected on-policy gradient vanishes: Brent's method in the logit on
        ``bracket`` (to 1e-12); ``None`` if the drift keeps one sign there."""
        from scipy import optimize

        from grpo_companion import theory

        table = self.table() if table is None else table

        def drift(x: float) -> float:
            return self.drift(float(theory.sigmoid(x)), p_ref, table, lengths,
                              uniform_kl=uniform_kl)

        lo, hi = bracket
        if drift(lo) * drift(hi) > 0:
            return None
        return float(theory.sigmoid(optimize.brentq(drift, lo, hi, xtol=1e-12)))

    def round_pos(self, p_prev: float, p_ref: float, mu: int | None = None,
                  table: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                  step_size: float = 1.0) -> float:
        """PoS after one generation round of TRL's loss from PoS ``p_prev``.

        The batch is drawn once with PoS ``p_prev`` (TRL's ``pi_old``), and the loss of
        the round is TRL's expected loss over it (:meth:`expected_loss`), so that steps
        after the first are off policy and the clip of ``epsilon``/``epsilon_high`` acts.
        ``mu`` gradient steps of size ``step_size`` on the success logit (TRL's
        ``num_iterations``), or with ``mu=None`` the exact minimiser of the round's loss,
        which many small steps approach (Brent's method on its gradient in the logit, on
        ``[-15, 15]``, to 1e-13: the loss is unimodal there).
        """
        _check_open(p_prev, "p_prev")
        _check_open(p_ref, "p_ref")
        if not (isinstance(step_size, int | float) and math.isfinite(step_size)
                and step_size > 0):
            raise ValueError(f"step_size must be a finite number > 0, got {step_size!r}")
        table = self.table() if table is None else table

        def gradient(x: float) -> float:
            logit = torch.tensor(x, dtype=F64, requires_grad=True)
            (grad,) = torch.autograd.grad(self.expected_loss(logit, p_prev, p_ref, table), logit)
            return grad.item()

        if mu is None:
            from scipy import optimize

            from grpo_companion import theory

            x = optimize.brentq(gradient, -15, 15, xtol=1e-13)
            return float(theory.sigmoid(x))
        if isinstance(mu, bool) or not isinstance(mu, int) or mu < 1:
            raise ValueError(f"mu must be an integer >= 1 or None (the round solved), got {mu!r}")
        logit = torch.tensor(math.log(p_prev / (1 - p_prev)), dtype=F64, requires_grad=True)
        for _ in range(mu):
            (grad,) = torch.autograd.grad(self.expected_loss(logit, p_prev, p_ref, table), logit)
            with torch.no_grad():
                logit -= step_size * grad
        return float(torch.sigmoid(logit.detach()))

    def rounds(self, p_ref: float, n_rounds: int, mu: int | None = None,
               table: tuple[torch.Tensor, torch.Tensor] | None = None, *,
               step_size: float = 1.0) -> np.ndarray:
        """PoS over ``n_rounds`` generation rounds of TRL's loss from ``p_ref``, shape
        ``(n_rounds + 1,)``: each round :meth:`round_pos` from the PoS the last one left."""
        if isinstance(n_rounds, bool) or not isinstance(n_rounds, int) or n_rounds < 0:
            raise ValueError(f"n_rounds must be an integer >= 0, got {n_rounds!r}")
        table = self.table() if table is None else table
        path = [p_ref]
        for _ in range(n_rounds):
            path.append(self.round_pos(path[-1], p_ref, mu, table, step_size=step_size))
        return np.array(path)

    def softmax_gradient(self, theta: Any, theta_ref: Any, correct: Any) -> np.ndarray:
        """Minus the exact expected gradient of TRL's loss in the logits of a tabular softmax.

        Outputs with logits ``theta`` (reference ``theta_ref``), verified where ``correct``,
        one token per completion, groups of ``G`` sampled on policy: TRL's loss on every
        composition of a group over the outputs (its advantages from :meth:`table`),
        weighted by its multinomial probability and differentiated by autograd. The
        independent check of :func:`grpo_companion.practice.log_answers.softmax_expected_gradient`.
        """
        import itertools

        correct = np.asarray(correct, dtype=bool)
        g, k_out = self.group_size, correct.size
        plus, minus = self.table()
        th = torch.tensor(np.asarray(theta, dtype=np.float64), requires_grad=True)
        log_ref = torch.log_softmax(torch.tensor(np.asarray(theta_ref, dtype=np.float64)), 0)
        pi = torch.softmax(th.detach(), 0).numpy()
        total = torch.zeros((), dtype=F64)
        for head in itertools.product(range(g + 1), repeat=k_out - 1):
            if sum(head) > g:
                continue
            counts = [*head, g - sum(head)]
            ys = np.repeat(np.arange(k_out), counts)
            k = int(correct[ys].sum())
            logp = torch.log_softmax(th, 0)[ys][:, None]
            adv = torch.where(torch.as_tensor(correct[ys]), plus[k], -minus[k])
            inputs = self.inputs(adv, logp.detach(), log_ref[ys][:, None], torch.ones(g, 1))
            total = total + stats.multinomial.pmf(counts, g, pi) * self.loss(logp, inputs)
        (grad,) = torch.autograd.grad(total, th)
        return -grad.numpy()
