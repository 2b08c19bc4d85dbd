"""Held-out success trajectories against the relaxed recurrence (chapter 8, Appendix A).

The paper's Figure 3 reads the success rates of test questions along training
as orbits of the PoS recurrence (Theorem 2). Chapter 8 tests that reading on a
tiny transformer: each held-out prompt's measured trajectory is compared with
the *relaxed* recurrence of :mod:`grpo_companion.theory.relaxed` started at the
prompt's own ``p_ref``, with one step fraction ``lambda`` fitted on half of the
prompts (:func:`fit_step_fraction_on`) and the prediction judged on the other
half only (:func:`judge`). :func:`before_after` is the analog of Appendix A's
before/after mean success, with the paired standard error of the change.

Arrays of success probabilities have shape ``(iterations + 1, prompts)``; row 0
holds each prompt's ``p_ref``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ._validate import (
    as_float_array,
    check_count,
    check_probability,
    check_real,
    check_seed,
)
from .calibration import Calibration, resolve_calibration
from .relaxed import fit_step_fraction, relaxed_iterate

__all__ = [
    "BeforeAfter",
    "Judgement",
    "before_after",
    "fit_step_fraction_on",
    "judge",
    "predict",
    "rmse",
    "split_prompts",
]


def _check_trajectories(success_prob: ArrayLike, min_rows: int = 1) -> np.ndarray:
    x = check_probability("success_prob", success_prob)
    if x.ndim != 2 or x.shape[0] < min_rows or x.shape[1] == 0:
        raise ValueError(f"success_prob must have shape (iterations + 1, prompts) with at "
                         f"least {min_rows} row(s) and one prompt, got shape {x.shape}")
    return x


def _check_prompts(prompts: ArrayLike, n_prompts: int) -> np.ndarray:
    """Distinct integer column indices in ``[0, n_prompts)``, at least one."""
    valid = f"distinct integer indices in [0, {n_prompts - 1}], at least one"
    if prompts is None or isinstance(prompts, str | bytes | bool):
        raise ValueError(f"prompts must be {valid}, got {prompts!r}")
    idx = np.asarray(prompts)
    if (idx.ndim != 1 or idx.size == 0 or idx.dtype == bool
            or not np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"prompts must be {valid}, got {prompts!r}")
    if idx.min() < 0 or idx.max() >= n_prompts or np.unique(idx).size != idx.size:
        raise ValueError(f"prompts must be {valid}, got {prompts!r}")
    return idx.astype(np.intp)


def split_prompts(n_prompts: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random split of ``range(n_prompts)`` into fit and test halves, each sorted.

    The fit half gets ``n_prompts // 2`` indices (``numpy.random.default_rng(seed)``
    permutation); it is used only to fit ``lambda``, the test half only to judge.
    """
    n = check_count("n_prompts", n_prompts, 2)
    order = np.random.default_rng(check_seed("seed", seed)).permutation(n)
    return np.sort(order[: n // 2]), np.sort(order[n // 2:])


def predict(
    p_ref: ArrayLike,
    beta: float,
    n_steps: int,
    step_fraction: float,
    *,
    alpha: float = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """PoS after ``0..n_steps`` relaxed GRPO steps, each prompt from its own ``p_ref``.

    :func:`~grpo_companion.theory.relaxed.relaxed_iterate` with ``p_0 = p_ref``:
    the two-KL recurrence (Theorem 9 along tilts of ``pi_ref``) with reference
    share ``step_fraction * alpha`` and KL weight ``beta / step_fraction``;
    ``step_fraction = 1`` is the paper's recurrence (Theorem 2 for ``alpha = 1``).
    Shape ``(n_steps + 1, *p_ref.shape)``.
    """
    pr = check_probability("p_ref", p_ref)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    return relaxed_iterate(pr, pr, beta, n_steps, step_fraction, alpha=alpha, calibration=cal)


def fit_step_fraction_on(
    success_prob: ArrayLike,
    prompts: ArrayLike,
    beta: float,
    *,
    alpha: float = 1.0,
    bounds: tuple[float, float] = (1e-4, 1.0),
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> float:
    """Least-squares step fraction ``lambda`` from the trajectories of ``prompts`` only.

    :func:`~grpo_companion.theory.relaxed.fit_step_fraction` on the columns
    ``prompts`` of ``success_prob``: the other columns do not enter the fit, so
    they can judge it (:func:`judge`).
    """
    observed = _check_trajectories(success_prob, 2)
    idx = _check_prompts(prompts, observed.shape[1])
    cal = resolve_calibration(calibration, **calibration_kwargs)
    return fit_step_fraction(observed[:, idx], beta, alpha=alpha, bounds=bounds,
                             calibration=cal)


def rmse(predicted: ArrayLike, observed: ArrayLike) -> float:
    """Root-mean-square difference of two arrays of the same shape (at least one entry)."""
    a = as_float_array("predicted", predicted)
    b = as_float_array("observed", observed)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"predicted and observed must have the same non-empty shape, got "
                         f"{a.shape} and {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("predicted and observed must be finite")
    return float(np.sqrt(np.mean((a - b) ** 2)))


@dataclass(frozen=True)
class Judgement:
    """Test-prompt errors of three predictions (see :func:`judge`).

    Attributes
    ----------
    none, exact, relaxed : float
        RMSE over the test prompts and all iterations of "no change"
        (``p_n = p_ref``), of exact steps (``lambda = 1``, the paper's recurrence)
        and of the relaxed prediction passed in.
    inside : ndarray of bool, ``(test prompts,)``
        Final measured rate within ``n_se`` binomial standard errors of the
        relaxed prediction.
    signed : ndarray, ``(test prompts,)``
        Final measured rate minus the relaxed prediction.
    """

    none: float
    exact: float
    relaxed: float
    inside: np.ndarray
    signed: np.ndarray


def judge(
    success_prob: ArrayLike,
    predicted: ArrayLike,
    prompts: ArrayLike,
    beta: float,
    *,
    alpha: float = 1.0,
    eval_samples: int = 50,
    n_se: float = 3.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> Judgement:
    """Errors of "no change", exact steps and a relaxed prediction on the test ``prompts``.

    ``predicted`` (same shape as ``success_prob``) is the relaxed prediction,
    e.g. :func:`predict` with a fitted ``lambda``; the exact-step baseline is
    :func:`predict` with ``step_fraction = 1`` (the recurrence of Theorem 2, or
    Table 1's row for ``alpha``). The band of the final iteration is
    ``n_se * sqrt(max(p (1 - p), 1 / eval_samples) / eval_samples)`` at the
    predicted ``p``: ``n_se`` binomial standard errors of an ``eval_samples``-sample
    rate, with the variance floored at ``1 / eval_samples`` so that the band
    stays open at ``p`` in {0, 1}.
    """
    observed_all = _check_trajectories(success_prob, 2)
    pred_all = check_probability("predicted", predicted)
    if pred_all.shape != observed_all.shape:
        raise ValueError(f"predicted must have the shape of success_prob, "
                         f"{observed_all.shape}, got {pred_all.shape}")
    idx = _check_prompts(prompts, observed_all.shape[1])
    n = check_count("eval_samples", eval_samples, 1)
    width = float(check_real("n_se", n_se, 0.0, open_low=True, scalar=True))
    cal = resolve_calibration(calibration, **calibration_kwargs)
    observed, pred = observed_all[:, idx], pred_all[:, idx]
    n_steps = observed.shape[0] - 1
    exact = predict(observed[0], beta, n_steps, 1.0, alpha=alpha, calibration=cal)
    final = pred[-1]
    band = width * np.sqrt(np.maximum(final * (1 - final), 1 / n) / n)
    signed = observed[-1] - final
    return Judgement(
        none=rmse(np.broadcast_to(observed[0], observed.shape), observed),
        exact=rmse(exact, observed),
        relaxed=rmse(pred, observed),
        inside=np.abs(signed) <= band,
        signed=signed,
    )


@dataclass(frozen=True)
class BeforeAfter:
    """Mean success before and after training, with standard errors over prompts.

    ``gain_se`` is the paired standard error: that of the per-prompt changes.
    """

    before: float
    before_se: float
    after: float
    after_se: float
    gain: float
    gain_se: float

    @property
    def gain_z(self) -> float:
        """The change in paired standard errors (the paired t statistic); inf if that is 0."""
        if self.gain_se == 0:
            return math.copysign(math.inf, self.gain) if self.gain else math.nan
        return self.gain / self.gain_se


def before_after(success_prob: ArrayLike) -> BeforeAfter:
    """Mean success of the first and last rows and of their difference (Appendix A analog).

    Standard errors are ``std(ddof=1) / sqrt(prompts)``; needs at least two rows (before
    and after) and two prompts.
    """
    x = _check_trajectories(success_prob, 2)
    if x.shape[1] < 2:
        raise ValueError(f"success_prob must hold at least two prompts for a standard error, "
                         f"got shape {x.shape}")
    before, after = x[0], x[-1]
    root_n = np.sqrt(x.shape[1])
    diff = after - before
    return BeforeAfter(
        before=float(before.mean()), before_se=float(before.std(ddof=1) / root_n),
        after=float(after.mean()), after_se=float(after.std(ddof=1) / root_n),
        gain=float(diff.mean()), gain_se=float(diff.std(ddof=1) / root_n),
    )
