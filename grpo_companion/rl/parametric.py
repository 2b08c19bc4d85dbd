"""Parametric GRPO iterations with shared parameters (paper, Appendix F, Theorem 10).

The paper's dynamics (Theorems 1-3) are those of the *non-parametric* iterates
``pi_n``: one free distribution per prompt. A real model shares its parameters
across prompts and cannot represent ``pi_n`` for every prompt at once. This
module provides the smallest such model and runs GRPO on it with exact
expectations (no sampling), so that the gap it measures is the approximation
(and optimisation) error alone.

Model
-----
A log-linear policy with the reference as base measure::

    pi_theta(o|q) = pi_ref(o|q) exp(theta . phi(q, o)) / Z_theta(q),   theta in R^d,

so ``theta = 0`` is ``pi_ref`` (the reference lies in the family) and the
features ``phi`` (array ``(n_prompts, n_outputs, d)``) fix the capacity:
:func:`tabular_features` (``d = N K``) represents every policy,
:func:`random_features` spans a random ``d``-dimensional subspace of the
logits, :func:`correctness_features` lets groups of prompts share one
"be correct" logit.

Iteration
---------
:func:`parametric_grpo` runs (GRPO Iterations) in the family: step ``n``
maximises over ``theta``, from the previous ``theta``::

    J_n(theta) = mean_q [ w+(p~_{n-1}(q)) P_theta(S|q) - w-(p~_{n-1}(q)) P_theta(F|q) ]
                 - beta mean_q KL(pi_theta(.|q) || pi_ref(.|q)),

where ``p~_{n-1}`` is the success probability of the previous *parametric*
policy (Algorithm 1 samples from its own old policy). Since
``J_n(theta) = beta mean_q [log Z*_n(q) - KL(pi_theta || pi*_n)]`` with
``pi*_n`` the closed-form optimum of Theorem 1 for the weights at ``p~_{n-1}``,
each step is the reverse-KL (information) projection of ``pi*_n`` onto the
family; :func:`projection_error` returns the KL left over.

Gap measures (:func:`parametric_gap`): the total variation between the
parametric and the exact iterates per prompt and averaged over prompts, the
smallest increments ``delta_n`` that satisfy Assumption 1 and their sum.
Everything is numpy float64; expectations are exact sums over outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, special

from grpo_companion.theory.calibration import Calibration, resolve_calibration

__all__ = [
    "ErrorDecomposition",
    "GapReport",
    "LogLinearPolicy",
    "ParametricRun",
    "correctness_features",
    "error_decomposition",
    "exact_iterates",
    "grpo_objective",
    "minimal_increments",
    "parametric_grpo",
    "parametric_gap",
    "projection_error",
    "random_features",
    "success_prob",
    "tabular_features",
    "total_variation",
]


def _check_mask(success: np.ndarray) -> np.ndarray:
    mask = np.asarray(success)
    if mask.ndim != 2 or mask.dtype != bool:
        raise ValueError(f"success must be a boolean array (n_prompts, n_outputs), got "
                         f"dtype {mask.dtype} and shape {mask.shape}")
    if not (mask.any(axis=1) & (~mask).any(axis=1)).all():
        raise ValueError("every prompt needs at least one success and one failure output")
    return mask


def _check_beta(beta: float) -> float:
    b = float(beta)
    if not b > 0 or not np.isfinite(b):
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    return b


def _check_steps(n_steps: int) -> int:
    if isinstance(n_steps, bool) or not isinstance(n_steps, int | np.integer) or n_steps < 0:
        raise ValueError(f"n_steps must be an int >= 0, got {n_steps!r}")
    return int(n_steps)


# --------------------------------------------------------------------------- features


def tabular_features(n_prompts: int, n_outputs: int) -> np.ndarray:
    """One-hot features ``(N, K, N K)``: one free logit per (prompt, output)."""
    for name, value in (("n_prompts", n_prompts), ("n_outputs", n_outputs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return np.eye(n_prompts * n_outputs).reshape(n_prompts, n_outputs, -1)


def random_features(n_prompts: int, n_outputs: int, dim: int, *, seed: int = 0) -> np.ndarray:
    """The first ``dim`` columns of a random orthogonal ``(N K) x (N K)`` matrix.

    Returns ``(N, K, dim)``. For a fixed seed the families are nested
    (``dim`` columns are the first ``dim`` of ``dim + 1``), and ``dim = N K`` is
    the tabular family in rotated coordinates.
    """
    total = n_prompts * n_outputs
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= total:
        raise ValueError(f"dim must be an int in [1, {total}], got {dim!r}")
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.normal(size=(total, total)))
    q = q * np.sign(np.diag(r))  # Haar-distributed, deterministic signs
    return q[:, :dim].reshape(n_prompts, n_outputs, dim)


def correctness_features(success: np.ndarray, groups: np.ndarray | int) -> np.ndarray:
    """Shared "be correct" logits: ``phi(q, o) = r(q, o) e_{g(q)}``, shape ``(N, K, G)``.

    ``groups`` is an int ``G`` (prompt ``q`` goes to group ``q mod G``) or an
    int array ``(N,)`` of group labels ``0..G-1``. ``G = N`` with one prompt per
    group contains every exact GRPO iterate started at ``pi_ref`` (Theorem 1
    only tilts the success class of each prompt); ``G = 1`` moves all prompts
    by the same log-odds.
    """
    mask = _check_mask(success)
    n = mask.shape[0]
    if isinstance(groups, int | np.integer) and not isinstance(groups, bool):
        if not 1 <= groups <= n:
            raise ValueError(f"groups must be in [1, {n}], got {groups!r}")
        labels = np.arange(n) % int(groups)
    else:
        labels = np.asarray(groups)
        if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer) or (
                labels.min() < 0):
            raise ValueError(f"groups must be an int or {n} non-negative int labels, "
                             f"got {groups!r}")
    onehot = np.eye(int(labels.max()) + 1)[labels]  # (N, G)
    return mask[:, :, None] * onehot[:, None, :]


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class LogLinearPolicy:
    """``pi_theta(o|q) ∝ pi_ref(o|q) exp(theta . phi(q, o))`` with shared ``theta``.

    Parameters
    ----------
    ref_log_probs
        ``(N, K)`` log-probabilities of the reference policy (rows normalised).
    features
        ``(N, K, d)`` feature map ``phi``.
    """

    ref_log_probs: np.ndarray
    features: np.ndarray

    def __post_init__(self) -> None:
        ref = np.asarray(self.ref_log_probs, dtype=np.float64)
        phi = np.asarray(self.features, dtype=np.float64)
        if ref.ndim != 2 or phi.ndim != 3 or phi.shape[:2] != ref.shape:
            raise ValueError(f"ref_log_probs must be (N, K) and features (N, K, d), got "
                             f"{ref.shape} and {phi.shape}")
        if not np.all(np.isfinite(ref)) or not np.all(np.isfinite(phi)):
            raise ValueError("ref_log_probs and features must be finite")
        norm = special.logsumexp(ref, axis=1)
        if np.abs(norm).max() > 1e-9:
            raise ValueError(f"ref_log_probs rows must be normalised, logsumexp = {norm!r}")
        object.__setattr__(self, "ref_log_probs", ref)
        object.__setattr__(self, "features", phi)

    @property
    def dim(self) -> int:
        return self.features.shape[2]

    def log_probs(self, theta: np.ndarray) -> np.ndarray:
        """``(N, K)`` log-probabilities of ``pi_theta``."""
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (self.dim,):
            raise ValueError(f"theta must have shape ({self.dim},), got {theta.shape}")
        logits = self.ref_log_probs + self.features @ theta
        return logits - special.logsumexp(logits, axis=1, keepdims=True)

    def probs(self, theta: np.ndarray) -> np.ndarray:
        return np.exp(self.log_probs(theta))


def success_prob(probs: np.ndarray, success: np.ndarray) -> np.ndarray:
    """PoS ``P(S|q)`` per prompt (eq. 7) of policies ``(..., N, K)``."""
    return np.minimum(np.sum(np.where(success, probs, 0.0), axis=-1), 1.0)


def total_variation(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``TV(p, q) = 1/2 sum_o |p(o) - q(o)| = sup_A |p(A) - q(A)|`` over the last axis."""
    return 0.5 * np.sum(np.abs(np.asarray(p) - np.asarray(q)), axis=-1)


