"""Local contraction around a fixed point (Theorem 7, Theorem 6, Remark 2).

Theorem 7 of the paper is the one-dimensional local contraction lemma: if
``f`` is continuously differentiable, ``f(x*) = x*`` and ``|f'(x*)| < 1``, there
are a radius ``r > 0`` and a rate ``k < 1`` with ``|f'| <= k`` on
``I = [x* - r, x* + r]``; then ``f`` maps ``I`` into itself, contracts it, and
every orbit started in ``I`` converges to ``x*``, the only fixed point in ``I``.
Theorem 6 applies it to the PoS map ``h``. :func:`local_contraction` carries out
the lemma's construction numerically for many fixed points at once and then
checks each of its conclusions on actual orbits; :func:`reference_map_contraction`
does it for the reference map in log-odds (where fixed points extremely close
to 1 stay resolvable), and :func:`uniform_contraction` takes the worst case over
prompts, as Remark 2 asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from grpo_companion.validation import (
    broadcast,
    check_beta,
    check_count,
    check_logit,
    check_memory,
    check_real,
)

from ..calibration import Calibration, resolve_calibration

__all__ = [
    "ContractionCheck",
    "local_contraction",
    "reference_map_contraction",
    "uniform_contraction",
]

#: relative float64 resolution allowed in orbit comparisons, per unit of |x*|
_ROUNDING = 64 * np.finfo(float).eps


@dataclass(frozen=True)
class ContractionCheck:
    """Outcome of :func:`local_contraction`, one entry per fixed point.

    Attributes
    ----------
    x_star : the fixed points checked.
    slope : ``|f'(x*)|``.
    fixed_residual : ``|f(x*) - x*|``.
    radius : the radius ``r`` of the contracting interval found (0 where none).
    rate : ``k``, the largest ``|f'|`` sampled on the interval (NaN where none).
    maps_into : ``f`` maps every sampled point of the interval into it.
    unique : ``f(x) - x`` changes sign once on the interval, at ``x*``.
    worst_ratio : the largest ``(|x_n - x*| - rounding) / (k^n |x_0 - x*|)`` over the
        orbits started on the interval and their ``n_steps`` steps (at most 1 for a
        contraction).
    final_error : the largest ``|x_N - x*|`` after ``N`` steps.

    ``worst_ratio`` and ``final_error`` are NaN where no radius was found.
    holds : every conclusion of Theorem 7 checked for this fixed point.
    """

    x_star: np.ndarray
    slope: np.ndarray
    fixed_residual: np.ndarray
    radius: np.ndarray
    rate: np.ndarray
    maps_into: np.ndarray
    unique: np.ndarray
    worst_ratio: np.ndarray
    final_error: np.ndarray
    holds: np.ndarray


def local_contraction(
    f: Callable[[np.ndarray], np.ndarray],
    fprime: Callable[[np.ndarray], np.ndarray],
    x_star: ArrayLike,
    *,
    radius0: float = 1.0,
    n_halvings: int = 50,
    n_samples: int = 129,
    n_starts: int = 8,
    n_steps: int = 200,
    fixed_tol: float = 1e-9,
) -> ContractionCheck:
    """Carry out Theorem 7 at each fixed point ``x_star`` and check its conclusions.

    For each fixed point the target rate is ``k0 = (1 + |f'(x*)|) / 2`` (any
    ``k`` strictly between ``|f'(x*)|`` and 1 would do). The radius is the largest
    ``r = radius0 / 2^j``, ``j = 0..n_halvings``, for which ``|f'| <= k0`` at
    ``n_samples`` evenly spaced points of ``[x* - r, x* + r]``; the rate ``k`` is
    the largest sampled ``|f'|`` there. Then ``n_starts`` orbits started evenly
    across the interval (its two ends included, ``x*`` excluded) are iterated
    ``n_steps`` times and must satisfy ``|x_n - x*| <= k^n |x_0 - x*|`` (up to
    float64 rounding) and stay in the interval.

    Parameters
    ----------
    f, fprime : callables
        The map and its derivative, applied elementwise to an array of shape
        ``(m, K)`` whose row ``i`` belongs to fixed point ``i`` (bind the
        parameters of row ``i`` as arrays of shape ``(m, 1)``).
    x_star : array_like
        The ``m`` fixed points (1-D).
    radius0, n_halvings, n_samples, n_starts, n_steps : search and orbit sizes.
    fixed_tol : ``|f(x*) - x*|`` allowed, relative to ``max(1, |x*|)``.

    Returns
    -------
    ContractionCheck
        ``holds`` is False where ``x_star`` is not a fixed point, where
        ``|f'(x*)| >= 1`` (no radius is found), or where an orbit breaks the bound.
    """
    for name, func in (("f", f), ("fprime", fprime)):
        if not callable(func):
            raise ValueError(f"{name} must be a callable (an elementwise map), got {func!r}")
    x = np.atleast_1d(check_real("x_star", x_star))
    if x.ndim != 1:
        raise ValueError(f"x_star must be a 1-D array of finite numbers, got shape {x.shape}")
    n_halvings = check_count("n_halvings", n_halvings, 0)
    n_samples = check_count("n_samples", n_samples, 3)
    n_starts = check_count("n_starts", n_starts, 2)
    n_steps = check_count("n_steps", n_steps, 1)
    check_memory("n_samples", n_samples, 32.0 * x.size * max(n_samples, n_starts),
                 "the sampled intervals")
    radius0 = float(check_real("radius0", radius0, 0.0, open_low=True, scalar=True))
    fixed_tol = float(check_real("fixed_tol", fixed_tol, 0.0, open_low=True, scalar=True))
    col = x[:, None]
    scale = np.maximum(1.0, np.abs(x))
    residual = np.abs(np.asarray(f(col), dtype=float)[:, 0] - x)
    slope = np.abs(np.asarray(fprime(col), dtype=float)[:, 0])
    target = 0.5 * (1.0 + slope)
    unit = np.linspace(-1.0, 1.0, n_samples)[None, :]

    radius = np.zeros(x.size)
    rate = np.full(x.size, np.nan)
    searching = slope < 1
    r = np.full(x.size, float(radius0))
    for _ in range(n_halvings + 1):
        if not searching.any():
            break
        k_here = np.max(np.abs(np.asarray(fprime(col + r[:, None] * unit), dtype=float)), axis=1)
        found = searching & (k_here <= target)
        radius[found], rate[found] = r[found], k_here[found]
        searching &= ~found
        r = np.where(searching, 0.5 * r, r)

    has = radius > 0
    r_col = radius[:, None]  # 0 where no radius: nothing is sampled or iterated there
    xs = col + r_col * unit
    fx = np.asarray(f(xs), dtype=float)
    # rounding, plus the distance from x_star to the exact fixed point that its
    # residual implies on a contracting interval, residual / (1 - k)
    k_safe = np.where(has, np.minimum(rate, 1 - 1e-12), 0.0)
    slack = (_ROUNDING * scale + residual / (1.0 - k_safe))[:, None]
    maps_into = np.all(np.abs(fx - col) <= r_col + slack, axis=1) & has
    g = fx - xs  # strictly decreasing through 0 on a contracting interval
    left, right = unit[0] < 0, unit[0] > 0
    unique = has & np.all(g[:, left] >= -slack, axis=1) & np.all(g[:, right] <= slack, axis=1)
    unique &= np.all(np.diff(g, axis=1) < slack, axis=1)

    starts = np.concatenate([np.linspace(-1.0, -1.0 / n_starts, n_starts // 2),
                             np.linspace(1.0 / n_starts, 1.0, n_starts - n_starts // 2)])
    orbit = col + r_col * starts[None, :]
    dist0 = np.abs(orbit - col)
    k = np.where(has, rate, 1.0)[:, None]
    worst = np.zeros(x.size)
    stays = np.ones(x.size, dtype=bool)
    envelope = dist0.copy()
    for _ in range(n_steps):
        orbit = np.where(has[:, None], np.asarray(f(orbit), dtype=float), col)
        envelope = envelope * k
        dist = np.abs(orbit - col)
        stays &= np.all(dist <= r_col + slack, axis=1)
        # distance beyond rounding, in units of the contraction envelope k^n |x_0 - x*|
        ratio = np.maximum(dist - slack, 0.0) / np.maximum(envelope, 1e-300)
        worst = np.maximum(worst, np.max(ratio, axis=1))
    final = np.where(has, np.max(np.abs(orbit - col), axis=1), np.nan)
    worst = np.where(has, worst, np.nan)
    fixed = residual <= fixed_tol * scale
    within = np.nan_to_num(worst, nan=np.inf) <= 1.0
    holds = fixed & has & (rate < 1) & maps_into & unique & stays & within
    return ContractionCheck(x_star=x, slope=slope, fixed_residual=residual, radius=radius,
                            rate=rate, maps_into=maps_into, unique=unique, worst_ratio=worst,
                            final_error=final, holds=holds)


def reference_map_contraction(
    logit_star: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    calibration: Calibration | None = None,
    **kwargs: Any,
) -> ContractionCheck:
    """Theorem 6: :func:`local_contraction` for the reference map in log-odds.

    The map is ``g(L) = L_ref + Omega(L) / beta`` (Theorem 2 in logit form) with
    ``g'(L) = Omega'(L) / beta``; at a fixed point ``g'(L*) = h'(p*)``, and since
    ``logit`` is a smooth increasing bijection of (0, 1) onto the real line, an
    interval around ``L*`` is an interval around ``p*``: orbits of ``g`` started
    in it are the logits of orbits of ``h`` started in its image. ``logit_star``,
    ``logit_p_ref`` and ``beta`` are broadcast to 1-D; ``kwargs`` other than the
    calibration's are passed to :func:`local_contraction`.
    """
    cal_keys = {"normalization", "eps", "eps_placement", "group_size", "ddof"}
    option_keys = {"radius0", "n_halvings", "n_samples", "n_starts", "n_steps", "fixed_tol"}
    unknown = set(kwargs) - cal_keys - option_keys
    if unknown:
        raise ValueError(
            f"unknown keyword(s) {', '.join(sorted(unknown))}; the calibration keywords are "
            f"{', '.join(sorted(cal_keys))} and the options {', '.join(sorted(option_keys))}")
    cal = resolve_calibration(calibration, **{k: v for k, v in kwargs.items() if k in cal_keys})
    options = {k: v for k, v in kwargs.items() if k not in cal_keys}
    ls = check_real("logit_star", logit_star)
    lr = check_logit("logit_p_ref", logit_p_ref)
    b = check_beta(beta)
    ls, lr, b = (np.ravel(a) for a in broadcast(logit_star=ls, logit_p_ref=lr, beta=b))
    lr_c, b_c = lr[:, None], b[:, None]

    def g(L: np.ndarray) -> np.ndarray:
        return lr_c + cal.omega_unchecked(L) / b_c

    def g_prime(L: np.ndarray) -> np.ndarray:
        return cal.omega_prime_unchecked(L) / b_c

    return local_contraction(g, g_prime, ls, **options)


def uniform_contraction(check: ContractionCheck) -> tuple[float, float]:
    """Remark 2: one radius and one rate for a whole set of fixed points.

    Returns ``(min radius, max rate)`` over the entries of ``check``. Both are
    uniform (every fixed point of the set contracts on an interval of at least
    that radius, at least that fast) exactly when every entry holds; otherwise
    ``(0.0, nan)``.
    """
    if not isinstance(check, ContractionCheck):
        raise ValueError(f"check must be a ContractionCheck (from local_contraction), "
                         f"got {check!r}")
    if check.x_star.size == 0 or not np.all(check.holds):
        return 0.0, float("nan")
    return float(np.min(check.radius)), float(np.max(check.rate))
