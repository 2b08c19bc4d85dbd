"""All interior fixed points and period-2 orbits of the PoS maps, vectorised over cells.

Fixed points of ``L -> alpha L_ref + (1 - alpha) L + Omega(L) / beta`` with
``alpha > 0`` are the zeros of::

    g(L) = L_ref + c * Omega(L) - L,        c = 1 / (alpha beta)

(Theorem 2 for ``alpha = 1``; Table 1, two-KL row, for ``0 < alpha < 1``).
``g(L_ref) = c Omega(L_ref) > 0``, so every root exceeds ``L_ref``
(Theorem 3), and ``g(L) < 0`` for ``L > L_ref + c sup Omega``. Between the
(cell-independent) extrema of ``Omega'`` the derivative ``g'`` is monotone,
so each such piece holds at most one critical point of ``g``; between
critical points ``g`` is monotone and holds at most one root. Every root is
therefore bracketed and refined by SciPy's vectorised bracketing root finder
(``scipy.optimize.elementwise.find_root``, Chandrupatla's method), all
brackets at once. No per-cell Python loop is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special
from scipy.optimize.elementwise import find_root

from grpo_companion.validation import (
    broadcast,
    check_alpha,
    check_beta,
    check_logit,
    check_probability,
)

from .calibration import Calibration, resolve_calibration
from .logistic import logit

__all__ = ["fixed_points", "fixed_points_logit"]

_XTOL = 4.0 * np.finfo(np.float64).eps
#: scan_roots's stopping width: a bracket below ``2 eps abs(x)`` spans one to three ulps
_SCAN_XTOL = 2.0 * np.finfo(np.float64).eps
_SCAN_XATOL = 4.0 * np.finfo(np.float64).tiny  # roots near 0 to adjacent floats too


def scan_roots(
    g: Callable[[np.ndarray, np.ndarray], np.ndarray],
    lo_end: np.ndarray,
    hi_end: np.ndarray,
    n_grid: int,
) -> np.ndarray:
    """Every root of ``g`` on ``[lo_end, hi_end]`` per cell, by sign changes and bisection.

    ``lo_end`` and ``hi_end`` are 1-D (one entry per cell); ``g(x, cells)`` evaluates cell
    ``cells`` at ``x`` elementwise (``cells`` broadcasts against ``x``). ``g`` is scanned on
    ``n_grid`` points per cell, evenly spaced in ``asinh x`` (fine near 0, logarithmic far
    out), and each bracket with a sign change is narrowed to one to three ulps by
    :func:`bracketed_roots` (SciPy's ``find_root``; this replaced a bisection to adjacent
    floats, which took up to 2200 evaluations), all brackets at once. Two roots closer
    than the grid spacing (near a saddle-node) can be missed.
    Returns shape ``(cells, width)``, each row sorted and padded with NaN. Used by the maps
    of :mod:`grpo_companion.theory.analyses.clipped` and
    :mod:`grpo_companion.theory.analyses.sample_weighting`.
    """
    n = lo_end.shape[0]
    a0, a1 = np.arcsinh(lo_end)[:, None], np.arcsinh(hi_end)[:, None]
    grid = np.sinh(a0 + (a1 - a0) * np.linspace(0.0, 1.0, n_grid))
    s = np.sign(g(grid, np.arange(n)[:, None]))
    cell, j = np.nonzero(s[:, :-1] * s[:, 1:] < 0)
    found = bracketed_roots(lambda x, i: g(x, cell[i]), grid[cell, j], grid[cell, j + 1],
                            xrtol=_SCAN_XTOL, xatol=_SCAN_XATOL)
    exact_cell, exact_j = np.nonzero(s == 0)
    cell = np.concatenate([cell, exact_cell])
    roots = np.concatenate([found, grid[exact_cell, exact_j]])
    order = np.lexsort((roots, cell))
    cell, roots = cell[order], roots[order]
    counts = np.bincount(cell, minlength=n)
    out = np.full((n, int(counts.max()) if counts.size else 0), np.nan)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    out[cell, np.arange(cell.size) - starts[cell]] = roots
    return out


def bracketed_roots(
    f: Callable[[np.ndarray, np.ndarray], np.ndarray | tuple[np.ndarray, ...]],
    a: np.ndarray,
    b: np.ndarray,
    fa: np.ndarray | None = None,
    fb: np.ndarray | None = None,
    *,
    xrtol: float = 0.5 * _XTOL,
    xatol: float = 0.5 * _XTOL,
) -> np.ndarray:
    """One root of ``f`` in each bracket ``[a, b]`` (a sign change), all brackets at once.

    ``f(x, idx)`` evaluates bracket ``idx`` at ``x`` elementwise and returns the value (or a
    tuple whose first entry is the value; a derivative after it is ignored). ``fa`` and
    ``fb``, the values at the ends, are optional: an end where ``f`` is 0 is returned as it
    is. The root is refined by SciPy's vectorised Chandrupatla iteration
    (``scipy.optimize.elementwise.find_root``) until the bracket is narrower than
    ``xatol + xrtol * abs(x)``; of its two final ends the one where ``f`` is smaller in
    magnitude is returned. The defaults (two float64 epsilons each) keep the error below
    ``_XTOL * max(1, abs(x))``, the step at which the safeguarded Newton iteration this
    replaces stopped. ``tests/theory/test_root_finders.py`` checks the fixed points
    against mpmath at 40 digits; ``benchmarks/bench_root_finders.py`` times both.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    idx = np.arange(a.size)
    if a.size == 0:
        return np.empty(0)

    def value(x: np.ndarray, i: np.ndarray) -> np.ndarray:
        out = f(x, i)
        return out[0] if isinstance(out, tuple) else out

    lo, hi = np.minimum(a, b), np.maximum(a, b)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        res = find_root(value, (lo, hi), args=(idx,),
                        tolerances={"xatol": xatol, "xrtol": xrtol, "fatol": 0.0})
    x = np.asarray(res.x, dtype=np.float64)
    if fa is not None:
        x = np.where(np.asarray(fa) == 0, a, x)
    if fb is not None:
        x = np.where(np.asarray(fb) == 0, b, x)
    return x


