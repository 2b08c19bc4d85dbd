"""Clipped GRPO solved exactly: the one-round optimum and its PoS map.

One round of clipped GRPO maximises, over policies ``pi`` on a finite set of
outputs, the PPO-style clipped surrogate minus a reference KL::

    J(pi) = sum_o pi_prev(o) min(r(o) A(o), clip(r(o), 1 - k, 1 + k_high) A(o))
            - beta KL(pi || pi_ref),          r = pi / pi_prev,

with ``A = +w+`` on a success and ``-w-`` on a failure (the calibration
weights at the sampler's PoS, :mod:`grpo_companion.theory.calibration`). For a
success the surrogate term is ``w+ min(pi(o), (1 + k_high) pi_prev(o))``, for a
failure ``-w- max(pi(o), (1 - k) pi_prev(o))``; both are concave, and the KL is
strictly convex, so the round has exactly one optimum.

**KKT form** (:func:`clipped_round_policy`). With a multiplier ``lam`` for
``sum pi = 1`` and ``t = lam / beta``, stationarity asks
``beta log(pi(o) / pi_ref(o)) + lam`` to lie in the superdifferential of the
output's surrogate term: ``[0, w+]`` at a success's kink ``(1 + k_high)
pi_prev(o)``, ``{w+}`` below it and ``{0}`` above; ``[-w-, 0]`` at a failure's
kink ``(1 - k) pi_prev(o)``, ``{0}`` below and ``{-w-}`` above. Hence::

    success: pi(o) = min(pi_ref e^{w+/beta - t}, max(pi_ref e^{-t}, (1 + k_high) pi_prev(o)))
    failure: pi(o) = max(pi_ref e^{-w-/beta - t}, min(pi_ref e^{-t}, (1 - k) pi_prev(o)))

i.e. in both cases the kink value clamped between the two free values,
``log pi(o) = clip(log c(o), lo(o) - t, hi(o) - t)``. Each is a non-increasing
function of ``t``, piecewise ``e^{-t}`` or constant, so ``sum pi(t) = 1`` is
solved exactly: the piece holding the root is found among the breakpoints, and
on it ``sum pi = e^{-t} F + P`` (``F`` from the free outputs, ``P`` the pinned
mass) gives ``t = log F - log(1 - P)`` in closed form (no iterative tolerance).

**Class-proportional PoS map** (:func:`clipped_pos_map_logit`). When
``pi_prev / pi_ref`` is constant on the successes and on the failures (true along
the iteration from ``pi_ref``), the optimum keeps that property and depends on
``p = pi_prev(successes)`` only. With success mass ``x`` the objective is, up to
a constant, ``w+ min(x, x1) - w- max(1 - x, 1 - x2) - beta KL(x || p_ref)`` with
``x1 = (1 + k_high) p`` and ``x2 = 1 - (1 - k)(1 - p)``. Its slope from the
surrogate is a decreasing step function, ``Omega = w+ + w-`` below
``min(x1, x2)``, then ``w-`` (if ``x1 < x2``) or ``w+`` (if ``x2 < x1``), then 0
above ``max(x1, x2)``; equating it to ``beta (logit x - logit p_ref)`` gives, in
logits, with ``L_u = L_ref + Omega / beta`` (the unclipped map, Theorem 2),
``l_1 = L_ref + w_mid / beta``, ``m1 = logit min(x1, x2)`` and
``m2 = logit max(x1, x2)``::

    L_new = min(L_u, max(m1, min(l_1, max(m2, L_ref))))

Consequences, each checked in ``tests/theory/test_clipped.py``:
``L_ref <= L_new <= L_u``; ``L_new`` lies strictly between ``L_old`` and ``L_u``
or equals ``L_u``, so the clipped and unclipped steps have the same sign
everywhere and **the clipped map has exactly the unclipped fixed points** (for
``k, k_high > 0``); and for ``p >= p_ref`` the round obeys
``1 - p_n >= (1 - k)(1 - p_{n-1})`` when ``p_{n-1} <= 1/2`` (and
``p_n <= (1 + k_high) p_{n-1}`` when ``p_{n-1} >= 1/2``), but not both caps at
once: below 1/2 the success mass may pass ``(1 + k_high) p_{n-1}`` (its term is
then flat) while the failures' term still pushes (``L_new = l_1``).

**The optimiser instead of the optimum** (:func:`expected_clipped_training`). A
trainer does not solve the round: it takes ``mu`` Adam steps on the sampled
clipped objective, Adam's state carrying over between rounds. Its deterministic
counterpart takes those steps on the *expected* objective, :func:`clipped_objective`
with the finite-group weights ``w+_G, w-_G`` at the round's ``p``, for two outputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    broadcast,
    check_beta,
    check_count,
    check_flag,
    check_logit,
    check_probability,
    check_probability_vector,
    check_real,
    check_success_mask,
)

from ..calibration import Calibration, resolve_calibration
from ..logistic import logit
from ..roots import scan_roots

__all__ = [
    "clipped_fixed_points",
    "clipped_fixed_points_logit",
    "clipped_iterate_logit",
    "clipped_objective",
    "clipped_pos_map",
    "clipped_pos_map_logit",
    "clipped_round_policy",
    "clipped_surrogate",
    "expected_clipped_training",
    "rounds_to_settle",
]


# ------------------------------------------------------------------------ checks
def _check_clip(clip_eps: ArrayLike, clip_eps_high: ArrayLike | None) -> tuple[np.ndarray,
                                                                               np.ndarray]:
    """``clip_eps`` in (0, 1]; ``clip_eps_high`` in (0, inf] (``None``: ``clip_eps``)."""
    low = check_real("clip_eps", clip_eps, 0.0, 1.0, open_low=True)
    if clip_eps_high is None:
        return low, low
    high = check_real("clip_eps_high", clip_eps_high, 0.0, open_low=True, finite=False)
    return low, high


def _check_weight(name: str, value: ArrayLike) -> np.ndarray:
    return check_real(name, value, 0.0)


def _log1p_eps(k: np.ndarray, sign: float) -> np.ndarray:
    """``log(1 + sign k)``; ``log(1 + inf) = inf`` and ``log(1 - 1) = -inf``."""
    with np.errstate(divide="ignore"):
        return np.log1p(sign * k)


# -------------------------------------------------------------------- surrogate
def clipped_surrogate(
    ratio: ArrayLike,
    advantage: ArrayLike,
    clip_eps: ArrayLike,
    clip_eps_high: ArrayLike | None = None,
) -> np.ndarray:
    """Per-sample clipped surrogate ``min(r A, clip(r, 1 - k, 1 + k_high) A)`` (PPO, GRPO).

    The quantity whose ``pi_prev``-expectation a clipped GRPO round maximises; TRL's
    per-token loss is its negative (``epsilon = k``, ``epsilon_high = k_high``).

    Parameters
    ----------
    ratio : array_like
        ``r = pi / pi_prev``, ``>= 0`` and finite.
    advantage : array_like
        ``A``, finite.
    clip_eps, clip_eps_high : array_like
        ``k`` in (0, 1] and ``k_high`` in (0, inf] (default ``k``).
    """
    r = check_real("ratio", ratio, 0.0)
    a = check_real("advantage", advantage)
    lo, hi = _check_clip(clip_eps, clip_eps_high)
    r, a, lo, hi = broadcast(ratio=r, advantage=a, clip_eps=lo, clip_eps_high=hi)
    clipped = np.minimum(np.maximum(r, 1.0 - lo), 1.0 + hi)
    return np.minimum(r * a, clipped * a)[()]


def clipped_objective(
    pi: ArrayLike,
    pi_ref: ArrayLike,
    pi_prev: ArrayLike,
    success_mask: ArrayLike,
    beta: ArrayLike,
    clip_eps: ArrayLike,
    w_plus: ArrayLike,
    w_minus: ArrayLike,
    *,
    clip_eps_high: ArrayLike | None = None,
) -> np.ndarray:
    """The round's objective ``J(pi)`` (module docstring) over the last axis of outputs.

    ``sum_S w+ min(pi, (1 + k_high) pi_prev) - sum_F w- max(pi, (1 - k) pi_prev)
    - beta KL(pi || pi_ref)``: for ``pi_prev(o) > 0`` each surrogate term equals
    ``pi_prev(o) min(r A, clip(r) A)`` (:func:`clipped_surrogate`); ``pi_prev(o) = 0``
    gives its limit. ``pi`` must vanish where ``pi_ref`` does (else ``-inf``).
    """
    p = check_probability_vector("pi", pi)
    ref = check_probability_vector("pi_ref", pi_ref)
    old = check_probability_vector("pi_prev", pi_prev)
    mask = check_success_mask(success_mask)
    b = check_beta(beta)[..., None]
    lo, hi = _check_clip(clip_eps, clip_eps_high)
    wp = _check_weight("w_plus", w_plus)[..., None]
    wm = _check_weight("w_minus", w_minus)[..., None]
    p, ref, old, mask, b, lo, hi, wp, wm = broadcast(
        pi=p, pi_ref=ref, pi_prev=old, success_mask=mask, beta=b, clip_eps=lo[..., None],
        clip_eps_high=hi[..., None], w_plus=wp, w_minus=wm)
    with np.errstate(invalid="ignore"):  # inf * 0 where k_high = inf and pi_prev = 0
        cap = np.where(old > 0, (1.0 + hi) * old, 0.0)
    gain = np.where(mask, wp * np.minimum(p, cap), -wm * np.maximum(p, (1.0 - lo) * old))
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_terms = np.where(p > 0, p * (np.log(p) - np.log(ref)), 0.0)
    return (gain.sum(axis=-1) - b[..., 0] * kl_terms.sum(axis=-1))[()]


# --------------------------------------------------------------- tabular round
def _log_round(lo: np.ndarray, hi: np.ndarray, pin: np.ndarray) -> np.ndarray:
    """Solve ``sum_o exp(clip(pin_o, lo_o - t, hi_o - t)) = 1`` for ``t``; return ``log pi``.

    Arrays of shape ``(..., K)`` with ``lo <= hi``. Every output's term is
    ``lo - t`` for ``t < lo - pin``, ``pin`` between ``lo - pin`` and ``hi - pin``
    and ``hi - t`` above, so the sum is non-increasing in ``t``; it is ``>= 1`` at
    ``t = logsumexp(lo)`` and ``<= 1`` at ``t = logsumexp(hi)``. The root's piece is
    found among the sorted breakpoints and solved there in closed form.
    """
    with np.errstate(divide="ignore"):
        t_lo = special.logsumexp(lo, axis=-1, keepdims=True)
        t_hi = special.logsumexp(hi, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        knots = np.concatenate([lo - pin, hi - pin], axis=-1)
    knots = np.where(np.isnan(knots), t_lo, knots)  # outputs without reference mass
    knots = np.clip(knots, t_lo, t_hi)
    ts = np.sort(np.concatenate([t_lo, t_hi, knots], axis=-1), axis=-1)  # (..., M)

    def terms(t: np.ndarray) -> np.ndarray:  # t (..., M) -> log pi_o(t), (..., M, K)
        tt = t[..., :, None]
        with np.errstate(invalid="ignore"):
            return np.minimum(np.maximum(pin[..., None, :], lo[..., None, :] - tt),
                              hi[..., None, :] - tt)

    with np.errstate(divide="ignore"):
        f = special.logsumexp(terms(ts), axis=-1)  # (..., M), non-increasing
    j = np.clip(np.sum(f >= 0.0, axis=-1, keepdims=True) - 1, 0, ts.shape[-1] - 2)
    left = np.take_along_axis(ts, j, axis=-1)
    right = np.take_along_axis(ts, j + 1, axis=-1)
    mid = 0.5 * (left + right)
    with np.errstate(invalid="ignore"):
        low_free = mid < lo - pin
        high_free = mid > hi - pin
    pinned = ~(low_free | high_free) & np.isfinite(pin) & (hi > -np.inf)
    free_exp = np.where(low_free, lo, np.where(high_free, hi, -np.inf))
    with np.errstate(divide="ignore", invalid="ignore"):
        log_f = special.logsumexp(free_exp, axis=-1, keepdims=True)
        pinned_mass = np.sum(np.where(pinned, np.exp(pin), 0.0), axis=-1, keepdims=True)
        log_rest = np.log1p(-np.minimum(pinned_mass, 1.0))  # log(1 - P), the free mass
        t_star = np.clip(log_f - log_rest, left, right)
        # a free output's log-mass as (e - log F) + log(1 - P): exact when one output is free
        free_part = (free_exp - log_f) + log_rest
        exact = np.isfinite(log_f) & (pinned_mass < 1.0) & (log_f - log_rest >= left) & (
            log_f - log_rest <= right)
        fallback = np.minimum(np.maximum(pin, lo - t_star), hi - t_star)
        log_pi = np.where(exact, np.where(pinned, pin, np.where(low_free | high_free,
                                                                  free_part, -np.inf)),
                          fallback)
        log_pi = np.where(hi == -np.inf, -np.inf, log_pi)
        return log_pi - special.logsumexp(log_pi, axis=-1, keepdims=True)


def clipped_round_policy(
    pi_ref: ArrayLike,
    pi_prev: ArrayLike,
    success_mask: ArrayLike,
    beta: ArrayLike,
    clip_eps: ArrayLike,
    w_plus: ArrayLike,
    w_minus: ArrayLike,
    *,
    clip_eps_high: ArrayLike | None = None,
) -> np.ndarray:
    """Exact maximiser of one clipped GRPO round, :func:`clipped_objective` (KKT form).

    ``pi(o) = clip(c(o), pi_ref(o) e^{s_lo/beta - t}, pi_ref(o) e^{s_hi/beta - t})``
    with ``c = (1 + k_high) pi_prev``, ``(s_lo, s_hi) = (0, w+)`` on a success and
    ``c = (1 - k) pi_prev``, ``(s_lo, s_hi) = (-w-, 0)`` on a failure, and ``t``
    (the normaliser) solved exactly (module docstring). Computed in log space.

    Parameters
    ----------
    pi_ref, pi_prev : array_like
        Probability vectors over the last axis (leading axes broadcast). Outputs
        with ``pi_ref = 0`` get 0; ``pi_prev = 0`` is the limit ``pi_prev -> 0``.
    success_mask : array_like
        1/True on the outputs the verifier accepts.
    beta : array_like
        KL strength, ``> 0``.
    clip_eps : array_like
        ``k`` in (0, 1]: ratios below ``1 - k`` are clipped (``k = 1``: never).
    w_plus, w_minus : array_like
        Advantage ``+w_plus`` of a success and ``-w_minus`` of a failure, ``>= 0``
        (:func:`~grpo_companion.theory.weights` at ``pi_prev``'s PoS for GRPO).
    clip_eps_high : array_like, optional
        ``k_high`` in (0, inf] for the upper clip ``1 + k_high`` (``inf``: none);
        default ``clip_eps``.

    Notes
    -----
    Costs ``O(K^2)`` per policy (every breakpoint is evaluated). Accurate to a few
    ulps of ``max |log pi_ref| + w / beta`` in ``log pi``.
    """
    ref = check_probability_vector("pi_ref", pi_ref)
    old = check_probability_vector("pi_prev", pi_prev)
    mask = check_success_mask(success_mask)
    b = check_beta(beta)[..., None]
    k_lo, k_hi = _check_clip(clip_eps, clip_eps_high)
    wp = _check_weight("w_plus", w_plus)[..., None]
    wm = _check_weight("w_minus", w_minus)[..., None]
    ref, old, mask, b, k_lo, k_hi, wp, wm = broadcast(
        pi_ref=ref, pi_prev=old, success_mask=mask, beta=b, clip_eps=k_lo[..., None],
        clip_eps_high=k_hi[..., None], w_plus=wp, w_minus=wm)
    with np.errstate(divide="ignore", over="ignore"):
        log_ref, log_old = np.log(ref), np.log(old)
        up, down = wp / b, wm / b
    return np.exp(_tabular(log_ref, log_old, mask, up, down, k_lo, k_hi))


def _tabular(log_ref: np.ndarray, log_old: np.ndarray, mask: np.ndarray, up: np.ndarray,
             down: np.ndarray, k_lo: np.ndarray, k_hi: np.ndarray) -> np.ndarray:
    """``log pi`` of the round optimum from checked, broadcast log-policies."""
    with np.errstate(invalid="ignore"):
        lo = np.where(mask, log_ref, log_ref - down)
        hi = np.where(mask, log_ref + up, log_ref)
        pin = np.where(mask, _log1p_eps(k_hi, 1.0), _log1p_eps(k_lo, -1.0)) + log_old
    pin = np.where(np.isneginf(log_old) | np.isnan(pin), -np.inf, pin)
    return _log_round(lo, hi, pin)


# ---------------------------------------------------------------- the PoS map
def _cap_logits(lp: np.ndarray, k_lo: np.ndarray, k_hi: np.ndarray) -> tuple[np.ndarray,
                                                                               np.ndarray]:
    """``logit x1`` and ``logit x2``: ``x1 = (1 + k_high) p``, ``x2 = 1 - (1 - k)(1 - p)``.

    ``logit x1 = log(1 + k_high) + L - log(1 - k_high e^L)`` (``+inf`` once
    ``x1 >= 1``); ``logit x2 = logaddexp(L, log k) - log(1 - k)``. Both in log space.
    """
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        prod = k_hi * np.exp(lp)
        room = np.log1p(-np.minimum(prod, 1.0))
        x1 = np.where(prod >= 1.0, np.inf, _log1p_eps(k_hi, 1.0) + lp - room)
        x1 = np.where(np.isneginf(lp), -np.inf, x1)
        x2 = np.logaddexp(lp, np.log(k_lo)) - _log1p_eps(k_lo, -1.0)
    return x1, x2


def _clipped_map_logit(lp: np.ndarray, lr: np.ndarray, b: np.ndarray, k_lo: np.ndarray,
                       k_hi: np.ndarray, cal: Calibration) -> np.ndarray:
    """The clipped PoS map on logits (module docstring) on checked, broadcast inputs."""
    wp, wm = cal.weights_of_logit(lp)
    x1, x2 = _cap_logits(lp, k_lo, k_hi)
    m1, m2 = np.minimum(x1, x2), np.maximum(x1, x2)
    w_mid = np.where(x1 < x2, wm, wp)
    with np.errstate(over="ignore", invalid="ignore"):
        l_u = lr + (wp + wm) / b
        l_1 = lr + w_mid / b
        return np.minimum(l_u, np.maximum(m1, np.minimum(l_1, np.maximum(m2, lr))))


def _prepare(logit_p, logit_p_ref, beta, clip_eps, clip_eps_high, calibration, kwargs,
             names=("logit_p", "logit_p_ref")):
    lp = check_logit(names[0], logit_p)
    lr = check_logit(names[1], logit_p_ref)
    b = check_beta(beta)
    k_lo, k_hi = _check_clip(clip_eps, clip_eps_high)
    cal = resolve_calibration(calibration, **kwargs)
    lp, lr, b, k_lo, k_hi = broadcast(**{names[0]: lp, names[1]: lr}, beta=b, clip_eps=k_lo,
                                      clip_eps_high=k_hi)
    cal.check_boundary(lp, names[0])
    return lp, lr, b, k_lo, k_hi, cal


def clipped_pos_map_logit(
    logit_p: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    clip_eps: ArrayLike,
    *,
    clip_eps_high: ArrayLike | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """One round of clipped GRPO on the PoS logit (class-proportional policies).

    ``L_new = min(L_u, max(m1, min(l_1, max(m2, L_ref))))`` (module docstring):
    the success mass of :func:`clipped_round_policy` when ``pi_prev / pi_ref`` is
    constant within the successes and within the failures, with ``w+, w-`` the
    calibration weights at ``p = sigmoid(logit_p)`` (default: the paper's,
    ``eps = 1e-5``). ``clip_eps = 1, clip_eps_high = inf`` is the unclipped map
    :func:`~grpo_companion.theory.pos_map_logit`. Closed form, exact in logit space;
    broadcasts over all arguments.
    """
    lp, lr, b, k_lo, k_hi, cal = _prepare(logit_p, logit_p_ref, beta, clip_eps, clip_eps_high,
                                          calibration, calibration_kwargs)
    return _clipped_map_logit(lp, lr, b, k_lo, k_hi, cal)[()]


def clipped_pos_map(
    p: ArrayLike,
    p_ref: ArrayLike,
    beta: ArrayLike,
    clip_eps: ArrayLike,
    *,
    clip_eps_high: ArrayLike | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """:func:`clipped_pos_map_logit` on probabilities: ``p_n`` from ``p_{n-1}``."""
    lp = logit(check_probability("p", p))
    lr = logit(check_probability("p_ref", p_ref))
    lp, lr, b, k_lo, k_hi, cal = _prepare(lp, lr, beta, clip_eps, clip_eps_high, calibration,
                                          calibration_kwargs, names=("p", "p_ref"))
    return special.expit(_clipped_map_logit(lp, lr, b, k_lo, k_hi, cal))[()]


def clipped_iterate_logit(
    logit_p0: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    clip_eps: ArrayLike,
    n_steps: int,
    *,
    clip_eps_high: ArrayLike | None = None,
    keep_path: bool = True,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Iterate :func:`clipped_pos_map_logit` ``n_steps`` times from ``logit_p0``.

    Returns shape ``(n_steps + 1, *broadcast_shape)`` with the start first, or the
    last logits only when ``keep_path=False``.
    """
    n_steps = check_count("n_steps", n_steps, 0)
    keep_path = check_flag("keep_path", keep_path)
    lp, lr, b, k_lo, k_hi, cal = _prepare(logit_p0, logit_p_ref, beta, clip_eps, clip_eps_high,
                                          calibration, calibration_kwargs,
                                          names=("logit_p0", "logit_p_ref"))
    path = [lp]
    for _ in range(n_steps):
        path.append(_clipped_map_logit(path[-1], lr, b, k_lo, k_hi, cal))
    return np.stack(path) if keep_path else path[-1][()]


def rounds_to_settle(path: ArrayLike, tol: float = 1e-3) -> int:
    """Rounds an iteration takes to settle: the first round after which it stays within
    ``tol`` of where it ends.

    ``path`` is one iteration, start first (``path[0]`` is round 0), as
    :func:`clipped_iterate_logit` returns it for one start, in logits or success
    probabilities; ``tol > 0`` is measured in the same units. The result ``n`` is the
    smallest round such that ``abs(path[m] - path[-1]) <= tol`` for every ``m >= n``: 0 for
    a path that starts within ``tol`` of its end, ``len(path) - 1`` at most. It compares
    how fast the clipped and the unclipped maps (the paper's Theorem 2) approach their
    fixed points.
    """
    x = check_real("path", path, finite=False)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"path must be a 1-D array of at least one round, got shape {x.shape}")
    if np.isnan(x).any() or not np.isfinite(x[-1]):
        raise ValueError("path must end at a finite value")
    tol = float(check_real("tol", tol, 0.0, open_low=True, scalar=True))
    away = np.nonzero(np.abs(x - x[-1]) > tol)[0]
    return int(away[-1]) + 1 if away.size else 0


