"""Table 1 of the paper (p. 13) as data, with a numerical check of every row.

Each row is a :class:`Table1Row` holding a :class:`~grpo_companion.theory.Variant`:
a calibration (mean + variance whitening or mean only) and an anchor, whose
reference share ``alpha`` of the KL penalty is 1 (KL to ``pi_ref``), 0 (mirror,
KL to the previous policy) or in between (two-KL). The
paper's fixed-point / stability claim for the row is stored with it.

:func:`check_table1` checks every row twice:

1. **Recurrence.** GRPO iterations are run in policy space on a random
   finite outcome space with the closed-form optimum
   (:func:`~grpo_companion.theory.policy_iterate`), and the PoS of each
   iterate is compared with the scalar recurrence
   (:func:`~grpo_companion.theory.iterate`), both one step at a time and along
   whole trajectories. For two-KL rows the Renyi correction of eq. (23) is
   also checked: it vanishes along ``pi_0 = pi_ref`` and, from another
   ``pi_0``, the first step matches the recurrence only with it included.
2. **Claim.** The row's fixed-point and stability statement is tested on a
   ``(p_ref, beta)`` grid. The verdict is ``"pass"``, ``"fail"`` or
   ``"corrected"`` (part of the claim fails and the record states the
   corrected version).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import special

from grpo_companion.validation import check_beta, check_count, check_memory, check_real, check_seed

from ..calibration import Calibration
from ..dynamics import iterate, iterate_logit, pos_map_derivative, pos_map_logit_derivative
from ..logistic import logit
from ..policies import policy_iterate, pos, renyi_correction
from ..regimes import Regime, classify_dynamics
from ..roots import fixed_points_logit
from ..variants import Anchor, Variant

__all__ = ["RowCheck", "Table1Row", "check_table1", "max_lemma1_bound", "variants"]


@dataclass(frozen=True)
class Table1Row:
    """One row of Table 1: a :class:`~grpo_companion.theory.Variant` and the paper's claim.

    Attributes
    ----------
    key : str
        Short identifier (``"grpo"``, ``"dr_grpo"``, ``"mirror"``, ``"mirror_dr"``,
        ``"two_kl"``, ``"two_kl_mean"``).
    method : str
        The row's name in the paper.
    variant : Variant
        Its calibration and anchor (the same object the trainer takes).
    recurrence : str
        The logit recurrence (LaTeX), with ``Delta_R = 0`` along ``pi_0 = pi_ref``.
    claim : str
        The paper's fixed-point / stability claim, paraphrased.
    """

    key: str
    method: str
    variant: Variant
    recurrence: str
    claim: str

    @property
    def calibration(self) -> Calibration:
        """The row's calibration."""
        return self.variant.calibration

    @property
    def alpha(self) -> float:
        """Reference share of the KL penalty (the anchor's ``alpha``)."""
        return self.variant.alpha


