"""Success amplification (Theorem 3) and the fixed point near 1 (Section 3).

Theorem 3's proof reduces to one identity: if the logit moves up by
``d = Omega(p) / beta``, the success probability moves up by::

    sigma(L_ref + d) - p_ref = p_ref (1 - p_ref) (e^d - 1) / (1 + p_ref (e^d - 1)),

which is positive whenever ``d > 0``. :func:`success_gain` evaluates it without
cancellation for any logits. :func:`upper_fixed_point_logit` gives the
first-order position of the fixed point near 1 when ``Omega`` is bounded
(``eps > 0``), and :func:`scan_fixed_points` counts fixed points by sign
changes on a grid, independently of the root finder in :mod:`~grpo_companion.theory.roots`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    broadcast,
    check_beta,
    check_count,
    check_interval,
    check_logit,
    check_memory,
    check_probability,
)

from ..calibration import Calibration, resolve_calibration

__all__ = ["scan_fixed_points", "success_gain", "upper_fixed_point_logit"]


def success_gain(logit_p_ref: ArrayLike, logit_gain: ArrayLike) -> np.ndarray:
    """``sigma(L_ref + d) - sigma(L_ref)``, the closed form in Theorem 3's proof.

    Equal to ``p_ref (1 - p_ref) (e^d - 1) / (1 + p_ref (e^d - 1))``; evaluated as
    ``sigma(a) sigma(-b) (1 - e^(b - a))`` with ``a`` the larger and ``b`` the
    smaller of ``L_ref + d`` and ``L_ref`` (sign restored afterwards), which has
    no cancellation for any finite logits.

    Parameters
    ----------
    logit_p_ref : array_like
        ``logit(p_ref)``; ``+-inf`` allowed (then the gain is 0 for finite ``d``).
    logit_gain : array_like
        ``d``, the logit increment (``Omega(p) / beta`` for the reference map).

    Raises
    ------
    ValueError
        If an input is NaN, or ``L_ref`` and ``d`` are infinite with opposite signs.
    """
    lr = check_logit("logit_p_ref", logit_p_ref)
    d = check_logit("logit_gain", logit_gain)
    lr, d = broadcast(logit_p_ref=lr, logit_gain=d)
    clash = np.isinf(lr) & np.isinf(d) & (np.sign(lr) != np.sign(d))
    if clash.any():
        raise ValueError(
            "logit_p_ref and logit_gain must not be infinite with opposite signs, got "
            f"logit_p_ref={float(lr[clash].flat[0])!r}, logit_gain={float(d[clash].flat[0])!r}"
        )
    with np.errstate(invalid="ignore"):
        moved = lr + d
    hi = np.maximum(moved, lr)
    lo = np.minimum(moved, lr)
    with np.errstate(invalid="ignore", over="ignore"):
        spread = np.where(np.abs(d) > 0, -np.expm1(-np.abs(d)), 0.0)
        out = special.expit(hi) * special.expit(-lo) * spread
    out = np.where(d == 0, 0.0, np.sign(d) * out)
    out = np.where(np.isinf(lr) & np.isfinite(d), 0.0, out)
    return out[()] if out.ndim == 0 else out


def upper_fixed_point_logit(
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """First-order logit of the fixed point near 1: ``L_ref + Omega(p = 1) / beta``.

    For the paper's calibration ``Omega(1) = 1 / sqrt(eps)``, so the upper fixed
    point sits at ``logit p* ~ L_ref + 1 / (beta sqrt(eps))``: interior, not 1.
    Since ``h(1) = sigmoid(L_ref + Omega(1) / beta) < 1`` when ``Omega(1)`` is
    finite, ``p = 1`` is never a fixed point then. If ``Omega`` increases
    towards ``p = 1`` (the paper's GRPO), this value is an upper bound on every
    fixed point's logit, and it is close to the largest one when that one lies
    where ``p (1 - p) << eps``.

    Raises
    ------
    ValueError
        If ``Omega(1)`` is infinite (``eps = 0`` with population whitening).
    """
    lr = check_logit("logit_p_ref", logit_p_ref)
    b = check_beta(beta)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    if cal.undefined_at_boundary:
        raise ValueError(
            "Omega(1) is infinite for eps=0 with population whitening; "
            f"got eps={cal.eps!r}, normalization={cal.normalization!r}"
        )
    top = float(cal.omega_unchecked(np.array(np.inf)))
    lr, b = broadcast(logit_p_ref=lr, beta=b)
    out = lr + top / b
    return out[()] if out.ndim == 0 else out


def scan_fixed_points(
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    n_points: int = 4000,
    logit_range: tuple[float, float] = (-60.0, 60.0),
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Count fixed points of the reference map by sign changes of ``logit h(p) - logit p``.

    An oracle independent of :func:`~grpo_companion.theory.fixed_points`: the
    function ``L_ref + Omega(L) / beta - L`` is evaluated on a grid of
    ``n_points`` logits, uniform in ``asinh(L)`` over ``logit_range`` (fine near
    ``p = 1/2``, logarithmic in ``|L|`` far out), and sign changes are counted.
    Roots outside ``logit_range`` or closer together than the grid spacing are
    missed; choose the range to cover the fixed points of interest.

    Returns
    -------
    below, above : ndarray of int
        Per cell (broadcast shape of ``p_ref`` and ``beta``), the number of sign
        changes in grid intervals that end at or below ``logit p_ref`` and of the
        others. Theorem 3 says ``below`` is always 0.
    """
    n_points = check_count("n_points", n_points, 2)
    lo, hi = check_interval("logit_range", logit_range)
    lr = special.logit(check_probability("p_ref", p_ref, open_interval=True))
    b = check_beta(beta)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lr, b = broadcast(p_ref=lr, beta=b)
    check_memory("n_points", n_points, 8.0 * 4 * n_points * max(lr.size, 1),
                 "the scan grid of every cell")
    grid = np.sinh(np.linspace(np.arcsinh(lo), np.arcsinh(hi), int(n_points)))
    with np.errstate(over="ignore"):  # eps = 0: Omega overflows to +inf far out, g = +inf
        om = cal.omega_unchecked(grid)
        g = lr[..., None] + om / b[..., None] - grid
    change = np.signbit(g[..., 1:]) != np.signbit(g[..., :-1])
    at_or_below = grid[1:] <= lr[..., None]
    below = np.sum(change & at_or_below, axis=-1)
    above = np.sum(change & ~at_or_below, axis=-1)
    return below, above
