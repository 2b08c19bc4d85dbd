"""Direct numerical maximisation of the KL-regularised GRPO step (an independent check).

On a finite outcome space the no-clip GRPO step (eq. 17) is

    max_pi  E_pi[A] - beta (alpha KL(pi || pi_ref) + (1 - alpha) KL(pi || pi_prev)),

with ``A = +w+(p_nu)`` on successes and ``-w-(p_nu)`` on failures, where
``p_nu`` is the probability of success of the sampling policy (``pi_prev``
unless given). :mod:`~grpo_companion.theory.policies` gives the maximiser in
closed form (Theorems 1, 4, 8 and Lemma 2); this module finds it without using that form, by running
BFGS on unconstrained softmax logits with the analytic gradient, starting from
the uniform policy, then polishing with Newton steps on the exact Hessian.
``alpha = 1`` with ``pi_ref`` set to any anchor is the general-anchor problem
of Theorem 8.

:func:`max_scaled_error` is the measure by which the chapters compare a computed curve with an
independent reference: the largest error in units that the caller chooses (the reference
itself for a relative error, a reading tolerance for values read off a figure of the paper).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, special

from grpo_companion.validation import (
    broadcast,
    check_count,
    check_probability,
    check_probability_vector,
    check_real,
    check_scalar_array,
    check_success_mask,
)

from ..calibration import Calibration, resolve_calibration

_NEWTON_STEPS = 30

__all__ = ["NumericalOptimum", "max_scaled_error", "maximise_regularised_objective",
           "regularised_objective", "success_log_odds"]


def max_scaled_error(value: ArrayLike, reference: ArrayLike, scale: ArrayLike) -> float:
    """Largest ``abs(value - reference) / scale`` over the entries: an error in chosen units.

    ``scale = abs(reference)`` gives the largest relative error (chapter 1: the plotted
    weights of eq. 4 against a 30-digit evaluation), ``scale = max(1, abs(reference))`` an
    error relative for large values and absolute for small ones (chapter 10), and a
    tolerance per point the largest miss in tolerances (chapter 5: Lemma 1's bound against
    values read off the paper's Figure 4). The three arrays broadcast and ``scale`` is
    ``> 0``; returns a float.
    """
    v = check_real("value", value, finite=False)
    r = check_real("reference", reference, finite=False)
    u = check_real("scale", scale, 0.0, open_low=True, finite=False)
    v, r, u = broadcast(value=v, reference=r, scale=u)
    if v.size == 0:
        raise ValueError("value must hold at least one entry (after broadcasting)")
    return float(np.max(np.abs(v - r) / u))


def success_log_odds(policy: ArrayLike, success_mask: ArrayLike) -> np.ndarray:
    """``log pi(S) - log pi(F)``: the logit of a policy's success probability, from its masses.

    ``policy`` holds probability vectors on its last axis (leading axes: a path, say) and
    ``success_mask`` marks the successes ``S`` (``F`` is the rest; both non-empty). Summing
    each class and taking logs avoids forming ``1 - p``, so a policy with ``p`` within
    ``1e-16`` of 1 keeps its exact log-odds (chapter 3 compares the log-odds of the
    iterates of Lemma 2 with the Renyi-corrected recurrence). Returns shape
    ``policy.shape[:-1]``.
    """
    pi = check_probability_vector("policy", policy)
    mask = check_success_mask(success_mask)
    if mask.shape != pi.shape[-1:]:
        raise ValueError(f"success_mask must have one entry per outcome ({pi.shape[-1]}), "
                         f"got shape {mask.shape}")
    if mask.all() or not mask.any():
        raise ValueError("success_mask must mark at least one success and one failure")
    with np.errstate(divide="ignore"):
        return (np.log(pi[..., mask].sum(-1)) - np.log(pi[..., ~mask].sum(-1)))[()]


@dataclass(frozen=True)
class NumericalOptimum:
    """Result of :func:`maximise_regularised_objective`.

    Attributes
    ----------
    policy:
        ``softmax`` of the optimal logits.
    objective:
        Value of the regularised objective at ``policy``.
    gradient_norm:
        Max-norm of the gradient in logit space at the end.
    n_iterations:
        BFGS iterations plus Newton steps used.
    converged:
        Whether the gradient max-norm reached ``gtol``.
    """

    policy: np.ndarray
    objective: float
    gradient_norm: float
    n_iterations: int
    converged: bool


@dataclass(frozen=True)
class _Problem:
    advantage: np.ndarray
    log_anchor: np.ndarray  # alpha log pi_ref + (1 - alpha) log pi_prev (unnormalised)
    beta: float


def _setup(pi_ref, pi_prev, success_mask, beta, alpha, p_nu, cal) -> _Problem:
    ref = check_probability_vector("pi_ref", pi_ref)
    prev = check_probability_vector("pi_prev", pi_prev)
    for name, pi in (("pi_ref", ref), ("pi_prev", prev)):
        if pi.ndim != 1:
            raise ValueError(f"{name} must be a single 1-D policy, got shape {pi.shape}")
    if ref.shape != prev.shape:
        raise ValueError(f"pi_ref and pi_prev must have the same shape, got {ref.shape} "
                         f"and {prev.shape}")
    mask = check_success_mask(success_mask)
    if mask.shape != ref.shape:
        raise ValueError(f"success_mask must have the shape of pi_ref {ref.shape}, "
                         f"got {mask.shape}")
    b = float(check_real("beta", beta, 0.0, open_low=True, scalar=True))
    a = float(check_real("alpha", alpha, 0.0, 1.0, scalar=True))
    # a zero anchor entry forces pi = 0 there, which finite logits cannot reach
    if a > 0 and (ref <= 0).any():
        raise ValueError(f"pi_ref must be > 0 everywhere when alpha > 0, got {ref!r}")
    if a < 1 and (prev <= 0).any():
        raise ValueError(f"pi_prev must be > 0 everywhere when alpha < 1, got {prev!r}")
    if p_nu is None:
        p = float(np.sum(prev[mask]))
    else:
        p = float(check_scalar_array("p_nu", check_probability("p_nu", p_nu)))
    w_plus, w_minus = cal.weights(p)
    adv = np.where(mask, float(w_plus), -float(w_minus))
    with np.errstate(divide="ignore"):
        log_anchor = (a * np.log(ref) if a > 0 else 0.0) + (
            (1 - a) * np.log(prev) if a < 1 else 0.0
        )
    return _Problem(adv, np.broadcast_to(log_anchor, ref.shape).astype(float), b)


def _value_and_grad(z: np.ndarray, prob: _Problem) -> tuple[float, np.ndarray]:
    """Objective and its gradient w.r.t. the logits ``z`` (``pi = softmax(z)``)."""
    log_pi = z - special.logsumexp(z)
    pi = np.exp(log_pi)
    # E_pi[A] - beta (E_pi[log pi] - E_pi[log anchor]); the anchor's normaliser is a constant
    d_pi = prob.advantage - prob.beta * (log_pi + 1.0 - prob.log_anchor)
    value = float(pi @ (prob.advantage - prob.beta * (log_pi - prob.log_anchor)))
    grad = pi * (d_pi - pi @ d_pi)
    return value, grad


def _hessian(z: np.ndarray, prob: _Problem) -> np.ndarray:
    """Hessian of the objective w.r.t. the logits.

    With ``u = A + beta log anchor - beta log pi`` and ``g = pi (u - pi.u)`` the gradient,
    ``H = diag(pi (u - pi.u - beta)) - pi (u - pi.u) pi^T - pi g^T + beta pi pi^T``.
    """
    log_pi = z - special.logsumexp(z)
    pi = np.exp(log_pi)
    u = prob.advantage + prob.beta * (prob.log_anchor - log_pi)
    centred = u - pi @ u
    g = pi * centred
    return (np.diag(pi * (centred - prob.beta)) - np.outer(pi * centred, pi)
            - np.outer(pi, g) + prob.beta * np.outer(pi, pi))


def regularised_objective(
    policy: ArrayLike,
    pi_ref: ArrayLike,
    pi_prev: ArrayLike,
    success_mask: ArrayLike,
    beta: float,
    *,
    alpha: float = 1.0,
    p_nu: float | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> float:
    """``E_pi[A] - beta (alpha KL(pi||pi_ref) + (1 - alpha) KL(pi||pi_prev))`` at ``policy``.

    ``A`` uses ``p_nu`` if given, else the probability of success of ``pi_prev``.
    """
    cal = resolve_calibration(calibration, **calibration_kwargs)
    prob = _setup(pi_ref, pi_prev, success_mask, beta, alpha, p_nu, cal)
    pi = check_probability_vector("policy", policy)
    if pi.shape != prob.advantage.shape:
        raise ValueError(f"policy must be a single 1-D policy of shape {prob.advantage.shape} "
                         f"(like pi_ref), got shape {pi.shape}")
    ref = np.asarray(pi_ref, dtype=float)
    prev = np.asarray(pi_prev, dtype=float)
    a = float(alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        def kl(q: np.ndarray) -> float:
            return float(np.sum(np.where(pi > 0, pi * (np.log(pi) - np.log(q)), 0.0)))

        penalty = (a * kl(ref) if a > 0 else 0.0) + ((1 - a) * kl(prev) if a < 1 else 0.0)
    return float(pi @ prob.advantage - prob.beta * penalty)


def maximise_regularised_objective(
    pi_ref: ArrayLike,
    pi_prev: ArrayLike,
    success_mask: ArrayLike,
    beta: float,
    *,
    alpha: float = 1.0,
    p_nu: float | None = None,
    x0: ArrayLike | None = None,
    gtol: float = 1e-11,
    maxiter: int = 10_000,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> NumericalOptimum:
    """Maximise the two-KL regularised objective over the simplex by BFGS on softmax logits.

    Parameters
    ----------
    pi_ref, pi_prev : array_like
        1-D policies over the same outcomes; entries must be positive where
        their KL term is active (``alpha > 0``, resp. ``alpha < 1``).
    success_mask : array_like
        0/1 (or bool) success indicator per outcome.
    beta : float
        KL strength, > 0.
    alpha : float
        Reference share in [0, 1]: 1 is Theorem 1 (or Theorem 8 with anchor
        ``pi_ref``), 0 is mirror GRPO (Theorem 4).
    p_nu : float, optional
        PoS that calibrates the advantage; default: that of ``pi_prev``.
    x0 : array_like, optional
        Starting logits (default zeros, the uniform policy).
    gtol : float
        Target gradient max-norm in logit space, > 0.
    """
    cal = resolve_calibration(calibration, **calibration_kwargs)
    prob = _setup(pi_ref, pi_prev, success_mask, beta, alpha, p_nu, cal)
    gtol = float(check_real("gtol", gtol, 0.0, open_low=True, scalar=True))
    maxiter = check_count("maxiter", maxiter, 1)
    n = prob.advantage.size
    z0 = np.zeros(n) if x0 is None else check_real("x0", x0)
    if z0.shape != (n,):
        raise ValueError(f"x0 must be {n} finite logits (one per outcome), got {x0!r}")

    def neg(z: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = _value_and_grad(z, prob)
        return -value, -grad

    # BFGS brings the logits close; Newton steps on the gradient (exact Hessian,
    # shift direction fixed by centring the logits) then reach rounding level,
    # where BFGS alone tends to stop on a line-search "precision loss".
    res = optimize.minimize(neg, z0, jac=True, method="BFGS",
                            options={"gtol": max(gtol, 1e-8), "maxiter": maxiter})
    z = res.x - np.mean(res.x)
    n_iter = int(res.nit)
    value, grad = _value_and_grad(z, prob)
    best = (float(np.max(np.abs(grad))), z, value)
    for _ in range(_NEWTON_STEPS):
        if best[0] <= gtol:
            break
        hessian = _hessian(z, prob) - np.full((n, n), 1.0 / n**2)  # + centring term
        try:
            step = np.linalg.solve(hessian, grad)
        except np.linalg.LinAlgError:  # pragma: no cover - singular only off the optimum
            break
        z = z - step
        z = z - np.mean(z)
        n_iter += 1
        value, grad = _value_and_grad(z, prob)
        norm = float(np.max(np.abs(grad)))
        if norm < best[0]:
            best = (norm, z, value)
    grad_norm, z, value = best
    return NumericalOptimum(
        policy=special.softmax(z),
        objective=value,
        gradient_norm=grad_norm,
        n_iterations=n_iter,
        converged=grad_norm <= gtol,
    )
