"""Long-run behaviour of the PoS recurrences: fixed points, 2-cycles, chaos, saturation.

Lemma 1 and Theorem 6 give local convergence when ``|h'(p*)| < 1``. When the
slope at every fixed point exceeds 1 in size the orbit can settle on a
period-2 orbit or wander irregularly (paper, Figure 5, last row). This module
classifies each cell of a parameter grid by iterating the logit map.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    broadcast,
    check_alpha,
    check_beta,
    check_count,
    check_logit,
    check_memory,
    check_probability,
    check_real,
)

from .calibration import Calibration, resolve_calibration
from .dynamics import _affine_parts, _check_map_inputs, _prepare, _prev_part
from .logistic import _log_bernoulli_variance, logit
from .roots import bracketed_roots, fixed_points_logit

__all__ = ["DynamicsResult", "Regime", "classify_dynamics", "period_two_orbits",
           "period_two_orbits_logit"]


class Regime(IntEnum):
    """Long-run regime of a PoS orbit (integer codes suit regime maps)."""

    FIXED_POINT = 0  #: converges to an interior fixed point
    CYCLE_2 = 1  #: settles on a period-2 orbit
    IRREGULAR = 2  #: neither (chaotic, longer period, or not yet settled)
    SATURATES = 3  #: p_n -> 1 (logit -> +inf)
    ABSORBED = 4  #: p_n = 0 for all n


@dataclass(frozen=True)
class DynamicsResult:
    """Output of :func:`~grpo_companion.theory.classify_dynamics`.

    Every array has the broadcast parameter shape.

    Attributes
    ----------
    regime : ndarray of int
        :class:`Regime` codes.
    period : ndarray of int
        Smallest period ``<= max_period`` seen at the end of the run, 0 if none.
    limits : ndarray, shape (..., 2)
        PoS limit(s): ``(p*, p*)`` for a fixed point, the two points (ascending)
        of a 2-cycle, ``(1, 1)`` when saturating, ``(0, 0)`` when absorbed and
        NaN for irregular orbits.
    lyapunov : ndarray
        Mean of ``log |dp_n / dp_{n-1}|`` over the measuring steps: negative for
        attracting fixed points and cycles, positive for chaotic orbits. NaN for
        orbits sitting exactly at PoS 0 or 1, where it is not defined.
    final_logit : ndarray
        Logit of the last iterate.
    """

    regime: np.ndarray
    period: np.ndarray
    limits: np.ndarray
    lyapunov: np.ndarray
    final_logit: np.ndarray


def classify_dynamics(
    p0: ArrayLike,
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    n_transient: int = 1000,
    n_measure: int = 1000,
    max_period: int = 8,
    tol: float = 1e-9,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> DynamicsResult:
    """Classify the long-run behaviour of Table 1's recurrences from ``p0`` (all cells at once).

    The orbit is iterated ``n_transient`` steps, then ``n_measure`` more while
    the Lyapunov exponent is accumulated. A cell is a fixed point (period 1)
    or a 2-cycle when its last logits repeat with that period to relative
    tolerance ``tol``; mirror maps (``alpha = 0``, Theorem 5) and orbits whose
    logit overflows saturate; ``p = 0`` with nothing to lift it is absorbed.
    A cell still moving when the run ends, but monotonically with shrinking
    steps (a slow contraction such as a small ``alpha``, ``h'(p*)`` just below
    1), is a fixed point when its geometric tail points at an attracting fixed
    point: the first root of ``L_ref + Omega(L) / (alpha beta) - L`` ahead of
    the orbit, which must agree with the tail's Aitken extrapolation; its
    limits are that fixed point (found by :func:`fixed_points_logit`, so
    ``(1, 1)`` for a fixed point closer to 1 than float64 resolves) and its
    period is 1. Other near-neutral cells (``|h'(p*)|`` close to 1, e.g.
    oscillating) may need more steps and are reported as irregular with a
    Lyapunov exponent close to 0.
    """
    lp = logit(check_probability("p0", p0))
    lr = logit(check_probability("p_ref", p_ref))
    lp, lr, b, a, cal = _prepare(lp, lr, beta, alpha, calibration, calibration_kwargs,
                                 names=("p0", "p_ref"))
    n_transient = check_count("n_transient", n_transient, 0)
    n_measure = check_count("n_measure", n_measure, 1)
    # the period test compares the last iterate with the max_period before it
    max_period = check_count("max_period", max_period, 1, n_transient + n_measure - 1)
    check_memory("max_period", max_period, 8.0 * (max_period + 1) * lp.size,
                 "the orbit history")
    tol = float(check_real("tol", tol, 0.0, open_low=True, scalar=True))
    ref_part, keep = _affine_parts(lr, a)
    inv_beta = 1.0 / b
    current = np.array(lp, dtype=np.float64)
    lyap = np.zeros(current.shape)
    history = []
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for n in range(n_transient + n_measure):
            nxt = ref_part + _prev_part(keep, current) + cal.omega_unchecked(current) * inv_beta
            if n >= n_transient:
                slope = (1.0 - a) + cal.omega_prime_unchecked(current) * inv_beta
                lyap += (np.log(np.abs(slope)) + _log_bernoulli_variance(nxt)
                         - _log_bernoulli_variance(current))
            if n >= n_transient + n_measure - max_period - 1:
                history.append(nxt)
            current = nxt
    lyap /= n_measure
    hist = np.stack(history)  # oldest first, hist[-1] is the final logit
    last = hist[-1]
    scale = tol * np.maximum(1.0, np.abs(last))
    period = np.zeros(last.shape, dtype=np.int64)
    for k in range(max_period, 0, -1):
        with np.errstate(invalid="ignore"):
            period = np.where(np.abs(last - hist[-1 - k]) <= scale, k, period)

    limit_logit = np.array(last, dtype=np.float64)
    converging, target = _slow_convergence(hist, period, lr, b, a, cal, tol)
    period = np.where(converging, 1, period)
    limit_logit = np.where(converging, target, limit_logit)

    regime = np.full(last.shape, int(Regime.IRREGULAR))
    regime = np.where(period == 1, int(Regime.FIXED_POINT), regime)
    regime = np.where(period == 2, int(Regime.CYCLE_2), regime)
    with np.errstate(invalid="ignore"):
        rising = np.all(np.diff(hist, axis=0) > 0, axis=0)
    saturating = (last == np.inf) | ((a == 0) & np.isfinite(last))
    saturating |= rising & (period != 1) & (not np.isfinite(cal.omega_sup))
    regime = np.where(saturating, int(Regime.SATURATES), regime)
    regime = np.where(last == -np.inf, int(Regime.ABSORBED), regime)

    pair = np.sort(np.stack([hist[-1], hist[-2]], axis=-1), axis=-1)
    limits = np.full((*last.shape, 2), np.nan)
    limits = np.where((regime == Regime.FIXED_POINT)[..., None],
                      special.expit(limit_logit)[..., None], limits)
    limits = np.where((regime == Regime.CYCLE_2)[..., None], special.expit(pair), limits)
    limits = np.where((regime == Regime.SATURATES)[..., None], 1.0, limits)
    limits = np.where((regime == Regime.ABSORBED)[..., None], 0.0, limits)
    lyap = np.where(np.isinf(last) | np.isinf(lp), np.nan, lyap)
    return DynamicsResult(regime, period, limits, lyap, last)


def _slow_convergence(
    hist: np.ndarray, period: np.ndarray, lr: np.ndarray, b: np.ndarray, a: np.ndarray,
    cal: Calibration, tol: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Cells whose orbit is still approaching an attracting fixed point, and its logit.

    ``hist`` holds the last logits of every cell (oldest first). A cell
    qualifies when it has no period yet, moves monotonically with step ratios
    in (0, 1) over the whole window, and the first fixed point ahead of it
    (in the direction it moves) is attracting and agrees with the Aitken
    extrapolation ``L + d r / (1 - r)`` of its last step ``d`` and ratio ``r``.
    """
    converging = np.zeros(period.shape, dtype=bool)
    target = np.full(period.shape, np.nan)
    if hist.shape[0] < 4:
        return converging, target
    last = hist[-1]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        steps = np.diff(hist, axis=0)
        ratio = steps[1:] / steps[:-1]
        monotone = np.all(steps > 0, axis=0) | np.all(steps < 0, axis=0)
        contracting = np.all((ratio > 0) & (ratio < 1), axis=0)
    cand = (period == 0) & (a > 0) & np.isfinite(last) & monotone & contracting
    if not cand.any():
        return converging, target
    x, d, r = last[cand], steps[-1][cand], ratio[-1][cand]
    aitken = x + d * r / (1.0 - r)
    roots = np.atleast_2d(fixed_points_logit(lr[cand], b[cand], alpha=a[cand], calibration=cal))
    with np.errstate(invalid="ignore"):
        ahead = (roots - x[:, None]) * np.sign(d)[:, None] > 0  # NaN padding: False
    dist = np.where(ahead, np.abs(roots - x[:, None]), np.inf)
    j = np.argmin(dist, axis=-1) if dist.shape[-1] else np.zeros(x.shape, dtype=np.int64)
    gap = dist[np.arange(x.size), j] if dist.shape[-1] else np.full(x.shape, np.inf)
    root = np.where(np.isfinite(gap), roots[np.arange(x.size), j] if dist.shape[-1] else 0.0,
                    np.nan)
    with np.errstate(invalid="ignore", over="ignore"):
        slope = (1.0 - a[cand]) + cal.omega_prime_unchecked(np.nan_to_num(root)) / b[cand]
        agree = np.abs(aitken - root) <= 0.1 * gap + tol * np.maximum(1.0, np.abs(root))
    ok = np.isfinite(gap) & agree & (np.abs(slope) < 1.0)
    converging[cand] = ok
    target[cand] = np.where(ok, root, np.nan)
    return converging, target


