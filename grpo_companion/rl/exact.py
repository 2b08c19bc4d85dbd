"""Exact mode: the GRPO iteration with every sample average replaced by its expectation.

Tabular bandit only. The calibration weights come from the exact PoS (log-odds) of
pi_{n-1} through the run's ``theory.Calibration``, the objective is
:func:`~grpo_companion.rl.losses.exact_objective` (eq. (6), (9), (17)) and each
iteration maximises it to convergence (:func:`exact_iteration`, mirror ascent in
float64), so that the PoS sequence is the paper's recurrence (Theorems 2, 4, 9) up to
optimisation error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from grpo_companion.rl import losses
from grpo_companion.rl.run_state import RunState, TrainingFault
from grpo_companion.rl.train_config import TrainConfig

_LOG_TINY = math.log(1e-300)
#: A logit gap of this many nats moves a whole class below float64's smallest number
#: from anywhere in the tabular policies' range (logits >= ZERO_LOGIT = -1e4).
_EXACT_GAP_CAP = 3.0e4


def exact_iteration(state: RunState, prev: Any) -> dict[str, float]:
    """One exact GRPO iteration: maximise eq. (6)/(9)/(17) to convergence.

    Returns the iteration's statistics (``loss``: minus the objective; the sampled
    statistics are NaN).

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
    config, task = state.config, state.task
    with torch.no_grad():
        prev_logp = prev.log_probs()
        ref_logp = state.ref_policy.log_probs()
        logit_prev = task.success_logit(prev_logp).cpu().numpy()
    w_plus, w_minus, capped, log_w = _exact_weights(state, logit_prev)
    w_plus, w_minus = (torch.as_tensor(w, device=state.device) for w in (w_plus, w_minus))
    success = task.success.to(state.device)
    step = config.optim.exact_step / config.grpo.beta
    anchor = config.variant.anchor  # the KL anchor's (weight, target) pairs
    logits = state.policy.logits
    for _ in range(config.optim.exact_max_iter):
        logp = torch.log_softmax(logits.detach(), dim=-1).requires_grad_(True)
        objective = losses.exact_objective(
            logp, success, w_plus, w_minus, beta=config.grpo.beta, ref_logp=ref_logp,
            prev_logp=prev_logp, anchor=anchor)
        (grad_logp,) = torch.autograd.grad(objective.sum(), logp)
        with torch.no_grad():
            probs = logp.exp()
            # dJ/dlogp = pi * dJ/dpi, so dJ/dpi is recovered where pi is a normal
            # float64 (outputs below 1e-300 carry no mass that could show in a PoS).
            support = logp > _LOG_TINY
            grad_pi = torch.where(support, grad_logp / torch.where(support, probs, 1.0), 0.0)
            high = grad_pi.masked_fill(~support, -math.inf).amax(dim=-1)
            low = grad_pi.masked_fill(~support, math.inf).amin(dim=-1)
            gap = float((high - low).max()) / config.grpo.beta
            if gap <= config.optim.exact_tol:
                break
            # a constant per prompt does not change the step; taking off the largest keeps
            # the numbers near 0 where the policy has mass (tiny beta, huge weights)
            logits.copy_(torch.log_softmax(logp + step * (grad_pi - high[:, None]), dim=-1))
    else:
        raise TrainingFault(f"exact inner solve did not converge in exact_max_iter="
                            f"{config.optim.exact_max_iter} steps at iteration {state.iteration} "
                            f"(stationarity gap {gap:.3g} > exact_tol={config.optim.exact_tol})")
    value = objective.detach()
    if capped.any():
        # the weights were scaled down where the step is beyond float64 anyway; report the
        # objective with the true weights, each term formed in log space (no inf * 0)
        value = _exact_objective_log(logits.detach(), success, log_w, config, ref_logp,
                                     prev_logp)
    return {"loss": -float(value.mean()), "mean_reward": math.nan, "clip_fraction": math.nan}




def _exact_weights(state: RunState, logit_prev: np.ndarray) -> tuple[
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
    config, cal = state.config, state.calibration
    try:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # checked below
            w_plus, w_minus = (np.asarray(w, dtype=np.float64)
                               for w in cal.weights_of_logit(logit_prev))
            log_plus, log_minus = (np.asarray(w, dtype=np.float64)
                                   for w in cal.log_weights_of_logit(logit_prev))
    except ValueError as err:  # the calibration refuses gains that are not finite
        raise state.weights_fault(str(err)) from None
    bad = np.isnan(w_plus) | np.isnan(w_minus) | np.isnan(log_plus) | np.isnan(log_minus)
    if bad.any():
        raise state.weights_fault(f"NaN for {int(bad.sum())} of {bad.size} prompts")
    log_omega = np.logaddexp(log_plus, log_minus)
    log_cap = math.log(config.grpo.beta * _EXACT_GAP_CAP)
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
    penalty = losses.exact_objective(logp, success, zero, zero, beta=config.grpo.beta,
                                     ref_logp=ref_logp, prev_logp=prev_logp,
                                     anchor=config.variant.anchor)
    return gain.sum(dim=-1) + penalty

