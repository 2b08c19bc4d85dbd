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
from numpy.typing import ArrayLike
from scipy import optimize, special

from grpo_companion.validation import (
    as_float_array,
    broadcast,
    check_alpha,
    check_beta,
    check_count,
    check_memory,
    check_probability,
    check_probability_vector,
    check_real,
    check_scalar_array,
    check_seed,
    check_success_mask,
)

from ..calibration import Calibration, resolve_calibration
from ..dynamics import pos_map
from ..policies import anchored_policy, kl_divergence, policy_iterate, pos
from ..roots import fixed_points

__all__ = [
    "ErrorDecomposition",
    "GapMeasurement",
    "GapReport",
    "LogLinearPolicy",
    "ParametricRun",
    "correctness_features",
    "error_decomposition",
    "exact_iterates",
    "grpo_objective",
    "measure_gap",
    "minimal_increments",
    "nearest_fixed_point",
    "parametric_gap",
    "parametric_grpo",
    "projection_error",
    "random_features",
    "tabular_features",
    "total_variation",
]


# --------------------------------------------------------------------------- checks


def _check_mask(success: ArrayLike) -> np.ndarray:
    """A boolean ``(n_prompts, n_outputs)`` reward table with both classes in every row."""
    mask = check_success_mask(success, "success")
    if mask.ndim != 2:
        raise ValueError(f"success must be a 2-D array (n_prompts, n_outputs) of 0/1 or "
                         f"booleans, got shape {mask.shape}")
    both = mask.any(axis=1) & (~mask).any(axis=1)
    if not both.all():
        raise ValueError(f"success must give every prompt at least one success and one "
                         f"failure output; prompt {int(np.flatnonzero(~both)[0])} has not")
    return mask


def _check_beta(beta: object) -> float:
    return float(check_scalar_array("beta", check_beta(beta)))


def _check_tol(name: str, value: object) -> float:
    return float(check_real(name, value, 0.0, open_low=True, scalar=True))


# --------------------------------------------------------------------------- features


def tabular_features(n_prompts: int, n_outputs: int) -> np.ndarray:
    """One-hot features ``(N, K, N K)``: one free logit per (prompt, output)."""
    n = check_count("n_prompts", n_prompts, 1)
    k = check_count("n_outputs", n_outputs, 1)
    return np.eye(n * k).reshape(n, k, -1)


def random_features(n_prompts: int, n_outputs: int, dim: int, *, seed: int = 0) -> np.ndarray:
    """The first ``dim`` columns of a random orthogonal ``(N K) x (N K)`` matrix.

    Returns ``(N, K, dim)``. For a fixed seed the families are nested
    (``dim`` columns are the first ``dim`` of ``dim + 1``), and ``dim = N K`` is
    the tabular family in rotated coordinates.
    """
    n = check_count("n_prompts", n_prompts, 1)
    k = check_count("n_outputs", n_outputs, 1)
    d = check_count("dim", dim, 1, n * k)
    rng = np.random.default_rng(check_seed("seed", seed))
    q, r = np.linalg.qr(rng.normal(size=(n * k, n * k)))
    q = q * np.sign(np.diag(r))  # Haar-distributed, deterministic signs
    return q[:, :d].reshape(n, k, d)


