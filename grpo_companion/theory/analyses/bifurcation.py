"""Orbit sampling, cobweb staircases and labelled regime maps for the PoS recurrences.

Helpers behind the dynamics chapter's bifurcation diagrams, cobweb plots and
regime maps. Everything is vectorised over parameter grids and built on
:func:`~grpo_companion.theory.iterate_logit`,
:func:`~grpo_companion.theory.classify_dynamics` and
:func:`~grpo_companion.theory.fixed_points`.

The regime labels refine :class:`~grpo_companion.theory.Regime`: with
``eps > 0`` the whitened weights are bounded, so an orbit that "goes to 1"
actually converges to a fixed point extremely close to 1 (the paper's
Figure 5 prints it as ``p* = 1.0000``). :func:`regime_map` separates such
*saturated* fixed points (``1 - p* < saturation_tol``) from interior ones, and
splits the cells that :func:`~grpo_companion.theory.classify_dynamics` calls irregular into higher
periods, chaotic orbits (Lyapunov exponent ``> 0``) and orbits not yet settled.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    check_alpha,
    check_beta,
    check_count,
    check_memory,
    check_probability,
    check_real,
    check_scalar_array,
)

from ..calibration import Calibration, resolve_calibration
from ..dynamics import _prepare, iterate_logit
from ..logistic import logit
from ..regimes import Regime, classify_dynamics
from ..roots import fixed_points_logit

__all__ = ["LABEL_NAMES", "Label", "RegimeMap", "cobweb_path", "orbit_tail", "regime_map"]

_MAX_PERIOD = 8  # longest period told apart by regime_map (HIGHER_PERIOD is 3..8)


def orbit_tail(
    p0: ArrayLike,
    p_ref: ArrayLike,
    beta: ArrayLike,
    n_steps: int,
    n_keep: int,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """The last ``n_keep`` of ``n_steps`` iterates ``p_{n_steps-n_keep+1}, ..., p_{n_steps}``.

    Shape ``(n_keep, *broadcast_shape)``: one column of a bifurcation diagram
    per parameter cell.
    """
    n_steps = check_count("n_steps", n_steps, 1)
    n_keep = check_count("n_keep", n_keep, 1, n_steps)
    lp, lr, b, a, cal = _prepare(logit(check_probability("p0", p0)),
                                 logit(check_probability("p_ref", p_ref)), beta, alpha,
                                 calibration, calibration_kwargs, names=("p0", "p_ref"))
    check_memory("n_keep", n_keep, 8.0 * n_keep * lp.size, "the kept iterates")
    transient = iterate_logit(lp, lr, b, n_steps - n_keep + 1, alpha=a, keep_path=False,
                              calibration=cal)
    path = iterate_logit(transient, lr, b, n_keep - 1, alpha=a, calibration=cal)
    return special.expit(path)


def cobweb_path(
    p0: float,
    p_ref: float,
    beta: float,
    n_steps: int,
    *,
    alpha: float = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the cobweb staircase of ``p_n = h(p_{n-1})``.

    Returns ``(x, y)`` of length ``2 n_steps + 1``: ``(p0, p0), (p0, p1), (p1, p1),
    (p1, p2), ...``; vertical segments go from the diagonal to the graph of
    ``h``, horizontal ones back to the diagonal.
    """
    start = check_scalar_array("p0", check_probability("p0", p0))
    ref = check_scalar_array("p_ref", check_probability("p_ref", p_ref))
    b = check_beta(beta)
    a = check_alpha(alpha)
    b, a = check_scalar_array("beta", b), check_scalar_array("alpha", a)
    n_steps = check_count("n_steps", n_steps, 0)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lp = iterate_logit(logit(start), logit(ref), b, n_steps, alpha=a, calibration=cal)
    p = special.expit(lp)
    x = np.repeat(p, 2)[:-1]  # p0, p0, p1, p1, ..., p_n
    y = np.repeat(p, 2)[1:]  # p0, p1, p1, p2, ..., p_n
    return x, y


class Label(IntEnum):
    """Long-run behaviour of one cell of a regime map (refines :class:`Regime`)."""

    INTERIOR = 0  #: converges to a fixed point p* with 1 - p* >= saturation_tol
    SATURATED = 1  #: converges to a fixed point within saturation_tol of 1, or p_n -> 1
    CYCLE_2 = 2  #: settles on a period-2 orbit
    HIGHER_PERIOD = 3  #: settles on a period 3..max_period orbit
    CHAOTIC = 4  #: no period <= max_period and a positive Lyapunov exponent
    UNSETTLED = 5  #: no period <= max_period and a Lyapunov exponent <= 0 (slow convergence)
    ABSORBED = 6  #: p_n = 0 for every n (p_ref = 0)