# --------------------------------------------------------------------------- objective


def _advantages(success: np.ndarray, p_prev: np.ndarray, cal: Calibration) -> np.ndarray:
    w_plus, w_minus = cal.weights(p_prev)
    return np.where(success, w_plus[:, None], -w_minus[:, None])


def grpo_objective(
    policy: LogLinearPolicy,
    theta: np.ndarray,
    success: np.ndarray,
    p_prev: np.ndarray,
    beta: float,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> tuple[float, np.ndarray]:
    """Exact (GRPO Iterations) objective and its gradient in ``theta``.

    ``J(theta) = mean_q [w+(p_prev) P_theta(S|q) - w-(p_prev) P_theta(F|q)
    - beta KL(pi_theta(.|q) || pi_ref(.|q))]``.
    """
    mask = _check_mask(success)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    adv = _advantages(mask, np.asarray(p_prev, dtype=np.float64), cal)
    return _objective(policy, np.asarray(theta, dtype=np.float64), adv, _check_beta(beta))


def _objective(policy: LogLinearPolicy, theta: np.ndarray, adv: np.ndarray,
               beta: float) -> tuple[float, np.ndarray]:
    value, grad, _ = _objective_parts(policy, theta, adv, beta, hessian=False)
    return value, grad


def _objective_parts(policy: LogLinearPolicy, theta: np.ndarray, adv: np.ndarray, beta: float,
                     *, hessian: bool) -> tuple[float, np.ndarray, np.ndarray | None]:
    """Value, gradient and (optionally) Hessian of the objective in ``theta``.

    Per prompt, with logits ``s`` and payoff ``c = A - beta log(pi / pi_ref)``:
    ``V = E_pi[c]``, ``dV/ds = g = pi (c - V)`` and
    ``d2V/ds2 = diag(g) - g pi^T - pi g^T - beta (diag(pi) - pi pi^T)``.
    """
    log_pi = policy.log_probs(theta)
    pi = np.exp(log_pi)
    c = adv - beta * (log_pi - policy.ref_log_probs)  # per-output payoff
    value = np.sum(pi * c, axis=1)  # E_pi[A] - beta KL, per prompt
    g = pi * (c - value[:, None])  # d value / d logits (softmax identity)
    phi = policy.features
    n = adv.shape[0]
    grad = np.einsum("qo,qod->d", g, phi) / n
    if not hessian:
        return float(value.mean()), grad, None
    a = np.einsum("qo,qod->qd", g, phi)
    b = np.einsum("qo,qod->qd", pi, phi)
    flat = phi.reshape(-1, phi.shape[2])
    hess = (flat * (g - beta * pi).reshape(-1, 1)).T @ flat
    hess -= a.T @ b + b.T @ a
    hess += beta * (b.T @ b)
    return float(value.mean()), grad, hess / n


def projection_error(policy: LogLinearPolicy, theta: np.ndarray, success: np.ndarray,
                     p_prev: np.ndarray, beta: float, *,
                     calibration: Calibration | None = None,
                     **calibration_kwargs: Any) -> np.ndarray:
    """``KL(pi_theta(.|q) || pi*(.|q))`` per prompt, ``pi*`` the Theorem 1 optimum at ``p_prev``.

    ``J(theta) = beta mean_q [log Z*(q) - KL(pi_theta || pi*)]``: the KL is the
    objective a step leaves on the table, divided by ``beta``.
    """
    mask = _check_mask(success)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    b = _check_beta(beta)
    adv = _advantages(mask, np.asarray(p_prev, dtype=np.float64), cal)
    log_target = policy.ref_log_probs + adv / b
    log_target -= special.logsumexp(log_target, axis=1, keepdims=True)
    log_pi = policy.log_probs(theta)
    return np.sum(np.exp(log_pi) * (log_pi - log_target), axis=1)


# --------------------------------------------------------------------------- iterations


@dataclass(frozen=True)
class ParametricRun:
    """Output of :func:`parametric_grpo`; index 0 is ``pi_ref`` (``theta = 0``).

    Attributes
    ----------
    thetas : ``(n + 1, d)``
    probs : ``(n + 1, N, K)`` policies ``pi~_n``
    success_prob : ``(n + 1, N)`` PoS ``p~_n(q)``
    grad_norm : ``(n,)`` final gradient norm of each step's optimisation
    projection_kl : ``(n, N)`` ``KL(pi~_n || pi*_n)``, ``pi*_n`` the exact step from ``p~_{n-1}``
    """

    thetas: np.ndarray
    probs: np.ndarray
    success_prob: np.ndarray
    grad_norm: np.ndarray
    projection_kl: np.ndarray


def parametric_grpo(
    policy: LogLinearPolicy,
    success: np.ndarray,
    beta: float,
    n_steps: int,
    *,
    gtol: float = 1e-10,
    accept_gtol: float = 1e-8,
    max_iter: int = 1000,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> ParametricRun:
    """GRPO iterations in the log-linear family, exact expectations (Appendix F).

    Step ``n`` maximises :func:`grpo_objective` with weights at ``p~_{n-1}``
    by a Newton-CG trust-region method (exact Hessian), started from
    ``theta_{n-1}`` (``theta_0 = 0``, ``pi~_0 = pi_ref``).
    The solver aims at gradient norm ``gtol``; where float64 rounding of the
    objective stops it earlier, plain Newton steps on the gradient polish the
    solution. A step is accepted if the final gradient norm is at most
    ``accept_gtol``; ``RuntimeError`` is raised otherwise.
    """
    mask = _check_mask(success)
    if mask.shape != policy.ref_log_probs.shape:
        raise ValueError(f"success has shape {mask.shape}, the policy "
                         f"{policy.ref_log_probs.shape}")
    b = _check_beta(beta)
    n_steps = _check_steps(n_steps)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    theta = np.zeros(policy.dim)
    thetas, probs = [theta], [policy.probs(theta)]
    grad_norms, kls = [], []
    for _ in range(n_steps):
        p_prev = success_prob(probs[-1], mask)
        adv = _advantages(mask, p_prev, cal)

        def neg(x: np.ndarray, adv: np.ndarray = adv) -> tuple[float, np.ndarray]:
            value, grad = _objective(policy, x, adv, b)
            return -value, -grad

        def neg_hess(x: np.ndarray, adv: np.ndarray = adv) -> np.ndarray:
            return -_objective_parts(policy, x, adv, b, hessian=True)[2]

        res = optimize.minimize(neg, theta, jac=True, hess=neg_hess, method="trust-ncg",
                                options={"gtol": gtol, "maxiter": max_iter,
                                         "initial_trust_radius": 10.0,
                                         "max_trust_radius": 1e4})
        theta, grad_norm = _polish(neg, neg_hess, res.x)
        if not grad_norm <= accept_gtol:
            raise RuntimeError(f"step {len(thetas)}: the trust-region Newton solver stopped "
                               f"with gradient norm {grad_norm:.3g} ({res.message})")
        thetas.append(theta)
        probs.append(policy.probs(theta))
        grad_norms.append(grad_norm)
        kls.append(projection_error(policy, theta, mask, p_prev, b, calibration=cal))
    probs_arr = np.stack(probs)
    return ParametricRun(
        thetas=np.stack(thetas),
        probs=probs_arr,
        success_prob=success_prob(probs_arr, mask),
        grad_norm=np.asarray(grad_norms),
        projection_kl=np.stack(kls) if kls else np.zeros((0, mask.shape[0])),
    )


def _polish(neg: Any, neg_hess: Any, theta: np.ndarray,
            max_steps: int = 8) -> tuple[np.ndarray, float]:
    """A few plain Newton steps on the gradient (least squares for singular Hessians).

    Near the optimum the objective's decrease drops below float64 resolution and
    the trust-region solver stops; the gradient still has ~1e-15 resolution, so
    Newton steps that shrink it are taken while they do.
    """
    grad = neg(theta)[1]
    norm = float(np.linalg.norm(grad))
    for _ in range(max_steps):
        if norm == 0.0:
            break
        step = np.linalg.lstsq(neg_hess(theta), -grad, rcond=1e-12)[0]
        candidate = theta + step
        cand_grad = neg(candidate)[1]
        cand_norm = float(np.linalg.norm(cand_grad))
        if not cand_norm < norm:
            break
        theta, grad, norm = candidate, cand_grad, cand_norm
    return theta, norm


def exact_iterates(
    ref_probs: np.ndarray,
    success: np.ndarray,
    beta: float,
    n_steps: int,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Non-parametric iterates ``pi_0 = pi_ref, ..., pi_n`` (Theorem 1), ``(n + 1, N, K)``.

    A thin wrapper of :func:`grpo_companion.theory.policy_iterate`.
    """
    from grpo_companion.theory import policy_iterate

    return policy_iterate(ref_probs, _check_mask(success), _check_beta(beta),
                          _check_steps(n_steps), calibration=calibration,
                          **calibration_kwargs)


# --------------------------------------------------------------------------- gap


def minimal_increments(tv: np.ndarray) -> np.ndarray:
    """Smallest ``delta_n >= 0`` with ``TV_n <= TV_{n-1} + delta_n`` (Assumption 1).

    ``delta_n = max(0, TV_n - TV_{n-1})`` along axis 0; shape ``(n, ...)`` for
    ``tv`` of shape ``(n + 1, ...)``.
    """
    tv = np.asarray(tv, dtype=np.float64)
    return np.maximum(0.0, np.diff(tv, axis=0))


@dataclass(frozen=True)
class GapReport:
    """Gap between parametric and exact iterates (Assumption 1, Theorem 10).

    Per-prompt arrays have a last axis over prompts; ``*_mean`` arrays use the
    prompt-averaged TV, ``E_q TV(pi~_n(.|q), pi_n(.|q))``, which is the TV of the
    joint laws of ``(q, o)`` under a uniform prompt distribution.

    Attributes
    ----------
    tv : ``(n + 1, N)`` per-prompt TV; ``tv[0] = 0``
    tv_mean : ``(n + 1,)``
    delta, delta_mean : ``(n, N)``, ``(n,)`` smallest Assumption 1 increments
    delta_star, delta_star_mean : ``(n + 1, N)``, ``(n + 1,)`` partial sums ``sum_{i<=n} delta_i``
    pos_gap, pos_gap_mean : ``|p~_n - p_n|`` per prompt and of the prompt means
    """

    tv: np.ndarray
    tv_mean: np.ndarray
    delta: np.ndarray
    delta_mean: np.ndarray
    delta_star: np.ndarray
    delta_star_mean: np.ndarray
    pos_gap: np.ndarray
    pos_gap_mean: np.ndarray


def parametric_gap(param_probs: np.ndarray, exact_probs: np.ndarray,
                   success: np.ndarray) -> GapReport:
    """TV, Assumption 1 increments and PoS gaps along two policy sequences ``(n + 1, N, K)``."""
    mask = _check_mask(success)
    a = np.asarray(param_probs, dtype=np.float64)
    e = np.asarray(exact_probs, dtype=np.float64)
    if a.shape != e.shape or a.ndim != 3 or a.shape[1:] != mask.shape:
        raise ValueError(f"param_probs and exact_probs must both be (n + 1, N, K) = "
                         f"(n + 1, {mask.shape[0]}, {mask.shape[1]}), got {a.shape}, {e.shape}")
    tv = total_variation(a, e)
    tv_mean = tv.mean(axis=1)
    delta, delta_mean = minimal_increments(tv), minimal_increments(tv_mean)
    zero_row = np.zeros((1, tv.shape[1]))
    p_a, p_e = success_prob(a, mask), success_prob(e, mask)
    return GapReport(
        tv=tv,
        tv_mean=tv_mean,
        delta=delta,
        delta_mean=delta_mean,
        delta_star=np.vstack([zero_row, np.cumsum(delta, axis=0)]),
        delta_star_mean=np.concatenate([[0.0], np.cumsum(delta_mean)]),
        pos_gap=np.abs(p_a - p_e),
        pos_gap_mean=np.abs(p_a.mean(axis=1) - p_e.mean(axis=1)),
    )


@dataclass(frozen=True)
class ErrorDecomposition:
    """Split of each step's TV into a projection and a propagation part.

    With ``pi*_n`` the exact (Theorem 1) step taken from the parametric
    ``pi~_{n-1}``, the triangle inequality gives, per prompt,
    ``TV(pi~_n, pi_n) <= TV(pi~_n, pi*_n) + TV(pi*_n, pi_n)``. Both ``pi*_n``
    and ``pi_n`` tilt ``pi_ref`` by a function of the reward only, so the second
    term equals ``|h(p~_{n-1}) - h(p_{n-1})|`` (``h`` the PoS map of Theorem 2).

    All attributes have shape ``(n, N)``, for steps ``n = 1, 2, ...``.

    Attributes
    ----------
    projection : ``TV(pi~_n, pi*_n)``, the error made by this step alone
    propagation : ``TV(pi*_n, pi_n) = |h(p~_{n-1}) - h(p_{n-1})|``
    pinsker : ``sqrt(KL(pi~_n || pi*_n) / 2) >= projection`` (Pinsker)
    """

    projection: np.ndarray
    propagation: np.ndarray
    pinsker: np.ndarray


def error_decomposition(
    run: ParametricRun,
    exact_probs: np.ndarray,
    ref_probs: np.ndarray,
    success: np.ndarray,
    beta: float,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> ErrorDecomposition:
    """Projection and propagation parts of ``TV(pi~_n, pi_n)`` (see :class:`ErrorDecomposition`)."""
    from grpo_companion.theory import pos_map

    mask = _check_mask(success)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    b = _check_beta(beta)
    ref = np.asarray(ref_probs, dtype=np.float64)
    p_param = run.success_prob[:-1]
    adv = np.stack([_advantages(mask, p, cal) for p in p_param])
    log_target = np.log(ref) + adv / b
    target = np.exp(log_target - special.logsumexp(log_target, axis=-1, keepdims=True))
    p_exact = success_prob(np.asarray(exact_probs, dtype=np.float64), mask)[:-1]
    p_ref = success_prob(ref, mask)
    propagation = np.abs(pos_map(p_param, p_ref, b, calibration=cal)
                         - pos_map(p_exact, p_ref, b, calibration=cal))
    return ErrorDecomposition(
        projection=total_variation(run.probs[1:], target),
        propagation=propagation,
        pinsker=np.sqrt(np.maximum(run.projection_kl, 0.0) / 2),
    )