#: The name :mod:`grpo_companion.theory.regimes` imports (it passes value and slope).


def _critical_points(cal: Calibration, slope: np.ndarray) -> np.ndarray:
    """Solutions ``L`` of ``Omega'(L) = slope`` on each monotone piece of ``Omega'``.

    Returns shape ``(n, pieces)``, NaN where a piece has none. Uses the
    calibration's cell-independent table (linear interpolation, spacing 0.01 in
    the logit); the critical points only delimit the monotone stretches of ``g``.
    """
    pieces = cal.omega_prime_pieces
    out = np.full((slope.size, len(pieces)), np.nan)
    for j, (values, logits) in enumerate(pieces):
        inside = (slope >= values[0]) & (slope <= values[-1])
        out[inside, j] = np.interp(slope[inside], values, logits)
        beyond = (slope > values[-1]) & (logits[-1] == cal._logit_table[[0, -1]]).any()
        if beyond.any():
            raise ValueError(
                "alpha * beta is outside the supported range for this calibration "
                f"(a turning point of the fixed-point equation lies beyond |logit| = "
                f"{cal._logit_table[-1]:.0f})"
            )
    return out


def _pad_rows(values: np.ndarray) -> np.ndarray:
    """Sort each row (NaN last) and drop columns that are NaN in every row."""
    values = np.sort(values, axis=-1)
    if values.size == 0:
        return values
    width = int(np.max(np.sum(~np.isnan(values), axis=-1), initial=0))
    return values[..., :width]


