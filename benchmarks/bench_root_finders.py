"""SciPy's ``elementwise.find_root`` against the hand-written root finders it replaced. JSON.

Issue 22, item 5. Side by side on the grids the theory uses, each timed as the median of
``--repeats`` runs (``old_s``, ``new_s``, ``speedup`` = old over new):

- ``fixed_points``: every interior fixed point (Theorem 2) over a 200 x 200
  ``(p_ref, beta)`` grid, ``p_ref`` in [0.01, 0.99], ``beta`` in [0.01, 100] (paper
  calibration, and ``eps = 0``). Old: the safeguarded Newton iteration (``rtsafe``).
  ``old_points`` / ``new_points``: logits at which ``Omega`` or ``Omega'`` were
  evaluated, a cost that does not move with the machine's load.
- ``period_two_orbits``: the period-2 orbits of chapter 5's regime map over a 40 x 40 grid
  (``theory.regimes`` refines ``f o f - id`` with the same finder).
- ``clipped_fixed_points``: ``theory.analyses.clipped`` (``roots.scan_roots``) over a
  20 x 20 grid; old: bisection to adjacent floats.
- ``reverse_kl_policy``: the normaliser of the reverse-KL optimum over 200 x 200 betas and
  8 outcomes; old: 200 bisections on ``lam``.
- ``round_step``: ``trained_loss.round_step_logit`` (k3) over a 100 x 100 ``(L_old, L_ref)``
  grid; old: 80 bisections of the bracketing grid cell (re-created by handing the new code
  a bisecting stand-in for ``find_root``).

``errors`` gives, for the fixed points on tests/theory/test_root_finders.py's hard grid
(logits -700..700, beta 1e-12..1e12, seven calibrations) and its double-root cells, the
worst error against mpmath at 40 digits of old and new, as a share of the allowance the
test derives from the equation's conditioning (``worst_over_allowance``; at most 1
passes) and in units of ``eps * max(1, abs(L))``. For the reverse-KL policy it gives the
worst relative error of ``pi`` on the test's cases (NaN counted as an infinite error).

Usage: ``python benchmarks/bench_root_finders.py [--repeats N] [--no-errors]`` from the
repository root.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
from scipy import special

from grpo_companion.theory import kl_estimators, regimes, roots
from grpo_companion.theory.analyses import clipped, trained_loss
from grpo_companion.theory.calibration import Calibration

_XTOL = 4.0 * np.finfo(np.float64).eps


# ------------------------------------------------------------- the replaced finders
def _legacy_midpoint(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    mid = np.sinh(0.5 * (np.arcsinh(a) + np.arcsinh(b)))
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return np.where((mid > lo) & (mid < hi), mid, 0.5 * (a + b))


def legacy_newton_bracketed(f, a, b, fa, fb, max_iter: int = 400) -> np.ndarray:
    """The safeguarded Newton iteration theory.roots used before issue 22 (rtsafe)."""
    out = np.empty(a.size)
    idx = np.arange(a.size)
    x = np.where(np.abs(fa) < np.abs(fb), a, b)
    step_old = np.abs(b - a)
    step = step_old.copy()
    for _ in range(max_iter):
        if idx.size == 0:
            break
        fx, dfx = f(x, idx)
        like_a = np.sign(fx) == np.sign(fa)
        a = np.where(like_a, x, a)
        b = np.where(like_a, b, x)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            nxt = x - fx / dfx
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        newton = (nxt > lo) & (nxt < hi) & (np.abs(nxt - x) <= 0.5 * step_old)
        nxt = np.where(newton, nxt, _legacy_midpoint(a, b))
        step_old, step = step, np.abs(nxt - x)
        tol = _XTOL * np.maximum(1.0, np.abs(x))
        done = (fx == 0) | (step <= tol) | (hi - lo <= tol)
        out[idx[done]] = np.where(fx[done] == 0, x[done], nxt[done])
        keep = ~done
        a, b, fa, x, idx = a[keep], b[keep], fa[keep], nxt[keep], idx[keep]
        step_old, step = step_old[keep], step[keep]
    out[idx] = x
    return out


def legacy_fixed_points_flat(lr: np.ndarray, c: np.ndarray, cal: Calibration) -> np.ndarray:
    """theory.roots._fixed_points_flat as it was, with the legacy Newton iteration."""
    n = lr.size

    def g(x, i):
        return lr[i] + c[i] * cal.omega_unchecked(x) - x

    def g_and_slope(x, i):
        return g(x, i), c[i] * cal.omega_prime_unchecked(x) - 1.0

    every = np.arange(n)
    lo = lr.copy()
    turns = cal.omega_prime_extrema
    with np.errstate(over="ignore"):
        if np.isfinite(cal.omega_sup):
            hi = lr + c * cal.omega_sup + 1.0
        else:
            start = np.maximum(lo, turns[-1] if turns.size else lo) + 1.0
            hi, step = start.copy(), np.ones(n)
            for _ in range(2100):
                gv, dv = g_and_slope(hi, every)
                open_ = (gv <= 0) | (dv <= 0)
                if not open_.any():
                    break
                step = np.where(open_, 2.0 * step, step)
                hi = np.where(open_, start + step, hi)
    crit = roots._critical_points(cal, 1.0 / c)
    knots = np.concatenate([lo[:, None], turns[None, :].repeat(n, 0), crit, hi[:, None]], axis=1)
    knots = np.where((knots >= lo[:, None]) & (knots <= hi[:, None]), knots, np.nan)
    knots = np.sort(knots, axis=1)
    ok = ~np.isnan(knots)
    g_knots = np.full(knots.shape, np.nan)
    g_knots[ok] = g(knots[ok], np.broadcast_to(every[:, None], knots.shape)[ok])
    left, right = g_knots[:, :-1], g_knots[:, 1:]
    has = (np.sign(left) * np.sign(right) < 0) | ((right == 0) & (knots[:, 1:] > knots[:, :-1]))
    out = np.full(left.shape, np.nan)
    if has.any():
        rows, js = np.nonzero(has)
        out[rows, js] = legacy_newton_bracketed(
            lambda x, i: g_and_slope(x, rows[i]),
            knots[rows, js], knots[rows, js + 1], left[rows, js], right[rows, js])
    return out


def legacy_scan_roots(g, lo_end, hi_end, n_grid):
    """theory.roots.scan_roots as it was: bisection of every bracket to adjacent floats."""
    n = lo_end.shape[0]
    a0, a1 = np.arcsinh(lo_end)[:, None], np.arcsinh(hi_end)[:, None]
    grid = np.sinh(a0 + (a1 - a0) * np.linspace(0.0, 1.0, n_grid))
    s = np.sign(g(grid, np.arange(n)[:, None]))
    cell, j = np.nonzero(s[:, :-1] * s[:, 1:] < 0)
    left, right, s_left = grid[cell, j], grid[cell, j + 1], s[cell, j]
    for _ in range(2200):
        mid = 0.5 * (left + right)
        active = (mid > left) & (mid < right)
        if not active.any():
            break
        s_mid = np.sign(g(mid, cell))
        left = np.where((s_mid == s_left) & active, mid, left)
        right = np.where((s_mid != s_left) & active, mid, right)
    exact_cell, exact_j = np.nonzero(s == 0)
    cell = np.concatenate([cell, exact_cell])
    found = np.concatenate([0.5 * (left + right), grid[exact_cell, exact_j]])
    order = np.lexsort((found, cell))
    cell, found = cell[order], found[order]
    counts = np.bincount(cell, minlength=n)
    out = np.full((n, int(counts.max()) if counts.size else 0), np.nan)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    out[cell, np.arange(cell.size) - starts[cell]] = found
    return out


def legacy_reverse_kl_policy(ref: np.ndarray, adv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The reverse-KL optimum as it was: 200 bisections on ``lam`` (``b``: shape (..., 1))."""
    support = ref > 0
    top = np.max(np.where(support, adv, -np.inf), axis=-1)
    lo, hi = top.copy(), top + b[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            total = np.sum(np.where(support, b * ref / (mid[..., None] - adv), 0.0), axis=-1)
            above = total > 1.0
            lo = np.where(above, mid, lo)
            hi = np.where(above, hi, mid)
        pi = np.where(support, b * ref / (hi[..., None] - adv), 0.0)
        return pi / pi.sum(axis=-1, keepdims=True)


class _Bisected:
    def __init__(self, x: np.ndarray) -> None:
        self.x = x


def legacy_bisect_80(f, init, *, args=(), tolerances=None):
    """``find_root``'s call signature with trained_loss's former 80 bisections behind it."""
    a, c = (np.array(v, dtype=np.float64) for v in init)
    for _ in range(80):
        mid = 0.5 * (a + c)
        pos = f(mid, *args) > 0
        a, c = np.where(pos, mid, a), np.where(pos, c, mid)
    return _Bisected(0.5 * (a + c))


# ------------------------------------------------------------------------ timing
def _median(function: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _pair(old: Callable[[], object], new: Callable[[], object], repeats: int) -> dict:
    old_s, new_s = _median(old, repeats), _median(new, repeats)
    return {"old_s": round(old_s, 4), "new_s": round(new_s, 4),
            "speedup": round(old_s / new_s, 2)}


def _points_evaluated(function: Callable[[], object]) -> int:
    """Logits at which ``Omega`` or ``Omega'`` were evaluated during ``function()``: a
    machine-independent cost (the timings move with the load of a shared machine)."""
    count = [0]
    originals = {name: getattr(Calibration, name)
                 for name in ("omega_unchecked", "omega_prime_unchecked")}

    def counting(name):
        def wrapper(self, logit_p):
            count[0] += np.size(logit_p)
            return originals[name](self, logit_p)
        return wrapper

    with mock.patch.multiple(Calibration, **{n: counting(n) for n in originals}):
        function()
    return count[0]


def timings(repeats: int) -> dict:
    out = {}
    p_ref = np.linspace(0.01, 0.99, 200)
    beta = np.geomspace(0.01, 100.0, 200)
    lr, b = (a.ravel() for a in np.meshgrid(special.logit(p_ref), beta, indexing="ij"))
    for name, cal in (("paper", Calibration()), ("eps0", Calibration(eps=0.0))):
        old = legacy_fixed_points_flat(lr, 1.0 / b, cal)
        new = roots._fixed_points_flat(lr, 1.0 / b, cal)
        same = np.array_equal(np.isnan(old), np.isnan(new))
        scale = np.maximum(1.0, np.abs(np.where(np.isnan(new), 0.0, new)))
        gap = float(np.nanmax(np.abs(old - new) / scale) / np.finfo(np.float64).eps)
        out[f"fixed_points_200x200_{name}"] = {
            **_pair(lambda cal=cal: legacy_fixed_points_flat(lr, 1.0 / b, cal),
                    lambda cal=cal: roots._fixed_points_flat(lr, 1.0 / b, cal), repeats),
            "old_points": _points_evaluated(
                lambda cal=cal: legacy_fixed_points_flat(lr, 1.0 / b, cal)),
            "new_points": _points_evaluated(
                lambda cal=cal: roots._fixed_points_flat(lr, 1.0 / b, cal)),
            "roots": int(np.sum(~np.isnan(new))), "same_roots_found": bool(same),
            "max_old_new_gap_eps": round(gap, 2)}
    lr2, b2 = np.meshgrid(special.logit(np.linspace(0.02, 0.98, 40)), np.geomspace(0.05, 5, 40),
                          indexing="ij")

    def orbits():
        return regimes.period_two_orbits_logit(lr2, b2, alpha=0.5)

    def orbits_old():
        with mock.patch.object(regimes, "_newton_bracketed", legacy_newton_bracketed):
            return orbits()

    out["period_two_orbits_40x40"] = _pair(orbits_old, orbits, repeats)
    lr3, b3 = np.meshgrid(special.logit(np.linspace(0.05, 0.95, 20)), np.geomspace(0.1, 10, 20),
                          indexing="ij")

    def clip():
        return clipped.clipped_fixed_points_logit(lr3, b3, 0.2)

    def clip_old():
        with mock.patch.object(clipped, "scan_roots", legacy_scan_roots):
            return clip()

    a, c = clip_old(), clip()
    out["clipped_fixed_points_20x20"] = {
        **_pair(clip_old, clip, repeats),
        "max_old_new_gap_eps": round(float(np.nanmax(np.abs(a - c) / np.maximum(1, np.abs(c)))
                                           / np.finfo(np.float64).eps), 2)}
    rng = np.random.default_rng(0)
    ref = rng.dirichlet(np.ones(8), size=(200, 200))
    adv = rng.normal(size=(200, 200, 8))
    bb = np.broadcast_to(np.geomspace(1e-3, 1e3, 200)[None, :], (200, 200))
    out["reverse_kl_policy_200x200x8"] = _pair(
        lambda: legacy_reverse_kl_policy(ref, adv, bb[..., None]),
        lambda: kl_estimators._reverse_kl_policy(ref, adv, bb), repeats)
    lp4, lr4 = (a.ravel() for a in np.meshgrid(np.linspace(-8, 8, 100), np.linspace(-8, 8, 100),
                                               indexing="ij"))

    def rnd():
        return trained_loss.round_step_logit(lp4, lr4, 0.5, estimator="k3")

    def rnd_old():
        with mock.patch("scipy.optimize.elementwise.find_root", legacy_bisect_80):
            return rnd()

    a, c = rnd_old(), rnd()
    out["round_step_100x100_k3"] = {
        **_pair(rnd_old, rnd, repeats),
        "max_old_new_gap_eps": round(float(np.max(np.abs(a - c) / np.maximum(1, np.abs(c)))
                                           / np.finfo(np.float64).eps), 2)}
    return out


# ------------------------------------------------------------------------ errors
def _test_module():
    path = Path(__file__).resolve().parents[1] / "tests" / "theory" / "test_root_finders.py"
    spec = importlib.util.spec_from_file_location("test_root_finders", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def errors() -> dict:
    import mpmath

    t = _test_module()
    eps = float(np.finfo(np.float64).eps)
    worst = {"old": [0.0, 0.0], "new": [0.0, 0.0]}

    def record(cal, lr, beta, flat_roots, which):
        ratio = t.check_fixed_points(cal, lr, beta, 1.0, flat_roots)
        worst[which][0] = max(worst[which][0], ratio)
        with mpmath.workdps(t.DPS):
            for lr_i, b_i, row in zip(lr, beta, flat_roots, strict=True):
                c = mpmath.mpf(float(1.0 / b_i))
                for x in row[~np.isnan(row)]:
                    ref = t.nearest_root(
                        lambda z, c=c, lr_i=lr_i, cal=cal: (mpmath.mpf(float(lr_i))
                                                            + c * t.omega_mp(cal, z) - z), x)
                    if ref is not None:
                        err = float(abs(mpmath.mpf(float(x)) - ref)) / max(1.0, abs(float(ref)))
                        worst[which][1] = max(worst[which][1], err / eps)

    for cal in t.CALS:
        lr, beta = (a.ravel() for a in np.meshgrid(t.LOGITS, t.BETAS, indexing="ij"))
        record(cal, lr, beta, legacy_fixed_points_flat(lr, 1.0 / beta, cal), "old")
        record(cal, lr, beta, roots._fixed_points_flat(lr, 1.0 / beta, cal), "new")
    for cal in t.CALS[:5]:
        for tangent in (0.5, 3.0, 10.0, 30.0):
            lt = np.array([tangent])
            slope = cal.omega_prime_unchecked(lt)[0]
            lr0 = float(lt[0] - cal.omega_unchecked(lt)[0] / slope)
            curv = np.sign(cal.omega_prime_unchecked(lt * (1 + 1e-6))[0] - slope)
            beta = np.array([slope / (1.0 - curv * d)
                             for d in (0.0, 1e-15, 1e-12, 1e-9, 1e-6, 1e-3)])
            lr = np.full(beta.shape, lr0)
            record(cal, lr, beta, legacy_fixed_points_flat(lr, 1.0 / beta, cal), "old")
            record(cal, lr, beta, roots._fixed_points_flat(lr, 1.0 / beta, cal), "new")
    out = {"fixed_points": {k: {"worst_over_allowance": round(v[0], 3),
                                "worst_eps_units": round(v[1], 1)} for k, v in worst.items()}}
    rel = {"old": 0.0, "new": 0.0}
    cases = [
        (np.array([0.2, 0.3, 0.5]), np.array([1.0, -1.0, 0.0])),
        (np.array([1e-300, 0.5, 0.5 - 1e-300]), np.array([5.0, 0.0, 0.0])),
        (np.array([0.25, 0.25, 0.5]), np.array([1.0, 1.0 - 1e-15, -700.0])),
        (np.array([0.0, 0.4, 0.6]), np.array([100.0, 3.0, 2.0])),
    ]
    for beta in (1e-300, 1e-12, 1e-3, 1.0, 1e3, 1e12, 1e300):
        for ref, adv in cases:
            with mpmath.workdps(t.DPS):
                gaps = t._reverse_kl_gaps_mp(ref, adv, beta)
                want = np.array([float(beta * mpmath.mpf(float(r)) / gap) if r > 0 else 0.0
                                 for r, gap in zip(ref, gaps, strict=True)])
            b = np.array([beta])
            got = {"old": legacy_reverse_kl_policy(ref, adv, b),
                   "new": kl_estimators._reverse_kl_policy(ref, adv, np.array(beta))}
            for k, pi in got.items():
                with np.errstate(invalid="ignore", divide="ignore"):
                    r = np.where(want > 0, np.abs(pi - want) / want, np.abs(pi))
                rel[k] = max(rel[k], float(np.max(np.where(np.isnan(r), np.inf, r))))
    out["reverse_kl_policy_worst_relative_error"] = rel
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-errors", action="store_true")
    args = parser.parse_args()
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    result = {"timings": timings(args.repeats)}
    if not args.no_errors:
        result["errors"] = errors()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