def period_two_orbits_logit(
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    n_grid: int = 4096,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Period-2 orbits ``{a, b}``, ``a < b``, ``f(a) = b``, ``f(b) = a``, of the logit map.

    Fixed points of ``f o f`` that are not fixed points of ``f``. Every periodic
    orbit of a map with ``alpha > 0`` lies in the invariant interval
    ``[L_ref + Omega_inf / (alpha beta), L_ref + Omega_sup / (alpha beta)]``
    (for unbounded ``Omega``: up to the largest fixed point); ``f o f - id`` is
    scanned there on a grid refined where ``Omega`` varies, and sign changes are
    refined by SciPy's ``find_root`` (``roots.bracketed_roots``, internal to the theory).
    Orbits whose two roots fall within one grid cell can be missed (near a period-doubling
    bifurcation).

    Returns
    -------
    ndarray
        Shape ``(..., k, 2)``, NaN-padded for array arguments; ``(k, 2)`` for
        scalars.
    """
    lr = check_logit("logit_p_ref", logit_p_ref)
    return _period_two_orbits(lr, beta, alpha, n_grid, calibration, calibration_kwargs,
                              "logit_p_ref")


def _period_two_orbits(
    lr: np.ndarray, beta: ArrayLike, alpha: ArrayLike, n_grid: int,
    calibration: Calibration | None, calibration_kwargs: dict[str, Any], name: str,
) -> np.ndarray:
    """:func:`period_two_orbits_logit` after the logit check; ``name`` is the caller's."""
    b = check_beta(beta)
    a = check_alpha(alpha)
    n_grid = check_count("n_grid", n_grid, 2)
    check_memory("n_grid", n_grid, 8.0 * 16 * n_grid, "its grids")
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lr, b, a = broadcast(**{name: lr, "beta": b, "alpha": a})
    _check_map_inputs(np.zeros_like(lr), lr, a, cal)
    shape = lr.shape
    lr, b, a = lr.ravel(), b.ravel(), a.ravel()
    active = (a > 0) & np.isfinite(lr)
    c = np.where(active, 1.0 / np.where(active, a * b, 1.0), 0.0)
    lo = lr + c * cal.omega_inf * (1 - 1e-9)
    if np.isfinite(cal.omega_sup):
        hi = lr + c * cal.omega_sup * (1 + 1e-9)
    else:
        hi = np.nanmax(np.atleast_2d(fixed_points_logit(lr, b, alpha=a, calibration=cal)),
                       axis=-1, initial=-np.inf)
    active &= hi > lo
    t = np.linspace(0.0, 1.0, n_grid)
    table = cal._logit_table
    dense = np.linspace(table[0], table[-1], n_grid)

    def f(x: np.ndarray, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ref_part, keep = _affine_parts(lr[i], a[i])
        val = ref_part + keep * x + cal.omega_unchecked(x) / b[i]
        slope = keep + cal.omega_prime_unchecked(x) / b[i]
        return val, slope

    def ff(x: np.ndarray, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y, dy = f(x, i)
        z, dz = f(y, i)
        return z - x, dz * dy - 1.0

    out = np.full((lr.size, 0, 2), np.nan)
    rows_all = np.flatnonzero(active)
    chunk = max(1, 2**22 // (2 * n_grid))
    results = []
    for start in range(0, rows_all.size, chunk):
        rows = rows_all[start:start + chunk]
        grid = np.concatenate([lo[rows, None] + (hi - lo)[rows, None] * t,
                               np.clip(dense, lo[rows, None], hi[rows, None])], axis=1)
        grid = np.sort(grid, axis=1)
        cells = np.broadcast_to(rows[:, None], grid.shape)
        vals = ff(grid.ravel(), cells.ravel())[0].reshape(grid.shape)
        left, right = vals[:, :-1], vals[:, 1:]
        has = (np.sign(left) * np.sign(right) < 0) | ((right == 0) & (grid[:, 1:] > grid[:, :-1]))
        r_i, j_i = np.nonzero(has)
        if r_i.size == 0:
            continue
        cell = rows[r_i]
        x = bracketed_roots(lambda z, i, cell=cell: ff(z, cell[i]), grid[r_i, j_i],
                              grid[r_i, j_i + 1], left[r_i, j_i], right[r_i, j_i])
        image = f(x, cell)[0]
        lower = image - x > 1e-7 * np.maximum(1.0, np.abs(x))  # lower point, not a fixed point
        results.append((cell[lower], x[lower], image[lower]))
    if results:
        cell = np.concatenate([r[0] for r in results])
        low = np.concatenate([r[1] for r in results])
        high = np.concatenate([r[2] for r in results])
        width = int(np.bincount(cell, minlength=lr.size).max())
        out = np.full((lr.size, width, 2), np.nan)
        order = np.lexsort((low, cell))
        cell, low, high = cell[order], low[order], high[order]
        slot = np.arange(cell.size) - np.searchsorted(cell, cell)
        out[cell, slot, 0] = low
        out[cell, slot, 1] = high
    out = out.reshape(*shape, out.shape[1], 2)
    if not shape:
        return out[~np.isnan(out[:, 0])]
    return out


def period_two_orbits(
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    n_grid: int = 4096,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Period-2 orbits of the PoS map in probability space; see :func:`period_two_orbits_logit`.

    Returns pairs ``(p_a, p_b)`` with ``p_a < p_b``, ``h(p_a) = p_b`` and
    ``h(p_b) = p_a`` (fixed points of ``h o h`` that are not fixed points of ``h``).
    """
    lr = logit(check_probability("p_ref", p_ref))
    orbits = _period_two_orbits(lr, beta, alpha, n_grid, calibration, calibration_kwargs,
                                "p_ref")
    return special.expit(orbits)