def _fixed_points_flat(lr: np.ndarray, c: np.ndarray, cal: Calibration) -> np.ndarray:
    """Roots of ``g`` per cell for flat arrays ``lr`` (finite) and ``c`` (> 0)."""
    n = lr.size

    def g(x: np.ndarray, i: np.ndarray) -> np.ndarray:
        return lr[i] + c[i] * cal.omega_unchecked(x) - x

    def g_and_slope(x: np.ndarray, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return g(x, i), c[i] * cal.omega_prime_unchecked(x) - 1.0

    every = np.arange(n)
    lo = lr.copy()
    turns = cal.omega_prime_extrema
    with np.errstate(over="ignore"):
        if np.isfinite(cal.omega_sup):
            hi = lr + c * cal.omega_sup + 1.0
        else:  # g -> +inf: go past the last turn of Omega' until g and g' are both > 0
            start = np.maximum(lo, turns[-1] if turns.size else lo) + 1.0
            hi, step = start.copy(), np.ones(n)
            for _ in range(2100):
                gv, dv = g_and_slope(hi, every)
                open_ = (gv <= 0) | (dv <= 0)
                if not open_.any():
                    break
                step = np.where(open_, 2.0 * step, step)
                hi = np.where(open_, start + step, hi)
    if not np.isfinite(hi).all():
        raise ValueError("beta is too small: the fixed-point search range overflows float64")
    crit = _critical_points(cal, 1.0 / c)
    knots = np.concatenate([lo[:, None], turns[None, :].repeat(n, 0), crit, hi[:, None]], axis=1)
    knots = np.where((knots >= lo[:, None]) & (knots <= hi[:, None]), knots, np.nan)
    knots = np.sort(knots, axis=1)
    ok = ~np.isnan(knots)
    g_knots = np.full(knots.shape, np.nan)
    g_knots[ok] = g(knots[ok], np.broadcast_to(every[:, None], knots.shape)[ok])
    left, right = g_knots[:, :-1], g_knots[:, 1:]
    has = (np.sign(left) * np.sign(right) < 0) | ((right == 0) & (knots[:, 1:] > knots[:, :-1]))
    roots = np.full(left.shape, np.nan)
    if has.any():
        rows, js = np.nonzero(has)
        roots[rows, js] = bracketed_roots(
            lambda x, i: g(x, rows[i]),
            knots[rows, js], knots[rows, js + 1], left[rows, js], right[rows, js],
        )
    return roots


def fixed_points_logit(
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Logits of every interior fixed point (Theorem 2 / Table 1), in increasing order.

    Solves ``L = L_ref + Omega(L) / (alpha beta)``. Returns a 1-D array for
    scalar arguments; otherwise the broadcast shape plus one trailing axis,
    padded with NaN. ``alpha = 0`` (mirror, Theorem 5) and ``L_ref = +-inf``
    (``p_ref`` in {0, 1}, absorbing) have no interior fixed point.
    """
    lr = check_logit("logit_p_ref", logit_p_ref)
    return _fixed_points_logit(lr, beta, alpha, calibration, calibration_kwargs, "logit_p_ref")


def _fixed_points_logit(
    lr: np.ndarray, beta: ArrayLike, alpha: ArrayLike, calibration: Calibration | None,
    calibration_kwargs: dict[str, Any], name: str,
) -> np.ndarray:
    """:func:`fixed_points_logit` after the logit check; ``name`` is the caller's."""
    b = check_beta(beta)
    a = check_alpha(alpha)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lr, b, a = broadcast(**{name: lr, "beta": b, "alpha": a})
    shape = lr.shape
    active = (a > 0) & np.isfinite(lr)
    flat_roots = np.full((lr.size, 0), np.nan)
    if active.any():
        act = active.ravel()
        sub = _fixed_points_flat(lr.ravel()[act], 1.0 / (a.ravel()[act] * b.ravel()[act]), cal)
        flat_roots = np.full((lr.size, sub.shape[1]), np.nan)
        flat_roots[act] = sub
    padded = _pad_rows(flat_roots)
    roots = padded.reshape(*shape, padded.shape[-1])
    if not shape:
        return roots[~np.isnan(roots)]
    return roots


def fixed_points(
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Every fixed point ``p* = h(p*)`` in (0, 1), sorted (Theorem 2, Proposition 1, Table 1).

    For the reference map (``alpha = 1``) there can be one or three; all satisfy
    ``p* > p_ref`` (Theorem 3). Two-KL maps started at ``pi_ref`` share the
    fixed points of the reference map with ``beta`` replaced by ``alpha beta``.
    Mirror maps (``alpha = 0``) and ``p_ref`` in {0, 1} have none.

    Returns
    -------
    ndarray
        Scalar arguments: the 1-D array of fixed points. Array arguments: one
        more trailing axis holding each cell's fixed points in increasing order,
        padded with NaN. A fixed point closer to 1 than float64 resolves prints as
        1.0; :func:`fixed_points_logit` keeps its exact logit.
    """
    lr = logit(check_probability("p_ref", p_ref))
    roots = _fixed_points_logit(lr, beta, alpha, calibration, calibration_kwargs, "p_ref")
    return special.expit(roots)
