"""The PoS recurrence of the loss a sampled run actually trains (chapter 8).

The paper's recurrence (Theorem 2) describes GRPO with the exact KL penalty
``KL(pi || pi_ref)``, each iteration solved exactly. A sampled run differs in
three ways that chapter 7 measures on the bandit:

- **the KL estimator** decides which divergence the expected gradient
  penalises at ``pi = pi_old`` (``kl_estimators.ESTIMATOR_TARGETS``):
  ``k2`` and ``k3_ratio`` the forward KL, plain ``k3`` the reverse KL
  ``KL(pi_ref || pi)``. Only for ``k3_ratio`` is the expected penalty of a
  round the divergence itself as a function of ``pi``; for ``k3`` and ``k2``
  the samples come from ``pi_old`` and the two share their value's gradient at
  ``pi_old`` only. So the *divergence step* (:func:`exact_step_logit`: the
  Gibbs tilt of Theorem 2 for the forward KL, or
  :func:`~grpo_companion.theory.kl_estimators.reverse_kl_policy` for the
  reverse KL, whose fixed points solve ``p (1 - p) Omega(p) = beta (p - p_ref)``)
  has the fixed points of the trained loss and its on-policy gradient, but is
  the optimum of one round for ``k3_ratio`` alone. The optimum of one round of
  the sampled loss is :func:`round_step_logit` (plain ``k3`` from ``p_ref =
  0.3`` at ``beta = 1``, ``G = 8``, TRL's calibration: 0.62 against the reverse-KL
  step's 0.69);
- **the group size** gives the expected weights of a group of ``G``
  (``Calibration(group_size=G)``, Section 3 of the paper);
- **mu optimiser steps** (with clipping) take a fraction of a step, which no
  theorem gives.

So the prediction here is the *relaxed* recurrence of the trained objective,

    L_n = (1 - lam) L_{n-1} + lam logit T(p_{n-1}),

with ``T`` the divergence step (:func:`exact_step_logit`) and ``lam`` in
``(0, 1]`` fitted (:func:`fit_step_fraction`). For the forward KL this is
chapter 8's relaxed recurrence (the two-KL recurrence of Theorem 9 with share
``lam`` and weight ``beta / lam``); for every estimator its fixed points are
those of ``T`` (and of the solved rounds), whatever ``lam``. Clipping enters
only through ``lam``.

Chapter 8 judges the prediction against prompt-blind baselines fitted on other
prompts (:func:`prompt_blind_predictions`: no change, a common shift, the mean
trajectory, and one level approached at one rate), with a flexible kernel
regression on ``(p_ref, beta)`` as a reference (:func:`kernel_reference`), and
follows prompts whose groups hold no success with
:func:`signal_delayed_path_logit`.

:func:`one_step_tv` measures how far a parametric policy is, after one
iteration, from the tabular policy that a step ``T`` reaches from the same
previous policy: a one-step analog of Theorem 10's ``delta_n``, which the
paper defines against the exact orbit started at ``pi_ref``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, special

from grpo_companion.validation import (
    broadcast,
    check_beta,
    check_count,
    check_interval,
    check_memory,
    check_real,
    check_seed,
)

from ..calibration import Calibration, resolve_calibration
from ..dynamics import pos_map_logit
from ..kl_estimators import ESTIMATOR_TARGETS, _reverse_kl_policy, reverse_kl_fixed_points
from ..logistic import logit, sigmoid
from ..roots import fixed_points

__all__ = [
    "PROMPT_BLIND",
    "STEPS",
    "Verdict",
    "common_shift",
    "destination",
    "destination_crossing",
    "exact_step_logit",
    "fit_relaxation",
    "fit_step_fraction",
    "judge",
    "kernel_reference",
    "mean_trajectory",
    "one_step_tv",
    "predictor_paths",
    "prompt_blind_predictions",
    "relaxation_path_logit",
    "relaxed_path_logit",
    "round_step_logit",
    "signal_delayed_path_logit",
    "split_prompts",
]

#: Success logits are kept within this range: beyond it the PoS is 0 or 1 in float64 terms.
_LOGIT_CAP = 700.0


def _check_estimator(estimator: object) -> str:
    known = tuple(k for k, v in ESTIMATOR_TARGETS.items() if v in ("forward", "reverse"))
    if estimator not in known:
        raise ValueError(f"estimator must be one of {known} (an estimator whose expected "
                         f"gradient penalises a KL, so that there is a fixed point), "
                         f"got {estimator!r}")
    return str(estimator)


def _check_logits(name: str, value: ArrayLike) -> np.ndarray:
    x = np.asarray(check_real(name, value), dtype=np.float64)
    return np.clip(x, -_LOGIT_CAP, _LOGIT_CAP)


def _step(lp: np.ndarray, lr: np.ndarray, b: np.ndarray, target: str,
          cal: Calibration) -> np.ndarray:
    if target == "forward":
        return pos_map_logit(lp, lr, b, calibration=cal)
    w_plus, w_minus = cal.weights_of_logit(lp)
    ref = np.stack([sigmoid(lr), sigmoid(-lr)], axis=-1)
    adv = np.stack([w_plus, -w_minus], axis=-1)
    pi = _reverse_kl_policy(ref, adv, b)
    with np.errstate(divide="ignore"):
        return np.log(pi[..., 0]) - np.log(pi[..., 1])


def _step_inputs(logit_p: ArrayLike, logit_p_ref: ArrayLike, beta: ArrayLike,
                 calibration: Calibration | None, calibration_kwargs: dict[str, Any]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Calibration]:
    """The checked, broadcast ``(L_old, L_ref, beta)`` and calibration of a one-step map."""
    lp = _check_logits("logit_p", logit_p)
    lr = _check_logits("logit_p_ref", logit_p_ref)
    b = check_beta(beta)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lp, lr, b = broadcast(logit_p=lp, logit_p_ref=lr, beta=b)
    return lp, lr, b, cal


def exact_step_logit(
    logit_p: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    estimator: str = "k3_ratio",
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Success logit of the divergence step of one GRPO iteration from PoS ``sigmoid(logit_p)``.

    The step maximises ``E_pi[A] - beta D(pi)`` with the calibrated advantage
    ``+w+`` / ``-w-`` at the previous PoS and ``D`` the divergence that
    ``estimator``'s expected gradient penalises at ``pi_old``: the forward KL
    (Theorem 2's map ``h``, in logits ``L_ref + Omega / beta``) or the reverse KL
    (:func:`~grpo_companion.theory.kl_estimators.reverse_kl_pos`). In both the
    failures keep ``pi_ref``'s relative probabilities, so the PoS is the whole
    of the step. It has the trained loss's fixed points and on-policy
    gradient; it is the optimum of one round of the sampled loss for
    ``k3_ratio`` (and the exact KL) only, :func:`round_step_logit` otherwise.
    """
    target = ESTIMATOR_TARGETS[_check_estimator(estimator)]
    lp, lr, b, cal = _step_inputs(logit_p, logit_p_ref, beta, calibration, calibration_kwargs)
    return np.clip(_step(lp, lr, b, target, cal), -_LOGIT_CAP, _LOGIT_CAP)