def variants(eps: float = 1e-5, alpha_two_kl: float = 0.5) -> tuple[Table1Row, ...]:
    """The six rows of Table 1, in the paper's order."""
    alpha_two_kl = float(check_real("alpha_two_kl", alpha_two_kl, 0.0, 1.0, open_low=True,
                                    open_high=True, scalar=True))
    std = Calibration("mean_std", eps)
    mean = Calibration("mean_only")
    a = float(alpha_two_kl)
    return (
        Table1Row("grpo", "GRPO, no clip (mean-var)", Variant(std, Anchor.reference()),
                r"L_n = L_{\mathrm{ref}} + \Omega_\varepsilon(p_{n-1})/\beta",
                r"implicit fixed point "
                r"$p^\star = \sigma(L_{\mathrm{ref}} + \Omega(p^\star)/\beta)$; "
                r"converges if $\sup_p \lvert h'(p)\rvert < 1$"),
        Table1Row("dr_grpo", "Dr. GRPO, no clip (mean-only)", Variant(mean, Anchor.reference()),
                r"L_n = L_{\mathrm{ref}} + 1/\beta",
                r"$p^\star = \sigma(L_{\mathrm{ref}} + 1/\beta)$, reached in one step; "
                "trivially stable"),
        Table1Row("mirror", "Mirror GRPO (mean-var)", Variant(std, Anchor.mirror()),
                r"L_n = L_{n-1} + \Omega_\varepsilon(p_{n-1})/\beta",
                "no interior fixed point; $p_n$ increases to 1 (global); 0 absorbing only "
                "without success support"),
        Table1Row("mirror_dr", "Mirror Dr. GRPO (mean-only)", Variant(mean, Anchor.mirror()),
                r"L_n = L_{n-1} + 1/\beta",
                r"no interior fixed point; $L_n = L_{\mathrm{ref}} + n/\beta$, "
                "$p_n$ increases to 1"),
        Table1Row("two_kl", "Two-KL, mean+var", Variant(std, Anchor.two_kl(a)),
                r"L_n = \alpha L_{\mathrm{ref}} + (1-\alpha) L_{n-1} + \Delta_R"
                r" + \Omega_\varepsilon(p_{n-1})/\beta",
                r"$L^\star = L_{\mathrm{ref}} + \Delta_R^\star/\alpha"
                r" + \Omega(p^\star)/(\alpha\beta)$; affine contraction in log-odds if "
                r"$\Delta_R$ bounded; monotonicity not guaranteed"),
        Table1Row("two_kl_mean", "Two-KL, mean only", Variant(mean, Anchor.two_kl(a)),
                r"L_n = \alpha L_{\mathrm{ref}} + (1-\alpha) L_{n-1} + \Delta_R + 1/\beta",
                r"unique $L^\star = L_{\mathrm{ref}} + \Delta_R^\star/\alpha + 1/(\alpha\beta)$;"
                r" contraction in log-odds with rate $1 - \alpha$; $p^\star > p_{\mathrm{ref}}$"
                r" if $\Delta_R^\star + 1/\beta > 0$"),
    )


@dataclass(frozen=True)
class RowCheck:
    """Result of checking one row of Table 1.

    Attributes
    ----------
    variant : Table1Row
    recurrence_error : float
        Largest ``|PoS(pi_n) - h(PoS(pi_{n-1}))|`` over prompts, betas and steps
        (policy closed form against the scalar map, one step at a time).
    trajectory_error : float
        Largest ``|PoS(pi_n) - p_n|`` along whole trajectories from ``pi_ref``
        (non-chaotic parameters only, so that rounding is not amplified).
    renyi_max : float
        Largest ``|Delta_R|`` along the policy iterates from ``pi_ref`` (0 expected).
    status : str
        ``"pass"``, ``"fail"`` or ``"corrected"``.
    reason : str
        What was checked, and the correction if any.
    evidence : dict
        The numbers behind the verdict.
    """

    variant: Table1Row
    recurrence_error: float
    trajectory_error: float
    renyi_max: float
    status: str
    reason: str
    evidence: dict[str, float] = field(default_factory=dict)


def max_lemma1_bound(calibration: Calibration) -> float:
    """``max_L |dOmega/dL|``: the largest value of Lemma 1's bound ``B(p*)`` over (0, 1).

    The two-KL map ``L -> alpha L_ref + (1-alpha) L + Omega(L)/beta`` is a
    contraction in log-odds exactly when ``beta > max B / alpha``.
    """
    if not isinstance(calibration, Calibration):
        raise ValueError(f"calibration must be a Calibration, got {calibration!r}")
    ext = calibration.omega_prime_extrema
    grid = np.concatenate([calibration._logit_table, ext])
    return float(np.max(np.abs(calibration.omega_prime_unchecked(grid))))