def correctness_features(success: ArrayLike, groups: ArrayLike | int) -> np.ndarray:
    """Shared "be correct" logits: ``phi(q, o) = r(q, o) e_{g(q)}``, shape ``(N, K, G)``.

    ``groups`` is an int ``G`` (prompt ``q`` goes to group ``q mod G``) or an
    int array ``(N,)`` of group labels ``0..G-1``. ``G = N`` with one prompt per
    group contains every exact GRPO iterate started at ``pi_ref`` (Theorem 1
    only tilts the success class of each prompt); ``G = 1`` moves all prompts
    by the same log-odds.
    """
    mask = _check_mask(success)
    n = mask.shape[0]
    if np.ndim(groups) == 0:
        labels = np.arange(n) % check_count("groups", groups, 1, n)
    else:
        labels = np.asarray(groups)
        if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer) or (
                labels.min() < 0):
            raise ValueError(f"groups must be an int in [1, {n}] or {n} non-negative int "
                             f"labels, got {groups!r}")
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
        ref = as_float_array("ref_log_probs", self.ref_log_probs, "finite log-probabilities")
        phi = as_float_array("features", self.features, "finite numbers")
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

    @property
    def ref_probs(self) -> np.ndarray:
        """``(N, K)`` probabilities of ``pi_ref`` (``theta = 0``)."""
        return np.exp(self.ref_log_probs)

    def log_probs(self, theta: ArrayLike) -> np.ndarray:
        """``(N, K)`` log-probabilities of ``pi_theta``."""
        return self._log_probs(self._check_theta(theta))

    def _check_theta(self, theta: ArrayLike) -> np.ndarray:
        x = as_float_array("theta", theta, "finite numbers")
        if x.shape != (self.dim,) or not np.all(np.isfinite(x)):
            raise ValueError(f"theta must be {self.dim} finite numbers (shape ({self.dim},)), "
                             f"got shape {x.shape}")
        return x

    def _log_probs(self, theta: np.ndarray) -> np.ndarray:
        """:meth:`log_probs` without the checks, for the solver's inner loop."""
        logits = self.ref_log_probs + self.features @ theta
        return logits - special.logsumexp(logits, axis=1, keepdims=True)

    def probs(self, theta: ArrayLike) -> np.ndarray:
        """``(N, K)`` probabilities of ``pi_theta``."""
        return np.exp(self.log_probs(theta))


def total_variation(p: ArrayLike, q: ArrayLike) -> np.ndarray:
    """``TV(p, q) = 1/2 sum_o |p(o) - q(o)| = sup_A |p(A) - q(A)|`` over the last axis.

    This is the distance of the paper's Assumption 1 (Appendix F).
    """
    pp = check_probability_vector("p", p)
    qq = check_probability_vector("q", q)
    pp, qq = broadcast(p=pp, q=qq)
    return 0.5 * np.sum(np.abs(pp - qq), axis=-1)


# --------------------------------------------------------------------------- objective


def _advantages(success: np.ndarray, p_prev: np.ndarray, cal: Calibration) -> np.ndarray:
    """``+w+(p_prev)`` on successes, ``-w-(p_prev)`` on failures, per prompt (eqs. 3-4)."""
    w_plus, w_minus = cal.weights(p_prev)
    return np.where(success, np.asarray(w_plus)[..., None], -np.asarray(w_minus)[..., None])


def _check_p_prev(p_prev: ArrayLike, mask: np.ndarray) -> np.ndarray:
    p = check_probability("p_prev", p_prev)
    if p.shape != mask.shape[:1]:
        raise ValueError(f"p_prev must hold one success probability per prompt, shape "
                         f"({mask.shape[0]},), got shape {p.shape}")
    return p


def _check_policy(policy: object, mask: np.ndarray) -> LogLinearPolicy:
    if not isinstance(policy, LogLinearPolicy):
        raise ValueError(f"policy must be a LogLinearPolicy, got {type(policy).__name__}")
    if mask.shape != policy.ref_log_probs.shape:
        raise ValueError(f"success has shape {mask.shape}, the policy "
                         f"{policy.ref_log_probs.shape}")
    return policy


