"""GRPO's surrogate objective on a finite outcome space, and its contrastive form (Sec. 2.2-2.3).

For a prompt, the old policy ``pi_old`` samples an outcome ``o``, the verifier
marks it a success or a failure, and the calibrated advantage is ``+w+(p)`` on
a success and ``-w-(p)`` on a failure, with ``p`` the probability of success
of ``pi_old``. With the likelihood ratio ``x = pi(o) / pi_old(o)`` the
per-sample objective is the PPO clip

    f(x, a) = min(x a, clip(x, 1 - clip_eps, 1 + clip_eps) a)

(GRPO-Clip); without clipping (``clip_eps=None``) it is ``x a`` (GRPO). This
module computes, exactly on a finite outcome space,

- :func:`surrogate`: ``E_{o ~ pi_old}[f(x(o), A(o))]``;
- :func:`contrastive_terms` / :func:`contrastive_form`: the weighted contrastive
  form ``w+ E_old[min(x, 1+c) 1{r=1}] - w- E_old[max(x, 1-c) 1{r=0}]``, which
  without clipping is ``w+ P_pi(r=1) - w- P_pi(r=0)`` (eq. 5);

and a Monte Carlo estimate of the surrogate from samples of ``pi_old``
(:func:`monte_carlo_surrogate`), with its standard error.

``clip_eps`` is the PPO clipping half-width; the smoothing ``eps`` of the
calibration is a different constant, passed with the calibration keywords.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from grpo_companion.validation import (
    broadcast,
    check_count,
    check_memory,
    check_probability_vector,
    check_real,
    check_seed,
    check_success_mask,
)

from ..calibration import Calibration, resolve_calibration

__all__ = [
    "ContrastiveTerms",
    "MonteCarloEstimate",
    "check_clip_eps",
    "clipped_objective",
    "contrastive_form",
    "contrastive_terms",
    "likelihood_ratio",
    "monte_carlo_surrogate",
    "surrogate",
]


def check_clip_eps(clip_eps: object) -> float | None:
    """``clip_eps`` must be ``None`` (no clipping) or a number in ``[0, inf]``.

    ``inf`` is the paper's no-clipping limit and is returned as ``None``.
    """
    if clip_eps is None:
        return None
    c = float(check_real("clip_eps", clip_eps, 0.0, finite=False, scalar=True))
    return None if math.isinf(c) else c


def clipped_objective(ratio: ArrayLike, advantage: ArrayLike, clip_eps: float | None) -> np.ndarray:
    """Per-sample PPO objective ``min(x a, clip(x, 1-c, 1+c) a)``; ``x a`` if ``clip_eps`` is None.

    Parameters
    ----------
    ratio : array_like
        Likelihood ratios ``x >= 0``.
    advantage : array_like
        Advantages ``a`` (any sign), broadcast against ``ratio``.
    clip_eps : float or None
        Clipping half-width ``c >= 0``; ``None`` or ``inf`` disables clipping.
    """
    x = check_real("ratio", ratio, 0.0)
    a = check_real("advantage", advantage)
    c = check_clip_eps(clip_eps)
    x, a = broadcast(ratio=x, advantage=a)
    return _clipped(x, a, c)


def likelihood_ratio(policy: ArrayLike, prev_policy: ArrayLike) -> np.ndarray:
    """``pi(o) / pi_old(o)`` where ``pi_old(o) > 0`` and 0 elsewhere.

    ``policy`` must give no mass where ``prev_policy`` gives none (absolute
    continuity), otherwise importance sampling from ``pi_old`` cannot see it.
    """
    pi = check_probability_vector("policy", policy)
    old = check_probability_vector("prev_policy", prev_policy)
    pi, old = broadcast(policy=pi, prev_policy=old)
    return _likelihood_ratio(pi, old)


def _likelihood_ratio(pi: np.ndarray, old: np.ndarray) -> np.ndarray:
    unseen = (old == 0) & (pi > 0)
    if unseen.any():
        raise ValueError(
            "policy must be absolutely continuous w.r.t. prev_policy: it gives mass "
            f"{float(pi[unseen].flat[0])!r} to an outcome where prev_policy is 0"
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(old > 0, pi / np.where(old > 0, old, 1.0), 0.0)


def _advantage(
    old: np.ndarray, mask: np.ndarray, cal: Calibration
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    p_prev = np.sum(np.where(mask, old, 0.0), axis=-1)
    w_plus, w_minus = cal.weights(p_prev)
    adv = np.where(mask, w_plus[..., None], -w_minus[..., None])
    return p_prev, w_plus, w_minus, adv


def surrogate(
    policy: ArrayLike,
    prev_policy: ArrayLike,
    success_mask: ArrayLike,
    *,
    clip_eps: float | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Exact ``E_{o ~ pi_old}[f(pi(o)/pi_old(o), A(o))]`` (GRPO-Clip, or GRPO if no clipping).

    The advantage is ``+w+(p_prev)`` on successes and ``-w-(p_prev)`` on
    failures, ``p_prev`` being the probability of success of ``prev_policy``.
    Policies may be batched on leading axes; the last axis runs over outcomes.
    """
    cal = resolve_calibration(calibration, **calibration_kwargs)
    c = check_clip_eps(clip_eps)
    x, old, mask = _prepare(policy, prev_policy, success_mask)
    _, _, _, adv = _advantage(old, mask, cal)
    return np.sum(old * _clipped(x, adv, c), axis=-1)