#: The one-step maps a relaxed recurrence can take (:func:`relaxed_path_logit`).
STEPS = ("divergence", "round")


def _check_step(step: object) -> str:
    if not isinstance(step, str) or step not in STEPS:
        raise ValueError(f"step must be one of {STEPS} ('divergence': exact_step_logit, "
                         f"'round': round_step_logit), got {step!r}")
    return step


def _path_beta(beta: ArrayLike, lr: np.ndarray) -> np.ndarray:
    """``beta`` (a number, or one per prompt) broadcast to the prompts ``lr``."""
    b = check_beta(beta)
    return broadcast(logit_p_ref=lr, beta=b)[1]


def relaxed_path_logit(
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    n_steps: int,
    step_fraction: float,
    *,
    estimator: str = "k3_ratio",
    step: str = "divergence",
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Success logits ``(n_steps + 1, ...)`` of the relaxed recurrence from ``L_0 = L_ref``.

    ``L_n = (1 - lam) L_{n-1} + lam logit T(p_{n-1})`` with ``lam = step_fraction``
    and ``T`` the divergence step (:func:`exact_step_logit`, ``step="divergence"``)
    or the optimum of one round of the sampled loss (:func:`round_step_logit`,
    ``step="round"``; the two share their fixed points and differ in pace for
    ``k3``). ``beta`` is a number or one KL weight per prompt (broadcast against
    ``logit_p_ref``). ``lam = 1`` is the exact recurrence of the trained objective.
    """
    est = _check_estimator(estimator)
    how = _check_step(step)
    lr = _check_logits("logit_p_ref", logit_p_ref)
    steps = check_count("n_steps", n_steps)
    lam = float(check_real("step_fraction", step_fraction, 0.0, 1.0, open_low=True,
                           scalar=True))
    b = _path_beta(beta, lr)
    lr = np.broadcast_to(lr, b.shape)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    target = ESTIMATOR_TARGETS[est]
    check_memory("n_steps", steps, 8.0 * (steps + 1) * max(lr.size, 1), "the path")
    out = np.empty((steps + 1, *lr.shape))
    out[0] = current = lr
    for n in range(1, steps + 1):
        nxt = (_step(current, lr, b, target, cal) if how == "divergence"
               else _round_step(current, lr, b, est, cal))
        current = (1 - lam) * current + lam * np.clip(nxt, -_LOGIT_CAP, _LOGIT_CAP)
        out[n] = current
    return out


def signal_delayed_path_logit(
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    n_steps: int,
    step_fraction: float,
    first_signal: ArrayLike,
    *,
    estimator: str = "k3_ratio",
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """The relaxed recurrence of a prompt that gets no signal before iteration ``first_signal``.

    A group of ``G`` samples that are all failures (or all successes) has zero
    advantage, so the sampled loss of that iteration moves the prompt only by
    its KL term, which vanishes at ``pi = pi_ref`` (Section 3's finite-group
    weights are expectations over groups; a prompt with ``p`` near 0 draws a
    group with a success with probability about ``G p``). The tabular
    prediction for one run is then: ``L_n = L_ref`` for ``n < first_signal``,
    and from iteration ``first_signal`` on the relaxed recurrence
    (:func:`relaxed_path_logit`) started at ``L_ref``. ``first_signal`` holds
    one iteration ``>= 1`` per prompt; a value above ``n_steps`` means no
    signal in the run (the prompt stays at ``L_ref``).
    """
    lr = _check_logits("logit_p_ref", logit_p_ref)
    b = check_beta(beta)
    steps = check_count("n_steps", n_steps)
    first = np.asarray(check_real("first_signal", first_signal, 1.0), dtype=np.float64)
    if np.any(first != np.round(first)):
        raise ValueError(f"first_signal must hold whole iterations >= 1, got {first_signal!r}")
    lr, b, first = broadcast(logit_p_ref=lr, beta=b, first_signal=first)
    path = relaxed_path_logit(lr, b, steps, step_fraction, estimator=estimator,
                              calibration=resolve_calibration(calibration,
                                                              **calibration_kwargs))
    n = np.arange(steps + 1).reshape(-1, *([1] * lr.ndim))
    moved = np.clip(n - first + 1, 0, steps).astype(np.int64)  # steps taken by iteration n
    return np.take_along_axis(path, np.broadcast_to(moved, path.shape), axis=0)


def destination(
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    estimator: str = "k3_ratio",
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """The fixed point a small-step run from ``p_ref`` settles at: the first one at or above it.

    The one-step map amplifies (``T(p_ref) > p_ref``, Theorem 3 for the
    forward KL; the reverse-KL map likewise), and small relaxed steps move
    monotonically, so the run stops at the smallest fixed point ``>= p_ref``.
    ``p_ref`` in {0, 1} stays (absorbing).
    """
    est = _check_estimator(estimator)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    pr = np.asarray(check_real("p_ref", p_ref, 0.0, 1.0), dtype=np.float64)
    b = check_beta(beta)
    pr, b = broadcast(p_ref=pr, beta=b)
    out = pr.copy()
    live = (pr > 0.0) & (pr < 1.0)
    if not live.any():
        return out
    if ESTIMATOR_TARGETS[est] == "forward":
        roots = np.asarray(fixed_points(pr[live], b[live], calibration=cal), dtype=np.float64)
    else:
        roots = np.asarray(reverse_kl_fixed_points(pr[live], b[live], calibration=cal),
                           dtype=np.float64)
    roots = roots.reshape(int(live.sum()), -1)
    above = np.where(np.isfinite(roots) & (roots >= pr[live][:, None]), roots, np.inf)
    first = above.min(axis=1)
    out[live] = np.where(np.isfinite(first), first, 1.0)
    return out


def destination_crossing(
    level: float,
    beta: float,
    log10_bracket: tuple[float, float],
    *,
    estimator: str = "k3_ratio",
    xtol: float = 1e-9,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> float:
    """``log10 p_ref`` at which :func:`destination` crosses ``level``, bisected in ``log10 p_ref``.

    The destination of a small-step run jumps where a lower fixed point appears or
    disappears (for the forward KL near ``p_ref = 1e-9`` at chapter 8's settings), so the
    crossing is found by bisection on ``log10 p_ref`` in ``log10_bracket = (lo, hi)``, to
    ``xtol`` decades, not from a derivative. ``level`` is in (0, 1), ``beta > 0`` one
    number; the destination must lie on opposite sides of ``level`` at the two ends.
    Returns the ``log10 p_ref`` of the crossing (``scipy.optimize.bisect``).
    """
    lvl = float(check_real("level", level, 0.0, 1.0, open_low=True, open_high=True,
                           scalar=True))
    check_real("beta", beta, 0.0, open_low=True, scalar=True)
    lo, hi = check_interval("log10_bracket", log10_bracket, -300.0, 0.0)
    tol = float(check_real("xtol", xtol, 0.0, open_low=True, scalar=True))
    est = _check_estimator(estimator)
    cal = resolve_calibration(calibration, **calibration_kwargs)

    def gap(x: float) -> float:
        return float(destination(np.array([10.0 ** x]), beta, estimator=est,
                                 calibration=cal)[0]) - lvl

    if np.sign(gap(lo)) == np.sign(gap(hi)):
        raise ValueError(f"log10_bracket must hold a crossing of level {lvl:g}: the destination "
                         f"is on one side of it at both ends ({lo:g}, {hi:g})")
    return float(optimize.bisect(gap, lo, hi, xtol=tol))


def split_prompts(n_prompts: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random split of ``range(n_prompts)`` into fit and judge halves, each sorted.

    The fit half gets ``n_prompts // 2`` indices (a ``numpy.random.default_rng(seed)``
    permutation); it is used only to fit, the other half only to judge.
    """
    n = check_count("n_prompts", n_prompts, 2)
    order = np.random.default_rng(check_seed("seed", seed)).permutation(n)
    return np.sort(order[: n // 2]), np.sort(order[n // 2:])


def fit_step_fraction(
    logit_success: ArrayLike,
    steps: ArrayLike,
    beta: ArrayLike,
    *,
    estimator: str = "k3_ratio",
    step: str = "divergence",
    bounds: tuple[float, float] = (1e-4, 1.0),
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> float:
    """Least-squares step fraction of the relaxed recurrence, in PoS.

    Parameters
    ----------
    logit_success : array, shape (len(steps), prompts)
        Measured success logits at iterations ``steps``; the first row is
        iteration 0 (each prompt's ``L_ref``), where every prediction starts.
    steps : increasing ints starting at 0.
    beta : the KL weight, a number or one per prompt.
    step : the one-step map of the recurrence (:func:`relaxed_path_logit`).
    bounds : the search interval of the fraction (log scale).
    """
    obs, at = _check_trajectories(logit_success, steps)
    b = _path_beta(beta, obs[0])
    _check_step(step)
    low, high = check_interval("bounds", bounds, 0.0, 1.0, open_low=True)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    check_memory("steps", int(at[-1]), 8.0 * (int(at[-1]) + 1) * obs.shape[1], "the path")
    observed = sigmoid(obs)

    def loss(log_fraction: float) -> float:
        path = relaxed_path_logit(obs[0], b, int(at[-1]), float(np.exp(log_fraction)),
                                  estimator=estimator, step=step, calibration=cal)
        return float(np.mean((sigmoid(path[at]) - observed) ** 2))

    best = optimize.minimize_scalar(loss, bounds=(np.log(low), np.log(high)), method="bounded",
                                    options={"xatol": 1e-3})
    return float(np.exp(best.x))


def _check_trajectories(logit_success: ArrayLike, steps: ArrayLike,
                        name: str = "logit_success") -> tuple[np.ndarray, np.ndarray]:
    """Checked ``(logits (len(steps) >= 2, prompts >= 1), steps)``: increasing ints from 0."""
    obs = _check_logits(name, logit_success)
    at = np.asarray(steps)
    if obs.ndim != 2 or obs.shape[0] < 2 or obs.shape[1] == 0:
        raise ValueError(f"{name} must have shape (len(steps) >= 2, prompts >= 1), got "
                         f"shape {obs.shape}")
    if (at.ndim != 1 or len(at) != obs.shape[0] or not np.issubdtype(at.dtype, np.integer)
            or at[0] != 0 or np.any(np.diff(at) <= 0)):
        raise ValueError(f"steps must be increasing ints starting at 0, one per row of "
                         f"{name} ({obs.shape[0]}), got {steps!r}")
    return obs, at


def _check_table(logit_success: ArrayLike, min_rows: int = 1) -> np.ndarray:
    """Checked logits ``(rows >= min_rows, prompts >= 1)``."""
    obs = _check_logits("logit_success", logit_success)
    if obs.ndim != 2 or obs.shape[0] < min_rows or obs.shape[1] == 0:
        raise ValueError(f"logit_success must have shape (rows >= {min_rows}, prompts >= 1), "
                         f"got shape {obs.shape}")
    return obs


def _pos_logit(pos: np.ndarray) -> np.ndarray:
    """The success logit of a PoS, within the cap (0 and 1 map to -cap and +cap)."""
    with np.errstate(divide="ignore"):
        return np.clip(logit(pos), -_LOGIT_CAP, _LOGIT_CAP)


def common_shift(logit_success: ArrayLike) -> np.ndarray:
    """A prompt-blind baseline: the mean logit change of each row from row 0.

    ``logit_success`` is ``(rows, prompts)``; returns ``(rows,)``. Predicting
    ``L_ref + shift[n]`` for every prompt says "all prompts move alike", which
    the per-prompt recurrence must beat to show it knows more than the trend.
    """
    obs = _check_table(logit_success)
    return np.mean(obs - obs[:1], axis=1)


def fit_relaxation(logit_success: ArrayLike, steps: ArrayLike) -> tuple[float, float]:
    """A prompt-blind baseline with two constants: one level, approached at one rate.

    Every prompt's logit relaxes from its own ``L_ref`` toward one level ``L*``
    at one rate ``r``: ``L_n = L* + (1 - r)**n (L_ref - L*)``
    (:func:`relaxation_path_logit`). It can express "every prompt converges to
    the same place", which the per-prompt recurrence must beat to show that its
    destinations depend on ``p_ref``. Both constants are fitted by least squares
    in PoS (rows after the first; Nelder-Mead on ``(L*, logit r)`` from a grid's
    best point). Returns ``(level, rate)``.
    """
    obs, at = _check_trajectories(logit_success, steps)
    observed = sigmoid(obs[1:])

    def loss(theta: np.ndarray) -> float:
        path = relaxation_path_logit(obs[0], at, float(theta[0]), float(sigmoid(theta[1])))
        return float(np.mean((sigmoid(path[1:]) - observed) ** 2))

    grid = [(lv, lg) for lv in np.linspace(-6.0, 8.0, 15) for lg in np.linspace(-8.0, 4.0, 13)]
    start = min(grid, key=lambda t: loss(np.array(t)))
    best = optimize.minimize(loss, np.array(start), method="Nelder-Mead",
                             options={"xatol": 1e-6, "fatol": 1e-12, "maxiter": 4000})
    return float(np.clip(best.x[0], -_LOGIT_CAP, _LOGIT_CAP)), float(sigmoid(best.x[1]))


def relaxation_path_logit(logit_p_ref: ArrayLike, steps: ArrayLike, level: float,
                          rate: float) -> np.ndarray:
    """Logits ``(len(steps), prompts)``: ``L* + (1 - r)**n (L_ref - L*)``, see fit_relaxation."""
    lr = _check_logits("logit_p_ref", logit_p_ref)
    at = np.asarray(steps)
    if (at.ndim != 1 or at.size == 0 or not np.issubdtype(at.dtype, np.integer)
            or at[0] != 0 or np.any(np.diff(at) <= 0)):
        raise ValueError(f"steps must be increasing ints starting at 0, got {steps!r}")
    lv = float(check_real("level", level, scalar=True))
    r = float(check_real("rate", rate, 0.0, 1.0, scalar=True))
    keep = (1.0 - r) ** at.astype(np.float64)
    return lv + keep.reshape(-1, *([1] * lr.ndim)) * (lr - lv)


def mean_trajectory(logit_success: ArrayLike) -> np.ndarray:
    """A prompt-blind baseline: the logit of the prompts' mean PoS at each row, ``(rows,)``."""
    return _pos_logit(np.mean(sigmoid(_check_table(logit_success)), axis=1))


def _check_groups(name: str, value: ArrayLike | None, n: int) -> np.ndarray:
    if value is None:
        return np.zeros(n, dtype=np.int64)
    g = np.asarray(value)
    if g.shape != (n,) or g.dtype == bool or not np.issubdtype(g.dtype, np.integer):
        raise ValueError(f"{name} must hold one int label per prompt ({n}), got {value!r}")
    return g


#: The prompt-blind predictors of :func:`prompt_blind_predictions`, in the order reported.
PROMPT_BLIND = ("no change", "common shift", "mean trajectory", "relaxation to a level")


def prompt_blind_predictions(
    logit_success: ArrayLike,
    steps: ArrayLike,
    fit_logit_success: ArrayLike,
    *,
    group: ArrayLike | None = None,
    fit_group: ArrayLike | None = None,
) -> dict[str, np.ndarray]:
    """Every prompt-blind baseline's logits ``(len(steps), prompts)`` for the judged prompts.

    Each is fitted on the fit prompts ``fit_logit_success`` of the same
    ``group`` (e.g. one label per KL weight: a baseline may know the setting a
    prompt is trained under, not its ``p_ref``); :data:`PROMPT_BLIND` names them:

    - *no change*: ``L_n = L_ref`` (no constant);
    - *common shift*: ``L_ref + shift[n]`` (:func:`common_shift`; one constant per row);
    - *mean trajectory*: the fit prompts' mean PoS at each row, whatever the
      prompt (:func:`mean_trajectory`; one per row);
    - *relaxation to a level*: :func:`fit_relaxation` (two constants).

    Row 0 of ``logit_success`` is each judged prompt's ``L_ref``.
    """
    obs, at = _check_trajectories(logit_success, steps)
    fit, _ = _check_trajectories(fit_logit_success, steps, "fit_logit_success")
    g = _check_groups("group", group, obs.shape[1])
    fg = _check_groups("fit_group", fit_group, fit.shape[1])
    missing = sorted(set(g.tolist()) - set(fg.tolist()))
    if missing:
        raise ValueError(f"group labels {missing} have no fit prompt in fit_group")
    out = {name: np.empty_like(obs) for name in PROMPT_BLIND}
    out["no change"][:] = obs[:1]
    for label in np.unique(g):
        cols, fit_cols = g == label, fg == label
        mine = fit[:, fit_cols]
        out["common shift"][:, cols] = obs[:1, cols] + common_shift(mine)[:, None]
        out["mean trajectory"][:, cols] = mean_trajectory(mine)[:, None]
        level, rate = fit_relaxation(mine, at)
        out["relaxation to a level"][:, cols] = relaxation_path_logit(obs[0, cols], at, level,
                                                                      rate)
    return out


def kernel_reference(
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    fit_logit_success: ArrayLike,
    fit_beta: ArrayLike,
) -> np.ndarray:
    """A flexible reference fitted on the fit prompts: kernel regression on (L_ref, log beta).

    Not a criterion: it shows how much of what is predictable from a prompt's
    ``(p_ref, beta)`` at each recorded iteration a model with many degrees of
    freedom captures. At each row ``n`` the predicted logit of a prompt is the
    Nadaraya-Watson mean of the fit prompts' logits at row ``n``, with Gaussian
    weights on the distance in ``(L_ref, log beta)`` (each coordinate divided by
    its spread over the fit prompts). The bandwidth is the one of 25 (0.05 to
    3, log-spaced) with the least leave-one-out PoS error on the fit prompts.
    Returns ``(rows, prompts)`` logits; row 0 is each prompt's own ``L_ref``.
    """
    fit = _check_logits("fit_logit_success", fit_logit_success)
    if fit.ndim != 2 or fit.shape[0] < 2 or fit.shape[1] < 2:
        raise ValueError(f"fit_logit_success must have shape (rows >= 2, prompts >= 2), got "
                         f"shape {fit.shape}")
    lr = _check_logits("logit_p_ref", logit_p_ref)
    if lr.ndim != 1 or lr.size == 0:
        raise ValueError(f"logit_p_ref must be 1-d with one entry per prompt, got {lr.shape}")
    b = _path_beta(beta, lr)
    fb = check_beta(fit_beta, "fit_beta")
    try:
        fb = np.broadcast_to(fb, fit.shape[1:])
    except ValueError as err:
        raise ValueError(f"fit_beta must be a number or one per fit prompt ({fit.shape[1]}), "
                         f"got shape {np.shape(fb)}") from err
    feats_fit = np.stack([fit[0], np.log(fb)], axis=1)
    scale = feats_fit.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    z_fit, z = feats_fit / scale, np.stack([lr, np.log(b)], axis=1) / scale

    def weights(a: np.ndarray, h: float) -> np.ndarray:
        d2 = ((a[:, None, :] - z_fit[None, :, :]) ** 2).sum(-1)
        return np.exp(-0.5 * (d2 - d2.min(axis=1, keepdims=True)) / h**2)

    def predict(w: np.ndarray) -> np.ndarray:
        pos = sigmoid(fit[1:]) @ w.T / w.sum(axis=1)  # (rows - 1, prompts): mean PoS
        return _pos_logit(pos)

    def loo_error(h: float) -> float:
        w = weights(z_fit, h)
        np.fill_diagonal(w, 0.0)
        w = np.where(w.sum(axis=1, keepdims=True) > 0, w, 1.0)
        with np.errstate(divide="ignore"):
            return float(np.mean((sigmoid(predict(w)) - sigmoid(fit[1:])) ** 2))

    h = min(np.geomspace(0.05, 3.0, 25), key=loo_error)
    return np.concatenate([lr[None, :], predict(weights(z, float(h)))], axis=0)


@dataclass(frozen=True)
class Verdict:
    """Outcome of :func:`judge` on one set of prompts.

    ``rmse`` maps every predictor to its root-mean-square PoS error over every
    recorded iteration after the first and every prompt; ``ratio`` is the
    predictor's over the best of ``baselines`` (``best_baseline``);
    ``passed`` is ``ratio <= margin``.
    """

    rmse: dict[str, float]
    predictor: str
    baselines: tuple[str, ...]
    best_baseline: str
    ratio: float
    passed: bool
    n_prompts: int


#: The name :func:`predictor_paths` gives the :func:`kernel_reference` among its predictions.
KERNEL_REFERENCE = "kernel reference"


def predictor_paths(
    logit_success: ArrayLike,
    beta: ArrayLike,
    steps: ArrayLike,
    recurrences: Any,
    fit_logit_success: ArrayLike,
    fit_beta: ArrayLike,
    *,
    group: ArrayLike | None = None,
    fit_group: ArrayLike | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> dict[str, np.ndarray]:
    """Every predictor's logits ``(len(steps), prompts)`` for the judged prompts: chapter 8's
    predictions, to be scored by :func:`judge`.

    ``logit_success`` are the judged prompts' measured logits at the recorded ``steps``
    (row 0: each prompt's ``L_ref``), ``beta`` their KL weights (a number or one per
    prompt). ``recurrences`` maps a name to ``(estimator, step, step_fraction)``: the
    relaxed recurrence of the trained loss (:func:`relaxed_path_logit` from each prompt's
    own ``L_ref`` and ``beta``, read at ``steps``), for each fitted step fraction. Then come
    the prompt-blind baselines fitted on the fit prompts (:func:`prompt_blind_predictions`,
    with ``group`` and ``fit_group``) and the flexible reference (:func:`kernel_reference`,
    on ``fit_logit_success`` and ``fit_beta``), under the names :data:`PROMPT_BLIND` and
    ``"kernel reference"``, in that order.
    """
    obs, at = _check_trajectories(logit_success, steps)
    if not isinstance(recurrences, dict) or not recurrences:
        raise ValueError(f"recurrences must be a non-empty dict name -> (estimator, step, "
                         f"step_fraction), got {recurrences!r}")
    taken = sorted(set(recurrences) & {*PROMPT_BLIND, KERNEL_REFERENCE})
    if taken:
        raise ValueError(f"recurrences must not reuse the baselines' names, got {taken}")
    cal = resolve_calibration(calibration, **calibration_kwargs)
    out = {}
    for name, spec in recurrences.items():
        if not (isinstance(spec, tuple) and len(spec) == 3):
            raise ValueError(f"recurrences[{name!r}] must be (estimator, step, step_fraction), "
                             f"got {spec!r}")
        estimator, step, fraction = spec
        out[name] = relaxed_path_logit(obs[0], beta, int(at[-1]), fraction, estimator=estimator,
                                       step=step, calibration=cal)[at]
    out.update(prompt_blind_predictions(obs, at, fit_logit_success, group=group,
                                        fit_group=fit_group))
    out[KERNEL_REFERENCE] = kernel_reference(obs[0], beta, fit_logit_success, fit_beta)
    return out


def judge(
    logit_success: ArrayLike,
    predictions: dict[str, ArrayLike],
    *,
    predictor: str,
    baselines: tuple[str, ...],
    margin: float = 0.8,
) -> Verdict:
    """Score one predictor against the best of some baselines, in PoS.

    ``logit_success`` are measured success logits ``(rows >= 2, prompts)``
    (row 0: ``L_ref``); ``predictions`` maps names to predicted logits of that
    shape (e.g. :func:`relaxed_path_logit` at the recorded steps, and
    :func:`prompt_blind_predictions`). Every prediction's error is reported;
    the verdict compares ``predictor`` with the best of ``baselines``: it passes
    when its error is at most ``margin`` times that one's.
    """
    obs = _check_table(logit_success, min_rows=2)
    if not isinstance(predictions, dict) or not predictions:
        raise ValueError(f"predictions must be a non-empty dict of name -> logits, got "
                         f"{type(predictions).__name__}")
    if not isinstance(predictor, str) or predictor not in predictions:
        raise ValueError(f"predictor must name one of predictions ({sorted(predictions)}), "
                         f"got {predictor!r}")
    if (not isinstance(baselines, tuple) or not baselines
            or any(not isinstance(n, str) or n not in predictions or n == predictor
                   for n in baselines)):
        raise ValueError(f"baselines must be a non-empty tuple of names in predictions other "
                         f"than the predictor, got {baselines!r}")
    m = float(check_real("margin", margin, 0.0, open_low=True, scalar=True))
    observed = sigmoid(obs)[1:]
    rmse = {}
    for name, value in predictions.items():
        pred = _check_logits(f"predictions[{name!r}]", value)
        if pred.shape != obs.shape:
            raise ValueError(f"predictions[{name!r}] must have the shape of logit_success "
                             f"{obs.shape}, got {pred.shape}")
        rmse[name] = float(np.sqrt(np.mean((sigmoid(pred[1:]) - observed) ** 2)))
    best = min(baselines, key=lambda n: rmse[n])
    ratio = rmse[predictor] / rmse[best] if rmse[best] > 0 else np.inf
    return Verdict(rmse, predictor, baselines, best, float(ratio), bool(ratio <= m),
                   int(obs.shape[1]))


def _check_log_distributions(name: str, value: ArrayLike) -> np.ndarray:
    """Rows of log-probabilities: each in [-inf, 0] (no NaN), each row summing to 1."""
    try:
        x = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be an array of log-probabilities, got {value!r}") from err
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] < 2:
        raise ValueError(f"{name} must have shape (prompts >= 1, outputs >= 2), got shape "
                         f"{x.shape}")
    if np.isnan(x).any() or (x > 0).any():
        raise ValueError(f"{name} must hold log-probabilities in [-inf, 0] (no NaN)")
    total = np.exp(np.logaddexp.reduce(x, axis=1))
    if np.any(np.abs(total - 1.0) > 1e-6):
        raise ValueError(f"{name} must have rows that sum to 1 as probabilities (within 1e-6), "
                         f"got sums from {total.min():.6g} to {total.max():.6g}")
    return x


def one_step_tv(
    log_probs: ArrayLike,
    ref_log_probs: ArrayLike,
    correct: ArrayLike,
    logit_target: ArrayLike,
) -> tuple[np.ndarray, np.ndarray]:
    """Total variation from a policy to the tabular step with success logit ``logit_target``.

    A step of :func:`exact_step_logit` or :func:`round_step_logit` puts
    ``p* = sigmoid(logit_target)`` on the correct output and spreads ``1 - p*``
    over the failures in ``pi_ref``'s proportions. For a policy ``pi`` on the
    same outputs::

        TV = |pi(correct) - p*| / 2 + sum_fail |pi(o) - (1 - p*) pi_ref(o | fail)| / 2

    Parameters
    ----------
    log_probs, ref_log_probs : arrays (prompts, outputs)
        Log-probabilities of every output under ``pi`` and ``pi_ref``.
    correct : ints (prompts,), the column of each prompt's correct output.
    logit_target : (prompts,), the optimum's success logit.

    Returns
    -------
    (tv, pos_part)
        The distance and its first term, half the PoS error.
    """
    lp = _check_log_distributions("log_probs", log_probs)
    lr = _check_log_distributions("ref_log_probs", ref_log_probs)
    if lp.shape != lr.shape:
        raise ValueError(f"log_probs and ref_log_probs must have one same shape (prompts, "
                         f"outputs >= 2), got {lp.shape} and {lr.shape}")
    col = np.asarray(correct)
    if (col.shape != lp.shape[:1] or not np.issubdtype(col.dtype, np.integer)
            or np.any(col < 0) or np.any(col >= lp.shape[1])):
        raise ValueError(f"correct must hold one column index in [0, {lp.shape[1] - 1}] per "
                         f"prompt ({lp.shape[0]}), got {correct!r}")
    target = _check_logits("logit_target", logit_target)
    if target.shape != lp.shape[:1]:
        raise ValueError(f"logit_target must have shape ({lp.shape[0]},), got {target.shape}")
    rows = np.arange(lp.shape[0])
    is_correct = np.zeros(lp.shape, dtype=bool)
    is_correct[rows, col] = True
    ref_fail = np.where(is_correct, -np.inf, lr)
    log_ref_fail_mass = np.logaddexp.reduce(ref_fail, axis=1, keepdims=True)
    shape = np.exp(ref_fail - log_ref_fail_mass)  # pi_ref(o | fail), 0 on the correct output
    p_star = sigmoid(target)
    q_star = sigmoid(-target)
    pos_part = 0.5 * np.abs(np.exp(lp[rows, col]) - p_star)
    fail_part = 0.5 * np.sum(np.where(is_correct, 0.0, np.abs(np.exp(lp) - q_star[:, None]
                                                                * shape)), axis=1)
    return pos_part + fail_part, pos_part




# --- the exact optimum of one round of the sampled loss (pi_old fixed) --------------------------

#: Estimators whose round objective has a maximiser (k1's does not: it rewards log pi -> -inf at
#: pi_old's samples, so one round solved exactly drives the sampled outputs' probability to 0).
ROUND_ESTIMATORS = ("exact", "k2", "k3", "k3_ratio")


def _round_parts(lq: np.ndarray, lp: np.ndarray, lr: np.ndarray, b: np.ndarray,
                 omega: np.ndarray, estimator: str) -> tuple[np.ndarray, np.ndarray]:
    """``(J, F)`` of the two-outcome round objective at success logit ``lq``.

    ``J(q) = q Omega - beta K(q)`` (up to a constant) with ``K`` the penalty's
    expectation under pi_old, and ``F = dJ/dq`` (whose sign is that of
    ``dJ/dL``). ``p = sigmoid(lp)`` is pi_old's PoS, ``r = sigmoid(lr)`` pi_ref's.
    """
    log_q, log_1q = -np.logaddexp(0.0, -lq), -np.logaddexp(0.0, lq)
    log_r, log_1r = -np.logaddexp(0.0, -lr), -np.logaddexp(0.0, lr)
    p, q = special.expit(lp), special.expit(lq)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if estimator == "k3":
            # K = p (r/q + log q) + (1-p) ((1-r)/(1-q) + log(1-q)) + const
            r_over_q, s_over_1q = np.exp(log_r - log_q), np.exp(log_1r - log_1q)
            k = p * (r_over_q + log_q) + (1 - p) * (s_over_1q + log_1q)
            dk = p * (1 - r_over_q) / q - (1 - p) * (1 - s_over_1q) / special.expit(-lq)
        else:  # k2: K = p (log q - log r)^2 / 2 + (1-p) (log(1-q) - log(1-r))^2 / 2
            k = 0.5 * p * (log_q - log_r) ** 2 + 0.5 * (1 - p) * (log_1q - log_1r) ** 2
            dk = p * (log_q - log_r) / q - (1 - p) * (log_1q - log_1r) / special.expit(-lq)
    return q * omega - b * k, omega - b * dk


def _round_step(lp: np.ndarray, lr: np.ndarray, b: np.ndarray, estimator: str,
                cal: Calibration, grid: int = 768) -> np.ndarray:
    """Vectorised maximiser of the round objective, in logits (see :func:`round_step_logit`).

    Each bracketing grid cell is narrowed by SciPy's vectorised root finder
    (``scipy.optimize.elementwise.find_root``) to a bracket below ``2 eps`` relative (one to
    three ulps), where 80 bisections used to run; ``tests/theory/test_root_finders.py``
    checks the roots against mpmath.
    """
    omega = cal.omega_of_logit(lp)
    if estimator in ("exact", "k3_ratio"):  # the penalty is KL(pi || pi_ref): Theorem 2's tilt
        return lr + omega / b
    shape_out = np.broadcast_shapes(np.shape(lp), np.shape(lr), np.shape(b))
    lp, lr, b, omega = (np.asarray(a, dtype=np.float64).ravel()
                        for a in np.broadcast_arrays(lp, lr, b, omega))
    # a bracket [lo, hi] with F(lo) > 0 > F(hi): F -> +inf as q -> 0 and -inf as q -> 1
    lo, hi = np.minimum(lp, lr) - 1.0, np.maximum(lp, lr) + 1.0
    width = np.ones_like(lo)
    for _ in range(12):
        bad = _round_parts(lo, lp, lr, b, omega, estimator)[1] <= 0
        lo = np.where(bad, np.maximum(lo - width, -_LOGIT_CAP), lo)
        bad_hi = _round_parts(hi, lp, lr, b, omega, estimator)[1] >= 0
        hi = np.where(bad_hi, np.minimum(hi + width, _LOGIT_CAP), hi)
        if not (bad.any() or bad_hi.any()):
            break
        width = width * 4.0
    # the maximum that ascent from pi_old reaches: the first + to - sign change of F above
    # L_old when F(L_old) > 0, the last one below it when F(L_old) < 0; a grid fine enough to
    # separate the maxima, with extra points where F turns fast (near L_ref and L_old)
    t = np.linspace(0.0, 1.0, grid)
    near = np.concatenate([-np.geomspace(8.0, 1e-6, 24), [0.0], np.geomspace(1e-6, 8.0, 24)])
    pts = np.concatenate([lo[:, None] + (hi - lo)[:, None] * t, lr[:, None] + near,
                          lp[:, None] + near], axis=1)
    pts = np.sort(np.clip(pts, lo[:, None], hi[:, None]), axis=1)
    f = _round_parts(pts, lp[:, None], lr[:, None], b[:, None], omega[:, None], estimator)[1]
    change = (f[:, :-1] > 0) & (f[:, 1:] <= 0)
    up = _round_parts(lp, lp, lr, b, omega, estimator)[1] > 0
    above = change & (pts[:, :-1] >= lp[:, None])
    below = change & (pts[:, 1:] <= lp[:, None])
    first_above = np.argmax(above, axis=1)
    last_below = change.shape[1] - 1 - np.argmax(below[:, ::-1], axis=1)
    cell = np.where(up, first_above, last_below)
    rows = np.arange(len(lp))
    a, c = pts[rows, cell], pts[rows, cell + 1]
    found = np.where(up, above[rows, first_above], below[rows, last_below])
    sub = np.flatnonzero(found)

    def slope(x: np.ndarray, i: np.ndarray) -> np.ndarray:
        k = sub[i]
        return _round_parts(x, lp[k], lr[k], b[k], omega[k], estimator)[1]

    from scipy.optimize.elementwise import find_root

    tiny, eps = np.finfo(np.float64).tiny, np.finfo(np.float64).eps
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        res = find_root(slope, (a[sub], c[sub]), args=(np.arange(sub.size),),
                        tolerances={"xatol": 4.0 * tiny, "xrtol": 2.0 * eps, "fatol": 0.0})
    out = lp.copy()  # no sign change: F(L_old) = 0 exactly, pi_old is the optimum
    out[sub] = res.x
    return out.reshape(shape_out)


def round_step_logit(
    logit_p: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    estimator: str = "k3",
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Success logit of the exact optimum of one round of the sampled GRPO loss.

    Within a round the outputs are drawn from ``pi_old`` (PoS ``p =
    sigmoid(logit_p)``), so the expected per-sample penalty is
    ``K(pi) = E_{o ~ pi_old}[k(o)]`` with ``k`` the estimator
    (:func:`grpo_companion.rl.losses.kl_penalty`); with the group weights
    ``+w+`` / ``-w-`` of ``p`` and no clipping, the round maximises, over the
    tabular policy ``pi``,

        J(pi) = pi(S) w+ - pi(F) w- - beta K(pi).

    Failures keep their ``pi_ref`` proportions if ``pi_old``'s do, so ``pi``
    reduces to its PoS ``q``; with ``r = p_ref``:

    - ``k3_ratio`` (and ``exact``): ``K`` is ``KL(pi || pi_ref)`` up to a
      constant, so the optimum is Theorem 2's Gibbs tilt,
      ``logit q = logit r + Omega(p) / beta`` (eq. 8);
    - ``k3``: ``K = p (r/q + log q) + (1-p) ((1-r)/(1-q) + log(1-q))`` + const,
      which is *not* ``KL(pi_ref || pi)``: the two share their gradient at
      ``pi = pi_old`` only. The stationary points solve
      ``Omega(p) = beta (q - r) (p / q**2 + (1-p) / (1-q)**2)``;
    - ``k2``: ``K = p log(q/r)**2 / 2 + (1-p) log((1-q)/(1-r))**2 / 2``.

    At ``q = p`` the ``k3`` equation is ``p (1-p) Omega(p) = beta (p - r)``:
    the fixed points are those of the reverse-KL step
    (:func:`exact_step_logit`), but one round goes elsewhere. ``k2``'s fixed
    points are the forward KL's.

    ``J`` can have two local maxima in ``q`` (``k3`` when ``p`` is far above
    ``r``: at ``p_ref = 0.05``, ``beta = 1``, ``p = 0.53`` a second one sits at
    ``q = 0.066``, with the larger ``J``). The optimiser's steps start at
    ``pi_old`` and climb ``J``, so the optimum returned is the maximum that
    ascent from ``q = p`` reaches: the first zero of ``dJ/dq`` above ``p`` if
    ``J`` rises there, the first below it if it falls. Its fixed points are
    then exactly the roots of the equation above. The root is bracketed on a
    grid of logits and narrowed to one to three ulps (SciPy's ``find_root``).

    ``k1`` is refused: its expected penalty ``p log q + (1-p) log(1-q)`` is
    unbounded below, so the round objective has no maximiser.
    """
    if estimator not in ROUND_ESTIMATORS:
        raise ValueError(f"estimator must be one of {ROUND_ESTIMATORS} (an estimator whose round "
                         f"objective has a maximiser; k1's rewards log pi -> -inf at the "
                         f"samples), got {estimator!r}")
    lp, lr, b, cal = _step_inputs(logit_p, logit_p_ref, beta, calibration, calibration_kwargs)
    return np.clip(_round_step(lp, lr, b, str(estimator), cal), -_LOGIT_CAP, _LOGIT_CAP)
