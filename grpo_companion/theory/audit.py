"""A census of a calibration's fixed points: does amplification (Theorem 3) hold for it?

:func:`~grpo_companion.theory.audit_calibration` takes any
:class:`~grpo_companion.theory.Calibration`, a built-in one or one a forker has just
registered with
:func:`~grpo_companion.theory.register_normalization`, and finds every interior fixed
point of the reference-KL PoS map (Theorem 2) on a grid of reference PoS and KL weights.
Theorem 3's argument needs only ``Omega > 0``: at a fixed point
``L* = L_ref + Omega(p*) / beta``, so the lift ``beta (L* - L_ref)`` is at least
``inf_p Omega``. The census checks that, cell by cell, rather than taking it on trust,
and counts how many cells have one fixed point and how many three. The function is
exported by the package (``theory.audit_calibration``); chapter 10 calls it on a variant
registered in the notebook.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_companion.validation import check_count, check_interval

from .calibration import Calibration
from .logistic import logit, sigmoid
from .roots import fixed_points_logit

__all__ = ["CalibrationAudit", "audit_calibration"]

#: Relative slack of the lift against ``inf Omega`` (the roots are solved to about 1e-12).
LIFT_RTOL = 1e-9


@dataclass(frozen=True)
class CalibrationAudit:
    """The fixed-point census of one calibration.

    Made by :func:`~grpo_companion.theory.audit_calibration`.

    Attributes
    ----------
    n_cells : int
        Cells of the ``(beta, p_ref)`` grid.
    points : int
        Interior fixed points found in all cells together.
    share3 : float
        Share of the cells with three fixed points (the map folds there).
    min_lift : float
        The smallest ``beta (L* - L_ref)`` over every fixed point found.
    omega_inf : float
        ``inf_p Omega(p)``, the lower bound Theorem 3's argument gives for the lift
        (the calibration's ``omega_inf``: a fine logit grid and the limits at 0 and 1).
    all_above : bool
        Every fixed point lies above its ``p_ref``.
    every_cell : bool
        Every cell has at least one fixed point.
    """

    n_cells: int
    points: int
    share3: float
    min_lift: float
    omega_inf: float
    all_above: bool
    every_cell: bool

    @property
    def amplifies(self) -> bool:
        """Amplification holds on the grid: a fixed point in every cell, all above
        ``p_ref``, none lifted less than ``inf Omega`` (to a relative ``1e-9``)."""
        return bool(self.all_above and self.every_cell
                    and self.min_lift >= self.omega_inf * (1 - LIFT_RTOL))


def audit_calibration(calibration: Calibration, *, n_grid: int = 240,
                      p_ref_bounds: tuple[float, float] = (1e-6, 1 - 1e-6),
                      beta_bounds: tuple[float, float] = (1e-2, 1e2)) -> CalibrationAudit:
    """Every fixed point of the reference-KL map of ``calibration`` on a grid (Theorems 2, 3).

    The grid has ``n_grid`` reference PoS values, evenly spaced in logit over
    ``p_ref_bounds``, times ``n_grid`` KL weights, evenly spaced in log over
    ``beta_bounds``. In each cell every interior fixed point is found in logits by
    :func:`grpo_companion.theory.fixed_points_logit` (fixed points within ``1e-16`` of 1
    stay resolved). The result counts them and compares their lift
    ``beta (L* - L_ref)`` with ``inf_p Omega``; ``.amplifies`` is the verdict.

    Parameters
    ----------
    calibration : Calibration
        Any calibration, with or without a finite group size.
    n_grid : int
        Grid points per axis (>= 2); the cost grows as ``n_grid**2``.
    p_ref_bounds : tuple of float
        ``(lo, hi)`` with ``0 < lo < hi < 1``.
    beta_bounds : tuple of float
        ``(lo, hi)`` with ``0 < lo < hi``, finite.
    """
    if not isinstance(calibration, Calibration):
        raise ValueError(f"calibration must be a theory.Calibration, got {calibration!r}")
    n = check_count("n_grid", n_grid, 2, 4000)
    p_lo, p_hi = check_interval("p_ref_bounds", p_ref_bounds, 0.0, 1.0, open_low=True)
    if p_hi >= 1.0:
        raise ValueError(f"p_ref_bounds must lie in (0, 1), got {p_ref_bounds!r}")
    b_lo, b_hi = check_interval("beta_bounds", beta_bounds, 0.0, open_low=True)
    p_ref = sigmoid(np.linspace(logit(p_lo), logit(p_hi), n))[None, :]
    beta = np.logspace(np.log10(b_lo), np.log10(b_hi), n)[:, None]
    logit_ref = logit(p_ref)
    roots = fixed_points_logit(logit_ref, beta, calibration=calibration)  # (n, n, 3), NaN-padded
    lift = (roots - logit_ref[..., None]) * beta[..., None]
    n_roots = np.sum(~np.isnan(roots), axis=-1)
    return CalibrationAudit(
        n_cells=int(n_roots.size), points=int(n_roots.sum()),
        share3=float(np.mean(n_roots == 3)),
        min_lift=float(np.nanmin(lift)) if n_roots.any() else float("nan"),
        omega_inf=float(calibration.omega_inf),
        all_above=bool(np.all(np.nan_to_num(lift, nan=np.inf) > 0)),
        every_cell=bool(np.all(n_roots >= 1)))