LABEL_NAMES = {
    Label.INTERIOR: "interior fixed point",
    Label.SATURATED: "saturated (p* ~ 1)",
    Label.CYCLE_2: "2-cycle",
    Label.HIGHER_PERIOD: "period 3-8",
    Label.CHAOTIC: "chaotic (Lyapunov > 0)",
    Label.UNSETTLED: "not settled (Lyapunov <= 0)",
    Label.ABSORBED: "absorbed at 0",
}


@dataclass(frozen=True)
class RegimeMap:
    """Output of :func:`regime_map`; arrays have the broadcast parameter shape.

    Attributes
    ----------
    label : ndarray of int
        :class:`Label` codes.
    n_fixed_points : ndarray of int
        Number of fixed points of the map in (0, 1) (1 or 3 for the reference map).
    lyapunov : ndarray
        Lyapunov exponent from :func:`~grpo_companion.theory.classify_dynamics`.
    limits : ndarray, shape (..., 2)
        Limits from :func:`~grpo_companion.theory.classify_dynamics`.
    """

    label: np.ndarray
    n_fixed_points: np.ndarray
    lyapunov: np.ndarray
    limits: np.ndarray

    def fractions(self) -> dict[str, float]:
        """Share of cells with each label (all labels, summing to 1), keyed by label name."""
        n = self.label.size
        return {lab.name.lower(): float(np.sum(self.label == lab)) / n for lab in Label}


def regime_map(
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    p0: ArrayLike | None = None,
    alpha: ArrayLike = 1.0,
    n_transient: int = 500,
    n_measure: int = 300,
    saturation_tol: float = 1e-4,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> RegimeMap:
    """Label the long-run behaviour of every ``(p_ref, beta)`` cell, started at ``p0``.

    ``p0`` defaults to ``p_ref`` (the paper's ``pi_0 = pi_ref``). One call of
    :func:`~grpo_companion.theory.classify_dynamics` and one of
    :func:`~grpo_companion.theory.fixed_points` for the whole grid.
    """
    check_probability("p_ref", p_ref)  # before p0, which defaults to it
    cal = resolve_calibration(calibration, **calibration_kwargs)
    n_transient = check_count("n_transient", n_transient, 0)
    n_measure = check_count("n_measure", n_measure, 1)
    if n_transient + n_measure <= _MAX_PERIOD:
        raise ValueError(
            f"n_transient + n_measure must be > {_MAX_PERIOD} (periods up to {_MAX_PERIOD} are "
            f"told apart), got n_transient={n_transient}, n_measure={n_measure}")
    saturation_tol = float(check_real("saturation_tol", saturation_tol, 0.0, 1.0,
                                      open_low=True, open_high=True, scalar=True))
    start = p_ref if p0 is None else p0
    res = classify_dynamics(start, p_ref, beta, alpha=alpha, n_transient=n_transient,
                            n_measure=n_measure, max_period=_MAX_PERIOD, calibration=cal)
    roots = fixed_points_logit(logit(p_ref), beta, alpha=alpha, calibration=cal)
    if roots.ndim == 1:
        n_fp = np.asarray(np.sum(~np.isnan(roots)))
    else:
        n_fp = np.sum(~np.isnan(roots), axis=-1)
    n_fp = np.broadcast_to(n_fp, res.regime.shape)
    sat_logit = logit(1.0 - saturation_tol)
    reg = res.regime
    label = np.full(reg.shape, int(Label.UNSETTLED))
    fixed = reg == Regime.FIXED_POINT
    label = np.where(fixed & (res.final_logit < sat_logit), int(Label.INTERIOR), label)
    label = np.where(fixed & (res.final_logit >= sat_logit), int(Label.SATURATED), label)
    label = np.where(reg == Regime.SATURATES, int(Label.SATURATED), label)
    label = np.where(reg == Regime.CYCLE_2, int(Label.CYCLE_2), label)
    irregular = reg == Regime.IRREGULAR
    label = np.where(irregular & (res.period > 2), int(Label.HIGHER_PERIOD), label)
    with np.errstate(invalid="ignore"):
        chaotic = irregular & (res.period == 0) & (res.lyapunov > 0)
    label = np.where(chaotic, int(Label.CHAOTIC), label)
    label = np.where(reg == Regime.ABSORBED, int(Label.ABSORBED), label)
    return RegimeMap(label, np.array(n_fp), res.lyapunov, res.limits)