def _prepare(
    policy: ArrayLike, prev_policy: ArrayLike, success_mask: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked likelihood ratio, old policy and success mask, broadcast to one shape."""
    pi = check_probability_vector("policy", policy)
    old = check_probability_vector("prev_policy", prev_policy)
    mask = check_success_mask(success_mask)
    pi, old, mask = broadcast(policy=pi, prev_policy=old, success_mask=mask)
    return _likelihood_ratio(pi, old), old, mask


def _clipped(x: np.ndarray, a: np.ndarray, c: float | None) -> np.ndarray:
    if c is None:
        return x * a
    return np.minimum(x * a, np.clip(x, 1.0 - c, 1.0 + c) * a)


@dataclass(frozen=True)
class ContrastiveTerms:
    """The pieces of the weighted contrastive form of the objective.

    Attributes
    ----------
    p_prev, w_plus, w_minus:
        Probability of success of ``pi_old`` and the calibration weights at it.
    success_term:
        ``E_old[min(x, 1 + c) 1{r=1}]`` (``P_pi(r=1)`` without clipping).
    failure_term:
        ``E_old[max(x, 1 - c) 1{r=0}]`` (``P_pi(r=0)`` without clipping).
    """

    p_prev: np.ndarray
    w_plus: np.ndarray
    w_minus: np.ndarray
    success_term: np.ndarray
    failure_term: np.ndarray

    @property
    def value(self) -> np.ndarray:
        """``w+ success_term - w- failure_term``: equals the exact surrogate."""
        return self.w_plus * self.success_term - self.w_minus * self.failure_term

    @property
    def conditional_value(self) -> np.ndarray:
        """The same weights applied to *conditional* expectations given the reward.

        ``w+ E_old[min(x, 1+c) | r=1] - w- E_old[max(x, 1-c) | r=0]``: the
        literal reading of the first display of Section 2.2, which drops the
        event masses ``p_prev`` and ``1 - p_prev``. It is not the surrogate.
        """
        return (
            self.w_plus * self.success_term / self.p_prev
            - self.w_minus * self.failure_term / (1.0 - self.p_prev)
        )


def contrastive_terms(
    policy: ArrayLike,
    prev_policy: ArrayLike,
    success_mask: ArrayLike,
    *,
    clip_eps: float | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> ContrastiveTerms:
    """Success and failure terms of the contrastive form (Section 2.2-2.3, eq. 5).

    Clipping caps the ratio at ``1 + clip_eps`` on successes and floors it at
    ``1 - clip_eps`` on failures; without clipping the terms are the
    probabilities of success and failure of ``policy`` itself.
    """
    cal = resolve_calibration(calibration, **calibration_kwargs)
    c = check_clip_eps(clip_eps)
    x, old, mask = _prepare(policy, prev_policy, success_mask)
    p_prev, w_plus, w_minus, _ = _advantage(old, mask, cal)
    up = x if c is None else np.minimum(x, 1.0 + c)
    down = x if c is None else np.maximum(x, 1.0 - c)
    success = np.sum(np.where(mask, old * up, 0.0), axis=-1)
    failure = np.sum(np.where(mask, 0.0, old * down), axis=-1)
    return ContrastiveTerms(p_prev, w_plus, w_minus, success, failure)


def contrastive_form(
    policy: ArrayLike,
    prev_policy: ArrayLike,
    success_mask: ArrayLike,
    *,
    clip_eps: float | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """``w+ E_old[min(x, 1+c) 1{r=1}] - w- E_old[max(x, 1-c) 1{r=0}]`` (eq. 5 without clipping)."""
    return contrastive_terms(
        policy, prev_policy, success_mask, clip_eps=clip_eps, calibration=calibration,
        **calibration_kwargs,
    ).value


@dataclass(frozen=True)
class MonteCarloEstimate:
    """Sample mean of the per-sample objective and its standard error."""

    mean: float
    stderr: float
    n_samples: int


def monte_carlo_surrogate(
    policy: ArrayLike,
    prev_policy: ArrayLike,
    success_mask: ArrayLike,
    n_samples: int,
    *,
    rng: np.random.Generator | int | None = None,
    clip_eps: float | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> MonteCarloEstimate:
    """Estimate :func:`surrogate` from ``n_samples`` outcomes drawn i.i.d. from ``prev_policy``.

    The advantage uses the exact ``p_prev`` (the paper's population weights),
    so the estimator is unbiased; ``stderr`` is the sample standard deviation
    (``ddof=1``) over ``sqrt(n_samples)``. Only single (1-D) policies.
    """
    n = check_count("n_samples", n_samples, 2)
    check_memory("n_samples", n, 24.0 * n, "the draws")
    check_seed("rng", rng, allow_none=True)
    c = check_clip_eps(clip_eps)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    for name, value in (("policy", policy), ("prev_policy", prev_policy)):
        if check_probability_vector(name, value).ndim != 1:
            raise ValueError(f"{name} must be a single 1-D policy, got shape "
                             f"{np.shape(value)}")
    x, old, mask = _prepare(policy, prev_policy, success_mask)
    if mask.ndim != 1:
        raise ValueError(f"success_mask must be 1-D like the policies (a single policy), "
                         f"got shape {np.shape(success_mask)}")
    _, _, _, adv = _advantage(old, mask, cal)
    per_outcome = _clipped(x, adv, c)
    gen = np.random.default_rng(rng)
    draws = gen.choice(old.size, size=int(n), p=old / old.sum())
    values = per_outcome[draws]
    return MonteCarloEstimate(
        float(values.mean()), float(values.std(ddof=1) / math.sqrt(n)), int(n)
    )