def grpo_objective(
    policy: LogLinearPolicy,
    theta: ArrayLike,
    success: ArrayLike,
    p_prev: ArrayLike,
    beta: float,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> tuple[float, np.ndarray]:
    """Exact (GRPO Iterations) objective of Appendix F and its gradient in ``theta``.

    ``J(theta) = mean_q [w+(p_prev) P_theta(S|q) - w-(p_prev) P_theta(F|q)
    - beta KL(pi_theta(.|q) || pi_ref(.|q))]``.
    """
    mask = _check_mask(success)
    policy = _check_policy(policy, mask)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    adv = _advantages(mask, _check_p_prev(p_prev, mask), cal)
    return _objective(policy, policy._check_theta(theta), adv, _check_beta(beta))


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
    log_pi = policy._log_probs(theta)
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


def projection_error(policy: LogLinearPolicy, theta: ArrayLike, success: ArrayLike,
                     p_prev: ArrayLike, beta: float, *,
                     calibration: Calibration | None = None,
                     **calibration_kwargs: Any) -> np.ndarray:
    """``KL(pi_theta(.|q) || pi*(.|q))`` per prompt, ``pi*`` the Theorem 1 optimum at ``p_prev``.

    ``pi*`` is :func:`~grpo_companion.theory.anchored_policy` with the
    reference as anchor (Theorems 1 and 8). Since
    ``J(theta) = beta mean_q [log Z*(q) - KL(pi_theta || pi*)]``, the KL is the
    objective a step leaves on the table, divided by ``beta``.
    """
    mask = _check_mask(success)
    policy = _check_policy(policy, mask)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    target = anchored_policy(policy.ref_probs, mask, _check_p_prev(p_prev, mask),
                             _check_beta(beta), calibration=cal)
    return kl_divergence(policy.probs(theta), target)


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
    success: ArrayLike,
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
    policy = _check_policy(policy, mask)
    b = _check_beta(beta)
    n_steps = check_count("n_steps", n_steps, 0)
    n_prompts, n_outputs = mask.shape
    check_memory("n_steps", n_steps,
                 8.0 * (n_steps + 1) * (n_prompts * (n_outputs + 1) + policy.dim),
                 "the run's parameters and policies")
    gtol = _check_tol("gtol", gtol)
    accept_gtol = _check_tol("accept_gtol", accept_gtol)
    max_iter = check_count("max_iter", max_iter, 1)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    theta = np.zeros(policy.dim)
    thetas, probs = [theta], [policy.probs(theta)]
    grad_norms, kls = [], []
    for _ in range(n_steps):
        p_prev = pos(probs[-1], mask)
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
        success_prob=pos(probs_arr, mask),
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
    ref_probs: ArrayLike,
    success: ArrayLike,
    beta: float,
    n_steps: int,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Non-parametric iterates ``pi_0 = pi_ref, ..., pi_n`` (Theorem 1), ``(n + 1, N, K)``.

    :func:`~grpo_companion.theory.policy_iterate` for a reward table with a
    success and a failure in every row.
    """
    ref = check_probability_vector("ref_probs", ref_probs)
    mask = _check_mask(success)
    if ref.shape != mask.shape:
        raise ValueError(f"ref_probs must have the shape of success, {mask.shape}, "
                         f"got {ref.shape}")
    return policy_iterate(ref, mask, _check_beta(beta), n_steps, calibration=calibration,
                          **calibration_kwargs)


# --------------------------------------------------------------------------- gap


def minimal_increments(tv: ArrayLike) -> np.ndarray:
    """Smallest ``delta_n >= 0`` with ``TV_n <= TV_{n-1} + delta_n`` (Assumption 1).

    ``delta_n = max(0, TV_n - TV_{n-1})`` along axis 0; shape ``(n, ...)`` for
    ``tv`` of shape ``(n + 1, ...)``.
    """
    x = check_real("tv", tv, 0.0, 1.0)
    if x.ndim == 0 or x.shape[0] == 0:
        raise ValueError(f"tv must be an array of distances (n + 1, ...) with n >= 0, "
                         f"got shape {x.shape}")
    return np.maximum(0.0, np.diff(x, axis=0))


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


def parametric_gap(param_probs: ArrayLike, exact_probs: ArrayLike,
                   success: ArrayLike) -> GapReport:
    """TV, Assumption 1 increments and PoS gaps along two policy sequences ``(n + 1, N, K)``."""
    mask = _check_mask(success)
    a = check_probability_vector("param_probs", param_probs)
    e = check_probability_vector("exact_probs", exact_probs)
    if a.shape != e.shape or a.ndim != 3 or a.shape[1:] != mask.shape:
        raise ValueError(f"param_probs and exact_probs must both be (n + 1, N, K) = "
                         f"(n + 1, {mask.shape[0]}, {mask.shape[1]}), got {a.shape}, {e.shape}")
    tv = total_variation(a, e)
    tv_mean = tv.mean(axis=1)
    delta, delta_mean = minimal_increments(tv), minimal_increments(tv_mean)
    zero_row = np.zeros((1, tv.shape[1]))
    p_a, p_e = pos(a, mask), pos(e, mask)
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
    exact_probs: ArrayLike,
    ref_probs: ArrayLike,
    success: ArrayLike,
    beta: float,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> ErrorDecomposition:
    """Projection and propagation parts of ``TV(pi~_n, pi_n)`` (see :class:`ErrorDecomposition`)."""
    if not isinstance(run, ParametricRun):
        raise ValueError(f"run must be a ParametricRun, got {type(run).__name__}")
    mask = _check_mask(success)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    b = _check_beta(beta)
    ref = check_probability_vector("ref_probs", ref_probs)
    exact = check_probability_vector("exact_probs", exact_probs)
    if ref.shape != mask.shape or exact.shape != run.probs.shape:
        raise ValueError(f"ref_probs must be (N, K) = {mask.shape} and exact_probs "
                         f"{run.probs.shape} like the run, got {ref.shape} and {exact.shape}")
    p_param = run.success_prob[:-1]
    target = anchored_policy(ref, mask, p_param, b, calibration=cal)  # pi*_n, (n, N, K)
    p_exact = pos(exact, mask)[:-1]
    p_ref = pos(ref, mask)
    propagation = np.abs(pos_map(p_param, p_ref, b, calibration=cal)
                         - pos_map(p_exact, p_ref, b, calibration=cal))
    return ErrorDecomposition(
        projection=total_variation(run.probs[1:], target),
        propagation=propagation,
        pinsker=np.sqrt(np.maximum(run.projection_kl, 0.0) / 2),
    )


# --------------------------------------------------------------------------- chapter 9


def nearest_fixed_point(
    p: ArrayLike,
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """The fixed point ``p* = h(p*)`` of the PoS map nearest to ``p`` (Theorem 2, Table 1).

    Used to name the limit an orbit has reached: ``p`` is its last iterate.
    Elementwise over the broadcast of ``p``, ``p_ref``, ``beta`` and ``alpha``;
    NaN where the map has no interior fixed point (mirror maps, ``p_ref`` in {0, 1}).
    """
    pp = check_probability("p", p)
    pr = check_probability("p_ref", p_ref)
    b = check_beta(beta)
    a = check_alpha(alpha)
    pp, pr, b, a = broadcast(p=pp, p_ref=pr, beta=b, alpha=a)
    if pp.size == 0:
        return np.zeros(pp.shape)
    roots = fixed_points(pr.reshape(-1), b.reshape(-1), alpha=a.reshape(-1),
                         calibration=calibration, **calibration_kwargs)
    roots = roots.reshape(pp.size, -1)
    out = np.full(pp.size, np.nan)
    if roots.shape[1]:  # no column at all when no cell has a fixed point
        dist = np.abs(roots - pp.reshape(-1, 1))
        found = ~np.all(np.isnan(dist), axis=1)
        best = np.argmin(np.where(np.isnan(dist), np.inf, dist), axis=1)
        out[found] = roots[np.flatnonzero(found), best[found]]
    return out.reshape(pp.shape)[()]


@dataclass(frozen=True)
class GapMeasurement:
    """One run of :func:`measure_gap`: a parametric run against the exact iterates.

    Attributes
    ----------
    run : the :class:`ParametricRun`
    exact : ``(n + 1, N, K)`` non-parametric iterates (Theorem 1)
    gap : :class:`GapReport` of ``run.probs`` against ``exact``
    p_exact : ``(n + 1, N)`` PoS of the exact iterates
    p_star : ``(N,)`` the fixed point of each prompt's map nearest to its last exact PoS
    """

    run: ParametricRun
    exact: np.ndarray
    gap: GapReport
    p_exact: np.ndarray
    p_star: np.ndarray


def measure_gap(
    policy: LogLinearPolicy,
    success: ArrayLike,
    beta: float,
    n_steps: int,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> GapMeasurement:
    """Run parametric and exact GRPO side by side and measure the gap (Theorem 10, App. F).

    Both start at ``pi_ref`` (the policy's ``theta = 0``). The fixed point
    ``p*`` that Theorem 10 compares with is, for each prompt, the root of the
    reference map (Theorem 2) nearest to the last exact iterate; whether the
    exact orbit has actually reached it is for the caller to check
    (``|p_exact[-1] - p_star|``).
    """
    mask = _check_mask(success)
    policy = _check_policy(policy, mask)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    run = parametric_grpo(policy, mask, beta, n_steps, calibration=cal)
    ref = policy.ref_probs
    exact = exact_iterates(ref, mask, beta, n_steps, calibration=cal)
    p_exact = pos(exact, mask)
    p_star = nearest_fixed_point(p_exact[-1], pos(ref, mask), beta, calibration=cal)
    return GapMeasurement(run=run, exact=exact, gap=parametric_gap(run.probs, exact, mask),
                          p_exact=p_exact, p_star=np.asarray(p_star))
