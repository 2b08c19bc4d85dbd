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

from .calibration import Calibration, resolve_calibration
from .dynamics import iterate_logit
from .logistic import logit
from .regimes import Regime, classify_dynamics
from .roots import fixed_points_logit

__all__ = ["LABEL_NAMES", "Label", "RegimeMap", "cobweb_path", "orbit_tail", "regime_map"]


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
    if not 1 <= int(n_keep) <= int(n_steps):
        raise ValueError(f"need 1 <= n_keep <= n_steps, got n_keep={n_keep}, n_steps={n_steps}")
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lr = logit(p_ref)
    transient = iterate_logit(logit(p0), lr, beta, int(n_steps) - int(n_keep) + 1,
                              alpha=alpha, keep_path=False, calibration=cal)
    path = iterate_logit(transient, lr, beta, int(n_keep) - 1, alpha=alpha, calibration=cal)
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
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lp = iterate_logit(logit(float(p0)), logit(float(p_ref)), float(beta), int(n_steps),
                       alpha=alpha, calibration=cal)
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
    cal = resolve_calibration(calibration, **calibration_kwargs)
    start = p_ref if p0 is None else p0
    res = classify_dynamics(start, p_ref, beta, alpha=alpha, n_transient=n_transient,
                            n_measure=n_measure, calibration=cal)
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
