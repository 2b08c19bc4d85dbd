"""Fixed points, their stability and chaos along a grid of beta (chapter 5, bifurcation diagrams).

For one prompt (one ``p_ref``) the PoS map ``h`` of Theorem 2 (or its Table 1
variant for ``alpha``) changes with the KL weight ``beta``. :func:`sweep_beta`
collects, on a grid of ``beta``, what the bifurcation diagrams of the dynamics
chapter show and the bounds its prose quotes:

- the fixed points (Theorem 2, Proposition 1) and the band of ``beta`` where
  there are three of them (born in a saddle-node bifurcation);
- their stability ``|h'(p*)| < 1`` (Theorem 6; Lemma 1 gives ``h'(p*)`` in
  closed form for the reference map), and the smallest grid ``beta`` from which
  on the lowest fixed point stays stable: below it that point has lost
  stability, in a period-doubling bifurcation when ``h'(p*) < 0`` (``p* < 1/2``);
- the Lyapunov exponent of the orbit from ``p_0 = p_ref``
  (:func:`~grpo_companion.theory.classify_dynamics`) and the range of ``beta``
  where it is positive (chaos).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    as_float_array,
    check_alpha,
    check_count,
    check_probability,
    check_scalar_array,
)

from ..calibration import Calibration, resolve_calibration
from ..dynamics import pos_map_logit_derivative
from ..logistic import logit
from ..regimes import classify_dynamics
from ..roots import fixed_points_logit

__all__ = ["BetaSweep", "stable_from", "sweep_beta"]


@dataclass(frozen=True)
class BetaSweep:
    """What :func:`sweep_beta` finds along its ``beta`` grid.

    Attributes
    ----------
    beta : ``(n,)`` the grid, increasing
    fixed_points : ``(n, 3)`` fixed points in increasing order, NaN-padded
    logit_fixed_points : ``(n, 3)`` their logits (resolved where ``p*`` rounds to 1)
    stable : ``(n, 3)`` ``|h'(p*)| < 1`` (False where there is no fixed point)
    lyapunov : ``(n,)`` Lyapunov exponent of the orbit from ``p_0 = p_ref``
    three_fixed_points : ``(lo, hi)`` smallest and largest grid ``beta`` with three
        fixed points, NaN if none
    lowest_stable_from : smallest grid ``beta`` such that the lowest fixed point is
        stable at it and at every larger grid ``beta``; NaN if it is unstable at the
        largest
    chaos : ``(lo, hi)`` smallest and largest grid ``beta`` with a positive
        Lyapunov exponent, NaN if none
    """

    beta: np.ndarray
    fixed_points: np.ndarray
    logit_fixed_points: np.ndarray
    stable: np.ndarray
    lyapunov: np.ndarray
    three_fixed_points: tuple[float, float]
    lowest_stable_from: float
    chaos: tuple[float, float]

    @property
    def n_fixed_points(self) -> np.ndarray:
        """``(n,)`` number of fixed points at each grid ``beta``."""
        return np.sum(~np.isnan(self.logit_fixed_points), axis=1)


def _check_betas(betas: ArrayLike) -> np.ndarray:
    valid = "a non-empty increasing sequence of finite numbers > 0"
    b = as_float_array("betas", betas, valid)
    if b.ndim != 1 or b.size == 0 or not np.all(np.isfinite(b)) or np.any(b <= 0) or (
            np.any(np.diff(b) <= 0)):
        raise ValueError(f"betas must be {valid}, got {betas!r}")
    return b


def stable_from(betas: ArrayLike, stable: ArrayLike) -> float:
    """Smallest grid ``beta`` from which on a property holds at every larger grid ``beta``.

    ``betas`` is an increasing grid and ``stable`` a boolean of the same length (say, the
    lowest fixed point is stable, ``beta > B(p*)`` by Lemma 1). Returns ``betas[0]`` when
    ``stable`` holds everywhere, NaN when it fails at the largest ``beta``, and otherwise the
    grid value just after the last failure: the threshold of Remark 2 for one prompt, or for
    a population when ``stable`` holds for all of them. Its resolution is the grid's.
    """
    b = _check_betas(betas)
    if isinstance(stable, bool | np.bool_) or np.asarray(stable).dtype != bool or (
            np.shape(stable) != b.shape):
        raise ValueError(f"stable must be a boolean array of the shape of betas {b.shape}, "
                         f"got {stable!r}")
    bad = np.flatnonzero(~np.asarray(stable))
    if bad.size == 0:
        return float(b[0])
    if bad[-1] == b.size - 1:
        return np.nan
    return float(b[bad[-1] + 1])


def _range(values: np.ndarray, where: np.ndarray) -> tuple[float, float]:
    chosen = values[where]
    return (float(chosen.min()), float(chosen.max())) if chosen.size else (np.nan, np.nan)


def sweep_beta(
    p_ref: float,
    betas: ArrayLike,
    *,
    alpha: float = 1.0,
    n_transient: int = 500,
    n_measure: int = 300,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> BetaSweep:
    """Fixed points, stability and the orbit's Lyapunov exponent for each ``beta`` of a grid.

    ``p_ref`` is one success probability in (0, 1); ``betas`` an increasing grid.
    The fixed points are those of :func:`~grpo_companion.theory.fixed_points_logit`
    (Theorem 2, Table 1), their stability the test ``|dL_n/dL_{n-1}| < 1`` at
    ``L*`` (equal to ``|h'(p*)|`` there; Lemma 1, Theorem 6), and the Lyapunov
    exponent that of :func:`~grpo_companion.theory.classify_dynamics` from
    ``p_0 = p_ref`` after ``n_transient`` steps, averaged over ``n_measure``.
    The bounds (see :class:`BetaSweep`) are grid values, so their resolution is
    that of the grid.
    """
    pr = float(check_scalar_array("p_ref", check_probability("p_ref", p_ref,
                                                             open_interval=True)))
    b = _check_betas(betas)
    a = float(check_scalar_array("alpha", check_alpha(alpha)))
    n_transient = check_count("n_transient", n_transient, 0)
    n_measure = check_count("n_measure", n_measure, 1)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    roots = fixed_points_logit(np.full(b.shape, logit(pr)), b, alpha=a, calibration=cal)
    if roots.shape[1] < 3:  # pad to three columns (fewer when no beta has three)
        roots = np.pad(roots, ((0, 0), (0, 3 - roots.shape[1])), constant_values=np.nan)
    found = ~np.isnan(roots)
    slope = np.full(roots.shape, np.nan)
    if found.any():
        cols = np.broadcast_to(b[:, None], roots.shape)
        slope[found] = pos_map_logit_derivative(roots[found], cols[found], alpha=a,
                                                calibration=cal)
    with np.errstate(invalid="ignore"):
        stable = found & (np.abs(slope) < 1)
    lyap = classify_dynamics(pr, pr, b, alpha=a, n_transient=n_transient, n_measure=n_measure,
                             calibration=cal).lyapunov
    lowest_from = stable_from(b, stable[:, 0])
    with np.errstate(invalid="ignore"):
        chaotic = lyap > 0
    return BetaSweep(
        beta=b,
        fixed_points=special.expit(roots),
        logit_fixed_points=roots,
        stable=stable,
        lyapunov=lyap,
        three_fixed_points=_range(b, found.sum(axis=1) == 3),
        lowest_stable_from=lowest_from,
        chaos=_range(b, chaotic),
    )
