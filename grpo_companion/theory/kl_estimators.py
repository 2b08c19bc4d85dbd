"""Which fixed point sampled GRPO reaches with each per-sample KL estimator.

Sampled GRPO does not add ``KL(pi || pi_ref)`` to its loss but a per-sample
estimate ``k(o)`` averaged over outputs ``o`` drawn from ``pi_old`` (the
estimators of :func:`grpo_companion.rl.losses.kl_penalty`). With ``d = log
pi_ref(o) - log pi(o)``: ``k1 = -d``, ``k2 = d**2 / 2``, ``k3 = exp(d) - d - 1``
and ``k3_ratio = (pi / pi_old) k3``. What a gradient step follows is the
*expected gradient* ``grad_theta E_{o ~ pi_old}[k(o)]``; on policy
(``pi_old = pi``, the first of the mu steps) it is, for a softmax policy with
logits ``theta``:

- ``k2``, ``k3_ratio`` (and the exact KL): the gradient of ``KL(pi || pi_ref)``;
- ``k3``: ``pi - pi_ref``, the gradient of the *reverse* ``KL(pi_ref || pi)``;
- ``k1``: zero (its expected score vanishes).

A training run that settles (``pi_n = pi_{n-1}`` on average) settles where the
expected gradient of the whole loss is zero, so each estimator has its own
limit:

- forward KL: the Gibbs tilt ``pi_ref exp(A / beta) / Z``, whose PoS solves the
  paper's fixed-point equation ``logit p = logit p_ref + Omega(p) / beta``
  (:func:`grpo_companion.theory.fixed_points`);
- reverse KL: the maximiser of ``E_pi[A] - beta KL(pi_ref || pi)``,
  ``pi = beta pi_ref / (lam - A)`` (:func:`reverse_kl_policy`), whose PoS solves
  ``p (1 - p) Omega(p) = beta (p - p_ref)`` (:func:`reverse_kl_fixed_points`);
- k1: no anchor at all, the PoS keeps growing towards 1.

For the two-outcome bandit (one success, one failure; the policy *is* its
PoS) :func:`logit_drift` is the expected gradient of the sampled objective
with respect to the success logit ``L``; its zeros are these limits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize

from grpo_companion.validation import (
    broadcast,
    broadcast_shapes,
    check_beta,
    check_choice,
    check_probability,
    check_probability_vector,
    check_real,
)

from .calibration import Calibration, resolve_calibration
from .logistic import _log_bernoulli_variance, logit, sigmoid

__all__ = [
    "ESTIMATOR_TARGETS",
    "KL_ESTIMATORS",
    "KLEstimator",
    "expected_kl_gradient",
    "logit_drift",
    "reverse_kl_fixed_points",
    "reverse_kl_policy",
    "reverse_kl_pos",
]

@dataclass(frozen=True)
class KLEstimator:
    """One per-sample KL estimator: the single definition that the loss and the theory read.

    With ``d = log anchor(o) - log pi(o)`` on an output ``o`` drawn from ``pi_old``:

    Attributes
    ----------
    formula
        The per-sample value, as text.
    value
        ``value(d, xp)``: the per-sample value without the importance ratio, with ``xp``
        the array module (``numpy`` or ``torch``);
        :func:`grpo_companion.rl.losses.kl_penalty` computes the loss's penalty with it.
    score
        ``score(d, xp)``: the factor ``s(o)`` of the expected gradient with respect to the
        logits of a softmax policy, ``sum_o w(o) s(o) (1[o = j] - pi_j)``, where ``w`` is
        ``pi_old`` (or ``pi`` for a ratio-weighted estimator, whose importance ratio turns the
        expectation under ``pi_old`` into one under ``pi``). It is ``-value'(d)``, or
        ``value(d) - value'(d)`` when ratio-weighted, written without cancellation;
        :func:`expected_kl_gradient` reads it, and
        ``tests/theory/test_theory_kl_estimators.py`` checks it against autograd of
        ``value`` through the loss.
    follows
        Which divergence's gradient its expected on-policy gradient is: ``"forward"``
        (``KL(pi || pi_ref)``, the paper's Theorem 2), ``"reverse"`` (``KL(pi_ref || pi)``) or
        ``"none"`` (a zero expected gradient: no anchor).
    ratio_weighted
        Multiplied by the differentiated importance ratio ``pi / pi_old``.
    trl
        The TRL 1.16 setting that computes it, or ``""``.
    """

    formula: str
    value: Callable[[Any, ModuleType], Any]
    score: Callable[[Any, ModuleType], Any]
    follows: str
    ratio_weighted: bool = False
    trl: str = ""


#: The per-sample KL estimators, by the name that ``TrainConfig.kl`` and the theory use. A new
#: estimator is one entry here (the loss, the trainer's choices and the theory read this dict).
KL_ESTIMATORS: dict[str, KLEstimator] = {
    "k1": KLEstimator("-d", lambda d, xp: -d, lambda d, xp: xp.ones_like(d), "none"),
    "k2": KLEstimator("d**2 / 2", lambda d, xp: 0.5 * (d * d), lambda d, xp: -d, "forward"),
    "k3": KLEstimator("exp(d) - d - 1", lambda d, xp: xp.expm1(d) - d,
                      lambda d, xp: -xp.expm1(d), "reverse",
                      trl="beta > 0, use_bias_correction_kl=False"),
    "k3_ratio": KLEstimator("(pi / pi_old) (exp(d) - d - 1)", lambda d, xp: xp.expm1(d) - d,
                            lambda d, xp: -d, "forward", ratio_weighted=True,
                            trl="beta > 0, use_bias_correction_kl=True (TRL 1.16's default)"),
}

#: Which divergence each estimator's expected on-policy gradient follows; ``"exact"`` is the
#: exact KL of two tabular policies (the bandit trainer's ``kl="exact"``).
ESTIMATOR_TARGETS: dict[str, str] = {
    "exact": "forward", **{name: e.follows for name, e in KL_ESTIMATORS.items()}}

#: The estimator of ``"exact"``'s gradient: that of ``KL(pi || pi_ref)``, as ``k3_ratio``'s.
_EXACT = KLEstimator("KL(pi || pi_ref)", lambda d, xp: xp.expm1(d) - d, lambda d, xp: -d,
                     "forward", ratio_weighted=True)


def _check_estimator(estimator: str) -> str:
    return str(check_choice("estimator", estimator, ("exact", *KL_ESTIMATORS)))


def expected_kl_gradient(
    policy: ArrayLike,
    ref_policy: ArrayLike,
    estimator: str,
    *,
    old_policy: ArrayLike | None = None,
) -> np.ndarray:
    """Expected gradient ``grad_theta E_{o ~ pi_old}[k(o)]`` for a softmax policy.

    Parameters
    ----------
    policy, ref_policy, old_policy : array_like
        Probability vectors over outcomes (last axis): the policy ``pi`` being
        differentiated (logits ``theta``), the KL anchor, and the sampling
        policy (default: ``pi`` itself, the on-policy first step). ``policy``
        and ``ref_policy`` must be positive.
    estimator : ``"exact"`` (the exact KL) or a name of :data:`KL_ESTIMATORS`

    Returns
    -------
    ndarray
        The gradient with respect to the logits, same shape as ``policy``
        (it sums to zero over the last axis). Uses
        ``d log pi(o) / d theta_j = 1[o = j] - pi_j``.
    """
    _check_estimator(estimator)
    pi = check_probability_vector("policy", policy)
    ref = check_probability_vector("ref_policy", ref_policy)
    old = pi if old_policy is None else check_probability_vector("old_policy", old_policy)
    for name, x in (("policy", pi), ("ref_policy", ref)):
        if np.any(x <= 0):
            raise ValueError(f"{name} must be positive (the estimators take logs), "
                             f"got {float(x[x <= 0].flat[0])!r}")
    pi, ref, old = broadcast(policy=pi, ref_policy=ref, old_policy=old)
    est = _EXACT if estimator == "exact" else KL_ESTIMATORS[estimator]
    d = np.log(ref) - np.log(pi)
    weighted = (pi if est.ratio_weighted else old) * est.score(d, np)
    return weighted - pi * np.sum(weighted, axis=-1, keepdims=True)


def _bisect_lambda(ref: np.ndarray, adv: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Solve ``sum_o beta ref_o / (lam - A_o) = 1`` for ``lam > max_{ref_o > 0} A_o``."""
    support = ref > 0
    top = np.max(np.where(support, adv, -np.inf), axis=-1)
    lo, hi = top.copy(), top + beta[..., 0]  # at lam = top + beta every term <= ref_o
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            gap = mid[..., None] - adv
            total = np.sum(np.where(support, beta * ref / gap, 0.0), axis=-1)
            above = total > 1.0
            lo = np.where(above, mid, lo)
            hi = np.where(above, hi, mid)
    return hi


def reverse_kl_policy(
    ref_policy: ArrayLike, advantage: ArrayLike, beta: ArrayLike
) -> np.ndarray:
    """Maximiser of ``E_pi[A] - beta KL(pi_ref || pi)`` over the simplex.

    The stationarity condition ``A_o + beta pi_ref(o) / pi(o) = lam`` gives
    ``pi(o) = beta pi_ref(o) / (lam - A(o))`` with ``lam > max A`` (on the
    support of ``pi_ref``) fixed by normalisation (solved by bisection to
    machine precision). Unlike the forward-KL optimum (the Gibbs tilt
    ``pi_ref exp(A / beta) / Z``, :func:`grpo_companion.theory.optimal_policy`)
    the tilt is a rational, not exponential, function of the advantage.

    Parameters
    ----------
    ref_policy : array_like
        Reference probability vectors (last axis over outcomes).
    advantage : array_like
        Advantage of each outcome, broadcast against ``ref_policy``.
    beta : array_like
        Penalty strength ``> 0``, one per leading index (broadcast).
    """
    ref = check_probability_vector("ref_policy", ref_policy)
    adv = check_real("advantage", advantage)
    b = check_beta(beta)
    ref, adv = broadcast(ref_policy=ref, advantage=adv)
    broadcast_shapes(**{"ref_policy (batch axes)": ref.shape[:-1], "beta": b.shape})
    return _reverse_kl_policy(ref, adv, b)


def _reverse_kl_policy(ref: np.ndarray, adv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`reverse_kl_policy` on checked, broadcast inputs."""
    shape = np.broadcast_shapes(ref.shape[:-1], b.shape)
    ref = np.broadcast_to(ref, (*shape, ref.shape[-1]))
    adv = np.broadcast_to(adv, ref.shape)
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), shape)[..., None]
    lam = _bisect_lambda(ref, adv, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        pi = np.where(ref > 0, b * ref / (lam[..., None] - adv), 0.0)
    return pi / pi.sum(axis=-1, keepdims=True)


def reverse_kl_pos(
    p_ref: ArrayLike, w_plus: ArrayLike, w_minus: ArrayLike, beta: ArrayLike
) -> np.ndarray:
    """PoS of :func:`reverse_kl_policy` for the calibrated advantage ``+w+`` / ``-w-``.

    Only the class masses matter: ``p = beta p_ref / (lam - w+)`` and
    ``1 - p = beta (1 - p_ref) / (lam + w-)``, with ``lam`` fixed by their sum.
    """
    pr = check_probability("p_ref", p_ref)
    wp = check_real("w_plus", w_plus)
    wm = check_real("w_minus", w_minus)
    b = check_beta(beta)
    pr, wp, wm, b = broadcast(p_ref=pr, w_plus=wp, w_minus=wm, beta=b)
    ref = np.stack([pr, 1.0 - pr], axis=-1)
    adv = np.stack([wp, -wm], axis=-1)
    return _reverse_kl_policy(ref, adv, b)[..., 0]


def logit_drift(
    p: ArrayLike,
    p_ref: ArrayLike,
    beta: ArrayLike,
    estimator: str,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Expected gradient of the sampled GRPO objective in the success logit.

    Two-outcome bandit (one success, one failure), reference KL only
    (``alpha = 1``), at ``pi = pi_old`` with PoS ``p`` and success logit ``L``:

    - surrogate: ``p (1 - p) Omega(p)`` (the calibrated advantage);
    - forward KL (exact, k2, k3_ratio): ``- beta p (1 - p) (L - L_ref)``;
    - reverse KL (k3): ``- beta (p - p_ref)``;
    - k1: ``0``.

    A sampled run with small steps drifts up where this is positive and down
    where it is negative; it settles at a zero where the drift decreases.
    """
    _check_estimator(estimator)
    pp = check_probability("p", p)
    pr = check_probability("p_ref", p_ref)
    b = check_beta(beta)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    pp, pr, b = broadcast(p=pp, p_ref=pr, beta=b)
    lp, lr = logit(pp), logit(pr)
    log_var = _log_bernoulli_variance(lp)
    var = np.exp(log_var)
    if cal.undefined_at_boundary:
        # eps = 0: p (1 - p) Omega(p) = sqrt(p (1 - p)), formed in log space (Omega alone
        # overflows beyond |logit p| = 1419) and 0 at p in {0, 1}
        inner = np.isfinite(lp)
        safe = np.where(inner, lp, 0.0)
        push = np.where(inner, np.exp(log_var + cal.log_omega_unchecked(safe)), 0.0)
    else:
        push = var * cal.omega_unchecked(lp)
    target = ESTIMATOR_TARGETS[estimator]
    if target == "forward":
        with np.errstate(invalid="ignore"):
            pull = np.where(var > 0, var * (lp - lr), 0.0)
    elif target == "reverse":
        pull = pp - pr
    else:
        pull = np.zeros_like(push)
    return push - b * pull


def reverse_kl_fixed_points(
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Every interior PoS fixed point of GRPO with a reverse-KL anchor, increasing.

    Solves ``p (1 - p) Omega(p) = beta (p - p_ref)`` (the zeros of
    :func:`logit_drift` for ``"k3"``), equivalently ``p`` is the PoS of
    :func:`reverse_kl_policy` with the weights evaluated at ``p`` itself.
    Roots are bracketed on a fine logit grid and refined with Brent's method.
    For the population calibration with ``eps = 0`` the root is unique and has
    a closed form (see the tests).

    Returns
    -------
    ndarray
        1-D for scalar arguments; otherwise the broadcast shape plus a
        trailing axis padded with NaN. ``p_ref`` in {0, 1} gives no interior
        root (0 and 1 are absorbing).
    """
    pr = check_probability("p_ref", p_ref)
    b = check_beta(beta)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    pr, b = broadcast(p_ref=pr, beta=b)
    grid = np.linspace(-60.0, 60.0, 24001)

    def scaled(x: ArrayLike, pr_: float, b_: float) -> np.ndarray:
        # Omega(p) / beta - (p - p_ref) / (p (1 - p)): same zeros, finite in logit space
        x = np.asarray(x, dtype=np.float64)
        var = np.exp(_log_bernoulli_variance(x))
        return cal.omega_of_logit(x) / b_ - (sigmoid(x) - pr_) / var

    # the grid's Omega and p (1 - p) do not depend on p_ref or beta: computed once
    grid_omega = cal.omega_of_logit(grid)
    grid_var = np.exp(_log_bernoulli_variance(grid))
    grid_p = sigmoid(grid)
    rows = []
    for pr_, b_ in zip(pr.ravel(), b.ravel(), strict=True):
        roots: list[float] = []
        if 0.0 < pr_ < 1.0:
            sign = np.sign(grid_omega / float(b_) - (grid_p - float(pr_)) / grid_var)
            for i in np.flatnonzero(sign[:-1] * sign[1:] < 0):
                x = optimize.brentq(lambda z, a=float(pr_), c=float(b_): float(scaled(z, a, c)),
                                    grid[i], grid[i + 1], xtol=1e-13,
                                    rtol=4 * np.finfo(float).eps)
                roots.append(float(sigmoid(x)))
        rows.append(roots)
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    if pr.ndim == 0:
        return out[0]
    return out.reshape(*pr.shape, width)
