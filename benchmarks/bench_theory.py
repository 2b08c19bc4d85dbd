"""Benchmark grpo_companion.theory on one core; prints a JSON dict of figures.

Run: ``python benchmarks/bench_theory.py``. Targets: every fixed point of a
1000 x 1000 (p_ref, beta) grid in <= 5 s; 10^6 cells iterated 100 steps in <= 3 s.
Per-cell Python loops are timed on a 2000-cell subsample and extrapolated.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from scipy import optimize  # noqa: E402

from grpo_companion import theory  # noqa: E402

EPS = 1e-5
N_SIDE = 1000
N_SUB = 2000
N_STEPS = 100


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _loop_fixed_points(l_ref: float, beta: float) -> list[float]:
    """Straightforward per-cell search: scan g on a grid, then brentq on each sign change."""
    def g(x: float) -> float:
        e = math.exp(-abs(x))
        return l_ref + 1.0 / (beta * math.sqrt(e / (1 + e) ** 2 + EPS)) - x

    hi = l_ref + 1.0 / (beta * math.sqrt(EPS)) + 1.0
    grid = np.concatenate([np.linspace(l_ref, hi, 2000), np.linspace(-40, 40, 2000)])
    grid = np.sort(grid[(grid >= l_ref) & (grid <= hi)])
    vals = [g(x) for x in grid]
    return [optimize.brentq(g, grid[k], grid[k + 1]) for k in range(len(grid) - 1)
            if vals[k] * vals[k + 1] < 0]


def _loop_iterate(l0: float, l_ref: float, beta: float) -> float:
    x = l0
    for _ in range(N_STEPS):
        e = math.exp(-abs(x))
        x = l_ref + 1.0 / (beta * math.sqrt(e / (1 + e) ** 2 + EPS))
    return x


def main() -> dict[str, float]:
    p_ref = np.linspace(0.0005, 0.9995, N_SIDE)
    beta = np.logspace(-2, 2, N_SIDE)
    theory.fixed_points(0.3, 1.0, eps=EPS)  # build the calibration's cached tables

    t_fp, roots = _timed(lambda: theory.fixed_points(p_ref[:, None], beta[None, :], eps=EPS))
    counts = np.bincount(np.sum(~np.isnan(roots), axis=-1).ravel(), minlength=4)

    rng = np.random.default_rng(0)
    cells = rng.integers(0, N_SIDE, size=(N_SUB, 2))
    l_ref_sub = np.log(p_ref[cells[:, 0]] / (1 - p_ref[cells[:, 0]]))
    beta_sub = beta[cells[:, 1]]
    t_fp_loop, loop_roots = _timed(
        lambda: [_loop_fixed_points(lr, b) for lr, b in zip(l_ref_sub, beta_sub, strict=True)])
    vec_sub = theory.fixed_points_logit(l_ref_sub, beta_sub, eps=EPS)
    agree = np.mean([len(r) == int(np.sum(~np.isnan(v))) for r, v in zip(loop_roots, vec_sub,
                                                                        strict=True)])

    l_grid = np.log(p_ref / (1 - p_ref))[:, None]
    t_it_final, _ = _timed(lambda: theory.iterate_logit(l_grid, l_grid, beta[None, :], N_STEPS,
                                                        keep_path=False, eps=EPS))
    t_it_path, _ = _timed(lambda: theory.iterate(p_ref[:, None], p_ref[:, None], beta[None, :],
                                                 N_STEPS, eps=EPS))
    t_it_loop, _ = _timed(lambda: [_loop_iterate(lr, lr, b)
                                   for lr, b in zip(l_ref_sub, beta_sub, strict=True)])

    scale = N_SIDE * N_SIDE / N_SUB
    return {
        "cells": N_SIDE * N_SIDE,
        "eps": EPS,
        "fixed_points_grid_s": round(t_fp, 3),
        "fixed_points_cells_with_1_2_3_roots": [int(c) for c in counts[1:4]],
        "fixed_points_loop_extrapolated_s": round(t_fp_loop * scale, 1),
        "fixed_points_speedup": round(t_fp_loop * scale / t_fp, 1),
        "fixed_points_count_agreement_with_loop": float(agree),
        "iterate_100_steps_final_only_s": round(t_it_final, 3),
        "iterate_100_steps_full_path_s": round(t_it_path, 3),
        "iterate_loop_extrapolated_s": round(t_it_loop * scale, 1),
        "iterate_speedup_final_only": round(t_it_loop * scale / t_it_final, 1),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
