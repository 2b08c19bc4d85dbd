"""The finite-group weights' arithmetic, on a checked calibration (see :mod:`.finite_group`).

Shared by :class:`~grpo_companion.theory.calibration.Calibration` (its weights for a
``group_size``) and the public, checked functions of :mod:`.finite_group`; it imports
neither, so that the two do not import each other.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from grpo_companion.validation import check_memory

from .logistic import _log_bernoulli_variance, _log_sigmoid
from .normalizations import NUMPY_OPS


def _group_table(calibration: object, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    g = group_size
    k = np.arange(1, g, dtype=np.float64)
    plus, minus = np.zeros(g + 1), np.zeros(g + 1)
    if g > 1:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # reported below
            got = calibration.definition.gains(k / g, (g - k) / g, g, calibration, NUMPY_OPS)
            plus[1:g], minus[1:g] = (np.broadcast_to(np.asarray(x, dtype=np.float64), k.shape)
                                     for x in got)
        _check_table(calibration, g, plus, minus)
    return plus, minus


def _check_table(calibration: object, g: int, plus: np.ndarray, minus: np.ndarray) -> None:
    """Every gain of a group of ``g`` must be finite and ``>= 0``; name the first that is not.

    Registration tries a few group sizes only; this runs for each group size a
    calibration is used with, before any weight, fixed point or advantage is
    formed from the table (which would otherwise turn a bad gain into NaN or a
    wrong sign silently).
    """
    name = calibration.normalization
    for problem, bad in (("not finite", ~(np.isfinite(plus) & np.isfinite(minus))),
                         ("negative", (plus < 0) | (minus < 0))):
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            rule = ("must be finite" if problem == "not finite" else
                    "are magnitudes (a success gets +gain_plus, a failure -gain_minus) and "
                    "must be >= 0")
            raise ValueError(
                f"normalisation {name!r}: gains are {problem} for group size {g} at k = {k} "
                f"successes (gain_plus={plus[k]!r}, gain_minus={minus[k]!r}); gains {rule} "
                f"for every "
                f"0 < k < G (here {int(bad.sum())} of the {g - 1} values of k fail)")


def _group_gains(calibration: object) -> tuple[np.ndarray, np.ndarray]:
    """``finite_group.group_gains`` of a checked calibration with a ``group_size``."""
    plus, minus = _group_table(calibration, calibration.group_size)
    # gain_plus[s]: a success with s other successes (k = s + 1); gain_minus[s]: k = s
    return plus[1:], minus[:-1]


def _binomial_pmf_of_logit(logit_p: np.ndarray, n: int) -> np.ndarray:
    """``Bin(s; n, sigmoid(L))`` for s = 0..n on a new trailing axis, computed in log space."""
    check_memory("group_size", n + 1, 32.0 * (n + 1) * max(np.size(logit_p), 1),
                 "the binomial weights of every cell")
    s = np.arange(n + 1, dtype=np.float64)
    lp = _log_sigmoid(logit_p)[..., None]
    lq = _log_sigmoid(-logit_p)[..., None]
    log_comb = special.gammaln(n + 1.0) - special.gammaln(s + 1.0) - special.gammaln(n - s + 1.0)
    with np.errstate(invalid="ignore"):
        log_pmf = log_comb + np.where(s > 0, s * lp, 0.0) + np.where(s < n, (n - s) * lq, 0.0)
    return np.exp(log_pmf)


def _group_weights_of_logit(
    logit_p: np.ndarray, gains: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    gain_plus, gain_minus = gains
    pmf = _binomial_pmf_of_logit(np.asarray(logit_p, dtype=np.float64), gain_plus.size - 1)
    return pmf @ gain_plus, pmf @ gain_minus


def _group_weights_prime_of_logit(
    logit_p: np.ndarray, gains: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    logit_p = np.asarray(logit_p, dtype=np.float64)
    gain_plus, gain_minus = gains
    n = gain_plus.size - 1
    pmf = _binomial_pmf_of_logit(logit_p, n - 1)
    dpdl = np.exp(_log_bernoulli_variance(logit_p))
    return (
        n * dpdl * (pmf @ np.diff(gain_plus)),
        n * dpdl * (pmf @ np.diff(gain_minus)),
    )
