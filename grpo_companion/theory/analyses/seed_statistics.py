"""Statistics over independent seeds: a mean and its standard error, and paired differences.

The chapters that train (ch. 7, Bandit training; ch. 14, Beyond the paper) repeat a run over a
few seeds and judge a result by how many standard errors over seeds it lies from zero. With
``n`` seeds the standard error of a mean is the sample standard deviation (``ddof=1``) over
``sqrt(n)``. Two variants trained from the same seeds (the same reference model, the same
prompts) are compared *paired*: per seed ``d = after - before``, then the mean of ``d``, its
standard error and their ratio, the statistic of the paired t-test
(``scipy.stats.ttest_rel``), with ``n - 1`` degrees of freedom.

The arrays hold the seeds on ``axis`` (default 0, the first); every other axis is carried
through (one statistic per ``k`` of a pass@k curve, say). ``axis=None`` pools every entry as
one sample (independent residuals, say).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from grpo_companion.validation import check_count, check_real

__all__ = ["PairedDifference", "mean_and_standard_error", "paired_difference", "t_p_value",
           "t_statistic"]


def _check_seeds(name: str, value: ArrayLike, axis: object) -> tuple[np.ndarray, int | None]:
    """``value`` as a finite float array with at least two seeds on ``axis`` (``None``: in all)."""
    x = check_real(name, value)
    if axis is None:
        if x.size < 2:
            raise ValueError(f"{name} must hold at least 2 values, got shape {x.shape}")
        return x, None
    if isinstance(axis, bool | np.bool_) or not isinstance(axis, int | np.integer):
        raise ValueError(f"axis must be an integer axis of {name}, got {axis!r}")
    if x.ndim == 0 or not -x.ndim <= int(axis) < x.ndim:
        raise ValueError(f"axis must be in [-{max(x.ndim, 1)}, {max(x.ndim - 1, 0)}] for "
                         f"{name} of shape {x.shape}, got {axis!r}")
    axis = int(axis) % x.ndim
    if x.shape[axis] < 2:
        raise ValueError(f"{name} must hold at least 2 seeds on axis {axis}, "
                         f"got shape {x.shape}")
    return x, axis


def mean_and_standard_error(values: ArrayLike,
                            axis: int | None = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds and its standard error ``std(ddof=1) / sqrt(n_seeds)``.

    ``values`` holds independent runs on ``axis`` (at least 2; ``None``: every entry is
    one); the result drops that axis. The standard error is that of a mean of independent
    draws: the sample standard deviation with Bessel's correction over the square root of
    the number of draws.
    """
    x, axis = _check_seeds("values", values, axis)
    n = x.size if axis is None else x.shape[axis]
    return x.mean(axis=axis)[()], (x.std(axis=axis, ddof=1) / np.sqrt(n))[()]


def t_statistic(values: ArrayLike, axis: int | None = 0) -> np.ndarray:
    """One-sample t statistic of a mean against 0: the mean over ``axis`` in standard errors.

    ``mean / (std(ddof=1) / sqrt(n))`` of :func:`mean_and_standard_error` (``axis=None``:
    over every entry, e.g. residuals that should average 0). Its p-value is
    :func:`t_p_value` with the number of draws. Values without spread give ``+-inf`` (or
    NaN when they are all 0), as the division does.
    """
    mean, se = mean_and_standard_error(values, axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (mean / se)[()]


def t_p_value(t: ArrayLike, n_seeds: int) -> np.ndarray:
    """Two-sided p-value of a t statistic over ``n_seeds`` seeds (``n_seeds - 1`` d.o.f.).

    ``2 P(T > abs(t))`` for Student's t with ``n_seeds - 1`` degrees of freedom: the
    p-value of ``scipy.stats.ttest_rel`` for the statistic of :func:`paired_difference`.
    ``t = +-inf`` gives 0.
    """
    tt = check_real("t", t, finite=False)
    n = check_count("n_seeds", n_seeds, 2)
    return (2 * stats.t.sf(np.abs(tt), df=n - 1))[()]


@dataclass(frozen=True)
class PairedDifference:
    """Mean over seeds of a paired difference, with its standard error and t statistic.

    ``mean``: the mean over seeds of ``after - before``; ``standard_error``: its
    standard error ``std(ddof=1) / sqrt(n_seeds)``; ``t``: ``mean / standard_error``,
    the paired t statistic (0 where the difference is 0 on every seed, ``+-inf`` where it
    is the same non-zero number on every seed); ``n_seeds``: the number of pairs.
    """

    mean: np.ndarray
    standard_error: np.ndarray
    t: np.ndarray
    n_seeds: int

    def p_value(self) -> np.ndarray:
        """Two-sided p-value of ``t`` (:func:`t_p_value`, ``n_seeds - 1`` d.o.f.)."""
        return t_p_value(self.t, self.n_seeds)

    def beyond(self, n_se: float = 3.0) -> np.ndarray:
        """Where the difference exceeds ``n_se`` standard errors, either way (``abs(t) > n_se``).

        A difference with no spread over seeds counts only when it is not 0.
        """
        return (np.abs(self.t) > check_real("n_se", n_se, 0.0, scalar=True))[()]


def paired_difference(after: ArrayLike, before: ArrayLike, axis: int = 0) -> PairedDifference:
    """``after - before`` paired by seed: mean, standard error and the paired t statistic.

    ``after`` and ``before`` have the same shape, with the seeds (at least 2) on ``axis``,
    and row ``i`` of each comes from seed ``i``. The statistic equals that of
    ``scipy.stats.ttest_rel`` wherever the differences vary over seeds. Returns a
    :class:`PairedDifference`.
    """
    a, axis = _check_seeds("after", after, axis)
    b = check_real("before", before)
    if b.shape != a.shape:
        raise ValueError(f"before must have the shape of after {a.shape}, got {b.shape}")
    d = a - b
    mean = d.mean(axis=axis)
    se = d.std(axis=axis, ddof=1) / np.sqrt(d.shape[axis])
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, mean / np.where(se > 0, se, 1.0),
                     np.where(mean == 0, 0.0, np.sign(mean) * np.inf))
    return PairedDifference(mean=mean[()], standard_error=se[()], t=t[()],
                            n_seeds=int(d.shape[axis]))