def _random_problem(
    rng: np.random.Generator, n_prompts: int, n_outcomes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Random reference policies (rows) and a success mask with both classes present."""
    mask = np.zeros(n_outcomes, dtype=bool)
    mask[rng.choice(n_outcomes, size=max(1, n_outcomes // 3), replace=False)] = True
    # spread the PoS of the prompts over several orders of magnitude
    logits = rng.normal(size=(n_prompts, n_outcomes))
    shift = np.linspace(-7.0, 2.0, n_prompts)[:, None]
    logits = logits + np.where(mask, shift, 0.0)
    pi_ref = special.softmax(logits, axis=-1)
    return pi_ref, mask


def _recurrence_errors(
    v: Table1Row, pi_ref: np.ndarray, mask: np.ndarray, betas: np.ndarray, n_steps: int,
    rng: np.random.Generator,
) -> tuple[float, float, float, dict[str, float]]:
    n_p = pi_ref.shape[0]
    ref = np.repeat(pi_ref, betas.size, axis=0)  # (prompts * betas, outcomes)
    beta = np.tile(betas, n_p)
    path = policy_iterate(ref, mask, beta, n_steps, alpha=v.alpha, calibration=v.calibration)
    p_path = pos(path, mask)  # (n_steps + 1, cells)
    p_ref = p_path[0]
    one_step = iterate(p_path[:-1], p_ref[None, :], beta[None, :], 1, alpha=v.alpha,
                       calibration=v.calibration)[1]
    step_err = float(np.max(np.abs(p_path[1:] - one_step)))
    scalar = iterate(p_ref, p_ref, beta, n_steps, alpha=v.alpha, calibration=v.calibration)
    lyap = classify_dynamics(p_ref, p_ref, beta, alpha=v.alpha, n_transient=200,
                             n_measure=200, calibration=v.calibration).lyapunov
    calm = np.isnan(lyap) | (lyap < -1e-3)  # saturated, or clearly contracting
    traj_err = float(np.max(np.abs(p_path - scalar)[:, calm], initial=0.0))
    extra: dict[str, float] = {"trajectory_cells": float(calm.sum()),
                               "policy_cells": float(calm.size)}
    renyi = 0.0
    if 0 < v.alpha < 1:
        mass_s = np.sum(np.where(mask, path, 0.0), axis=-1)
        mass_f = np.sum(np.where(mask, 0.0, path), axis=-1)
        inner = np.all((mass_s > 0) & (mass_f > 0), axis=0)  # cells with both classes
        dr = renyi_correction(ref[None, inner], path[:, inner], mask, v.alpha)
        renyi = float(np.max(np.abs(dr), initial=0.0))
        extra["renyi_cells"] = float(inner.sum())
        # from a pi_0 that is not a reward-class tilt of pi_ref, Delta_R is needed
        pi_0 = special.softmax(rng.normal(size=ref.shape), axis=-1)
        pi_1 = policy_iterate(ref, mask, beta, 1, alpha=v.alpha, pi_0=pi_0,
                              calibration=v.calibration)[1]
        l1 = logit(pos(pi_1, mask))
        p0 = pos(pi_0, mask)
        delta = renyi_correction(ref, pi_0, mask, v.alpha)
        base = iterate_logit(logit(p0), logit(p_ref), beta, 1, alpha=v.alpha,
                             calibration=v.calibration)[1]
        extra["renyi_step_error"] = float(np.max(np.abs(l1 - (base + delta))))
        extra["renyi_step_size"] = float(np.max(np.abs(delta)))
    return step_err, traj_err, renyi, extra


def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    p_ref = np.logspace(-4, np.log10(0.95), n)[:, None]
    beta = np.logspace(-2, 1.5, n)[None, :]
    return p_ref, beta


def _p_grid() -> np.ndarray:
    return np.unique(np.concatenate([special.expit(np.linspace(-35, 35, 1401)),
                                     np.linspace(1e-9, 1 - 1e-9, 1001)]))


def _check_reference(v: Table1Row, n_grid: int) -> tuple[str, str, dict[str, float]]:
    cal = v.calibration
    p_ref, beta = _grid(n_grid)
    lr = logit(p_ref)
    roots = fixed_points_logit(lr, beta, calibration=cal)
    n_fp = np.sum(~np.isnan(roots), axis=-1)
    with np.errstate(invalid="ignore"):
        resid = np.abs(roots - (lr[..., None] + cal.omega_unchecked(roots) / beta[..., None]))
        resid = float(np.nanmax(resid / np.maximum(1.0, np.abs(roots))))
        above = bool(np.all((roots > lr[..., None]) | np.isnan(roots)))
    ev = {"fp_residual": resid, "max_fixed_points": float(n_fp.max()),
          "min_fixed_points": float(n_fp.min())}
    if cal.constant_omega:  # mean-only: Omega is one number c
        c = cal.omega_inf
        p1 = iterate(p_ref, p_ref, beta, 2, calibration=cal)
        star = special.expit(lr + c / beta)
        ev["one_step_error"] = float(np.max(np.abs(p1[1] - star)))
        ev["second_step_change"] = float(np.max(np.abs(p1[2] - p1[1])))
        pg = _p_grid()[1:-1:50]
        ev["max_abs_slope"] = float(np.max(np.abs(pos_map_derivative(
            pg[:, None, None], p_ref, beta, calibration=cal))))
        ok = (ev["one_step_error"] < 1e-12 and ev["second_step_change"] == 0
              and ev["max_abs_slope"] == 0 and n_fp.min() == n_fp.max() == 1 and above)
        reason = (r"$p_1 = \sigma(L_{\mathrm{ref}} + 1/\beta)$ from any start, $p_2 = p_1$ "
                  r"exactly, $h' = 0$: a constant map, so one step and stable")
        return ("pass" if ok else "fail"), reason, ev
    # mean-var reference map: contraction is sufficient for convergence
    pg = _p_grid()[1:-1]
    sup = np.zeros(np.broadcast_shapes(p_ref.shape, beta.shape))
    for chunk in np.array_split(pg, 8):
        d = np.abs(pos_map_derivative(chunk[:, None, None], p_ref, beta, calibration=cal))
        sup = np.maximum(sup, d.max(axis=0))
    contraction = sup < 1
    res = classify_dynamics(p_ref, p_ref, beta, n_transient=400, n_measure=100, calibration=cal)
    unique = n_fp == 1
    target = np.where(unique, roots[..., 0], np.nan)
    hit = (res.regime == Regime.FIXED_POINT) & (
        np.abs(res.final_logit - target) <= 1e-6 * np.maximum(1.0, np.abs(target)))
    converged = res.regime == Regime.FIXED_POINT
    ev.update({
        "contraction_cells": float(contraction.sum()), "cells": float(contraction.size),
        "contraction_not_converging": float(np.sum(contraction & ~(unique & hit))),
        "converging_cells": float(converged.sum()),
    })
    ok = (contraction.any() and ev["contraction_not_converging"] == 0 and above
          and resid < 1e-9)
    reason = (r"fixed points solve the implicit equation and exceed $p_{\mathrm{ref}}$; "
              r"wherever $\sup \lvert h'\rvert < 1$ the orbit converges to the unique fixed "
              "point (a sufficient condition only: many more cells converge)")
    return ("pass" if ok else "fail"), reason, ev


def _check_mirror(v: Table1Row, n_grid: int) -> tuple[str, str, dict[str, float]]:
    cal = v.calibration
    p_ref, beta = _grid(n_grid)
    roots = fixed_points_logit(logit(p_ref), beta, alpha=0.0, calibration=cal)
    path = iterate_logit(logit(p_ref), logit(p_ref), beta, 40, alpha=0.0, calibration=cal)
    with np.errstate(invalid="ignore"):
        inc = np.diff(path, axis=0)
        min_inc = float(np.nanmin(np.where(np.isfinite(inc), inc, np.nan)))
    res = classify_dynamics(p_ref, p_ref, beta, alpha=0.0, n_transient=50, n_measure=10,
                            calibration=cal)
    zero = iterate(0.0, 0.0, 1.0, 10, alpha=0.0, calibration=cal)
    ev = {"interior_fixed_points": float(np.sum(~np.isnan(roots))),
          "min_logit_increment": min_inc,
          "bound_omega_inf_over_beta_max": float(cal.omega_inf / beta.max()),
          "share_saturating": float(np.mean(res.regime == Regime.SATURATES)),
          "p_from_zero_max": float(zero.max())}
    ok = (ev["interior_fixed_points"] == 0 and min_inc > 0 and ev["share_saturating"] == 1
          and ev["p_from_zero_max"] == 0)
    if cal.constant_omega:
        n = np.arange(path.shape[0]).reshape(-1, 1, 1)
        arith = np.abs(path - (logit(p_ref) + n * cal.omega_inf / beta))
        ev["arithmetic_error"] = float(np.max(arith / np.maximum(1.0, np.abs(path))))
        ok = ok and ev["arithmetic_error"] < 1e-12
        reason = (r"$L_n = L_{\mathrm{ref}} + n/\beta$ exactly; no interior fixed point; "
                  "$p_n$ increases to 1")
    else:
        reason = (r"no interior fixed point; every logit step is "
                  r"$\ge \Omega_\infty/\beta > 0$, so $p_n$ increases to 1; "
                  r"$p_{\mathrm{ref}} = 0$ stays at 0")
    return ("pass" if ok else "fail"), reason, ev


def _check_two_kl(v: Table1Row, n_grid: int) -> tuple[str, str, dict[str, float]]:
    cal, a = v.calibration, v.alpha
    p_ref, beta = _grid(n_grid)
    lr = logit(p_ref)
    roots = fixed_points_logit(lr, beta, alpha=a, calibration=cal)
    ref_roots = fixed_points_logit(lr, a * beta, calibration=cal)
    same = roots.shape == ref_roots.shape and bool(np.all(
        (np.isnan(roots) & np.isnan(ref_roots))
        | (np.abs(roots - ref_roots) <= 1e-9 * np.maximum(1.0, np.abs(roots)))))
    with np.errstate(invalid="ignore"):
        slope = np.abs(pos_map_logit_derivative(np.nan_to_num(roots), beta[..., None],
                                                alpha=a, calibration=cal))
    slope = np.where(np.isnan(roots), np.nan, slope)
    n_fp = np.sum(~np.isnan(roots), axis=-1)
    path = iterate_logit(lr, lr, beta, 60, alpha=a, calibration=cal)
    steps = np.diff(path, axis=0)
    non_monotone = np.any(steps > 1e-12, axis=0) & np.any(steps < -1e-12, axis=0)
    ev = {"fp_equal_reference_at_alpha_beta": float(same),
          "max_fixed_points": float(n_fp.max()),
          "max_fp_slope": float(np.nanmax(slope)),
          "cells_unstable_fp": float(np.sum(np.nanmax(slope, axis=-1) >= 1)),
          "cells_non_monotone": float(non_monotone.sum()), "cells": float(n_fp.size)}
    if cal.constant_omega:
        star = lr + cal.omega_inf / (a * beta)
        n = np.arange(path.shape[0]).reshape(-1, 1, 1)
        geo = np.abs((path - star) - (1 - a) ** n * (lr - star))
        ev["geometric_rate_error"] = float(np.max(geo))
        ev["fp_formula_error"] = float(np.nanmax(np.abs(roots[..., 0] - star)))
        ok = (same and n_fp.min() == n_fp.max() == 1 and ev["geometric_rate_error"] < 1e-9
              and ev["fp_formula_error"] < 1e-9 and bool(np.all(star > lr)))
        reason = (r"unique $L^\star = L_{\mathrm{ref}} + 1/(\alpha\beta) > L_{\mathrm{ref}}$; "
                  r"$L_n - L^\star = (1-\alpha)^n (L_0 - L^\star)$ exactly")
        return ("pass" if ok else "fail"), reason, ev
    bound = max_lemma1_bound(cal)
    # corrected claim: contraction in log-odds iff beta > max B / alpha
    b_hi, b_lo = 1.02 * bound / a, 0.98 * bound / a
    grid_l = cal._logit_table
    sup_hi = float(np.max(np.abs(pos_map_logit_derivative(grid_l, b_hi, alpha=a,
                                                          calibration=cal))))
    sup_lo = float(np.max(np.abs(pos_map_logit_derivative(grid_l, b_lo, alpha=a,
                                                          calibration=cal))))
    ev.update({"max_B": bound, "beta_contraction": bound / a, "sup_slope_above": sup_hi,
               "sup_slope_below": sup_lo})
    fp_ok = same
    claim_false = ev["cells_unstable_fp"] > 0 or n_fp.max() > 1
    corrected_ok = sup_hi < 1 < sup_lo
    if fp_ok and claim_false and corrected_ok:
        return ("corrected",
                r"fixed points are those of the reference map at $\alpha\beta$ "
                r"($\Delta_R^\star = 0$), but the map is not a contraction in general: up to "
                r"three fixed points, slopes $(1-\alpha) + \Omega'(L^\star)/\beta$ above 1; it "
                r"contracts in log-odds iff $\beta > \max_p B(p)/\alpha$", ev)
    ok = fp_ok and not claim_false
    return ("pass" if ok else "fail"), "fixed points and contraction on the grid", ev


def _check_betas(betas: object) -> np.ndarray:
    if betas is None or isinstance(betas, str | bytes) or np.ndim(betas) != 1:
        raise ValueError(f"betas must be a non-empty sequence of numbers > 0, got {betas!r}")
    values = check_beta(betas, "betas")
    if values.size == 0:
        raise ValueError(f"betas must be a non-empty sequence of numbers > 0, got {betas!r}")
    return values


def check_table1(
    *,
    eps: float = 1e-5,
    alpha_two_kl: float = 0.5,
    betas: tuple[float, ...] = (0.3, 1.0, 3.0, 10.0),
    n_prompts: int = 6,
    n_outcomes: int = 9,
    n_steps: int = 25,
    n_grid: int = 24,
    seed: int = 0,
) -> list[RowCheck]:
    """Check the six rows of Table 1 (see the module docstring); one record per row."""
    the_variants = variants(eps, alpha_two_kl)
    beta_values = _check_betas(betas)
    n_prompts = check_count("n_prompts", n_prompts, 1)
    n_outcomes = check_count("n_outcomes", n_outcomes, 2)
    n_steps = check_count("n_steps", n_steps, 1)
    n_grid = check_count("n_grid", n_grid, 2)
    check_memory("n_grid", n_grid, 8.0 * 64 * n_grid**2, "the (p_ref, beta) grid")
    check_memory("n_steps", n_steps, 8.0 * (n_steps + 1) * n_prompts * n_outcomes
                 * len(beta_values), "the policy paths")
    seed = check_seed("seed", seed)
    rng = np.random.default_rng(seed)
    pi_ref, mask = _random_problem(rng, n_prompts, n_outcomes)
    out = []
    for v in the_variants:
        step_err, traj_err, renyi, extra = _recurrence_errors(
            v, pi_ref, mask, beta_values, n_steps, rng)
        if v.alpha == 1:
            status, reason, ev = _check_reference(v, n_grid)
        elif v.alpha == 0:
            status, reason, ev = _check_mirror(v, n_grid)
        else:
            status, reason, ev = _check_two_kl(v, n_grid)
        ev.update(extra)
        out.append(RowCheck(v, step_err, traj_err, renyi, status, reason, ev))
    return out