# ---------------------------------------------------------------- fixed points
def clipped_fixed_points_logit(
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    clip_eps: ArrayLike,
    *,
    clip_eps_high: ArrayLike | None = None,
    n_grid: int = 4097,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Logits of the fixed points of :func:`clipped_pos_map_logit`, found on the clipped map.

    ``G(L) = clipped_map(L) - L`` is scanned for sign changes on ``n_grid``
    logits spaced evenly in ``asinh L`` over ``[L_ref + inf Omega / beta - 1,
    L_ref + sup Omega / beta + 1]`` (outside it the unclipped step, hence the
    clipped one, has one sign), and each bracket is bisected to adjacent floats.
    The unclipped map is never called, so comparing the result with
    :func:`~grpo_companion.theory.fixed_points_logit` tests the claim that clipping
    keeps the fixed points. Two roots closer than the grid spacing (near a
    saddle-node) can be missed. Output as :func:`~grpo_companion.theory.fixed_points_logit`:
    1-D for scalar arguments, else a trailing axis padded with NaN.
    """
    lr = check_logit("logit_p_ref", logit_p_ref)
    b = check_beta(beta)
    k_lo, k_hi = _check_clip(clip_eps, clip_eps_high)
    n_grid = check_count("n_grid", n_grid, 3)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    if not np.isfinite(cal.omega_sup):
        raise ValueError("calibration must have a bounded Omega (eps > 0 for population "
                         "whitening) for clipped_fixed_points_logit")
    if not np.all(np.isfinite(lr)):
        raise ValueError("logit_p_ref must be finite (p_ref in (0, 1)) for "
                         "clipped_fixed_points_logit")
    lr, b, k_lo, k_hi = broadcast(logit_p_ref=lr, beta=b, clip_eps=k_lo, clip_eps_high=k_hi)
    shape = lr.shape
    lr, b, k_lo, k_hi = (x.reshape(-1) for x in (lr, b, k_lo, k_hi))

    def g(x, cells):
        return _clipped_map_logit(x, lr[cells], b[cells], k_lo[cells], k_hi[cells], cal) - x

    out = scan_roots(g, lr + cal.omega_inf / b - 1.0, lr + cal.omega_sup / b + 1.0, n_grid)
    width = out.shape[-1]
    out = out.reshape(*shape, width)
    if not shape:
        return out[~np.isnan(out)]
    return out


def clipped_fixed_points(
    p_ref: ArrayLike,
    beta: ArrayLike,
    clip_eps: ArrayLike,
    *,
    clip_eps_high: ArrayLike | None = None,
    n_grid: int = 4097,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Fixed points ``p*`` of :func:`clipped_pos_map` (see :func:`clipped_fixed_points_logit`)."""
    lr = logit(check_probability("p_ref", p_ref, open_interval=True))
    return special.expit(clipped_fixed_points_logit(
        lr, beta, clip_eps, clip_eps_high=clip_eps_high, n_grid=n_grid,
        calibration=calibration, **calibration_kwargs))


# ------------------------------------------------- mu Adam steps per round
def _check_adam_betas(adam_betas: Any) -> tuple[float, float]:
    """``(beta1, beta2)``, each a number in [0, 1)."""
    valid = "a pair (beta1, beta2) of numbers in [0, 1)"
    try:
        if adam_betas is None or isinstance(adam_betas, str | bytes):
            raise TypeError
        items = tuple(adam_betas)
        if len(items) != 2:
            raise TypeError
        b1, b2 = (float(check_real("adam_betas", v, 0.0, 1.0, open_high=True, scalar=True))
                  for v in items)
    except (TypeError, ValueError) as err:
        raise ValueError(f"adam_betas must be {valid}, got {adam_betas!r}") from err
    return b1, b2


def expected_clipped_training(
    p_ref: ArrayLike,
    beta: ArrayLike,
    clip_eps: ArrayLike,
    n_iterations: int,
    mu: int,
    *,
    clip_eps_high: ArrayLike | None = None,
    lr: float = 0.1,
    adam_betas: tuple[float, float] = (0.9, 0.999),
    adam_eps: float = 1e-8,
    n_prompts: int = 1,
    keep_path: bool = True,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Clipped GRPO trained by ``mu`` Adam steps per iteration on the expected objective.

    The deterministic counterpart of the sampled trainer
    (``grpo_companion.rl.train`` with ``n_outputs=2, n_success=1, kl="exact",
    optimizer="adam"``): a tabular softmax policy over one success and one failure
    output, two free logits per prompt, starting at ``pi_ref``. Iteration ``n``
    freezes ``pi_prev`` (success mass ``p``) and the weights ``w+_G(p), w-_G(p)`` of
    ``calibration`` (``group_size=G`` gives the exact expected advantages of groups
    of ``G``; none gives the population weights of eq. (4)), then takes ``mu``
    steps of Adam (PyTorch's update, with bias correction; its moments and step
    count carry over from one iteration to the next, as in the trainer) on the loss
    ``-J(pi) / n_prompts``, with ``J`` the clipped round objective of
    :func:`clipped_objective`::

        J(x) = w+ min(x, (1 + k_high) p) - w- max(1 - x, (1 - k)(1 - p)) - beta KL(x || p_ref)

    for success mass ``x``. This is the expectation of the trainer's sampled
    objective: the group surrogate ``(1/G) sum_i min(r_i A_i, clip(r_i) A_i)``
    is linear in the advantages once the outputs are fixed, a success's advantage
    is ``>= 0`` (its term is ``A min(r, 1 + k_high)``) and a failure's ``<= 0``
    (``A max(r, 1 - k)``), and ``E[A | success] = w+_G``,
    ``E[A | failure] = -w-_G`` (:mod:`grpo_companion.theory.finite_group`), so the
    sampled objective's mean, and its gradient's mean, are those of ``J``. What the
    expectation leaves out is the noise, which Adam and the clip do not average
    linearly.

    With two outputs the loss depends on ``L = z_s - z_f`` only, its gradients
    in the two logits are opposite, and so are Adam's steps (it acts per
    coordinate and is odd in the gradient): ``L`` moves by twice the success
    logit's step. The gradient is ``dJ/dL = x (1 - x) [w+ 1{x < (1 + k_high) p}
    + w- 1{1 - x > (1 - k)(1 - p)} - beta (L - L_ref)]`` (a clipped term has zero
    gradient, as in the trainer's ``min``). A state where ``L`` stays put has zero
    gradient at ratio 1, where no clip is active, so the only rest points are the
    fixed points of the unclipped finite-group recurrence (Theorem 2 with
    ``w+_G, w-_G``), whatever ``k``; a run that keeps oscillating may average
    elsewhere.

    Parameters
    ----------
    p_ref : array_like
        Reference PoS in (0, 1), the start of every run.
    beta : array_like
        KL strength, ``> 0`` and finite.
    clip_eps : array_like
        ``k`` in (0, 1]; ``k = 1`` with ``clip_eps_high = inf`` is unclipped
        training (the trainer's ``clip_eps_low=None``).
    n_iterations : int
        Outer iterations, ``>= 0``.
    mu : int
        Adam steps per iteration, ``>= 1``.
    clip_eps_high : array_like, optional
        ``k_high`` in (0, inf]; default ``clip_eps``.
    lr : float
        Adam's learning rate, a finite number ``> 0`` (the trainer's bandit
        default is 0.1).
    adam_betas : (float, float)
        Adam's ``(beta1, beta2)``, each in [0, 1); PyTorch's default.
    adam_eps : float
        Adam's ``eps``, a finite number ``>= 0``; PyTorch's default. (With 0, a
        coordinate that has seen only zero gradients does not move.)
    n_prompts : int
        ``>= 1``: the trainer averages its loss over this many prompts, which
        scales every gradient by ``1 / n_prompts`` (it matters only through
        ``adam_eps``).
    keep_path : bool
        Return every iteration (default) or the last only.
    calibration : Calibration, optional
        The advantage weights; or the :class:`~grpo_companion.theory.Calibration`
        keywords (``eps``, ``group_size``, ...). Default: the paper's, ``eps = 1e-5``.

    Returns
    -------
    numpy.ndarray
        The success mass ``p_n`` after each iteration, shape
        ``(n_iterations + 1, *broadcast_shape)`` with ``p_ref`` first (the
        trainer's ``success_prob`` metric), or shape ``broadcast_shape`` when
        ``keep_path=False``. Costs ``n_iterations * mu`` vectorised steps.
    """
    ref = check_probability("p_ref", p_ref, open_interval=True)
    b = check_beta(beta)
    k_lo, k_hi = _check_clip(clip_eps, clip_eps_high)
    n_iterations = check_count("n_iterations", n_iterations, 0)
    mu = check_count("mu", mu, 1)
    step_lr = float(check_real("lr", lr, 0.0, open_low=True, scalar=True))
    b1, b2 = _check_adam_betas(adam_betas)
    a_eps = float(check_real("adam_eps", adam_eps, 0.0, scalar=True))
    n_prompts = check_count("n_prompts", n_prompts, 1)
    keep_path = check_flag("keep_path", keep_path)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    ref, b, k_lo, k_hi = broadcast(p_ref=ref, beta=b, clip_eps=k_lo, clip_eps_high=k_hi)
    lr_ref = logit(ref)
    with np.errstate(over="ignore"):
        up = 1.0 + k_hi  # inf: no upper clip
    down = 1.0 - k_lo  # 0: no lower clip
    lp = lr_ref.copy()
    m = np.zeros_like(lp)
    v = np.zeros_like(lp)
    path = [special.expit(lp)]
    t = 0
    for _ in range(n_iterations):
        p_old = special.expit(lp)
        q_old = special.expit(-lp)
        wp, wm = cal.weights_of_logit(lp)
        with np.errstate(invalid="ignore"):  # inf * 0 cannot occur: p_old > 0
            cap_s = up * p_old
        cap_f = down * q_old
        for _ in range(mu):
            t += 1
            x, y = special.expit(lp), special.expit(-lp)
            push = np.where(x < cap_s, wp, 0.0) + np.where(y > cap_f, wm, 0.0)
            grad = -(x * y) * (push - b * (lp - lr_ref)) / n_prompts  # d loss / d z_s
            m = m + (1.0 - b1) * (grad - m)
            v = b2 * v + (1.0 - b2) * grad * grad
            denom = np.sqrt(v) / math.sqrt(1.0 - b2 ** t) + a_eps
            # adam_eps = 0 and no gradient yet: no step (PyTorch would divide 0 by 0)
            ratio = np.divide(m, denom, out=np.zeros_like(m), where=denom > 0)
            lp = lp - 2.0 * (step_lr / (1.0 - b1 ** t)) * ratio
        path.append(special.expit(lp))
    return np.stack(path) if keep_path else path[-1][()]
