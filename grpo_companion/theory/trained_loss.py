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

from ._validate import (
    broadcast,
    check_beta,
    check_count,
    check_interval,
    check_memory,
    check_real,
    check_seed,
)
from .calibration import Calibration, resolve_calibration
from .dynamics import pos_map_logit
from .kl_estimators import ESTIMATOR_TARGETS, _reverse_kl_policy, reverse_kl_fixed_points
from .logistic import sigmoid
from .roots import fixed_points

__all__ = [
    "Verdict",
    "common_shift",
    "destination",
    "exact_step_logit",
    "fit_step_fraction",
    "judge",
    "one_step_tv",
    "relaxed_path_logit",
    "round_step_logit",
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


def relaxed_path_logit(
    logit_p_ref: ArrayLike,
    beta: float,
    n_steps: int,
    step_fraction: float,
    *,
    estimator: str = "k3_ratio",
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Success logits ``(n_steps + 1, ...)`` of the relaxed recurrence from ``L_0 = L_ref``.

    ``L_n = (1 - lam) L_{n-1} + lam logit T(p_{n-1})`` with ``T`` =
    :func:`exact_step_logit` and ``lam = step_fraction``; ``lam = 1`` is the
    exact recurrence of the trained objective.
    """
    est = _check_estimator(estimator)
    lr = _check_logits("logit_p_ref", logit_p_ref)
    b = float(check_real("beta", beta, 0.0, open_low=True, scalar=True))
    steps = check_count("n_steps", n_steps)
    lam = float(check_real("step_fraction", step_fraction, 0.0, 1.0, open_low=True,
                           scalar=True))
    cal = resolve_calibration(calibration, **calibration_kwargs)
    target = ESTIMATOR_TARGETS[est]
    check_memory("n_steps", steps, 8.0 * (steps + 1) * max(lr.size, 1), "the path")
    out = np.empty((steps + 1, *lr.shape))
    out[0] = current = lr
    beta_arr = np.full(lr.shape, b)
    for n in range(1, steps + 1):
        step = np.clip(_step(current, lr, beta_arr, target, cal), -_LOGIT_CAP, _LOGIT_CAP)
        current = (1 - lam) * current + lam * step
        out[n] = current
    return out


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
    beta: float,
    *,
    estimator: str = "k3_ratio",
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
    bounds : the search interval of the fraction (log scale).
    """
    obs = _check_logits("logit_success", logit_success)
    at = np.asarray(steps)
    if obs.ndim != 2 or obs.shape[0] < 2 or obs.shape[1] == 0:
        raise ValueError(f"logit_success must have shape (len(steps) >= 2, prompts >= 1), got "
                         f"shape {obs.shape}")
    if (at.ndim != 1 or len(at) != obs.shape[0] or not np.issubdtype(at.dtype, np.integer)
            or at[0] != 0 or np.any(np.diff(at) <= 0)):
        raise ValueError(f"steps must be increasing ints starting at 0, one per row of "
                         f"logit_success ({obs.shape[0]}), got {steps!r}")
    low, high = check_interval("bounds", bounds, 0.0, 1.0, open_low=True)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    check_memory("steps", int(at[-1]), 8.0 * (int(at[-1]) + 1) * obs.shape[1], "the path")
    observed = sigmoid(obs)

    def loss(log_fraction: float) -> float:
        path = relaxed_path_logit(obs[0], beta, int(at[-1]), float(np.exp(log_fraction)),
                                  estimator=estimator, calibration=cal)
        return float(np.mean((sigmoid(path[at]) - observed) ** 2))

    best = optimize.minimize_scalar(loss, bounds=(np.log(low), np.log(high)), method="bounded",
                                    options={"xatol": 1e-3})
    return float(np.exp(best.x))


def common_shift(logit_success: ArrayLike) -> np.ndarray:
    """A prompt-blind baseline: the mean logit change of each row from row 0.

    ``logit_success`` is ``(rows, prompts)``; returns ``(rows,)``. Predicting
    ``L_ref + shift[n]`` for every prompt says "all prompts move alike", which
    the per-prompt recurrence must beat to show it knows more than the trend.
    """
    obs = _check_logits("logit_success", logit_success)
    if obs.ndim != 2 or obs.shape[1] == 0:
        raise ValueError(f"logit_success must have shape (rows, prompts >= 1), got shape "
                         f"{obs.shape}")
    return np.mean(obs - obs[:1], axis=1)


@dataclass(frozen=True)
class Verdict:
    """Outcome of :func:`judge` on one set of prompts of one run.

    ``rmse_*`` are root-mean-square PoS errors over every recorded iteration
    after the first and every prompt; ``ratio`` is the prediction's over the
    better of the two baselines; ``passed`` is ``ratio <= margin``.
    """

    rmse_predicted: float
    rmse_no_change: float
    rmse_common_shift: float
    ratio: float
    passed: bool


def judge(
    logit_success: ArrayLike,
    steps: ArrayLike,
    beta: float,
    step_fraction: float,
    shift: ArrayLike,
    *,
    estimator: str = "k3_ratio",
    margin: float = 0.8,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> Verdict:
    """Score the relaxed recurrence from each prompt's own ``L_ref`` against two baselines.

    ``logit_success`` are measured success logits ``(len(steps), prompts)``
    (row 0: ``L_ref``); the prediction is :func:`relaxed_path_logit` with the
    given (already fitted) ``step_fraction``. The baselines are *no change*
    (``p_n = p_ref``) and the prompt-blind *common shift*
    (``L_ref + shift[n]``, ``shift`` from :func:`common_shift` on fit data, one
    entry per row). The prediction passes when its error is at most
    ``margin`` times the better baseline's.
    """
    obs = _check_logits("logit_success", logit_success)
    at = np.asarray(steps)
    if obs.ndim != 2 or obs.shape[0] < 2 or obs.shape[1] == 0 or at.shape != obs.shape[:1]:
        raise ValueError(f"logit_success must have shape (len(steps) >= 2, prompts >= 1), got "
                         f"shape {obs.shape} for {at.size} steps")
    sh = _check_logits("shift", shift)
    if sh.shape != at.shape:
        raise ValueError(f"shift must have one entry per step ({at.size}), got shape {sh.shape}")
    m = float(check_real("margin", margin, 0.0, open_low=True, scalar=True))
    if not np.issubdtype(at.dtype, np.integer) or at[0] != 0 or np.any(np.diff(at) <= 0):
        raise ValueError(f"steps must be increasing ints starting at 0, got {steps!r}")
    cal = resolve_calibration(calibration, **calibration_kwargs)
    path = relaxed_path_logit(obs[0], beta, int(at[-1]), step_fraction, estimator=estimator,
                              calibration=cal)
    observed = sigmoid(obs)[1:]

    def error(predicted: np.ndarray) -> float:
        return float(np.sqrt(np.mean((predicted - observed) ** 2)))

    predicted = error(sigmoid(path[at])[1:])
    no_change = error(np.broadcast_to(sigmoid(obs[0]), observed.shape))
    shifted = error(sigmoid(obs[0][None, :] + sh[1:, None]))
    ratio = predicted / min(no_change, shifted) if min(no_change, shifted) > 0 else np.inf
    return Verdict(predicted, no_change, shifted, float(ratio), bool(ratio <= m))


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
                cal: Calibration, grid: int = 768, bisections: int = 80) -> np.ndarray:
    """Vectorised maximiser of the round objective, in logits (see :func:`round_step_logit`)."""
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
    for _ in range(bisections):  # each bracket halves; 80 halvings of <= 1400 reach float64
        mid = 0.5 * (a + c)
        pos = _round_parts(mid, lp, lr, b, omega, estimator)[1] > 0
        a, c = np.where(pos, mid, a), np.where(pos, c, mid)
    found = np.where(up, above[rows, first_above], below[rows, last_below])
    out = np.where(found, 0.5 * (a + c), lp)  # F(L_old) = 0 exactly: pi_old is the optimum
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
    grid of logits and bisected 80 times (float64 resolution).

    ``k1`` is refused: its expected penalty ``p log q + (1-p) log(1-q)`` is
    unbounded below, so the round objective has no maximiser.
    """
    if estimator not in ROUND_ESTIMATORS:
        raise ValueError(f"estimator must be one of {ROUND_ESTIMATORS} (an estimator whose round "
                         f"objective has a maximiser; k1's rewards log pi -> -inf at the "
                         f"samples), got {estimator!r}")
    lp, lr, b, cal = _step_inputs(logit_p, logit_p_ref, beta, calibration, calibration_kwargs)
    return np.clip(_round_step(lp, lr, b, str(estimator), cal), -_LOGIT_CAP, _LOGIT_CAP)
